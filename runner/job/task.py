"""What a task is: its settings schema, its checks, its resource plan and its run function.

`app.run` knows nothing about any one task: it composes, asks the task to check its
settings and to scale the plan, runs the preflight, then hands the task a `TaskRun`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from omegaconf import DictConfig

from runner.errors import ConfigError
from runner.job import Composer
from runner.results import record
from runner.results.tracking import Trackers
from runner.settings.schema import ReadsCheckpoint, RunnerConfig, TaskSettings

if TYPE_CHECKING:  # light at import: a typo at composition needs none of these
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

    from runner.compile.settings import CompileSpec
    from runner.machine.plan import Plan
    from runner.results.remote import Mirror


@dataclass
class TaskRun:
    """Everything a task's run function gets: typed settings, never the raw config."""

    settings: RunnerConfig
    config: AlgorithmConfig
    spec: CompileSpec | None
    run_dir: Path | None  # None: keep nothing on disk (the exploration bench's copies)
    provenance: dict[str, Any]
    start_time: float
    checkpoint: Path | None = None
    # metrics.jsonl lines to start from: an interrupted sweep job's, up to its checkpoint.
    history: list[str] = field(default_factory=list)
    # logger=: where each iteration's figures go besides the run dir.
    tracker: Any = field(default_factory=Trackers)
    # The job's group choices (experiment, scale, ...), as Hydra composed them.
    choices: dict[str, Any] = field(default_factory=dict)
    # results.uri: the run dir's copy there, refreshed after each checkpoint.
    mirror: Mirror | None = None
    # Where checkpoints are written and pruned out of the run dir's sight, on its disk:
    # Ray Tune copies a trial's dir while the trial runs (a file that vanished mid-copy
    # fails Tune's sync), so a trial writes them beside its dir, never in it.
    scratch: Path | None = None
    # The task's part of the run record (summary.json, runner/results/record.py): the job
    # writes it, with what every record holds, however the task ends.
    record: dict[str, Any] = field(default_factory=dict)
    # The entry point's composition (runner/job/__init__.py), for a task that needs another config.
    compose: Composer | None = None
    # summary.json as the job wrote it when the task ended (runner/job/hooks.py's Record).
    summary: dict[str, Any] | None = None

    def aborted(self, signum: int, known: dict[str, Any]) -> None:
        """The record a second signal leaves before the process exits: what is known by
        then (nothing, for a run that keeps nothing on disk)."""
        if self.run_dir is not None:
            wall_seconds = time.perf_counter() - self.start_time
            known = {**self.provenance, **self.record, **known}
            record.aborted(self.run_dir, self.settings.task.name, signum, wall_seconds, known)

    @property
    def compiled(self) -> str:
        """The compile preset the run uses (compile=auto's choice), or "off"."""
        return self.spec.preset if self.spec is not None else "off"

    @property
    def files(self) -> Path:
        """The run dir of a run that keeps files: every task's own run does."""
        if self.run_dir is None:
            raise RuntimeError("this run keeps nothing on disk (its run_dir is None)")
        return self.run_dir


OwnSettings = TypeVar("OwnSettings", bound=TaskSettings)


def own_settings(settings: RunnerConfig, kind: type[OwnSettings]) -> OwnSettings:
    """The task's own settings, typed: the schema composes them as the task's class."""
    if not isinstance(settings.task, kind):
        raise TypeError(f"task settings are {type(settings.task).__name__}, not {kind.__name__}")
    return settings.task


def no_warnings(settings: RunnerConfig, spec: CompileSpec | None) -> list[str]:
    return []


def same_plan(plan: Plan, settings: RunnerConfig) -> Plan:
    return plan


def same_config(config: AlgorithmConfig, settings: RunnerConfig) -> None:
    return None


@dataclass(frozen=True)
class Task:
    """One kind of job. `check` raises ConfigError on bad settings (before anything is
    built) and returns warnings; `configure` changes the AlgorithmConfig for what the task
    runs (before RLlib's plan is taken from it); `scale_plan` turns RLlib's plan for one
    training run into what the task starts; `run` does the work and writes its files into
    the run dir."""

    settings: type[TaskSettings]
    run: Callable[[TaskRun], None]
    check: Callable[[RunnerConfig, CompileSpec | None], list[str]] = no_warnings
    configure: Callable[[AlgorithmConfig, RunnerConfig], None] = same_config
    scale_plan: Callable[[Plan, RunnerConfig], Plan] = same_plan
    # False for a task that starts no actor (it then needs no Ray of its own).
    needs_ray: bool = True
    # True for a task that takes compile=auto's per-component choice (training).
    compile_auto: bool = False
    # True for a task that trains (its compiled parts are checked where they will run).
    trains: bool = False
    # False for a task that compiles nothing itself (the compile group is not read).
    uses_compile: bool = True
    # What resume= continues: "checkpoint" (an RLlib checkpoint) or "search" (a Ray Tune
    # experiment in a task=tune run dir).
    resumes: str = "checkpoint"
    # False for a task that tracks its own runs (a search: one MLflow run per trial).
    tracked: bool = True

    @property
    def name(self) -> str:
        return self.settings.name

    @property
    def reads_checkpoint(self) -> bool:
        """A task that reads a trained checkpoint (task.checkpoint, `checkpoint=` on the
        command line): its run's config is composed as resume= does."""
        return issubclass(self.settings, ReadsCheckpoint)

    def checkpoint_source(self, cfg: DictConfig) -> tuple[str, str] | None:
        """(path, the setting that named it): resume= for training, checkpoint= for a task
        that reads one (evaluate, export); None when neither is set."""
        path = cfg.task.get("checkpoint") if self.reads_checkpoint else None
        if cfg.resume and path:
            raise ConfigError(
                f"task={self.name} reads checkpoint=; resume= continues training: set one"
            )
        if cfg.resume:
            return str(cfg.resume), "resume"
        return (str(path), "checkpoint") if path else None
