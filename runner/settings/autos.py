"""compile=auto and scaling=auto made concrete, once: the step after validate.

`resolve` measures (or reads from its cache, runner/machine/measure_cache.py) what each auto
decides and returns settings and a compile spec with no auto left in them, so the
AlgorithmConfig, the plan, the preflight and the task only ever see concrete settings. The
two never combine: each measures with the other's choice fixed. Their rules are here too
(`check_settings`, `check`), called by runner/settings/validate.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from runner.console import console
from runner.errors import ConfigError, PreflightError
from runner.machine import Resources, scaling_auto
from runner.settings.schema import AUTO, RunnerConfig

if TYPE_CHECKING:
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

    from runner.compile.settings import CompileSpec
    from runner.job.task import Task
    from runner.machine.plan import Plan


@dataclass(frozen=True)
class Resolved:
    """Settings and compile spec with no auto left, and the record's sections on what
    each auto chose (`scaling_auto`, `compile_auto`)."""

    settings: RunnerConfig
    spec: CompileSpec | None
    record: dict[str, Any] = field(default_factory=dict)


def compile_auto(settings: RunnerConfig) -> bool:
    return settings.compile.backend == AUTO


def measures_before_ray(settings: RunnerConfig) -> bool:
    """compile=auto times the module in this process before Ray takes the CPUs."""
    return compile_auto(settings)


def check_settings(settings: RunnerConfig) -> None:
    """The autos' rules on the settings alone (runner/settings/validate.py's `check_settings`)."""
    if not settings.scaling.auto.enabled:
        return
    scaling_auto.check(settings)
    if compile_auto(settings):
        raise ConfigError(
            "scaling=auto and compile=auto each measure with the other's choice fixed: pick "
            "the layout first (python -m runner scaling=auto dry_run=true), set it with "
            "scaling.num_env_runners=... scaling.num_envs_per_env_runner=..., then compile=auto"
        )


def check(settings: RunnerConfig, task: Task) -> list[str]:
    """compile=auto's rules for this task (after check_settings); the warnings."""
    if not (compile_auto(settings) and task.uses_compile):
        return []
    if not task.compile_auto:
        raise ConfigError(
            f"task={task.name} compares one compile preset with eager; compile=auto "
            "picks one per component for training: compare them all with task=autotune"
        )
    from runner.compile import auto  # torch._dynamo: only for compile=auto

    auto.check(settings)
    mode = settings.compile.mode
    return [f"compile.mode={mode} is ignored by compile=auto"] if mode else []


def resolve(
    settings: RunnerConfig,
    spec: CompileSpec | None,
    task: Task,
    resources: Resources,
    planner: Callable[[RunnerConfig, Resources], tuple[AlgorithmConfig, Plan]],
) -> Resolved:
    """The settings (scaling=auto: the layout chosen) and spec (compile=auto: each
    component kind's preset, or eager) the run uses; `spec` as validate made it otherwise.
    `planner` plans a layout as the job would (runner/job/app.py's `planned`)."""
    if settings.scaling.auto.enabled:
        chosen, section = scaling_auto.choose(settings, resources, planner)
        console.print(scaling_auto.describe(section))
        return Resolved(chosen, spec, {"scaling_auto": section})
    if compile_auto(settings) and task.uses_compile:
        return _compile_auto(settings, resources)
    return Resolved(settings, spec)


def _compile_auto(settings: RunnerConfig, resources: Resources) -> Resolved:
    from runner.algorithms.algorithm_config import build_algorithm_config
    from runner.compile import auto  # torch._dynamo: only for compile=auto

    refuse_unseen_gpus(settings, resources)
    section = auto.choose(settings, build_algorithm_config(settings, None))
    console.print(auto.describe(section))
    return Resolved(settings, auto.chosen_spec(settings, section), {"compile_auto": section})


def refuse_unseen_gpus(settings: RunnerConfig, res: Resources) -> None:
    """compile=auto times each component kind in this process, on the device it will run
    on: a GPU component needs a GPU this process sees."""
    from runner.compile import auto  # torch._dynamo: only for compile=auto
    from runner.compile.settings import module_device
    from runner.machine.preflight import cpu_build

    if res.driver_gpus:
        return
    on_gpu = [
        kind.replace("_", " ")
        for kind in auto.wanted_kinds(settings)
        if module_device(settings.scaling, kind) == "cuda"
    ]
    if on_gpu:
        raise PreflightError(
            f"compile=auto times each component in this process on its own device, and the "
            f"{' and '.join(on_gpu)} run on a GPU, but this process sees no GPU through "
            f"torch.cuda{cpu_build()}; run the command on a GPU node, or pick a preset "
            "(e.g. compile=inductor_default)"
        )
