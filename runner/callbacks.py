"""What watches a training run: callbacks the one loop (runner/loop.py) calls, and nothing
else. The loop trains and keeps the run's rows; everything that writes, logs, guards,
checks or stops a run by its figures is a callback here, built from the config in
`for_run`, in the order listed there:

- `on_start(training)`: the Algorithm is built (restored, when resuming);
- `on_iteration(training, it)`: one finished iteration; a callback may return a reason
  to stop. Every callback sees every iteration: the first reason given ends the run
  (`training.progress.reason`) once all have run, and a callback that must not act on a
  faulted iteration (the checkpoint after a non-finite loss) asks `training.faulted`;
- `on_checkpoint(training, path)`: a checkpoint was written whole;
- `on_end(training, outcome)`: the run ended; `outcome` is its figures (status, stop
  reason, env steps, ...) as summary.json gets them.

A user adds their own with a `callbacks:` list in the config, each a `_target_` mapping
(keywords beside it), as lightning-hydra-template's callbacks are: docs/bring_your_own.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner.console import console
from runner.errors import RunEnded, RunnerError
from runner.results.files import ENV_RUNNER_ERROR, MetricsLog, env_step
from runner.schema import NonFinite, StopConfig

if TYPE_CHECKING:
    from runner.loop import Progress, Training
    from runner.tasks.base import TaskRun


@dataclass(frozen=True)
class Iteration:
    """One finished iteration: RLlib's result, its headline row (what a line prints and
    metrics.jsonl keeps) and its numbers flattened to `a/b/c` names."""

    result: dict[str, Any]
    row: dict[str, Any]
    metrics: dict[str, float]
    seconds: float  # since training started


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


# Where RLlib's result holds each restarting component's lifetime restart count and
# its healthy actors now.
RESTART_COUNTERS = {
    "env_runners": "fault_tolerance",
    "evaluation_env_runners": "evaluation",
}


def record_restarts(progress: Progress, result: dict, iteration: int) -> None:
    """RLlib recreates a dead EnvRunner within a few iterations (and the compile
    callback compiles the new one): note per component when actors were lost and when
    they came back."""
    for component, section in RESTART_COUNTERS.items():
        stats = result.get(section) or {}
        if "num_healthy_workers" not in stats:
            continue
        healthy = int(stats["num_healthy_workers"])
        count = int(stats.get("num_remote_worker_restarts") or 0)
        count_before, healthy_before = progress.actor_counts.get(component, (0, healthy))
        events = {"lost": healthy_before - healthy, "restarted": count - count_before}
        progress.actor_counts[component] = (count, healthy)
        for event, n in events.items():
            if n > 0:
                progress.restarts.setdefault(component, []).append(
                    {"iteration": iteration, event: n}
                )
                console.print(
                    f"iteration {iteration}: {n} of the {component.replace('_', ' ')} {event}"
                    + (" (RLlib's fault tolerance recreates it)" if event == "lost" else "")
                )


class Callback:
    """The hooks a callback may define; each does nothing by default."""

    def on_start(self, training: Training) -> None:
        pass

    def on_iteration(self, training: Training, it: Iteration) -> str | None:
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


class ActorRestarts(Callback):
    """EnvRunners lost and recreated by RLlib's fault tolerance, noted per iteration."""

    def on_iteration(self, training: Training, it: Iteration) -> str | None:
        record_restarts(training.progress, it.result, it.row["iteration"])
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


class EnvRunnerErrors(Callback):
    """An error raised in a remote EnvRunner (by the env, a connector or the module) that
    comes back after RLlib restarted the EnvRunner fails the run: RLlib's fault tolerance
    restarts it and goes on sampling nothing, so a deterministic failure would otherwise
    end as a finished run with 0 env steps. Exit 1, the error in one line, its traceback
    in env_runner_error.txt and summary.json (`env_runner_error`). A lost actor (killed,
    out of memory) is left to RLlib's restarts. The tracebacks come from the EnvRunners'
    processes (runner/env_runner_errors.py)."""

    def __init__(self) -> None:
        self.first_seen: dict[str, int] = {}

    def on_iteration(self, training: Training, it: Iteration) -> str | None:
        from runner import env_runner_errors

        now = it.row["iteration"]
        for text in env_runner_errors.take():
            line = error_line(text)
            first = self.first_seen.setdefault(line, now)
            if first != now:
                return self._fail(training, text, line, first, now)
        return None

    def _fail(self, training: Training, text: str, line: str, first: int, now: int) -> str:
        reason = f"an EnvRunner failed the same way in iterations {first} and {now}: {line}"
        run_dir = training.run.run_dir
        if run_dir is not None:
            (run_dir / ENV_RUNNER_ERROR).write_text(text)
            reason += f" (traceback in {run_dir / ENV_RUNNER_ERROR})"
        training.run.record["env_runner_error"] = {
            "iterations": [first, now],
            "error": line,
            "traceback": text,
        }
        training.progress.end("failed", reason)
        training.progress.error = RunEnded(reason)
        return reason

    def on_end(self, training: Training, outcome: dict[str, Any]) -> None:
        from runner import env_runner_errors

        env_runner_errors.close()


class NonFiniteGuard(Callback):
    """guard.non_finite: a NaN or inf loss, gradient norm or return stops the run before
    any checkpoint of that iteration (stop), or is one warning line (warn)."""

    def __init__(self, mode: NonFinite) -> None:
        self.mode = mode

    def on_iteration(self, training: Training, it: Iteration) -> str | None:
        from runner import guard

        found = guard.non_finite(it.result)
        if not found:
            return None
        text = guard.describe(found, it.row["iteration"])
        if self.mode == NonFinite.stop:
            training.progress.non_finite = found
            training.progress.end("non_finite", text)
            return text
        console.print(f"warning: {text} (guard.non_finite=warn: going on)")
        return None


class Checkpoints(Callback):
    """checkpoint.every: a checkpoint every N iterations, never of a faulted one."""

    def __init__(self, every: int) -> None:
        self.every = every

    def on_iteration(self, training: Training, it: Iteration) -> str | None:
        if not training.faulted and training.algo.iteration % self.every == 0:
            training.save_checkpoint()
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
        from runner import video

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
    from runner.user_code import build

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
    found += [Trackers(run.tracker), ActorRestarts(), EnvRunnerErrors()]
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
