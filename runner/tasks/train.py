"""task=train: build the Algorithm, train it with the one loop (runner/job/loop.py) until a
stop criterion; its figures, the compile section and where it ran go into the run record.

With compile on the EnvRunners, every iteration (after the weight sync) replays each
compiled module's last input through compiled and eager code: `compile_max_abs_diff`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from runner.errors import RunEnded
from runner.job.task import Task, TaskRun
from runner.machine.shutdown import Interrupted
from runner.settings.schema import RunnerConfig, TaskSettings


@dataclass
class TrainSettings(TaskSettings):
    """Training takes its settings from the `stop` and `checkpoint` sections."""

    name: ClassVar[str] = "train"


def configure(config: Any, settings: RunnerConfig) -> None:
    """With `record.every`, the env must draw frames: one line before Ray starts if not."""
    if settings.record.every:
        from runner.envs import video

        video.check_renders(config)


def draw_learning_curve(run: TaskRun, progress: Any) -> None:
    """learning_curve.png, however the run ended (a signal and a crash included)."""
    from runner.results import plots
    from runner.results.files import return_points

    rows = progress.rows
    training = return_points(rows)
    evaluation = [(r["env_steps"] or 0, r["eval_return_mean"]) for r in rows]
    evaluated = [(x, y) for x, y in evaluation if y is not None]
    if training or evaluated:
        threshold = progress.check.threshold if progress.check.active else None
        plots.learning_curve(run.files / "learning_curve.png", training, evaluated, threshold)


def run(run: TaskRun) -> None:
    """Train, then the run record's figures with the compile section and where it ran; then the exit
    the outcome calls for (a signal's 128 + n, 1 for a stall, a non-finite value or a
    missed check, the crash itself)."""
    from runner.compile import report as compile_report
    from runner.console import console
    from runner.job import loop
    from runner.job.callbacks import Progress

    figures = loop.train(run)
    progress: Progress = figures.pop("progress")
    reports = figures.pop("compile_reports")
    compile_section, compile_line = compile_report.summarize(
        run.spec, reports, chosen="compile_auto" in run.record
    )
    if figures["iterations"] is not None:
        console.print(compile_line)
    summary = {
        **figures,
        "check": progress.check.to_dict(),
        "compile": compile_section,
        # The GPU each EnvRunner and Learner ran on (a machine may hold several models).
        "gpus_used": compile_report.gpus_used(reports),
    }
    run.record.update(summary)  # summary.json: the job writes it, whatever is raised below
    draw_learning_curve(run, progress)
    console.print(
        f"{'done' if progress.status == 'finished' else 'stopped'} "
        f"({summary['stop_reason'] or 'no stop criterion'}): "
        f"{summary['iterations'] or 0} iterations, {summary['env_steps'] or 0:,.0f} env steps, "
        f"{summary['wall_seconds']:.1f} s; results in {run.files}"
    )
    if progress.error is not None:
        raise progress.error
    if progress.signum is not None:
        newest = summary["checkpoint"]
        raise Interrupted(
            progress.signum,
            f"{progress.reason}; "
            + (
                f"checkpoint {newest}; continue with resume={run.files}"
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


TASK = Task(
    settings=TrainSettings,
    run=run,
    configure=configure,
    compile_auto=True,
    trains=True,
)
