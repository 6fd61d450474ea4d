"""Check the plan against what exists, before any Ray actor starts.

Ray waits forever for a GPU that does not exist, so a shortfall must fail here, in
seconds, with one line naming the numbers and the fix.
"""

from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.env.multi_agent_env import MultiAgentEnv

from runner.compile.settings import CompileSpec, missing_packages
from runner.envs import make_env, setting
from runner.errors import ConfigError, did_you_mean
from runner.plan import Plan
from runner.schema import Accelerator, RayConfig, RunnerConfig

FORCE_HINT = "or set preflight.strict=false to try anyway"
# The scaling guide's learner-placement rule for these algorithms.
LEARNER_PLACEMENT_ALGOS = ("IMPALA", "APPO")


@dataclass
class Resources:
    """What the run can use: this machine, or a Ray cluster."""

    where: str
    cpus: float
    gpus: float
    gpu_names: list[str]
    cpu_model: str = ""
    local: bool = False  # a local Ray, whose CPU count ray.num_cpus sets


@dataclass
class Report:
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict:
        return {"ok": self.ok, **asdict(self)}


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def local_resources(ray_cfg: RayConfig) -> Resources:
    """This machine as a local Ray would see it (ray.num_cpus / ray.num_gpus override)."""
    cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    names = [torch.cuda.get_device_name(i) for i in range(cuda)]
    return Resources(
        where="this machine",
        cpus=float(ray_cfg.num_cpus if ray_cfg.num_cpus is not None else os.cpu_count() or 1),
        gpus=float(ray_cfg.num_gpus if ray_cfg.num_gpus is not None else cuda),
        gpu_names=names,
        cpu_model=cpu_model(),
        local=True,
    )


def cluster_resources(address: str) -> Resources:
    """The connected Ray cluster's totals; GPU names from Ray's accelerator_type resources."""
    import ray

    total = ray.cluster_resources()
    names = [k.split(":", 1)[1] for k in total if k.startswith("accelerator_type:")]
    return Resources(
        where=f"the Ray cluster at {address}",
        cpus=float(total.get("CPU", 0)),
        gpus=float(total.get("GPU", 0)),
        gpu_names=names,
        cpu_model=cpu_model(),
    )


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
            f"hardware={hw.name} expects {gpu} but {res.where} has no GPU; "
            f"use hardware=cpu, connect to a GPU cluster with ray.address=..., {FORCE_HINT}"
        )
    elif (
        hw.accelerator == Accelerator.cuda
        and hw.gpu_name
        and res.gpu_names
        and not any(hw.gpu_name.lower() in name.lower() for name in res.gpu_names)
    ):
        problems.append(
            f"hardware={hw.name} expects an {hw.gpu_name} GPU but {res.where} has "
            f"{', '.join(sorted(set(res.gpu_names)))}; pick the matching hardware profile, "
            f"{FORCE_HINT}"
        )
    if hw.accelerator == Accelerator.cpu and plan.total_gpus > 0:
        problems.append(
            f"hardware=cpu but the plan asks for {plan.total_gpus:g} GPU(s) "
            f"({_breakdown(plan, 'gpus_each', 'GPU')}); set scaling.num_gpus_per_learner=0 "
            "and scaling.num_gpus_per_env_runner=0, or pick a GPU hardware profile"
        )
    return problems


def _gpu_shortfall(plan: Plan, res: Resources) -> list[str]:
    if plan.total_gpus <= res.gpus:
        return []
    return [
        f"the plan needs {plan.total_gpus:g} GPU(s) ({_breakdown(plan, 'gpus_each', 'GPU')}) "
        f"but {res.where} has {res.gpus:g}; lower scaling.num_learners or "
        f"scaling.num_gpus_per_learner, or connect to a cluster with ray.address=..., "
        f"{FORCE_HINT}"
    ]


def _cpu_shortfall(plan: Plan, res: Resources) -> tuple[list[str], list[str]]:
    """Actors beyond Ray's CPUs hang, so that fails; the driver sharing a core only warns."""
    if plan.actor_cpus > res.cpus:
        return [
            f"the plan's actors need {plan.actor_cpus:g} CPU(s) "
            f"({_breakdown(plan, 'cpus_each', 'CPU', actors_only=True)}) but {res.where} has "
            f"{res.cpus:g}; "
            + (f"{plan.fix}, " if plan.fix else "")
            + "lower scaling.num_env_runners or scaling.num_cpus_per_env_runner, "
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
    return [], []


def _learner_placement(config: AlgorithmConfig, res: Resources) -> list[str]:
    """The scaling guide's IMPALA/APPO rule, as a warning naming the recommended setting."""
    if config.algo_class.__name__.upper() not in LEARNER_PLACEMENT_ALGOS:
        return []
    name = config.algo_class.__name__
    current = (config.num_learners, config.num_gpus_per_learner)
    if res.gpus == 1:
        wanted = (0, 1)
    elif res.gpus == 0:
        wanted = (1, 0)
    else:
        return []
    if current == wanted:
        return []
    return [
        f"{name} with {res.gpus:g} GPU(s): the RLlib scaling guide recommends "
        f"scaling.num_learners={wanted[0]} scaling.num_gpus_per_learner={wanted[1]} "
        f"(got {current[0]} and {current[1]:g})"
    ]


def _check_run_settings(settings: RunnerConfig) -> None:
    """Counts and seconds are never negative; a return may be (Pendulum's are)."""
    stop, checkpoint = settings.stop, settings.checkpoint
    counts = {
        "stop.iterations": stop.iterations,
        "stop.env_steps": stop.env_steps,
        "stop.seconds": stop.seconds,
        "checkpoint.every": checkpoint.every,
        "check.env_steps": settings.check.env_steps,
        "ray.num_cpus": settings.ray.num_cpus,
        "ray.num_gpus": settings.ray.num_gpus,
    }
    for key, value in counts.items():
        if value is not None and value < 0:
            raise ConfigError(f"{key} must be >= 0 (or null), got {value}")


def check_env(settings: RunnerConfig, config: AlgorithmConfig) -> None:
    """Build one env here, as an EnvRunner will; for a multi-agent env, map each of its
    agents to a policy the config declares."""
    env = make_env(config.env, dict(config.env_config), setting(settings.env))
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
        if multi_agent_env:
            _check_mapping(env, config)
        _build_module(env, config)
    finally:
        env.close()


def _build_module(env: Any, config: AlgorithmConfig) -> None:
    """The RLModule (a MultiRLModule for a multi-agent env), built once for this env, so a
    custom module's constructor error is one line before any actor starts."""
    try:
        if config.is_multi_agent:
            config.get_multi_rl_module_spec(env=env).build()
        else:
            config.get_rl_module_spec(env=env).build()
    except Exception as ex:
        problem = f"{type(ex).__name__}: {ex}"
        raise ConfigError(f"algo.rl_module: building the RLModule failed: {problem}") from ex


def _check_mapping(env: MultiAgentEnv, config: AlgorithmConfig) -> None:
    agents = list(getattr(env, "possible_agents", None) or [])
    if not agents:
        observations, _ = env.reset(seed=0)
        agents = list(observations)
    policies = sorted(config.policies)
    for agent in agents:
        try:
            policy = config.policy_mapping_fn(agent, None)
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
    _check_run_settings(settings)
    check_env(settings, config)
    report = Report(warnings=list(warnings))
    # A hardware problem already names missing GPUs: the GPU count is checked only without one.
    report.problems += _hardware_problems(settings, plan, res) or _gpu_shortfall(plan, res)
    cpu_problems, cpu_warnings = _cpu_shortfall(plan, res)
    report.problems += cpu_problems
    report.warnings += cpu_warnings
    report.warnings += _learner_placement(config, res)
    if (
        report.problems
        and (settings.reproduction or settings.check.threshold is not None)
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
