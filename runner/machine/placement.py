"""The Learner layout a run leaves to the runner, picked for the machine it plans on.

`scaling.num_learners` and `scaling.num_gpus_per_learner` are null unless set: the
runner picks. IMPALA and APPO get the RLlib scaling guide's layout for the GPUs the run
may use (no GPU: one remote CPU Learner; one GPU: a local Learner on it; N GPUs: N
Learners of one GPU each); the other algorithms a local Learner with the hardware
profile's GPUs. An explicit IMPALA/APPO layout against the guide runs, with one warning.
A remote GPU Learner that compiles gets CPUs for inductor's compile workers, which
otherwise run on one thread: RLlib's default (auto) gives a GPU Learner no CPU. Aggregator
actors (IMPALA's and APPO's, 1 CPU each) that would leave the plan's actors more CPUs than the
machine has are fewer, to what fits (`fit_aggregators`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from runner.machine import Resources
from runner.settings.schema import Accelerator, RunnerConfig

if TYPE_CHECKING:
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

    from runner.compile.settings import CompileSpec
    from runner.machine.plan import Plan

# The scaling guide's learner-placement rule is written for these algorithms.
GUIDE_ALGOS = ("IMPALA", "APPO")
# CPUs a compiling remote GPU Learner gets when scaling.num_cpus_per_learner is null:
# inductor's compile threads are the CPUs Ray assigns (runner/compile/apply.py).
COMPILE_CPUS_PER_GPU_LEARNER = 2


@dataclass
class Placement:
    """What the runner chose (lines for the dry run and the run's start), what it warns of,
    and a note per plan role (the plan's hosts column)."""

    chosen: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: dict[str, str] = field(default_factory=dict)


def guide_layout(gpus: float) -> tuple[int, float]:
    """(num_learners, num_gpus_per_learner) by the scaling guide, for `gpus` whole GPUs."""
    whole = int(gpus)
    if whole == 0:
        return 1, 0.0
    if whole == 1:
        return 0, 1.0
    return whole, 1.0


def usable_gpus(settings: RunnerConfig, res: Resources) -> float:
    """The GPUs a run may use: none on hardware=cpu, whatever the machine has."""
    return res.gpus if settings.hardware.accelerator == Accelerator.cuda else 0.0


def resolve(settings: RunnerConfig, res: Resources) -> Placement:
    """Fill the Learner settings left null (in `settings.scaling`, in place) for `res`."""
    s, algo = settings.scaling, settings.algo.name.upper()
    placement = Placement()
    if algo in GUIDE_ALGOS:
        gpus = usable_gpus(settings, res)
        wanted = guide_layout(gpus)
        layout = f"scaling.num_learners={wanted[0]} scaling.num_gpus_per_learner={wanted[1]:g}"
        if s.num_learners is None and s.num_gpus_per_learner is None:
            s.num_learners, s.num_gpus_per_learner = wanted
            placement.chosen.append(
                f"learners: {settings.algo.name} on {gpus:g} GPU(s) takes the RLlib scaling "
                f"guide's layout: {layout} (set either to choose your own)"
            )
        else:
            _fill_defaults(settings)
            got = (s.num_learners, s.num_gpus_per_learner)
            if got != wanted:
                placement.warnings.append(
                    f"{settings.algo.name} with {gpus:g} GPU(s): the RLlib scaling guide "
                    f"recommends {layout} (got {got[0]} and {got[1]:g}); leave both unset "
                    "for the guide's layout"
                )
    _fill_defaults(settings)
    return placement


def compile_workers(settings: RunnerConfig, spec: CompileSpec | None, placement: Placement) -> None:
    """A remote GPU Learner that compiles (by the spec, compile=auto's choice made) gets
    CPUs for inductor's compile workers, unless scaling.num_cpus_per_learner sets them."""
    s = settings.scaling
    assert s.num_learners is not None and s.num_gpus_per_learner is not None  # `resolve` filled
    remote_gpu = s.num_learners > 0 and s.num_gpus_per_learner > 0
    if spec is not None and spec.learners and remote_gpu and s.num_cpus_per_learner is None:
        s.num_cpus_per_learner = float(COMPILE_CPUS_PER_GPU_LEARNER)
        placement.notes["learner"] = (
            f"{COMPILE_CPUS_PER_GPU_LEARNER:g} CPUs each for inductor's compile workers "
            "(scaling.num_cpus_per_learner sets them)"
        )


def _fill_defaults(settings: RunnerConfig) -> None:
    """Outside the guide: a local Learner, with the hardware profile's GPUs."""
    s = settings.scaling
    if s.num_learners is None:
        s.num_learners = 0
    if s.num_gpus_per_learner is None:
        s.num_gpus_per_learner = settings.hardware.num_gpus_per_learner


def fit_aggregators(
    config: AlgorithmConfig, plan: Plan, res: Resources, placement: Placement, strict: bool
) -> bool:
    """Fewer aggregator actors per Learner where that alone fits the plan (the main
    process and the actors) into `res`'s CPUs (a tuned example's two per Learner on a
    2-core machine): the config changed in place and one line for the run's start;
    False where it changes nothing (they fit, none are asked for, fewer would not fit
    either, or preflight.strict=false, which tries the plan as it is)."""
    from runner.machine.plan import AGGREGATOR

    per_learner = config.num_aggregator_actors_per_learner
    total = plan.count(AGGREGATOR)
    wanted = plan.total_cpus  # the main process's core too, as the preflight counts it
    excess = wanted - res.cpus
    if not strict or not per_learner or excess <= 0 or excess > total:
        return False
    fewer = math.ceil(excess / (total // per_learner))  # as many fewer for each Learner
    config.learners(num_aggregator_actors_per_learner=per_learner - fewer)
    placement.chosen.append(
        f"learners: {per_learner} aggregator actor(s) per Learner (1 CPU each) would want "
        f"{wanted:g} CPUs of {res.where}'s {res.cpus:g}: "
        f"algo.learners.num_aggregator_actors_per_learner={per_learner - fewer}"
        + (" (the Learner batches the episodes itself)" if per_learner == fewer else "")
        + f"; preflight.strict=false keeps {per_learner}"
    )
    return True
