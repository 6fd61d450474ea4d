"""task=exploration_bench: training with compiled EnvRunners vs the same run eager.

After RLlib's published method (run_ppo_with_inference_bm.py): two copies of one run, same
seed and settings, differing only in compile. Both exist at once, as published (hence its
2 x 64 EnvRunners), so the plan counts their actors twice. Iterations alternate between the
copies, and the copy that goes first swaps every round, so drift on a noisy machine hits
both alike. The published figure, `num_env_steps_sampled_throughput_per_sec`, is the env
steps sampled in an iteration over that iteration's seconds; here each iteration is timed
around `Algorithm.train()` (RLlib's own timers are smoothed), and a copy's figure is its
timed iterations' env steps over their seconds. Warm-up iterations (the first one compiles)
are kept in the rows but not counted.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from runner.console import console
from runner.errors import ConfigError, RunnerError
from runner.job.task import Task, TaskRun, own_settings
from runner.machine.shutdown import Interrupted
from runner.results import plots
from runner.results.files import BENCH, write_csv, write_json
from runner.settings.schema import RecordConfig, RunnerConfig, StopConfig, TaskSettings

if TYPE_CHECKING:  # light at import: the task's heavy modules load when it runs
    from runner.compile.settings import CompileSpec
    from runner.machine.plan import Plan


NEEDS_ENV_RUNNER_COMPILE = (
    "task=exploration_bench compares compiled with eager EnvRunners: pick a compile preset "
    "and keep compile.env_runners=true, e.g. compile=inductor_default"
)
COPIES = ("compiled", "eager")


@dataclass
class ExplorationBenchSettings(TaskSettings):
    """Training iterations per copy: untimed warm-up first, then timed."""

    name: ClassVar[str] = "exploration_bench"

    warmup_iterations: int = 1
    timed_iterations: int = 3


def check(settings: RunnerConfig, spec: CompileSpec | None) -> list[str]:
    """Bad exploration_bench settings, caught before anything is built or started."""
    task = own_settings(settings, ExplorationBenchSettings)
    if spec is None or not spec.env_runners:
        raise ConfigError(NEEDS_ENV_RUNNER_COMPILE)
    if task.timed_iterations < 1 or task.warmup_iterations < 0:
        raise ConfigError(
            "task.timed_iterations must be >= 1 and task.warmup_iterations >= 0, got "
            f"{task.timed_iterations} and {task.warmup_iterations}"
        )
    return []


def both_copies(plan: Plan, settings: RunnerConfig) -> Plan:
    """Both copies exist at once, as published: their actors count twice."""
    return plan.copies(2, "x2: an eager and a compiled copy at once")


def eager_twin(settings: RunnerConfig) -> RunnerConfig:
    """The same settings with compile off: the benchmark's eager copy."""
    off = dataclasses.replace(settings.compile, backend=None, env_runners=False, learners=False)
    return dataclasses.replace(settings, compile=off)


def _run_rounds(
    trainings: dict[str, Any], watch: Any, warmup: int, timed: int
) -> list[dict[str, Any]]:
    """Alternate one iteration of each copy through the one training loop, the copy that
    goes first swapping every round; each row timed by the loop around Algorithm.train()."""
    rows = []
    for i in range(warmup + timed):
        order = COPIES if i % 2 == 0 else COPIES[::-1]
        for name in order:
            training = trainings[name]
            if watch.signum is not None:
                raise Interrupted(watch.signum, "the benchmark was interrupted: nothing kept")
            if training.step(watch) and training.progress.status == "non_finite":
                raise RunnerError(f"the {name} copy: {training.progress.reason}")
            head, seconds = training.progress.rows[-1], training.iteration_seconds
            steps = head["env_steps_this_iter"] or 0
            row = {
                "iteration": head["iteration"],
                "copy": name,
                "timed": i >= warmup,
                "env_steps": steps,
                "seconds": seconds,
                "env_steps_per_s": steps / seconds,
                "episode_return_mean": head["episode_return_mean"],
                "compile_max_abs_diff": head.get("compile_max_abs_diff"),
            }
            rows.append(row)
            console.print(
                f"iter {row['iteration']:>3} {name:>8} | {steps:>7,.0f} env steps | "
                f"{seconds:6.2f} s | {row['env_steps_per_s']:8,.0f} steps/s"
                + ("" if row["timed"] else " | warm-up, not counted")
            )
    return rows


def figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Each copy's env steps per second over its timed iterations, and the speedup."""
    out: dict[str, Any] = {}
    for name in COPIES:
        timed = [r for r in rows if r["copy"] == name and r["timed"]]
        steps, seconds = sum(r["env_steps"] for r in timed), sum(r["seconds"] for r in timed)
        out[f"{name}_env_steps_per_s"] = steps / seconds if seconds else None
        out[f"{name}_timed_env_steps"] = steps
    eager, comp = out["eager_env_steps_per_s"], out["compiled_env_steps_per_s"]
    out["speedup"] = comp / eager - 1 if eager and comp else None
    return out


def _both_copies(
    run: TaskRun, task: ExplorationBenchSettings
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The compiled copy and its eager twin built, then their rounds run in turn: each
    round's rows, and the compiled copy's compile reports."""
    from runner.algorithms.algorithm_config import build_algorithm_config
    from runner.compile import report as compile_report
    from runner.job import loop

    settings, spec = run.settings, run.spec
    # Both copies keep nothing on disk (the bench's files are its own) and run every
    # iteration the rounds ask for: stop.*, check.* and periodic checkpoints do not apply.
    rounds = dataclasses.replace(
        settings,
        stop=StopConfig(),
        check=dataclasses.replace(settings.check, enabled=False),
        checkpoint=dataclasses.replace(settings.checkpoint, every=0, at_end=False),
        record=RecordConfig(),
    )
    twin = eager_twin(rounds)
    copies = {
        "compiled": TaskRun(rounds, run.config, spec, None, {}, run.start_time),
        "eager": TaskRun(twin, build_algorithm_config(twin, None), None, None, {}, run.start_time),
    }
    trainings = {name: loop.Training(copy, quiet=True) for name, copy in copies.items()}
    watch = loop.watch_for(trainings["compiled"])
    with watch:
        try:
            for training in trainings.values():
                with watch.build():
                    training.build()
            rows = _run_rounds(trainings, watch, task.warmup_iterations, task.timed_iterations)
            reports = compile_report.collect(trainings["compiled"].algo, verify=True)
        finally:
            for training in trainings.values():
                if training.algo is not None:
                    training.algo.stop()
    return rows, reports


def run(run: TaskRun) -> None:
    """Run both copies, then write bench.json, bench.csv and bench.png."""
    from runner.compile import report as compile_report

    settings, config, spec = run.settings, run.config, run.spec
    assert spec is not None  # check() refused compile off
    task = own_settings(settings, ExplorationBenchSettings)
    # Both copies keep nothing on disk (the bench's files are its own) and run every
    # iteration the rounds ask for: stop.*, check.* and periodic checkpoints do not apply.
    rows, reports = _both_copies(run, task)
    compile_section, compile_line = compile_report.summarize(spec, reports)
    console.print(compile_line)
    result = {
        "task": "exploration_bench",
        "env": settings.env.name,
        "algo": settings.algo.name,
        "backend": spec.backend,
        "mode": spec.mode or "default",
        "warmup_iterations": task.warmup_iterations,
        "timed_iterations": task.timed_iterations,
        "iterations": task.warmup_iterations + task.timed_iterations,
        "num_env_runners": config.num_env_runners,
        "num_envs_per_env_runner": config.num_envs_per_env_runner,
        "num_learners": config.num_learners,
        "num_gpus_per_learner": config.num_gpus_per_learner,
        "train_batch_size": config.total_train_batch_size,
        **figures(rows),
        "compile": compile_section,
        "rows": rows,
    }
    result.update(run.provenance)  # bench.json stands alone: the report reads it
    write_json(run.files / BENCH, result)
    run.record["exploration_bench"] = result
    write_csv(run.files / "bench.csv", rows)
    title = f"{settings.env.name} {settings.algo.name}: {spec.preset} EnvRunners vs eager"
    plots.exploration_bench(run.files / "bench.png", rows, COPIES, title)
    console.print(
        f"env steps/s over {task.timed_iterations} timed iteration(s): compiled "
        f"{result['compiled_env_steps_per_s']:,.0f}, eager {result['eager_env_steps_per_s']:,.0f}"
        f", speedup {result['speedup']:+.1%}"
    )
    console.print(f"done: results in {run.files}")


TASK = Task(
    settings=ExplorationBenchSettings,
    run=run,
    check=check,
    scale_plan=both_copies,
    trains=True,
)
