"""scaling=auto: the sampling layout that gives this env, module and machine the most env
steps per second, measured, as PufferLib's `vector.autotune` picks a vectorization.

A layout is EnvRunners x envs per EnvRunner x gymnasium's sync or async vectorization.
Each one that fits the CPU plan (the preflight's own CPU check on the machine the run
plans on) samples the real env with the real RLModule for `scaling.auto.seconds`, after
one warm-up round, through RLlib's EnvRunnerGroup and `synchronous_parallel_sample`, the
call an on-policy `training_step` makes, each round asking for one train batch. Per
vectorization mode and EnvRunner count, the envs per EnvRunner rise until the rate stops
rising (a hill climb), so a grid of dozens costs a handful of measurements.

The layout the config names (scaling=default's unless overridden) is always measured; a
candidate replaces it only if it beats it by `scaling.auto.margin`, so the choice is
never slower than the default as measured. Measurements are cached, keyed by what
decides them: env and env config, algorithm settings, module, CPU model, the CPUs the
plan counts, versions, the candidates and the timing; a second run decides without
sampling anything.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, cast

from runner.errors import ConfigError
from runner.machine import Resources, cpu_model
from runner.machine.budget import Budget
from runner.machine.measure_cache import cache_dir, cache_file, measured_or_cached
from runner.settings.schema import RunnerConfig

if TYPE_CHECKING:
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
    from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    from runner.machine.plan import Plan

MODES = ("sync", "async")
# The job's own planning (runner.job.app.prepare): settings and machine -> config and plan.
Planner = Callable[[RunnerConfig, Resources], "tuple[AlgorithmConfig, Plan]"]


@dataclass(frozen=True)
class Layout:
    num_env_runners: int
    num_envs_per_env_runner: int
    gym_env_vectorize_mode: str

    def __str__(self) -> str:
        runners = f"{self.num_env_runners} EnvRunner(s)" if self.num_env_runners else "local"
        envs, mode = self.num_envs_per_env_runner, self.gym_env_vectorize_mode
        return f"{runners} x {envs} envs ({mode})"


def check(settings: RunnerConfig) -> None:
    """scaling=auto's own settings, before anything is built or measured."""
    auto = settings.scaling.auto
    if settings.task.name != "train":
        raise ConfigError(
            f"scaling=auto picks the layout of one training run, not task={settings.task.name}'s: "
            "run `python -m runner scaling=auto dry_run=true` with the same settings and set "
            "the layout it prints (scaling.num_env_runners=... scaling.num_envs_per_env_runner=...)"
        )
    bad_modes = sorted(set(auto.vectorize_modes) - set(MODES))
    if bad_modes or not auto.vectorize_modes:
        raise ConfigError(
            f"scaling.auto.vectorize_modes must name some of {', '.join(MODES)}, got "
            f"{auto.vectorize_modes}"
        )
    counts = [*auto.env_runners, *auto.envs_per_env_runner]
    if not auto.env_runners or not auto.envs_per_env_runner or min(counts) < 0:
        raise ConfigError(
            "scaling.auto.env_runners and scaling.auto.envs_per_env_runner must be non-empty "
            f"lists of counts >= 0, got {auto.env_runners} and {auto.envs_per_env_runner}"
        )
    if not _runner_counts(settings):
        raise ConfigError(
            f"scaling.num_gpus_per_env_runner={settings.scaling.num_gpus_per_env_runner:g} "
            f"needs EnvRunner actors, and scaling.auto.env_runners={auto.env_runners} has "
            "no count above 0: add some (scaling.auto.env_runners=[1,2,4])"
        )
    if min(auto.envs_per_env_runner) < 1:
        raise ConfigError(
            f"scaling.auto.envs_per_env_runner counts start at 1, got {auto.envs_per_env_runner}"
        )
    if auto.seconds <= 0 or auto.margin < 0 or auto.budget_seconds <= 0:
        raise ConfigError(
            f"scaling.auto.seconds and budget_seconds must be > 0 and margin >= 0, got "
            f"{auto.seconds}, {auto.budget_seconds:g} and {auto.margin}"
        )


def baseline(settings: RunnerConfig) -> Layout:
    s = settings.scaling
    return Layout(s.num_env_runners, s.num_envs_per_env_runner, s.gym_env_vectorize_mode)


def with_layout(settings: RunnerConfig, layout: Layout) -> RunnerConfig:
    """The settings with `layout` as its scaling, and scaling=auto done."""
    auto = replace(settings.scaling.auto, enabled=False)
    return replace(settings, scaling=replace(settings.scaling, **asdict(layout), auto=auto))


def fits(plan: Plan, resources: Resources) -> bool:
    """Whether the preflight's CPU check passes this plan on `resources`."""
    from runner.machine.preflight import cpu_shortfall

    problems, _ = cpu_shortfall(plan, resources)
    return not problems


def measure(config: AlgorithmConfig, seconds: float) -> dict[str, Any]:
    """Env steps per second of this config's EnvRunners, sampling one train batch per round
    as an on-policy training_step does; the build and the warm-up round are timed apart."""
    from ray.rllib.env.env_runner_group import EnvRunnerGroup
    from ray.rllib.execution.rollout_ops import synchronous_parallel_sample

    start = time.perf_counter()
    group = EnvRunnerGroup(config=config, local_env_runner=config.num_env_runners == 0)
    try:
        build_seconds = time.perf_counter() - start
        batch = max(1, config.total_train_batch_size)

        def one_round() -> int:
            episodes = synchronous_parallel_sample(
                worker_set=group,
                max_env_steps=batch,
                concat=False,
                sample_timeout_s=config.sample_timeout_s,
                _uses_new_env_runners=True,
            )
            # concat=False on the new API stack: each EnvRunner's list of episodes
            # (a multi-agent episode counts env steps as a single-agent one does).
            per_runner = cast("list[list[SingleAgentEpisode | MultiAgentEpisode]]", episodes)
            return sum(e.env_steps() for sampled in per_runner for e in sampled)

        one_round()
        steps, rounds, timed = 0, 0, time.perf_counter()
        while rounds < 2 or time.perf_counter() - timed < seconds:
            steps += one_round()
            rounds += 1
        elapsed = time.perf_counter() - timed
    finally:
        group.stop()
    return {
        "env_steps_per_s": steps / elapsed,
        "env_steps": steps,
        "rounds": rounds,
        "seconds": elapsed,
        "build_seconds": build_seconds,
    }


def _runner_counts(settings: RunnerConfig) -> list[int]:
    """The EnvRunner counts to try: no local sampling (0) where EnvRunners get GPUs, which
    the driver's local EnvRunner does not (validate refuses that layout)."""
    counts = sorted(set(settings.scaling.auto.env_runners))
    return [n for n in counts if n > 0] if settings.scaling.num_gpus_per_env_runner > 0 else counts


def candidates(settings: RunnerConfig, cpus: float = 0) -> list[list[Layout]]:
    """Hill-climb series: per mode and EnvRunner count, envs per EnvRunner rising (async
    from 2 envs: one env in a subprocess is sync plus a hop). The likeliest first, so a
    budget spent leaves out the least likely: sync before async, and EnvRunner counts
    nearest one per core beside the driver's (Sample Factory's starting layout) first."""
    auto = settings.scaling.auto
    series = []
    for mode in auto.vectorize_modes:
        for runners in _runner_counts(settings):
            envs = [n for n in sorted(set(auto.envs_per_env_runner)) if mode == "sync" or n > 1]
            series.append([Layout(runners, n, mode) for n in envs])
    per_core = max(0.0, cpus - 1)
    return sorted(
        series,
        key=lambda s: (
            (s[0].gym_env_vectorize_mode != "sync", abs(s[0].num_env_runners - per_core))
            if s
            else (True, 0.0)
        ),
    )


def cache_key(settings: RunnerConfig, config: AlgorithmConfig, resources: Resources) -> dict:
    """What decides the figures: env, algorithm, module, machine, versions, candidates."""
    from ray import __version__ as ray_version
    from torch import __version__ as torch_version

    auto = settings.scaling.auto
    return {
        "env": asdict(settings.env),
        "algo": settings.algo.name,
        "train_batch": config.total_train_batch_size,
        "rollout_fragment_length": config.rollout_fragment_length,
        "module": repr(config.rl_module_spec),
        "cpu_model": cpu_model(),
        "cpus": resources.cpus,
        "where": resources.where,
        "cpus_per_env_runner": settings.scaling.num_cpus_per_env_runner,
        "versions": {"ray": ray_version, "torch": torch_version},
        "candidates": {
            "env_runners": sorted(set(auto.env_runners)),
            "envs_per_env_runner": sorted(set(auto.envs_per_env_runner)),
            "vectorize_modes": list(auto.vectorize_modes),
        },
        "seconds": auto.seconds,
        "baseline": asdict(baseline(settings)),
    }


# Measurements that follow the last candidate: the fastest and the configured layout again.
FINAL_MEASUREMENTS = 2
BUDGET_SPENT = "left out: scaling.auto.budget_seconds spent"
NO_FIT = "does not fit the CPU plan"


class _BudgetSpent(Exception):
    """No candidate may start: it and the final measurements would pass the budget."""


def _climb_start(series: list[Layout], envs: int) -> int:
    """The index a series' climb starts at: the envs per EnvRunner nearest `envs` (the
    configured layout's), the likeliest count."""
    return min(range(len(series)), key=lambda i: abs(series[i].num_envs_per_env_runner - envs))


def _climb(series: list[Layout], envs: int, rate: Callable[[Layout], float | None]) -> None:
    """Measure a series from the envs per EnvRunner nearest `envs`: up while the rate
    rises; down only if up did not (`rate`: None where a layout does not fit)."""
    first = _climb_start(series, envs)
    top = rate(series[first])
    for step in (1, -1):
        i, last = first + step, top
        while 0 <= i < len(series) and last is not None:
            now = rate(series[i])
            if now is None or now < last:
                break
            last, i = now, i + step
        if i != first + step:
            break


class _Measurements:
    """One scaling=auto measurement's state: the rows so far, each layout planned once,
    the layouts measured, and the budget they keep to (set once the layouts that fit are
    counted)."""

    budget: Budget

    def __init__(self, settings: RunnerConfig, resources: Resources, plan: Planner) -> None:
        self.settings, self.resources, self.plan = settings, resources, plan
        self.rows: list[dict[str, Any]] = []
        self.plans: dict[Layout, tuple[AlgorithmConfig, Plan]] = {}
        self.done: set[Layout] = set()

    def planned(self, layout: Layout) -> tuple[AlgorithmConfig, Plan]:
        if layout not in self.plans:
            self.plans[layout] = self.plan(with_layout(self.settings, layout), self.resources)
        return self.plans[layout]

    def fits(self, layout: Layout) -> bool:
        """Whether it fits the CPU plan; a row saying so where it does not."""
        fit = fits(self.planned(layout)[1], self.resources)
        self.rows += [] if fit else [{**asdict(layout), "status": NO_FIT}]
        return fit

    def measured(self, layout: Layout) -> float:
        """Sample with `layout` once more; its env steps/s."""
        self.budget.begin()
        self.done.add(layout)
        config = self.planned(layout)[0].copy(copy_frozen=False)
        config.evaluation(evaluation_interval=None)  # no evaluation EnvRunners here
        figures = measure(config, self.settings.scaling.auto.seconds)
        self.rows.append({**asdict(layout), "status": "measured", **figures})
        self.budget.measured(f"{layout}: {figures['env_steps_per_s']:,.0f} env steps/s")
        return figures["env_steps_per_s"]

    def rate(self, layout: Layout) -> float | None:
        """A candidate's rate, measured once; None where it does not fit."""
        if layout in self.done:
            return best_rates(self.rows)[layout]
        if not self.budget.affordable():
            raise _BudgetSpent
        return self.measured(layout) if self.fits(layout) else None


def measure_all(
    settings: RunnerConfig, resources: Resources, plan: Planner
) -> list[dict[str, Any]]:
    """One row per measurement, or per layout left out and why. One measurement decides
    nothing alone (Ray's own start-up, or anything else on the machine, can slow one):
    the fastest layout and the configured one are measured again at the end, in turn.

    The likeliest first, within scaling.auto.budget_seconds (runner/machine/budget.py: a line per
    measurement and a progress bar): the series (`candidates`) whose first layout fits
    the CPU plan, each climbed from the configured envs per EnvRunner, up while the rate
    rises, else down; a candidate starts only where it and the last two measurements
    would end within the budget."""
    state, base = _Measurements(settings, resources, plan), baseline(settings)
    fitting = [s for s in candidates(settings, resources.cpus) if s and state.fits(s[0])]
    layouts = {x for s in fitting for x in s} | {base}
    state.budget = Budget(
        "scaling=auto",
        settings.scaling.auto.budget_seconds,
        len(layouts) + FINAL_MEASUREMENTS,
        reserve=FINAL_MEASUREMENTS,
    )
    with state.budget.shown("measurements"):
        state.measured(base)
        try:
            for series in fitting:
                _climb(series, base.num_envs_per_env_runner, state.rate)
        except _BudgetSpent:
            left = dict.fromkeys(x for s in fitting for x in s if x not in state.done)
            state.rows += [{**asdict(x), "status": BUDGET_SPENT} for x in left]
        rates = best_rates(state.rows)
        fastest = max(rates, key=lambda layout: rates[layout])
        if fastest != base:
            state.measured(fastest)
            state.measured(base)
    return state.rows


def best_rates(rows: list[dict[str, Any]]) -> dict[Layout, float]:
    """Each measured layout's best env steps/s over its measurements."""
    rates: dict[Layout, float] = {}
    for row in rows:
        if row["status"] == "measured":
            layout = _layout(row)
            rates[layout] = max(rates.get(layout, 0.0), row["env_steps_per_s"])
    return rates


def decide(rows: list[dict[str, Any]], base: Layout, margin: float) -> dict[str, Any]:
    """The fastest layout, by its best measurement, if it beats the configured one's best
    by `margin`; else the configured one."""
    rates = best_rates(rows)
    best = max(rates, key=lambda layout: rates[layout])
    ratio = rates[best] / rates[base]
    if best != base and ratio > 1 + margin:
        chosen, why = best, f"{ratio:.2f}x the configured layout's env steps/s"
    else:
        chosen, ratio = base, 1.0
        why = f"no layout beat the configured one by scaling.auto.margin={margin:g}"
    return {
        "chosen": asdict(chosen),
        "why": why,
        "speedup": ratio,
        "baseline": asdict(base),
        "baseline_env_steps_per_s": rates[base],
    }


def _layout(row: dict[str, Any]) -> Layout:
    return Layout(
        row["num_env_runners"], row["num_envs_per_env_runner"], row["gym_env_vectorize_mode"]
    )


def choose(
    settings: RunnerConfig, resources: Resources, plan: Planner
) -> tuple[RunnerConfig, dict[str, Any]]:
    """The settings with the chosen layout, and the record's scaling_auto section: the
    figures from the cache (unless scaling.auto.refresh) or measured now on the run's Ray."""
    from runner.machine.ray_session import start_ray

    auto = settings.scaling.auto
    configured = plan(with_layout(settings, baseline(settings)), resources)[0]
    key = cache_key(settings, configured, resources)
    path = cache_file(cache_dir(auto.cache_dir, "scaling-auto"), "layouts", key)
    start = time.perf_counter()

    def measured() -> list[dict[str, Any]]:
        start_ray(settings.ray, settings.compile.cache_dir)
        return measure_all(settings, resources, plan)

    rows, source = measured_or_cached(path, key, auto.refresh, measured, "scaling.auto.cache_dir")
    section = {
        **decide(rows, baseline(settings), auto.margin),
        "source": source,
        "seconds": time.perf_counter() - start,
        "cache_file": str(path),
        "rows": rows,
    }
    return with_layout(settings, _layout(section["chosen"])), section


def describe(section: dict[str, Any]) -> str:
    chosen = _layout(section["chosen"])
    where = "cached figures" if section["source"] == "cache" else "measured now"
    return (
        f"scaling=auto chose {chosen}: {section['why']} ({where}, "
        f"{section['seconds']:.1f} s; figures in {section['cache_file']})"
    )
