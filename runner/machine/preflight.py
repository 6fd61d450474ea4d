"""Check the plan against what exists, before any Ray actor starts.

Ray waits forever for a GPU that does not exist, so a shortfall must fail here, in
seconds, with one line naming the numbers and the fix.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import gymnasium as gym
import torch
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.env.multi_agent_env import MultiAgentEnv

from runner.compile.settings import CompileSpec, missing_packages
from runner.envs import agent_ids, make_env, setting
from runner.errors import ConfigError, did_you_mean
from runner.job.check import Check
from runner.machine import Resources, capability_tuple, has_kernels, is_gpu_of
from runner.machine.plan import AGGREGATOR, ASYNC_ENVS, Plan
from runner.machine.short_stack import on_short_stack
from runner.settings.schema import Accelerator, RunnerConfig

# Async env processes per CPU past which stepping them is slower than sync vectorization.
ASYNC_ENVS_PER_CPU = 2

FORCE_HINT = "or set preflight.strict=false to try anyway"
# Action spaces an algorithm takes where RLlib's takes only some: for the others RLlib's
# own error misleads (DQN on a Box ends in a deprecation notice about RLModuleConfig).
ACTION_SPACES: dict[str, tuple[type[gym.Space], ...]] = {
    "DQN": (gym.spaces.Discrete,),
    "SAC": (gym.spaces.Box, gym.spaces.Discrete),
}


@dataclass
class Report:
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict:
        return {"ok": self.ok, **asdict(self)}


def cpu_build() -> str:
    cpu_only = torch.version.cuda is None and torch.version.hip is None
    return f" (torch {torch.__version__} is a CPU build)" if cpu_only else ""


def _breakdown(plan: Plan, key: str, unit: str, actors_only: bool = False) -> str:
    parts = [
        f"{g.count} {g.role} x {getattr(g, key):g}"
        for g in plan.groups
        if getattr(g, key) > 0 and not (actors_only and g.role == "main")
    ]
    return f"{' + '.join(parts)} {unit}" if parts else f"no {unit}"


def _hardware_problems(settings: RunnerConfig, plan: Plan, res: Resources) -> list[str]:
    hw = settings.hardware
    problems = []
    if hw.accelerator == Accelerator.cuda and res.gpus == 0:
        gpu = f"an NVIDIA {hw.gpu_name} GPU" if hw.gpu_name else "an NVIDIA GPU"
        problems.append(
            f"hardware={hw.name} expects {gpu} but {res.where} has no GPU"
            f"{cpu_build() if res.local else ''}; use hardware=cpu, connect to a GPU cluster "
            f"with ray.address=..., {FORCE_HINT}"
        )
    elif hw.accelerator == Accelerator.cuda and hw.gpu_name and res.gpu_names:
        # The driver's own GPU serves the main process's share (a local Learner).
        names = sorted(set(res.gpu_names) | set(res.driver_gpus if plan.main_gpus else []))
        others = [name for name in names if not is_gpu_of(name, hw.gpu_name)]
        if others:
            fix = (
                f"Ray may place a GPU actor on any of them: make only the {hw.gpu_name}s "
                "visible (CUDA_VISIBLE_DEVICES=...)"
                if len(others) < len(names)
                else "pick the matching hardware profile"
            )
            problems.append(
                f"hardware={hw.name} expects an NVIDIA {hw.gpu_name} GPU but {res.where} has "
                f"{', '.join(names)}; {fix}, {FORCE_HINT}"
            )
    if hw.accelerator == Accelerator.cpu and plan.total_gpus > 0:
        problems.append(
            f"hardware=cpu but the plan asks for {plan.total_gpus:g} GPU(s) "
            f"({_breakdown(plan, 'gpus_each', 'GPU')}); set scaling.num_gpus_per_learner=0 "
            "and scaling.num_gpus_per_env_runner=0, or pick a GPU hardware profile"
        )
    return problems


def _driver_gpu_problems(settings: RunnerConfig, plan: Plan, res: Resources) -> list[str]:
    """The main process's GPU share (a local Learner, the benchmarked module) is used by
    this process, which Ray never schedules: a GPU of the cluster cannot serve it."""
    if plan.main_gpus == 0 or res.driver_gpus:
        return []
    (main,) = [g for g in plan.groups if g.role == "main"]
    fix = "run this command on a machine with a GPU"
    if not res.local and settings.scaling.num_learners == 0 and "Learner" in main.note:
        fix += " or give the Learner an actor of its own with scaling.num_learners=1"
    return [
        f"the main process ({main.note}) needs {plan.main_gpus:g} GPU, but this process sees "
        f"no GPU through torch.cuda{cpu_build()}"
        + ("" if res.local else "; Ray never schedules the driver: no cluster GPU serves it")
        + f"; {fix}, {FORCE_HINT}"
    ]


def _gpu_shortfall(plan: Plan, res: Resources) -> list[str]:
    """The main process's GPUs count too: the driver's GPU is one of the machine's (or of
    the cluster's, on a node of its own), which Ray may also hand to an actor."""
    if plan.total_gpus <= res.gpus:
        return []
    return [
        f"the plan needs {plan.total_gpus:g} GPU(s) ({_breakdown(plan, 'gpus_each', 'GPU')}) "
        f"but {res.where} has {res.gpus:g}; lower scaling.num_learners or "
        f"scaling.num_gpus_per_learner, or connect to a cluster with ray.address=..., "
        f"{FORCE_HINT}"
    ]


def _kernel_problems(settings: RunnerConfig, res: Resources) -> list[str]:
    """A GPU this torch build has no kernels for fails at its first kernel ("no kernel
    image is available"): the driver's GPUs against torch.cuda.get_arch_list()."""
    cuda = settings.hardware.accelerator == Accelerator.cuda
    if not cuda or not res.torch_cuda_archs or torch.version.hip is not None:  # ROCm: gfx*
        return []
    for name, capability in zip(res.driver_gpus, res.driver_capabilities, strict=True):
        if has_kernels(capability, res.torch_cuda_archs):
            continue
        sm = "sm_" + capability.replace(".", "")
        build = (
            "e.g. PyTorch's CUDA 12.6 wheels, which alone kept Maxwell, Pascal and Volta in "
            "release 2.11's support matrix: pip install torch --index-url "
            "https://download.pytorch.org/whl/cu126"
            if capability_tuple(capability) < (7, 5)
            else "see https://pytorch.org/get-started/locally/"
        )
        return [
            f"{name} has compute capability {capability} ({sm}), but torch "
            f"{torch.__version__} has kernels for {' '.join(res.torch_cuda_archs)} only; "
            f"install a torch build with {sm} kernels ({build}), {FORCE_HINT}"
        ]
    return []


def _shared_gpu_learners(config: AlgorithmConfig) -> list[str]:
    """GPU Learners form one NCCL group, which refuses two ranks on one GPU."""
    count, gpus = config.num_learners, config.num_gpus_per_learner
    if count < 2 or not 0 < gpus < 1:
        return []
    return [
        f"scaling.num_learners={count} with scaling.num_gpus_per_learner={gpus:g}: Ray packs "
        "these Learners onto shared GPUs, and RLlib's GPU Learners form one NCCL group that "
        "aborts with 'Duplicate GPU detected' when two share a GPU (Ray issue #48012; RLlib's "
        "examples/gpus/fractional_gpus_per_learner.py expects that error); use one Learner "
        "per GPU (scaling.num_gpus_per_learner=1), or scaling.num_learners=0 with a "
        f"fractional local Learner, {FORCE_HINT}"
    ]


# The setting that counts each role's actors, per copy of the run (a search's trials,
# the exploration bench's two runs), and what it is.
_COUNTED_BY = {
    "env_runner": ("scaling.num_env_runners", "0: sampling in the main process"),
    "evaluation": ("eval.num_env_runners", "0: evaluating in the main process"),
    "learner": ("scaling.num_learners", "0: a local Learner in the main process"),
    AGGREGATOR: ("algo.learners.num_aggregator_actors_per_learner", "0: none"),
}


def _cpu_fixes(plan: Plan, excess: float) -> list[str]:
    """The settings that free `excess` CPUs of the plan's actors, computed from the plan,
    so no knob that cannot help is named (a run with no EnvRunner gets no advice to lower
    their count): each that does it alone, at the value that does; else the fewest of
    them together, as one fix."""
    learners = max(1, plan.count("learner") // plan.runs)  # a local one hosts them too
    knobs = []  # (key, actors it counts per step, CPUs each, the setting's value now)
    for g in plan.groups:
        if g.role in _COUNTED_BY and g.cpus_each > 0:
            # The actors one step of the setting adds: one per run of the plan (and Learner).
            step = plan.runs * (learners if g.role == AGGREGATOR else 1)
            knobs.append((g.role, step, g.cpus_each, g.count // step))

    def setting(role: str, value: int) -> str:
        key, zero = _COUNTED_BY[role]
        return f"{key}={value}" + (f" ({zero})" if value == 0 else "")

    alone = [
        setting(role, now - math.ceil(excess / (cpus * step)))
        for role, step, cpus, now in knobs
        if now - math.ceil(excess / (cpus * step)) >= 0
    ]
    if alone or not knobs:
        return alone
    together, left = [], excess
    for role, step, cpus, now in sorted(knobs, key=lambda k: -k[1] * k[2] * k[3]):
        drop = min(now, math.ceil(left / (cpus * step)))
        together.append(setting(role, now - drop))
        left -= drop * cpus * step
        if left <= 0:
            return [" with ".join(together)]
    return []


def cpu_shortfall(plan: Plan, res: Resources) -> tuple[list[str], list[str]]:
    """Actors beyond Ray's CPUs hang, so that fails; the driver sharing a core only warns.
    Async env processes, which Ray does not count, fail past two per CPU (each would step
    on under half a core: slower than sync vectorization) and warn past the CPUs."""
    processes = plan.count(ASYNC_ENVS)
    if processes > ASYNC_ENVS_PER_CPU * res.cpus:
        return [
            f"gym_env_vectorize_mode=async runs {processes} env processes (one per env in each "
            f"EnvRunner) beside {plan.total_cpus:g} CPUs of actors and driver, on "
            f"{res.where}'s {res.cpus:g} CPUs; use scaling.gym_env_vectorize_mode=sync, or "
            f"fewer scaling.num_envs_per_env_runner or scaling.num_env_runners, {FORCE_HINT}"
        ], []
    if plan.actor_cpus > res.cpus:
        fixes = _cpu_fixes(plan, plan.actor_cpus - res.cpus)
        return [
            f"the plan's actors need {plan.actor_cpus:g} CPU(s) "
            f"({_breakdown(plan, 'cpus_each', 'CPU', actors_only=True)}) but {res.where} has "
            f"{res.cpus:g}; "
            + (f"{plan.fix}, " if plan.fix else "")
            + (f"set {' or '.join(fixes)}, " if fixes else "")
            + (
                f"share the cores with ray.num_cpus={plan.total_cpus:g} (as RLlib's CI runs its "
                "tuned examples), "
                if res.local
                else ""
            )
            + f"or connect to a cluster with ray.address=..., {FORCE_HINT}"
        ], []
    if plan.total_cpus > res.cpus:
        return [], [
            f"the main process and the actors want {plan.total_cpus:g} CPUs and {res.where} "
            f"has {res.cpus:g}: the main process will share a core with the actors"
        ]
    if plan.total_cpus + processes > res.cpus:
        return [], [
            f"{processes} async env processes beside {plan.total_cpus:g} CPUs of actors and "
            f"driver on {res.cpus:g} CPUs: they will share cores"
        ]
    return [], []


def check_env(settings: RunnerConfig, config: AlgorithmConfig) -> None:
    """Build one env here, as an EnvRunner will; for a multi-agent env, map each of its
    agents to a policy the config declares."""
    env = make_env(config)
    try:
        multi_agent_env = isinstance(env, MultiAgentEnv)
        if multi_agent_env != config.is_multi_agent:
            raise ConfigError(
                f"{setting(settings.env)} is a MultiAgentEnv: declare algo.multi_agent.policies "
                "and algo.multi_agent.policy_mapping_fn"
                if multi_agent_env
                else f"algo.multi_agent declares policies but {setting(settings.env)} is a "
                "single-agent env; name a MultiAgentEnv, or drop algo.multi_agent"
            )
        if isinstance(env, MultiAgentEnv):
            _check_mapping(env, config)
        _check_action_space(settings, env)
        if isinstance(env, MultiAgentEnv):
            _build_module(env, config)
        else:
            _forward_pass(settings, config, env)
    finally:
        env.close()


def _check_action_space(settings: RunnerConfig, env: Any) -> None:
    """The env's action space (each agent's) is one the algorithm takes."""
    takes = ACTION_SPACES.get(settings.algo.name)
    if takes is None:
        return
    spaces = getattr(env, "action_spaces", None)
    if not spaces and isinstance(env, MultiAgentEnv):  # RLlib's PettingZoo wrappers: a Dict
        spaces = dict(getattr(env.action_space, "spaces", {}))
    spaces = spaces or {"": env.action_space}
    for agent, space in spaces.items():
        if not isinstance(space, takes):
            kinds = " or ".join(kind.__name__ for kind in takes)
            whose = f"agent {agent!r} of " if agent else ""
            raise ConfigError(
                f"{settings.algo.name} takes a {kinds} action space, and {whose}"
                f"{setting(settings.env)} has {space}: pick an algo that takes it (algo=ppo "
                "takes any), or another env"
            )


def _build_module(
    env: Any, config: AlgorithmConfig, spaces: dict | None = None, inference_only: bool = False
) -> Any:
    """The RLModule (a MultiRLModule for a multi-agent env), built once for this env, so a
    custom module's constructor error is one line before any actor starts."""
    from runner.algorithms.algorithm_config import build_module

    try:
        return build_module(config, env, inference_only, spaces)
    except Exception as ex:
        problem = f"{type(ex).__name__}: {ex}"
        raise ConfigError(f"algo.rl_module: building the RLModule failed: {problem}") from ex


def _forward_pass(settings: RunnerConfig, config: AlgorithmConfig, env: Any) -> None:
    """A single-agent env's first observation through what an EnvRunner builds: its
    env-to-module connectors (RLlib's and the user's), then its RLModule's exploration
    forward pass. A dtype, shape or space the module does not take is one line here,
    before any actor starts, instead of an error in every EnvRunner minutes later."""
    import gymnasium as gym
    import torch
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.env import INPUT_ENV_SINGLE_SPACES, INPUT_ENV_SPACES
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    vector = gym.vector.SyncVectorEnv([lambda: env])  # what an EnvRunner steps: a vector env
    spaces: dict[str, Any] = {
        INPUT_ENV_SPACES: (vector.observation_space, vector.action_space),
        INPUT_ENV_SINGLE_SPACES: (env.observation_space, env.action_space),
    }
    try:
        connectors = on_short_stack(config.build_env_to_module_connector, env=vector, spaces=spaces)
        spaces[DEFAULT_MODULE_ID] = (connectors.observation_space, env.action_space)
    except Exception as ex:
        raise ConfigError(
            f"algo.env_runners.env_to_module_connector: building the env-to-module "
            f"connectors failed: {type(ex).__name__}: {ex}"
        ) from ex
    module = _build_module(vector.unwrapped, config, spaces, inference_only=True)
    obs, infos = env.reset(seed=settings.seed)
    episode = SingleAgentEpisode(
        observation_space=env.observation_space, action_space=env.action_space
    )
    episode.add_env_reset(observation=obs, infos=infos)
    try:
        batch = connectors(
            rl_module=module, batch={}, episodes=[episode], explore=True, shared_data={}
        )
        with torch.no_grad():
            module.forward_exploration(batch, t=0)  # t: the env steps so far (DQN's epsilon)
    except Exception as ex:
        problem = " ".join(f"{type(ex).__name__}: {ex}".split())[:400]
        raise ConfigError(
            f"preflight: {setting(settings.env)}'s first observation ({_described(obs)}, of "
            f"{env.observation_space}) through the env-to-module connectors into the RLModule "
            f"(built for {spaces[DEFAULT_MODULE_ID][0]}) failed: {problem}: fix the model "
            "(algo.rl_module.model_config, or your module) or the observations (env.wrappers)"
        ) from ex


def _described(obs: Any) -> str:
    """An observation's kind in a few words: an array's dtype and shape."""
    shape, dtype = getattr(obs, "shape", None), getattr(obs, "dtype", None)
    return f"{dtype} {tuple(shape)}" if shape is not None else type(obs).__name__


def _check_mapping(env: MultiAgentEnv, config: AlgorithmConfig) -> None:
    policies = sorted(config.policies)
    for agent in agent_ids(env):
        try:
            # RLlib types the attribute by its 3-argument default; its new API stack calls
            # it with (agent_id, episode).
            policy = config.policy_mapping_fn(agent, None)  # type: ignore[call-arg]
        except KeyError as ex:
            raise ConfigError(str(ex.args[0])) from ex
        except Exception:  # a function that needs a real episode: RLlib calls it with one
            continue
        if policy not in config.policies:
            raise ConfigError(
                f"algo.multi_agent.policy_mapping_fn maps agent {agent!r} to '{policy}', which "
                f"is not one of algo.multi_agent.policies ({', '.join(policies)})"
                f"{did_you_mean(str(policy), policies)}"
            )


def check(
    settings: RunnerConfig,
    config: AlgorithmConfig,
    plan: Plan,
    res: Resources,
    warnings: list[str],
    spec: CompileSpec | None,
) -> Report:
    """Raise ConfigError on bad input; report shortfalls and missing packages (problems)
    and `warnings` (the compile and task checks') with the resource warnings."""
    check_env(settings, config)
    report = Report(warnings=list(warnings))
    # A hardware problem already names missing GPUs: the GPU count is checked only without one.
    report.problems += (
        _hardware_problems(settings, plan, res)
        or _driver_gpu_problems(settings, plan, res)
        or _gpu_shortfall(plan, res)
    )
    report.problems += _kernel_problems(settings, res)
    report.problems += _shared_gpu_learners(config)
    cpu_problems, cpu_warnings = cpu_shortfall(plan, res)
    report.problems += cpu_problems
    report.warnings += cpu_warnings
    if (
        report.problems
        and (settings.reproduction or Check(settings.check).active)
        and settings.hardware.accelerator == Accelerator.cuda
    ):
        report.problems[-1] += (
            "; or add scale=local to run this experiment scaled down on one CPU machine"
        )
    if not settings.preflight.strict and report.problems:
        report.warnings += [f"preflight.strict=false, going on: {p}" for p in report.problems]
        report.problems = []
    # A missing package is no shortfall to try anyway: strict=false does not waive it.
    report.problems += missing_packages(spec)
    return report
