"""task=train: build the Algorithm, train until a stop criterion, keep every result.

Each iteration is printed, appended to metrics.jsonl and TensorBoard, checked for
non-finite losses and returns (runner/guard.py) and checkpointed every `checkpoint.every`
iterations (whole or not at all: runner/results/checkpoints.py), and with `record.every`
an episode is recorded to videos/ (runner/video.py); the end writes a final checkpoint
and summary.json. A signal, a stall (runner/shutdown.py), a non-finite value
or a crash ends the run the same way, with summary.json's `status` saying which and the
checkpoints that finished kept. With compile on the EnvRunners, every iteration (after the
weight sync) replays each compiled module's last input through compiled and eager code:
`compile_max_abs_diff`.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray.rllib.algorithms.algorithm import Algorithm

from runner import guard, video
from runner.check import Check
from runner.compile import report as compile_report
from runner.compile.settings import CompileSpec, check_placement, compiled_parts
from runner.console import console
from runner.errors import ConfigError, RunnerError, one_line
from runner.ray_session import waiting_for
from runner.results import checkpoints
from runner.results.files import MetricsLog, flatten_numbers, headline, write_json
from runner.schema import NonFinite, RunnerConfig, StopConfig, TaskSettings
from runner.shutdown import Interrupted, Watch, signal_name
from runner.tasks.base import Task, TaskRun


@dataclass
class TrainSettings(TaskSettings):
    """Training takes its settings from the `stop` and `checkpoint` sections."""


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


def carry_last_return(row: dict[str, Any], previous: dict[str, Any] | None) -> None:
    """An iteration that ends no episode (common for SAC and DQN) has no return mean of
    its own: keep the last known one, and how many iterations old it is (0: this one's)."""
    if row["episode_return_mean"] is not None:
        row["last_episode_return_mean"], row["return_age"] = row["episode_return_mean"], 0
    elif previous is not None and previous["last_episode_return_mean"] is not None:
        row["last_episode_return_mean"] = previous["last_episode_return_mean"]
        row["return_age"] = previous["return_age"] + 1
    else:
        row["last_episode_return_mean"], row["return_age"] = None, None


def _return_text(row: dict[str, Any]) -> str:
    text = f"{_fmt(row['last_episode_return_mean'], '.2f'):>8}"
    return f"{text} ({row['return_age']} it ago)" if row["return_age"] else text


def print_row(row: dict[str, Any]) -> None:
    """One line per iteration (the last known return mean, with its age when it is not
    this iteration's); a multi-agent run adds each policy's return mean."""
    per_policy = row["module_episode_returns_mean"] or {}
    console.print(
        f"iter {row['iteration']:>4} | env steps {_fmt(row['env_steps'], ',.0f'):>10} | "
        f"return mean {_return_text(row)} | "
        f"{_fmt(row['env_steps_per_s'], ',.0f'):>7} steps/s | {row['wall_seconds']:7.1f} s"
        + (
            " | " + ", ".join(f"{m} {_fmt(v, '.1f')}" for m, v in sorted(per_policy.items()))
            if len(per_policy) > 1
            else ""
        )
    )


def env_runner_nodes(algo: Algorithm) -> list[str]:
    """The Ray node id of each remote EnvRunner (on a cluster: where they were placed)."""
    return algo.env_runner_group.foreach_env_runner(
        lambda _: ray.get_runtime_context().get_node_id(), local_env_runner=False
    )


def check(settings: RunnerConfig, spec: CompileSpec | None) -> list[str]:
    keep, watchdog = settings.checkpoint.keep, settings.watchdog
    if keep is not None and keep < 1:
        raise ConfigError(f"checkpoint.keep={keep}: keep at least 1, or null to keep all")
    if settings.checkpoint.keep_best < 0:
        raise ConfigError("checkpoint.keep_best must be 0 or more")
    if settings.shutdown.grace_seconds < 0:
        raise ConfigError("shutdown.grace_seconds must be 0 or more")
    if watchdog.seconds is not None and watchdog.seconds <= 0:
        raise ConfigError("watchdog.seconds must be more than 0 (or null for the default bound)")
    if settings.record.every < 0 or settings.record.episodes < 1:
        raise ConfigError(
            f"record.every={settings.record.every} (0: no video) and record.episodes="
            f"{settings.record.episodes} (at least 1) are out of range"
        )
    if settings.record.every:
        video.check_renders(settings.env)
    return check_placement(spec, compiled_parts(spec, settings.scaling), settings.algo.name)


@dataclass
class Progress:
    """A training run as it goes: its rows, its outcome, and what it kept."""

    check: Check
    rows: list[dict[str, Any]] = field(default_factory=list)
    best: float | None = None
    # finished | interrupted | aborted | stalled | non_finite | failed
    status: str = "finished"
    reason: str = ""
    signum: int | None = None
    abandoned: bool = False  # the iteration in flight outlived the grace after a signal
    error: Exception | None = None
    restarts: dict[str, list[dict[str, int]]] = field(default_factory=dict)
    non_finite: dict[str, float] = field(default_factory=dict)
    # Per component, RLlib's last (lifetime restarts, healthy actors).
    actor_counts: dict[str, tuple[int, int]] = field(default_factory=dict)

    def end(self, status: str, reason: str) -> None:
        self.status, self.reason = status, reason

    @property
    def iteration(self) -> int | None:
        return self.rows[-1]["iteration"] if self.rows else None


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


def learners_in_service(algo: Algorithm) -> None:
    """Raise if a remote Learner died unnoticed. RLlib takes a dead Learner out of service
    without raising from some calls (the checkpoint's write of its state is one); the
    next update or checkpoint would then fail with an IndexError, and the checkpoint
    written meanwhile would lack the Learner's state."""
    group = algo.learner_group
    if group.is_local:
        return
    healthy = group._worker_manager.num_healthy_actors()
    if healthy < len(group):
        raise RunnerError(
            f"a Ray actor died: a Learner (Ray Train's _WrappedExecutable), {len(group) - healthy}"
            f" of {len(group)} out of service: its process was killed, ran out of memory or "
            "crashed (its log is under Ray's session dir)"
        )


def save_checkpoint(algo: Algorithm, run: TaskRun, progress: Progress) -> Path:
    """A checkpoint with its manifest, then the older ones beyond checkpoint.keep pruned."""
    row = progress.rows[-1]
    path = checkpoints.save(
        algo,
        run.run_dir,
        {
            "iteration": algo.iteration,
            "env_steps": row["env_steps"],
            "episode_return_mean": row["last_episode_return_mean"],
        },
        verify=lambda: learners_in_service(algo),
    )
    checkpoints.prune(run.run_dir, run.settings.checkpoint.keep, run.settings.checkpoint.keep_best)
    return path


def after_iteration(
    algo: Algorithm,
    run: TaskRun,
    progress: Progress,
    result: dict,
    metrics: MetricsLog,
    seconds: float,
) -> str:
    """Record one finished iteration; the stop reason, or '' to go on."""
    settings = run.settings
    row = headline(result, time.perf_counter() - run.start_time)
    carry_last_return(row, progress.rows[-1] if progress.rows else None)
    if run.spec is not None and run.spec.env_runners:
        row["compile_max_abs_diff"] = compile_report.max_diff(
            compile_report.env_runner_reports(algo, True)
        )
    flat = flatten_numbers({k: v for k, v in result.items() if k != "config"})
    progress.rows.append(row)
    metrics.write(row, flat)
    run.tracker.log_row(row)
    print_row(row)
    record_restarts(progress, result, row["iteration"])
    found = guard.non_finite(result) if settings.guard.non_finite != NonFinite.off else {}
    if found:
        text = guard.describe(found, row["iteration"])
        if settings.guard.non_finite == NonFinite.stop:
            progress.non_finite = found
            progress.end("non_finite", text)
            return text  # before any checkpoint: the broken weights are never saved
        console.print(f"warning: {text} (guard.non_finite=warn: going on)")
    ret = row["episode_return_mean"]
    if ret is not None and (progress.best is None or ret > progress.best):
        progress.best = ret
    every = settings.checkpoint.every
    if every and algo.iteration % every == 0:
        save_checkpoint(algo, run, progress)
    record = settings.record
    if record.every and algo.iteration % record.every == 0:
        video.record(
            algo.config,
            algo.env_runner.get_state(),
            run.run_dir / "videos",
            record.episodes,
            record.explore,
            f"iter_{algo.iteration:06d}",
        )
    return (
        progress.check.update(flat, row["env_steps"] or 0, seconds)
        or stop_reason(settings.stop, row, seconds)
        or ""
    )


def _abort(run: TaskRun, progress: Progress) -> Callable[[int], None]:
    """The second signal during training: summary.json as it stands, before the exit."""

    def abort(signum: int) -> None:
        newest = checkpoints.latest(run.run_dir)
        write_json(
            run.run_dir / "summary.json",
            {
                "status": "aborted",
                "stop_reason": f"aborted by a second {signal_name(signum)}",
                "signal": signal_name(signum),
                "iterations": progress.iteration,
                "checkpoint": str(newest or ""),
                **run.provenance,
            },
        )

    return abort


def _interrupted(progress: Progress, watch: Watch, run_dir: Path) -> None:
    """A KeyboardInterrupt is the watch breaking in: a stall, or an iteration that
    outlived the grace after a signal."""
    if watch.cause == "stalled":
        progress.end(
            "stalled",
            f"stalled: no iteration finished within {watch.stall_seconds:g} s "
            f"(watchdog.seconds); {waiting_for()}",
        )
    elif watch.cause == "abandoned":
        progress.signum, progress.abandoned = watch.signum, True
        newest = checkpoints.latest(run_dir)
        progress.end(
            "interrupted",
            f"interrupted by {signal_name(watch.signum)}: the iteration in flight was "
            f"abandoned after {watch.grace_seconds:g} s (shutdown.grace_seconds); "
            f"newest checkpoint: {newest or 'none'}",
        )
    else:  # a KeyboardInterrupt raised by something else: treat it as Ctrl-C
        progress.signum = signal.SIGINT
        progress.end("interrupted", "interrupted by SIGINT")


def _finish(algo: Algorithm | None, run: TaskRun, progress: Progress) -> list[dict[str, Any]]:
    """Compile reports, the final checkpoint and the Algorithm's stop, as far as the way
    the run ended allows: a stalled or crashed Algorithm is left to Ray's shutdown, and
    nothing from a non-finite or abandoned iteration is saved."""
    if algo is None or progress.status == "stalled":
        return []
    if progress.status == "failed":
        # Stop what is left now: RLlib's LearnerGroup would otherwise try again from its
        # __del__ at exit, after Ray's shutdown, and start a new Ray to do it.
        with contextlib.suppress(Exception):
            algo.stop()
        algo.learner_group._is_shut_down = True
        return []
    clean = progress.status in ("finished", "interrupted") and not progress.abandoned
    reports = []
    if clean and progress.rows:
        reports = compile_report.collect(algo, verify=run.spec is not None and run.spec.env_runners)
        final = checkpoints.checkpoint_dir(run.run_dir, algo.iteration)
        wanted = run.settings.checkpoint.at_end or progress.status == "interrupted"
        if wanted and not final.exists():
            save_checkpoint(algo, run, progress)
    algo.stop()
    return reports


def train(run: TaskRun) -> dict[str, Any]:
    """Train until a stop criterion holds, a signal, a stall, a non-finite value or a
    crash; return the run's figures."""
    settings, run_dir = run.settings, run.run_dir
    progress = Progress(check=Check(settings.check))
    metrics = MetricsLog(run_dir, run.history)
    algo: Algorithm | None = None
    train_start = time.perf_counter()
    nodes: list[str] = []
    reports: list[dict[str, Any]] = []
    watch = Watch(settings.shutdown.grace_seconds, settings.watchdog, _abort(run, progress))
    with watch:
        try:
            with watch.build():
                algo = run.config.build_algo()
                if run.checkpoint is not None:
                    algo.restore_from_path(str(run.checkpoint.resolve()))
                    console.print(f"resumed from {run.checkpoint} at iteration {algo.iteration}")
            nodes = env_runner_nodes(algo)
            train_start = time.perf_counter()
            while not progress.reason:
                if watch.signum is not None:
                    progress.signum = watch.signum
                    progress.end("interrupted", f"interrupted by {signal_name(watch.signum)}")
                    break
                learners_in_service(algo)
                with watch.iteration():
                    result = algo.train()
                seconds = time.perf_counter() - train_start
                progress.reason = after_iteration(algo, run, progress, result, metrics, seconds)
        except KeyboardInterrupt:
            _interrupted(progress, watch, run_dir)
        except Exception as ex:  # a crash: the summary says so, the traceback goes on up
            progress.error = ex
            progress.end("failed", one_line(ex))
        finally:
            metrics.close()
        try:
            reports = _finish(algo, run, progress)
        except Exception as ex:  # e.g. a full disk while writing the final checkpoint
            progress.error = progress.error or ex
            progress.end("failed", one_line(ex))
    train_seconds = time.perf_counter() - train_start
    rows = progress.rows
    steps_this_run = sum(r["env_steps_this_iter"] or 0 for r in rows)
    last = rows[-1] if rows else {}
    return {
        "status": progress.status,
        "stop_reason": progress.reason,
        "signal": signal_name(progress.signum) if progress.signum else None,
        "iterations": last.get("iteration"),
        "iterations_this_run": len(rows),
        "env_steps": last.get("env_steps"),
        "final_episode_return_mean": last.get("last_episode_return_mean"),
        "final_module_episode_returns_mean": last.get("module_episode_returns_mean"),
        "best_episode_return_mean": progress.best,
        "wall_seconds": time.perf_counter() - run.start_time,
        "train_seconds": train_seconds,
        "env_steps_per_s": steps_this_run / train_seconds if train_seconds else None,
        "first_iteration_seconds": rows[0]["wall_seconds"] if rows else None,
        "resumed_from": str(run.checkpoint) if run.checkpoint else None,
        "checkpoint": str(checkpoints.latest(run_dir) or ""),
        "checkpoints": [str(p) for p in checkpoints.complete(run_dir)],
        "restarts": progress.restarts,
        "non_finite": progress.non_finite,
        "compile_reports": reports,
        "env_runner_nodes": nodes,
        "progress": progress,
    }


class RunEnded(RunnerError):
    """The run stopped on a stall or a non-finite value: exit code 1 (its summary says why)."""

    exit_code = 1


def run(run: TaskRun) -> None:
    """Train, then summary.json with the compile section and where it ran; then the exit
    the outcome calls for (a signal's 128 + n, 1 for a stall, a non-finite value or a
    missed check, the crash itself)."""
    figures = train(run)
    progress: Progress = figures.pop("progress")
    reports = figures.pop("compile_reports")
    compile_section, compile_line = compile_report.summarize(run.spec, reports, run.auto)
    if figures["iterations"] is not None:
        console.print(compile_line)
    summary = {
        **figures,
        "check": progress.check.to_dict(),
        "compile": compile_section,
        # The GPU each EnvRunner and Learner ran on (a machine may hold several models).
        "gpus_used": compile_report.gpus_used(reports),
        **run.provenance,
    }
    write_json(run.run_dir / "summary.json", summary)
    console.print(
        f"{'done' if progress.status == 'finished' else 'stopped'} "
        f"({summary['stop_reason'] or 'no stop criterion'}): "
        f"{summary['iterations'] or 0} iterations, {summary['env_steps'] or 0:,.0f} env steps, "
        f"{summary['wall_seconds']:.1f} s; results in {run.run_dir}"
    )
    if progress.error is not None:
        raise progress.error
    if progress.signum is not None:
        newest = summary["checkpoint"]
        raise Interrupted(
            progress.signum,
            f"{progress.reason}; "
            + (
                f"checkpoint {newest}; continue with resume={run.run_dir}"
                if newest
                else "no checkpoint was written"
            ),
        )
    if progress.status in ("stalled", "non_finite"):
        newest = summary["checkpoint"]
        raise RunEnded(
            progress.reason
            + (
                f"; the last good checkpoint is {newest}"
                if progress.status == "non_finite" and newest
                else ""
            )
        )
    progress.check.raise_if_failed()


TASK = Task(name="train", settings=TrainSettings, run=run, check=check, compile_auto=True)
