"""What watches a training run: callbacks the one loop (runner/job/loop.py) calls, and nothing
else. The loop trains and keeps the run's rows; everything that writes, logs, guards,
checks or stops a run by its figures is a callback here, built from the config in
`for_run`, in the order listed there:

- `on_start(training)`: the Algorithm is built (restored, when resuming);
- `on_iteration(training, it)`: one finished iteration; a callback may return a reason
  to stop, or a `Decision` (a stop with the run's status, the error it ends with and its
  record's fields; a checkpoint now), which the loop carries out as it comes, so later
  callbacks see it. Every callback sees every iteration: the first stop given ends the
  run (`training.progress.reason`) once all have run, and a callback that must not act on
  a faulted iteration (the checkpoint after a non-finite loss) asks `training.faulted`;
- `on_checkpoint(training, path)`: a checkpoint was written whole;
- `on_end(training, outcome)`: the run ended; `outcome` is its figures (status, stop
  reason, env steps, ...) as summary.json gets them.

A user adds their own with a `callbacks:` list in the config, each a `_target_` mapping
(keywords beside it), as lightning-hydra-template's callbacks are: docs/bring_your_own.md.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from runner.console import console
from runner.errors import RunEnded, RunnerError
from runner.job.check import Check
from runner.results.files import ENV_RUNNER_ERROR, MetricsLog, env_step
from runner.settings.schema import NonFinite, RunnerConfig, StopConfig

if TYPE_CHECKING:
    from runner.job.task import TaskRun


@dataclass
class Progress:
    """A training run as it goes: its rows, its outcome, and what it kept."""

    check: Check
    rows: list[dict[str, Any]] = field(default_factory=list)
    best: float | None = None
    best_eval: float | None = None
    last_eval: float | None = None  # the newest evaluation return (eval.every)
    # finished | interrupted | aborted | stalled | non_finite | failed
    status: str = "finished"
    reason: str = ""
    signum: int | None = None
    abandoned: bool = False  # the iteration in flight outlived the grace after a signal
    error: Exception | None = None
    restarts: dict[str, list[dict[str, int]]] = field(default_factory=dict)
    # Per component, RLlib's last (lifetime restarts, healthy actors).
    actor_counts: dict[str, tuple[int, int]] = field(default_factory=dict)

    def end(self, status: str, reason: str) -> None:
        self.status, self.reason = status, reason

    @property
    def iteration(self) -> int | None:
        return self.rows[-1]["iteration"] if self.rows else None


class Training(Protocol):
    """What a callback reads of the one loop's training (runner/job/loop.py's Training): what
    it decides goes back as on_iteration's return (a Tune trial's reporter, last, saves
    the checkpoint Tune takes with a trial's last result itself)."""

    run: TaskRun
    settings: RunnerConfig
    progress: Progress
    algo: Any
    saved: Path | None  # the checkpoint this iteration wrote, if any

    @property
    def faulted(self) -> bool: ...

    @property
    def objective(self) -> float | None: ...

    def save_checkpoint(self) -> Path | None: ...


@dataclass(frozen=True)
class Decision:
    """What a callback decides on an iteration, for the loop to carry out: a stop (its
    `reason`, the run's `status`, an `error` to end the task with, fields for the run's
    `record`), or a checkpoint now."""

    reason: str = ""
    status: str = "finished"
    error: Exception | None = None
    record: dict[str, Any] = field(default_factory=dict)
    checkpoint: bool = False


@dataclass(frozen=True)
class Iteration:
    """One finished iteration: RLlib's result, its headline row (what a line prints and
    metrics.jsonl keeps) and its numbers flattened to `a/b/c` names."""

    result: dict[str, Any]
    row: dict[str, Any]
    metrics: dict[str, float]
    seconds: float  # since training started
    # Training's EnvRunners short now, or lost or recreated in this iteration.
    troubled: bool = False


def stop_reason(stop: StopConfig, row: dict[str, Any], train_seconds: float) -> str | None:
    """The first stop criterion met, as text, or None to go on."""
    ret = row["episode_return_mean"]
    if stop.episode_return_mean is not None and ret is not None and ret >= stop.episode_return_mean:
        return f"episode_return_mean {ret:.1f} >= {stop.episode_return_mean:g}"
    if stop.iterations is not None and row["iteration"] >= stop.iterations:
        return f"iterations {row['iteration']} >= {stop.iterations}"
    if stop.env_steps is not None and (row["env_steps"] or 0) >= stop.env_steps:
        return f"env_steps {row['env_steps']:.0f} >= {stop.env_steps}"
    if stop.seconds is not None and train_seconds >= stop.seconds:
        return f"seconds {train_seconds:.0f} >= {stop.seconds:g}"
    return None


def describe_stops(stop: StopConfig, defaults: Collection[str]) -> str:
    """The stop criteria in force, in one line, as `stop_reason` tests them; the budgets
    that are the runner's defaults (`defaults`: runner/settings/schema.py's stop_default) marked."""
    criteria = {
        "episode_return_mean": (stop.episode_return_mean, "episode return mean >= {:g}"),
        "iterations": (stop.iterations, "{:,} iterations"),
        "env_steps": (stop.env_steps, "{:,} env steps"),
        "seconds": (stop.seconds, "{:g} s of training"),
    }
    parts = [
        text.format(value) + (" (default)" if key in defaults else "")
        for key, (value, text) in criteria.items()
        if value is not None
    ]
    if not parts:
        return "stops: no stop.* criterion is set: it trains until its check decides or a signal"
    shown = f"stops at the first of: {', '.join(parts)}"
    if defaults:
        shown += "; a budget you set (stop.iterations, env_steps or seconds) drops the defaults"
    return shown


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _return_text(row: dict[str, Any]) -> str:
    text = f"{_fmt(row['last_episode_return_mean'], '.2f'):>8}"
    return f"{text} ({row['return_age']} it ago)" if row["return_age"] else text


def print_row(row: dict[str, Any]) -> None:
    """One line per iteration (the last known return mean, with its age when it is not
    this iteration's); a multi-agent run adds each policy's return mean."""
    per_policy = row["module_episode_returns_mean"] or {}
    evaluated = row["eval_return_mean"]
    console.print(
        f"iter {row['iteration']:>4} | env steps {_fmt(row['env_steps'], ',.0f'):>10} | "
        f"return mean {_return_text(row)} | "
        + ("" if evaluated is None else f"eval {evaluated:8.2f} | ")
        + f"{_fmt(row['env_steps_per_s'], ',.0f'):>7} steps/s | {row['wall_seconds']:7.1f} s"
        + (
            " | " + ", ".join(f"{m} {_fmt(v, '.1f')}" for m, v in sorted(per_policy.items()))
            if len(per_policy) > 1
            else ""
        )
    )


class Callback:
    """The hooks a callback may define; each does nothing by default."""

    def on_start(self, training: Training) -> None:
        pass

    def on_iteration(self, training: Training, it: Iteration) -> str | Decision | None:
        return None

    def on_checkpoint(self, training: Training, path: Path) -> None:
        pass

    def on_end(self, training: Training, outcome: dict[str, Any]) -> None:
        pass


class PrintRow(Callback):
    """One console line per iteration."""

    def on_iteration(self, training: Training, it: Iteration) -> str | None:
        print_row(it.row)
        return None


class MetricsFiles(Callback):
    """metrics.jsonl and progress.csv (runner/results/files.py's MetricsLog)."""

    def __init__(self, run_dir: Path, history: list[str]) -> None:
        self.log = MetricsLog(run_dir, history)

    def on_iteration(self, training: Training, it: Iteration) -> str | None:
        self.log.write(it.row, it.metrics)
        return None

    def on_end(self, training: Training, outcome: dict[str, Any]) -> None:
        self.log.close()


class TensorBoard(Callback):
    """TensorBoard events in tensorboard/: RLlib's names, the env steps sampled so far as
    the step."""

    def __init__(self, run_dir: Path) -> None:
        from tensorboardX import SummaryWriter  # here: its import costs every other job

        self.writer = SummaryWriter(logdir=str(run_dir / "tensorboard"), flush_secs=10)

    def on_iteration(self, training: Training, it: Iteration) -> str | None:
        for name, value in it.metrics.items():
            self.writer.add_scalar(name, value, global_step=env_step(it.row))
        self.writer.flush()
        return None

    def on_end(self, training: Training, outcome: dict[str, Any]) -> None:
        self.writer.close()


class Trackers(Callback):
    """logger=mlflow / logger=wandb: each iteration to the run's trackers (started and
    finished by the job, runner/results/tracking.py, as they log the whole job)."""

    def __init__(self, trackers: Any) -> None:
        self.trackers = trackers

    def on_iteration(self, training: Training, it: Iteration) -> str | None:
        self.trackers.log(it.row, it.metrics)
        return None


# Where Python chains one exception to the next in a traceback's text.
_CHAINED = (
    "The above exception was the direct cause of the following exception:",
    "During handling of the above exception, another exception occurred:",
)


def error_line(traceback: str) -> str:
    """An EnvRunner's error as one line: the first exception of its chain (the env's own
    error, not RLlib's RuntimeError raised from it), type and message."""
    first = traceback
    for mark in _CHAINED:
        first = first.split(mark, 1)[0]
    lines = [line.strip() for line in first.strip().splitlines() if line.strip()]
    return (lines[-1] if lines else "(no traceback)")[:500]


class EnvRunnerFaults(Callback):
    """Remote EnvRunners lost and recreated by RLlib's fault tolerance, noted per
    iteration; and no success without env steps. RLlib restarts an EnvRunner whose env,
    connector or module raised, or whose process died, and goes on sampling nothing: a
    deterministic failure would end as a finished run with 0 env steps. The run fails
    (exit 1, the cause in one line, its traceback in env_runner_error.txt and summary.json's
    `env_runner_error`) when
    - the same error comes back in a later iteration (after the EnvRunner's restart);
    - the EnvRunners sampled nothing in `guard.unsampled_iterations` iterations in a row
      since one failed (was lost, restarted or reported an error);
    - a stop criterion would end a run that has sampled no env step at all.
    The cause is the EnvRunner's own exception, carried from its process, or, for a
    process that died without one (os._exit, a segfault), Ray's word on its exit and the
    last lines of its log (runner/machine/env_runner_errors.py). A lost actor whose replacement
    samples again (one killed, out of memory) is left to RLlib's restarts."""

    def __init__(self, unsampled_iterations: int) -> None:
        self.unsampled_iterations = unsampled_iterations
        self.first_seen: dict[str, int] = {}
        self.newest_error = ""  # the newest traceback an EnvRunner reported
        self.unsampled = 0  # iterations in a row that sampled nothing since a failure
        self.since_ms = 0  # when training started, in epoch milliseconds (Ray's clock)

    def on_start(self, training: Training) -> None:
        self.since_ms = int(time.time() * 1000)

    def on_iteration(self, training: Training, it: Iteration) -> Decision | None:
        from runner.machine import env_runner_errors

        now, progress = it.row["iteration"], training.progress
        texts = env_runner_errors.take()
        for text in texts:
            line = error_line(text)
            first = self.first_seen.setdefault(line, now)
            if first != now:
                why = f"an EnvRunner failed the same way in iterations {first} and {now}"
                return self._fail(training, why, line, text, [first, now])
        self.newest_error = texts[-1] if texts else self.newest_error
        if it.row["env_steps_this_iter"]:
            self.unsampled = 0
        elif it.troubled or texts or self.unsampled:
            self.unsampled += 1
        if self.unsampled >= self.unsampled_iterations:
            why = (
                f"the EnvRunners sampled nothing in {self.unsampled} iterations in a row "
                "since one failed (guard.unsampled_iterations)"
            )
            return self._fail(training, why, *self._cause(), [now - self.unsampled + 1, now])
        sampled = any(r["env_steps_this_iter"] for r in progress.rows)
        if not sampled and stop_reason(training.settings.stop, it.row, it.seconds):
            why = f"the run would stop with no env step sampled in {len(progress.rows)} iterations"
            return self._fail(training, why, *self._cause(), [progress.rows[0]["iteration"], now])
        return None

    def _cause(self) -> tuple[str, str]:
        """The cause in one line and its traceback: the newest error an EnvRunner reported,
        else the newest exit of an EnvRunner's process, else what Ray reports."""
        from runner.machine import env_runner_errors

        if self.newest_error:
            return error_line(self.newest_error), self.newest_error
        ended = env_runner_errors.exits(self.since_ms)
        if ended:
            return ended[-1].describe(), ended[-1].text()
        line = "no EnvRunner reported an error, and Ray reports no EnvRunner process that ended"
        return line, line + "\n"

    def _fail(
        self, training: Training, why: str, line: str, text: str, iterations: list
    ) -> Decision:
        reason = f"{why}: {line}"
        run_dir = training.run.run_dir
        if run_dir is not None:
            (run_dir / ENV_RUNNER_ERROR).write_text(text)
            reason += f" (traceback in {run_dir / ENV_RUNNER_ERROR})"
        error = {"iterations": iterations, "error": line, "traceback": text}
        return Decision(reason, "failed", RunEnded(reason), {"env_runner_error": error})

    def on_end(self, training: Training, outcome: dict[str, Any]) -> None:
        from runner.machine import env_runner_errors

        env_runner_errors.close()


class NonFiniteGuard(Callback):
    """guard.non_finite: a NaN or inf loss, gradient norm or return stops the run before
    any checkpoint of that iteration (stop), or is one warning line (warn)."""

    def __init__(self, mode: NonFinite) -> None:
        self.mode = mode

    def on_iteration(self, training: Training, it: Iteration) -> Decision | None:
        from runner.job import guard

        found = guard.non_finite(it.result)
        if not found:
            return None
        text = guard.describe(found, it.row["iteration"])
        if self.mode == NonFinite.stop:
            return Decision(text, "non_finite", record={"non_finite": found})
        console.print(f"warning: {text} (guard.non_finite=warn: going on)")
        return None


class Checkpoints(Callback):
    """checkpoint.every: a checkpoint every N iterations, never of a faulted one."""

    def __init__(self, every: int) -> None:
        self.every = every

    def on_iteration(self, training: Training, it: Iteration) -> Decision | None:
        if not training.faulted and training.algo.iteration % self.every == 0:
            return Decision(checkpoint=True)
        return None


class Mirror(Callback):
    """results.uri: the run dir copied there after each checkpoint (the job copies it
    once more when it ends)."""

    def __init__(self, mirror: Any) -> None:
        self.mirror = mirror

    def on_checkpoint(self, training: Training, path: Path) -> None:
        try:
            self.mirror.push()
        except RunnerError as ex:  # what is not there yet goes with the next copy
            console.print(f"warning: {ex} (copied again after the next checkpoint)")


class Video(Callback):
    """record.every: episodes recorded to videos/ every N iterations."""

    def __init__(self, run_dir: Path, every: int, episodes: int, explore: bool) -> None:
        self.run_dir, self.every, self.episodes, self.explore = run_dir, every, episodes, explore

    def on_iteration(self, training: Training, it: Iteration) -> str | None:
        algo = training.algo
        if training.faulted or algo.iteration % self.every:
            return None
        from runner.envs import video

        video.record(
            algo.config,
            algo.env_runner.get_state(),
            self.run_dir / "videos",
            self.episodes,
            self.explore,
            f"iter_{algo.iteration:06d}",
        )
        return None


class PassCheck(Callback):
    """check.*: the run's pass criterion, held against each iteration."""

    def on_iteration(self, training: Training, it: Iteration) -> str | None:
        return training.progress.check.update(it.metrics, it.row["env_steps"] or 0, it.seconds)


class StopCriteria(Callback):
    """stop.*: the first criterion met ends the run."""

    def on_iteration(self, training: Training, it: Iteration) -> str | None:
        return stop_reason(training.settings.stop, it.row, it.seconds)


def users(run: TaskRun) -> list[Callback]:
    """The config's `callbacks:` list, each built from its `_target_` mapping (validate
    checked that each names a Callback and keywords it takes)."""
    from runner.settings.user_code import build

    return [build(dict(node), f"callbacks[{n}]") for n, node in enumerate(run.settings.callbacks)]


def for_run(run: TaskRun, quiet: bool = False) -> list[Callback]:
    """The callbacks a run's config asks for, in the order they are called: the console,
    the run's files and loggers, the guard, checkpoints and what follows them, video,
    the pass check and the stop criteria, then the user's. A run that keeps nothing on
    disk (`run.run_dir` None: the exploration bench's copies) gets no files."""
    settings, run_dir = run.settings, run.run_dir
    found: list[Callback] = [] if quiet else [PrintRow()]
    if run_dir is not None:
        found += [MetricsFiles(run_dir, run.history), TensorBoard(run_dir)]
    found += [Trackers(run.tracker), EnvRunnerFaults(settings.guard.unsampled_iterations)]
    if settings.guard.non_finite != NonFinite.off:
        found.append(NonFiniteGuard(settings.guard.non_finite))
    if settings.checkpoint.every:
        found.append(Checkpoints(settings.checkpoint.every))
    if run.mirror is not None:
        found.append(Mirror(run.mirror))
    record = settings.record
    if record.every and run_dir is not None:
        found.append(Video(run_dir, record.every, record.episodes, record.explore))
    return [*found, PassCheck(), StopCriteria(), *users(run)]
