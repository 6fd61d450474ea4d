"""The Learner layout a run leaves to the runner, picked for the machine it plans on.

`scaling.num_learners` and `scaling.num_gpus_per_learner` are null unless set: the
runner picks. IMPALA and APPO get the RLlib scaling guide's layout for the GPUs the run
may use (no GPU: one remote CPU Learner; one GPU: a local Learner on it; N GPUs: N
Learners of one GPU each); the other algorithms a local Learner with the hardware
profile's GPUs. An explicit IMPALA/APPO layout against the guide runs, with one warning.
A remote GPU Learner that compiles gets CPUs for inductor's compile workers, which
otherwise run on one thread: RLlib's "auto" gives a GPU Learner no CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from runner.machine import Resources
from runner.schema import Accelerator, RunnerConfig

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
    assert s.num_learners is not None and s.num_gpus_per_learner is not None  # just filled
    compiles = settings.compile.backend is not None and settings.compile.learners
    remote_gpu = s.num_learners > 0 and s.num_gpus_per_learner > 0
    if compiles and remote_gpu and s.num_cpus_per_learner is None:
        s.num_cpus_per_learner = float(COMPILE_CPUS_PER_GPU_LEARNER)
        placement.notes["learner"] = (
            f"{COMPILE_CPUS_PER_GPU_LEARNER:g} CPUs each for inductor's compile workers "
            "(scaling.num_cpus_per_learner sets them)"
        )
    return placement


def _fill_defaults(settings: RunnerConfig) -> None:
    """Outside the guide: a local Learner, with the hardware profile's GPUs."""
    s = settings.scaling
    if s.num_learners is None:
        s.num_learners = 0
    if s.num_gpus_per_learner is None:
        s.num_gpus_per_learner = settings.hardware.num_gpus_per_learner
