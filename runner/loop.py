"""The one training loop: every `Algorithm.train()` the runner makes is called here.

task=train, each Ray Tune trial and both copies of the exploration bench drive a
`Training`: one iteration at a time, each printed, appended to metrics.jsonl, TensorBoard
and the tracker, checked for non-finite losses, gradient norms and returns
(runner/guard.py), held against the pass criterion (`check.*`) and the stop criteria
(`stop.*`), checkpointed every `checkpoint.every` iterations (whole or not at all, ranked
by the evaluation return when `eval.every` evaluates during training:
runner/results/checkpoints.py) and, with `record.every`, recorded to videos/
(runner/video.py). `train` adds the watch (signals, the grace after one, the stall
watchdog: runner/shutdown.py), the final checkpoint and the run's figures. A signal, a
stall, a non-finite value or a crash ends a run the same way, with `status` saying which
and the checkpoints that finished kept.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner import guard
from runner.check import Check
from runner.console import console
from runner.errors import RunnerError, one_line
from runner.results import checkpoints
from runner.results.files import MetricsLog, flatten_numbers, headline, write_json
from runner.schema import NonFinite, StopConfig
from runner.shutdown import Watch, signal_name
from runner.tasks.base import TaskRun


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


def learners_in_service(algo: Any) -> None:
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


def env_runner_nodes(algo: Any) -> list[str]:
    """The Ray node id of each remote EnvRunner (on a cluster: where they were placed)."""
    import ray

    return algo.env_runner_group.foreach_env_runner(
        lambda _: ray.get_runtime_context().get_node_id(), local_env_runner=False
    )


class Training:
    """One Algorithm trained under the run's rules, an iteration per `step`.

    `run.run_dir` None keeps nothing on disk (the exploration bench's copies); `quiet`
    prints no row; `on_iteration(training, result, reason)` runs after each iteration's
    own bookkeeping (a Tune trial reports there)."""

    def __init__(
        self,
        run: TaskRun,
        quiet: bool = False,
        on_iteration: Callable[[Training, dict, str], None] | None = None,
    ) -> None:
        self.run = run
        self.settings = run.settings
        self.quiet = quiet
        self.on_iteration = on_iteration
        self.progress = Progress(check=Check(run.settings.check))
        self.metrics = MetricsLog(run.run_dir, run.history) if run.run_dir else None
        self.algo: Any = None
        self.saved: Path | None = None  # the checkpoint this iteration wrote, if any
        self.iteration_seconds = 0.0  # the last Algorithm.train()'s own seconds
        # The return the checkpoint resumed from last knew, for iterations that end no
        # episode before this run's first does (a Tune searcher needs it in every result).
        self.resumed_row: dict[str, Any] | None = None
        self.train_start = time.perf_counter()

    def build(self) -> Any:
        """The Algorithm, restored from the run's checkpoint when it has one; a check
        against a random policy measures that policy first."""
        check = self.progress.check
        if check.needs_baseline:
            from runner.envs import make_env, random_returns

            env = make_env(self.run.config)
            try:
                returns = random_returns(env, self.settings.seed, check.config.baseline_episodes)
            finally:
                env.close()
            line = check.set_baseline(returns, self.settings.seed)
            if not self.quiet:
                console.print(line)
        self.algo = self.run.config.build_algo()
        if self.run.checkpoint is not None:
            self.algo.restore_from_path(str(Path(self.run.checkpoint).resolve()))
            known = (checkpoints.manifest(Path(self.run.checkpoint)) or {}).get(
                "episode_return_mean"
            )
            if known is not None:
                self.resumed_row = {"last_episode_return_mean": known, "return_age": 0}
            console.print(f"resumed from {self.run.checkpoint} at iteration {self.algo.iteration}")
        self.train_start = time.perf_counter()
        return self.algo

    def step(self, watch: Watch) -> str:
        """One iteration and what follows it; the stop reason, or '' to go on."""
        learners_in_service(self.algo)
        with watch.iteration():
            start = time.perf_counter()
            result = self.algo.train()
            self.iteration_seconds = time.perf_counter() - start
        self.progress.reason = self._after(result, time.perf_counter() - self.train_start)
        if self.on_iteration is not None:
            self.on_iteration(self, result, self.progress.reason)
        return self.progress.reason

    def _after(self, result: dict, seconds: float) -> str:
        """Record one finished iteration; the stop reason, or '' to go on."""
        run, settings, progress, algo = self.run, self.settings, self.progress, self.algo
        self.saved = None
        row = headline(result, time.perf_counter() - run.start_time)
        carry_last_return(row, progress.rows[-1] if progress.rows else self.resumed_row)
        if run.spec is not None and run.spec.env_runners:
            from runner.compile import report as compile_report

            row["compile_max_abs_diff"] = compile_report.max_diff(
                compile_report.env_runner_reports(algo, True)
            )
        flat = flatten_numbers({k: v for k, v in result.items() if k != "config"})
        progress.rows.append(row)
        if self.metrics is not None:
            self.metrics.write(row, flat)
        run.tracker.log(row, flat)
        if not self.quiet:
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
        ret, evaluated = row["episode_return_mean"], row["eval_return_mean"]
        if ret is not None and (progress.best is None or ret > progress.best):
            progress.best = ret
        if evaluated is not None:
            progress.last_eval = evaluated
            best = progress.best_eval
            progress.best_eval = evaluated if best is None else max(best, evaluated)
        every = settings.checkpoint.every
        if every and algo.iteration % every == 0:
            self.save_checkpoint()
        record = settings.record
        if record.every and algo.iteration % record.every == 0 and run.run_dir:
            from runner import video

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

    def save_checkpoint(self) -> Path | None:
        """A checkpoint with its manifest, then the older ones beyond checkpoint.keep
        pruned; none for a run that keeps nothing on disk."""
        run_dir = self.run.run_dir
        if run_dir is None or not self.progress.rows:
            return None
        row, progress = self.progress.rows[-1], self.progress
        ranked_by = checkpoints.ranked_by(self.settings.eval.every)
        self.saved = checkpoints.save(
            self.algo,
            run_dir,
            {
                "iteration": self.algo.iteration,
                "env_steps": row["env_steps"],
                "episode_return_mean": row["last_episode_return_mean"],
                "eval_return_mean": progress.last_eval,
                "ranked_by": ranked_by,
                "score": progress.last_eval
                if ranked_by == checkpoints.EVALUATION
                else row["last_episode_return_mean"],
            },
            verify=lambda: learners_in_service(self.algo),
            scratch=self.run.scratch,
        )
        keep = self.settings.checkpoint
        checkpoints.prune(run_dir, keep.keep, keep.keep_best, self.run.scratch)
        if self.run.mirror is not None:
            try:
                self.run.mirror.push()
            except RunnerError as ex:  # what is not there yet goes with the next copy
                console.print(f"warning: {ex} (copied again after the next checkpoint)")
        return self.saved

    def interrupted(self, watch: Watch) -> None:
        """A KeyboardInterrupt is the watch breaking in: a stall, or an iteration that
        outlived the grace after a signal."""
        progress = self.progress
        if watch.cause == "stalled":
            from runner.ray_session import waiting_for

            progress.end(
                "stalled",
                f"stalled: no iteration finished within {watch.stall_seconds:g} s "
                f"(watchdog.seconds); {waiting_for()}",
            )
        elif watch.cause == "abandoned":
            assert watch.signum is not None  # abandoned after a signal
            progress.signum, progress.abandoned = watch.signum, True
            newest = checkpoints.latest(self.run.run_dir) if self.run.run_dir else None
            progress.end(
                "interrupted",
                f"interrupted by {signal_name(watch.signum)}: the iteration in flight was "
                f"abandoned after {watch.grace_seconds:g} s (shutdown.grace_seconds); "
                f"newest checkpoint: {newest or 'none'}",
            )
        else:  # a KeyboardInterrupt raised by something else: treat it as Ctrl-C
            progress.signum = signal.SIGINT
            progress.end("interrupted", "interrupted by SIGINT")

    def finish(self) -> list[dict[str, Any]]:
        """Compile reports, the final checkpoint and the Algorithm's stop, as far as the
        way the run ended allows: a stalled or crashed Algorithm is left to Ray's shutdown,
        and nothing from a non-finite or abandoned iteration is saved."""
        algo, progress, run = self.algo, self.progress, self.run
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
            from runner.compile import report as compile_report

            verify = run.spec is not None and run.spec.env_runners
            reports = compile_report.collect(algo, verify=verify)
            if run.run_dir is not None:
                final = checkpoints.checkpoint_dir(run.run_dir, algo.iteration)
                wanted = self.settings.checkpoint.at_end or progress.status == "interrupted"
                if wanted and not final.exists():
                    self.save_checkpoint()
        algo.stop()
        return reports

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()


def _abort(run: TaskRun, progress: Progress) -> Callable[[int], None]:
    """The second signal during training: summary.json as it stands, before the exit."""

    def abort(signum: int) -> None:
        if run.run_dir is None:
            return
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


def watch_for(training: Training) -> Watch:
    """The watch over one training: signals, the grace after one, the stall watchdog."""
    settings = training.settings
    return Watch(
        settings.shutdown.grace_seconds,
        settings.watchdog,
        _abort(training.run, training.progress),
    )


def train(
    run: TaskRun, on_iteration: Callable[[Training, dict, str], None] | None = None
) -> dict[str, Any]:
    """Train until a stop criterion holds, a signal, a stall, a non-finite value or a
    crash; return the run's figures (`progress` and `compile_reports` among them)."""
    training = Training(run, on_iteration=on_iteration)
    progress = training.progress
    nodes: list[str] = []
    reports: list[dict[str, Any]] = []
    watch = watch_for(training)
    with watch:
        try:
            with watch.build():
                training.build()
            nodes = env_runner_nodes(training.algo)
            while not progress.reason:
                if watch.signum is not None:
                    progress.signum = watch.signum
                    progress.end("interrupted", f"interrupted by {signal_name(watch.signum)}")
                    break
                training.step(watch)
        except KeyboardInterrupt:
            training.interrupted(watch)
        except Exception as ex:  # a crash: the summary says so, the traceback goes on up
            progress.error = ex
            progress.end("failed", one_line(ex))
        finally:
            training.close()
        try:
            reports = training.finish()
        except Exception as ex:  # e.g. a full disk while writing the final checkpoint
            progress.error = progress.error or ex
            progress.end("failed", one_line(ex))
    train_seconds = time.perf_counter() - training.train_start
    rows = progress.rows
    steps_this_run = sum(r["env_steps_this_iter"] or 0 for r in rows)
    last = rows[-1] if rows else {}
    run_dir = run.run_dir
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
        "final_eval_return_mean": progress.last_eval,
        "best_eval_return_mean": progress.best_eval,
        "best_checkpoint": str(checkpoints.best(run_dir) or "") if run_dir else "",
        "checkpoints_ranked_by": checkpoints.ranked_by(run.settings.eval.every),
        "wall_seconds": time.perf_counter() - run.start_time,
        "train_seconds": train_seconds,
        "env_steps_per_s": steps_this_run / train_seconds if train_seconds else None,
        "first_iteration_seconds": rows[0]["wall_seconds"] if rows else None,
        "resumed_from": str(run.checkpoint) if run.checkpoint else None,
        "checkpoint": str(checkpoints.latest(run_dir) or "") if run_dir else "",
        "checkpoints": [str(p) for p in checkpoints.complete(run_dir)] if run_dir else [],
        "restarts": progress.restarts,
        "non_finite": progress.non_finite,
        "compile_reports": reports,
        "env_runner_nodes": nodes,
        "progress": progress,
    }
