"""The one training loop: every `Algorithm.train()` the runner makes is called here.

task=train, each Ray Tune trial and both copies of the exploration bench drive a
`Training`: one iteration at a time, its row kept, then handed to the run's callbacks
(runner/job/callbacks.py), which print it, write it to metrics.jsonl, TensorBoard and the
loggers, guard against non-finite values, checkpoint (whole or not at all, ranked by the
evaluation return when `eval.every` evaluates during training:
runner/results/checkpoints.py), record video, hold it against the pass criterion and
the stop criteria, and may ask to stop. `train` adds the watch (signals, the grace after
one, the stall watchdog: runner/machine/shutdown.py), the final checkpoint and the run's
figures. A signal, a stall, a non-finite value or a crash ends a run the same way, with
`status` saying which and the checkpoints that finished kept.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from runner.console import console
from runner.envs.masking import MAIN
from runner.errors import RunnerError, one_line
from runner.job import callbacks
from runner.job.callbacks import Callback, Decision, Iteration, Progress
from runner.job.check import Check
from runner.job.task import TaskRun
from runner.machine.shutdown import Watch, signal_name
from runner.results import checkpoints
from runner.results.files import flatten_numbers, headline


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


# Where RLlib's result holds each restarting component's lifetime restart count and
# its healthy actors now, and the AlgorithmConfig key that counts its actors.
RESTART_COUNTERS = {
    "env_runners": ("fault_tolerance", "num_env_runners"),
    "evaluation_env_runners": ("evaluation", "evaluation_num_env_runners"),
}


def note_restarts(progress: Progress, result: dict, iteration: int, config: Any) -> bool:
    """RLlib recreates a dead EnvRunner within a few iterations (and the compile
    callback compiles the new one): note per component when actors were lost and when
    they came back. True when training's EnvRunners are short now or were lost or
    recreated in this iteration."""
    troubled = False
    for component, (section, count_key) in RESTART_COUNTERS.items():
        stats = result.get(section) or {}
        if "num_healthy_workers" not in stats:
            continue
        healthy = int(stats["num_healthy_workers"])
        count = int(stats.get("num_remote_worker_restarts") or 0)
        wanted = int(getattr(config, count_key, 0) or 0)
        count_before, healthy_before = progress.actor_counts.get(component, (0, wanted))
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
        if component == "env_runners":
            troubled = healthy < wanted or any(n > 0 for n in events.values())
    return troubled


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

    Its callbacks are those the run's config asks for (`quiet`: no printed row; `run_dir`
    None: no files), then `extra` (a Tune trial's reporter)."""

    def __init__(self, run: TaskRun, quiet: bool = False, extra: Sequence[Callback] = ()) -> None:
        self.run = run
        self.settings = run.settings
        self.quiet = quiet
        self.progress = Progress(check=Check(run.settings.check))
        self.callbacks = [*callbacks.for_run(run, quiet), *extra]
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
        began = time.perf_counter()
        self.algo = self.run.config.build_algo()
        self.run.record.setdefault("startup", {})["build_s"] = time.perf_counter() - began
        if self.run.checkpoint is not None:
            self.algo.restore_from_path(str(Path(self.run.checkpoint).resolve()))
            known = (checkpoints.manifest(Path(self.run.checkpoint)) or {}).get(
                "episode_return_mean"
            )
            if known is not None:
                self.resumed_row = {"last_episode_return_mean": known, "return_age": 0}
            console.print(f"resumed from {self.run.checkpoint} at iteration {self.algo.iteration}")
        self.train_start = time.perf_counter()
        for callback in self.callbacks:
            callback.on_start(self)
        return self.algo

    @property
    def faulted(self) -> bool:
        """This iteration's values are not to be kept (a non-finite one, or an EnvRunner
        error that repeated, stopped the run)."""
        return self.progress.status in ("non_finite", "failed")

    def step(self, watch: Watch) -> str:
        """One iteration and what follows it; the stop reason, or '' to go on."""
        learners_in_service(self.algo)
        with watch.iteration():
            start = time.perf_counter()
            result = self.algo.train()
            self.iteration_seconds = time.perf_counter() - start
        self.run.record.setdefault("startup", {}).setdefault(
            "first_iteration_s", self.iteration_seconds
        )
        self._after(result, time.perf_counter() - self.train_start)
        return self.progress.reason

    def _after(self, result: dict, seconds: float) -> None:
        """Keep one finished iteration's row, then hand it to each callback; the first
        reason to stop one gives is the run's."""
        run, progress, algo = self.run, self.progress, self.algo
        self.saved = None
        focus = MAIN if run.settings.env.opponent is not None else None
        row = headline(result, time.perf_counter() - run.start_time, focus)
        carry_last_return(row, progress.rows[-1] if progress.rows else self.resumed_row)
        if run.spec is not None and run.spec.env_runners:
            from runner.compile import report as compile_report

            row["compile_max_abs_diff"] = compile_report.max_diff(
                compile_report.env_runner_reports(algo, True)
            )
        flat = flatten_numbers({k: v for k, v in result.items() if k != "config"})
        progress.rows.append(row)
        ret, evaluated = row["episode_return_mean"], row["eval_return_mean"]
        if ret is not None and (progress.best is None or ret > progress.best):
            progress.best = ret
        if evaluated is not None:
            progress.last_eval = evaluated
            best = progress.best_eval
            progress.best_eval = evaluated if best is None else max(best, evaluated)
        troubled = note_restarts(progress, result, row["iteration"], algo.config)
        it = Iteration(result, row, flat, seconds, troubled)
        for callback in self.callbacks:
            self._carry_out(callback.on_iteration(self, it))

    def _carry_out(self, decision: str | Decision | None) -> None:
        """A callback's decision, as it comes: a checkpoint now; the first stop is the
        run's (a reason alone, a user's callback's, stops it as finished)."""
        if not decision:
            return
        if isinstance(decision, str):
            decision = Decision(decision)
        if decision.checkpoint:
            self.save_checkpoint()
        progress = self.progress
        if decision.reason and not progress.reason:
            progress.end(decision.status, decision.reason)
            progress.error = decision.error
            self.run.record.update(decision.record)

    @property
    def objective(self) -> float | None:
        """What ranks a run's moments, defined once (a checkpoint's score, a search's
        metric): the newest evaluation return where the run evaluates (eval.every), else
        the last known training return mean."""
        if checkpoints.ranked_by(self.settings.eval.every) == checkpoints.EVALUATION:
            return self.progress.last_eval
        rows = self.progress.rows
        return rows[-1]["last_episode_return_mean"] if rows else None

    def save_checkpoint(self) -> Path | None:
        """A checkpoint with its manifest, then the older ones beyond checkpoint.keep
        pruned; none for a run that keeps nothing on disk."""
        run_dir = self.run.run_dir
        if run_dir is None or not self.progress.rows:
            return None
        row, progress = self.progress.rows[-1], self.progress
        self.saved = checkpoints.save(
            self.algo,
            run_dir,
            {
                "iteration": self.algo.iteration,
                "env_steps": row["env_steps"],
                "episode_return_mean": row["last_episode_return_mean"],
                "eval_return_mean": progress.last_eval,
                "ranked_by": checkpoints.ranked_by(self.settings.eval.every),
                "score": self.objective,
            },
            verify=lambda: learners_in_service(self.algo),
            scratch=self.run.scratch,
        )
        keep = self.settings.checkpoint
        checkpoints.prune(run_dir, keep.keep, keep.keep_best, self.run.scratch)
        for callback in self.callbacks:
            callback.on_checkpoint(self, self.saved)
        return self.saved

    def interrupted(self, watch: Watch) -> None:
        """A KeyboardInterrupt is the watch breaking in: a stall, or an iteration that
        outlived the grace after a signal."""
        progress = self.progress
        if watch.cause == "stalled":
            from runner.machine.ray_session import waiting_for

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

    def end(self, outcome: dict[str, Any]) -> None:
        """Each callback's on_end, all of them even when one fails (the first error is
        raised after)."""
        error: Exception | None = None
        for callback in self.callbacks:
            try:
                callback.on_end(self, outcome)
            except Exception as ex:
                error = error or ex
        if error is not None:
            raise error


def _abort(run: TaskRun, progress: Progress) -> Callable[[int], None]:
    """The second signal during training: summary.json as it stands, before the exit."""

    def abort(signum: int) -> None:
        newest = checkpoints.latest(run.run_dir) if run.run_dir else None
        run.aborted(signum, {"iterations": progress.iteration, "checkpoint": str(newest or "")})

    return abort


def watch_for(training: Training) -> Watch:
    """The watch over one training: signals, the grace after one, the stall watchdog."""
    settings = training.settings
    return Watch(
        settings.shutdown.grace_seconds,
        settings.watchdog,
        _abort(training.run, training.progress),
    )


def train(run: TaskRun, extra: Sequence[Callback] = ()) -> dict[str, Any]:
    """Train until a stop criterion holds, a signal, a stall, a non-finite value or a
    crash; return the run's figures (`progress` and `compile_reports` among them), which
    each callback's on_end gets first."""
    training = Training(run, extra=extra)
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
        try:
            reports = training.finish()
        except Exception as ex:  # e.g. a full disk while writing the final checkpoint
            progress.error = progress.error or ex
            progress.end("failed", one_line(ex))
    outcome = _outcome(run, progress, time.perf_counter() - training.train_start)
    outcome |= {"compile_reports": reports, "env_runner_nodes": nodes, "progress": progress}
    training.end(outcome)
    return outcome


def _outcome(run: TaskRun, progress: Progress, train_seconds: float) -> dict[str, Any]:
    """The run's figures, from the rows of its iterations and its run dir's checkpoints."""
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
        "non_finite": run.record.get("non_finite", {}),
    }
