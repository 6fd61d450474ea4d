"""What a job does around its task, one concern each: the job's counterpart of the
training callbacks (runner/job/callbacks.py). `app.run` makes the list (`for_job`), calls each
hook's `start` in order before the task, and the `end` of each that started in reverse
order however the task ended. A new concern is a new class here and a line in `for_job`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from runner.console import console
from runner.errors import RunnerError, one_line
from runner.job import Job
from runner.job.task import Task, TaskRun
from runner.machine.ray_session import release_driver_gpus, reserve_driver_gpus, start_ray
from runner.machine.shutdown import interrupted
from runner.results import record, remote, tracking
from runner.settings.schema import RunnerConfig

log = logging.getLogger("runner")


@dataclass(frozen=True)
class Ended:
    """How the task ended: MLflow's run status and the record's fields."""

    status: str  # FINISHED, KILLED or FAILED
    fields: dict[str, Any] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return self.status == "FINISHED"


class JobHook:
    """One concern around a task. `start` may fill the TaskRun in; `end` runs however the
    task ended, and a RunnerError it raises fails a finished job (a warning after a failed
    one, so the task's own error stays the one shown)."""

    def start(self, run: TaskRun) -> None:
        return None

    def end(self, run: TaskRun, ended: Ended) -> None:
        return None


class Mirror(JobHook):
    """results.uri: the run dir's last copy when the job ends (the training's Mirror
    callback copies it after each checkpoint)."""

    def __init__(self, mirror: remote.Mirror) -> None:
        self.mirror = mirror

    def start(self, run: TaskRun) -> None:
        run.mirror = self.mirror

    def end(self, run: TaskRun, ended: Ended) -> None:
        self.mirror.push()
        console.print(f"results mirrored to {self.mirror.uri}")


class Trackers(JobHook):
    """logger=: the job's MLflow / W&B runs (a search tracks each trial itself)."""

    def __init__(self, job: Job) -> None:
        self.job = job

    def start(self, run: TaskRun) -> None:
        run.tracker = tracking.start(run.settings, self.job, run.compiled)

    def end(self, run: TaskRun, ended: Ended) -> None:
        run.tracker.finish(run.files, ended.status)


class Record(JobHook):
    """summary.json, however the task ended: what every record holds, then the task's."""

    def __init__(self, job: Job) -> None:
        self.job = job

    def end(self, run: TaskRun, ended: Ended) -> None:
        fields = {
            "task": run.settings.task.name,
            **ended.fields,
            "wall_seconds": time.perf_counter() - run.start_time,
            "overrides": self.job.overrides,
            "choices": self.job.choices,
            **run.provenance,
            **run.record,
        }
        try:
            run.summary = record.write(run.files, fields)
        except OSError as ex:  # a full disk
            raise RunnerError(f"the run record could not be written in {run.files}: {ex}") from ex


class RaySession(JobHook):
    """The job's Ray (a local one, or the cluster's), its start timed into the record's
    `startup` (a Ray started early, or by an earlier job of a sweep, takes none here)."""

    def start(self, run: TaskRun) -> None:
        timed_ray_start(run.settings, run.record.setdefault("startup", {}))


class DriverGpus(JobHook):
    """A local Learner's GPUs, reserved through Ray for this job (runner/machine/ray_session.py),
    and RLlib's `local_gpu_idx` pointed at the one Ray gave."""

    def __init__(self, gpus: float) -> None:
        self.gpus = gpus

    def start(self, run: TaskRun) -> None:
        run.config.learners(local_gpu_idx=reserve_driver_gpus(self.gpus))

    def end(self, run: TaskRun, ended: Ended) -> None:
        release_driver_gpus()


def timed_ray_start(settings: RunnerConfig, startup: dict[str, float | None]) -> None:
    """start_ray, its seconds added to the job's `startup` (a Ray started early takes none
    here)."""
    began = time.perf_counter()
    start_ray(settings.ray, settings.compile.cache_dir)
    startup["ray_start_s"] = (startup.get("ray_start_s") or 0.0) + time.perf_counter() - began


def end_all(began: list[JobHook], run: TaskRun, ended: Ended) -> None:
    """Each started hook's end, in reverse; the first RunnerError fails a finished job once
    every end has run."""
    first: RunnerError | None = None
    for hook in reversed(began):
        try:
            hook.end(run, ended)
        except RunnerError as ex:
            if ended.finished and first is None:
                first = ex
            else:
                log.warning(str(ex))
    if first is not None:
        raise first


def for_job(task: Task, job: Job, main_gpus: float, mirror: remote.Mirror | None) -> list[JobHook]:
    """The job's hooks, in the order they start."""
    hooks: list[JobHook] = [Mirror(mirror)] if mirror is not None else []
    hooks += [Trackers(job)] if task.tracked else []
    hooks.append(Record(job))
    if task.needs_ray:
        hooks.append(RaySession())
        hooks += [DriverGpus(main_gpus)] if main_gpus else []
    return hooks


def run(hooks: list[JobHook], task_run: TaskRun, body: Callable[[], None]) -> None:
    """Start each hook in order, run `body` (the task under its watch), then end each hook
    that started, in reverse, however it ended: a signal as the runner's Interrupted."""
    began: list[JobHook] = []
    ended = Ended("FAILED", {"status": "failed"})
    try:
        for hook in hooks:
            began.append(hook)
            hook.start(task_run)
        body()
        ended = Ended("FINISHED", {"status": "finished"})
    except KeyboardInterrupt as ex:
        stop = interrupted(ex)
        ended = Ended("KILLED", {"status": "interrupted", "stop_reason": str(stop)})
        raise stop from None
    except BaseException as ex:
        ended = Ended("FAILED", {"status": "failed", "error": one_line(ex)})
        raise
    finally:
        end_all(began, task_run, ended)
