"""The resource plan: CPUs and GPUs for the main process, each EnvRunner and each Learner.

Computed from RLlib's own placement request (`Algorithm.default_resource_request`), so
the plan is what RLlib will ask Ray for, labelled by role. Pure: starts nothing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, cast

from ray._private.ray_constants import MIN_RESOURCE_GRANULARITY
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.tune.execution.placement_groups import PlacementGroupFactory

from runner.errors import ConfigError

if TYPE_CHECKING:
    from ray.rllib.algorithms.algorithm import Algorithm

UNITS = round(1 / MIN_RESOURCE_GRANULARITY)  # Ray's fixed-point units per CPU or GPU


@dataclass(frozen=True)
class Group:
    """`count` identical bundles of one role."""

    role: str
    count: int
    cpus_each: float
    gpus_each: float
    note: str = ""


@dataclass
class Plan:
    groups: list[Group]
    strategy: str
    # The first fix the preflight names for a CPU shortfall, where a task knows a better
    # one than the scaling keys (a search: fewer concurrent trials).
    fix: str = ""
    # The runs whose actors the plan holds (a search's concurrent trials, a bench's copies).
    runs: int = 1

    def _sum(self, key: str, roles: str = "all") -> float:
        """`key` summed over the groups (`roles`: all, actors, main) in Ray's own
        fixed-point units (1/10,000 of a CPU or GPU), as Ray counts them: in floats,
        30 EnvRunners x 0.1 GPU come to more than 3."""
        units = sum(
            g.count * round(getattr(g, key) * UNITS)
            for g in self.groups
            if roles == "all" or (g.role == "main") == (roles == "main")
        )
        return units / UNITS

    @property
    def total_cpus(self) -> float:
        return self._sum("cpus_each")

    @property
    def total_gpus(self) -> float:
        return self._sum("gpus_each")

    @property
    def actor_cpus(self) -> float:
        """What Ray itself must schedule: the main process is the driver, not an actor."""
        return self._sum("cpus_each", "actors")

    @property
    def actor_gpus(self) -> float:
        return self._sum("gpus_each", "actors")

    @property
    def main_gpus(self) -> float:
        """The driver's own share (a local Learner's GPU): Ray never schedules the driver,
        so these must be GPUs of the machine it runs on."""
        return self._sum("gpus_each", "main")

    def copies(self, n: int, why: str) -> Plan:
        """The actors of `n` such runs driven by one main process (e.g. eager + compiled)."""
        groups = [
            replace(g, note=f"{g.note} ({why})")
            if g.role == "main"
            else replace(g, count=g.count * n, note=why)
            for g in self.groups
        ]
        return Plan(groups=groups, strategy=self.strategy, runs=n)

    def trials(self, n: int, why: str) -> Plan:
        """`n` runs at once, each with its main process as an actor (Ray Tune trials),
        driven by a main process that reserves nothing."""
        groups = [Group("main", 1, 0.0, 0.0, "the driver (Ray Tune)")] + [
            replace(g, role="trial", count=n, note=f"{g.note} ({why})")
            if g.role == "main"
            else replace(g, count=g.count * n, note=why)
            for g in self.groups
        ]
        fix = f"lower task.max_concurrent ({why})"
        return Plan(groups=groups, strategy=self.strategy, fix=fix, runs=n)

    def count(self, role: str) -> int:
        return sum(g.count for g in self.groups if g.role == role)

    def to_dict(self) -> dict:
        return {
            "groups": [asdict(g) for g in self.groups],
            "strategy": self.strategy,
            "total": {"cpus": self.total_cpus, "gpus": self.total_gpus},
            "actors": {"cpus": self.actor_cpus, "gpus": self.actor_gpus},
        }


def _main_note(config: AlgorithmConfig) -> str:
    hosts = ["the driver"]
    if config.num_env_runners == 0:
        hosts.append(f"the local EnvRunner ({config.num_envs_per_env_runner} envs)")
    if config.num_learners == 0:
        hosts.append("the local Learner")
    return ", ".join(hosts)


def make_plan(config: AlgorithmConfig, notes: dict[str, str] | None = None) -> Plan:
    """Label RLlib's bundles: [main, EnvRunners..., evaluation..., Learners or aggregators...];
    `notes`: a role's hosts column, where the runner chose its resources. A remote
    Learner's bundle holds its aggregator actors too (1 CPU each): they get a row of
    their own, so the plan names every actor RLlib starts."""
    # RLlib types algo_class as a plain type; default_config_for sets an Algorithm's.
    algo_class = cast("type[Algorithm]", config.algo_class)
    try:  # RLlib validates the whole config here: its errors are bad input.
        request = algo_class.default_resource_request(config)
    except ValueError as ex:
        message = " ".join(str(ex).split()).split(" To suppress all validation errors")[0]
        raise ConfigError(f"RLlib rejected the config: {message}") from ex
    # The new API stack's algorithms ask for bundles (the old one's Resources are gone).
    assert isinstance(request, PlacementGroupFactory), type(request)
    bundles = [(b.get("CPU", 0.0), b.get("GPU", 0.0)) for b in request.bundles]
    n_env = config.num_env_runners
    aggregators = config.num_aggregator_actors_per_learner
    if config.num_learners > 0:
        n_learn, learn_role = config.num_learners, "learner"
    else:
        n_learn, learn_role = aggregators, AGGREGATOR
    roles = (
        ["main"]
        + ["env_runner"] * n_env
        + ["evaluation"] * (len(bundles) - 1 - n_env - n_learn)
        + [learn_role] * n_learn
    )
    groups: list[Group] = []
    processes = async_env_processes(config)
    for role, (cpus, gpus) in zip(roles, bundles, strict=True):
        if role == "learner":
            cpus -= aggregators  # in the Learner's bundle: their own row below
        last = groups[-1] if groups else None
        if last and (last.role, last.cpus_each, last.gpus_each) == (role, cpus, gpus):
            groups[-1] = Group(role, last.count + 1, cpus, gpus, last.note)
        else:
            note = _main_note(config) if role == "main" else (notes or {}).get(role, "")
            note = note or (AGGREGATOR_NOTE if role == AGGREGATOR else "")
            groups.append(Group(role, 1, float(cpus), float(gpus), note))
    if config.num_learners > 0 and aggregators:
        count = config.num_learners * aggregators
        note = f"{AGGREGATOR_NOTE}, each placed with its Learner"
        groups.append(Group(AGGREGATOR, count, 1.0, 0.0, note))
    if processes:
        note = "one process per env (gym_env_vectorize_mode=async); Ray does not count them"
        groups.append(Group(ASYNC_ENVS, processes, 0.0, 0.0, note))
    return Plan(groups=groups, strategy=request.strategy)


# RLlib's aggregator actors (IMPALA's and APPO's), 1 CPU each, that batch the EnvRunners'
# episodes for a Learner.
AGGREGATOR = "aggregator"
AGGREGATOR_NOTE = "batch episodes for a Learner (algo.learners.num_aggregator_actors_per_learner)"


# The plan's row for async vector envs: processes beside the actors, which Ray never sees.
ASYNC_ENVS = "async_env"


def async_env_processes(config: AlgorithmConfig) -> int:
    """Env processes of gymnasium's async vectorization: one per env in each EnvRunner."""
    mode = getattr(config.gym_env_vectorize_mode, "value", config.gym_env_vectorize_mode)
    if str(mode).lower() != "async":
        return 0
    return config.num_envs_per_env_runner * max(1, config.num_env_runners)
