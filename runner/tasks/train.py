"""task=train: build the Algorithm, train until a stop criterion, keep every result.

Each iteration is printed, appended to metrics.jsonl (flushed) and TensorBoard, and
checkpointed every `checkpoint.every` iterations; the end writes a final checkpoint and
summary.json. With compile on the EnvRunners, every iteration (after the weight sync)
replays each compiled module's last input through compiled and eager code:
`compile_max_abs_diff`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import ray
from ray.rllib.algorithms.algorithm import Algorithm

from runner.check import Check
from runner.compile import report as compile_report
from runner.compile.settings import CompileSpec, compiled_on_cpu, cuda_graph_warning
from runner.console import console
from runner.results.files import (
    MetricsLog,
    checkpoint_dir,
    flatten_numbers,
    headline,
    latest_checkpoint,
    write_json,
)
from runner.schema import RunnerConfig, StopConfig, TaskSettings
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
    warning = cuda_graph_warning(spec, compiled_on_cpu(spec, settings.scaling))
    return [warning] if warning else []


def train(run: TaskRun) -> dict[str, Any]:
    """Train until a stop criterion holds (or Ctrl-C); return the run's figures."""
    settings, run_dir = run.settings, run.run_dir
    verify = run.spec is not None and run.spec.env_runners
    algo = run.config.build_algo()
    if run.checkpoint is not None:
        algo.restore_from_path(str(run.checkpoint.resolve()))
        console.print(f"resumed from {run.checkpoint} at iteration {algo.iteration}")
    metrics = MetricsLog(run_dir)
    check = Check(settings.check)
    train_start = time.perf_counter()
    best = None
    rows: list[dict[str, Any]] = []
    reason = ""
    try:
        while True:
            result = algo.train()
            row = headline(result, time.perf_counter() - run.start_time)
            carry_last_return(row, rows[-1] if rows else None)
            if verify:
                row["compile_max_abs_diff"] = compile_report.max_diff(
                    compile_report.env_runner_reports(algo, True)
                )
            rows.append(row)
            metrics.write(row, result)
            print_row(row)
            ret = row["episode_return_mean"]
            if ret is not None and (best is None or ret > best):
                best = ret
            every = settings.checkpoint.every
            if every and algo.iteration % every == 0:
                algo.save_to_path(str(checkpoint_dir(run_dir, algo.iteration).resolve()))
            seconds = time.perf_counter() - train_start
            reason = (
                check.update(flatten_numbers(result), row["env_steps"] or 0, seconds)
                or stop_reason(settings.stop, row, seconds)
                or ""
            )
            if reason:
                break
    except KeyboardInterrupt:
        reason = "interrupted (Ctrl-C)"
    finally:
        metrics.close()
        reports = compile_report.collect(algo, verify=verify) if rows else []
        nodes = env_runner_nodes(algo)
        final = checkpoint_dir(run_dir, algo.iteration)
        if rows and settings.checkpoint.at_end and not final.exists():
            algo.save_to_path(str(final.resolve()))
        algo.stop()
    train_seconds = time.perf_counter() - train_start
    steps_this_run = sum(r["env_steps_this_iter"] or 0 for r in rows)
    last = rows[-1] if rows else {}
    return {
        "stop_reason": reason,
        "iterations": last.get("iteration"),
        "iterations_this_run": len(rows),
        "env_steps": last.get("env_steps"),
        "final_episode_return_mean": last.get("last_episode_return_mean"),
        "final_module_episode_returns_mean": last.get("module_episode_returns_mean"),
        "best_episode_return_mean": best,
        "wall_seconds": time.perf_counter() - run.start_time,
        "train_seconds": train_seconds,
        "env_steps_per_s": steps_this_run / train_seconds if train_seconds else None,
        "first_iteration_seconds": rows[0]["wall_seconds"] if rows else None,
        "resumed_from": str(run.checkpoint) if run.checkpoint else None,
        "checkpoint": str(latest_checkpoint(run_dir) or ""),
        "compile_reports": reports,
        "env_runner_nodes": nodes,
        "check": check,
    }


def run(run: TaskRun) -> None:
    """Train, then summary.json with the compile section and where it ran."""
    figures = train(run)
    compile_section, compile_line = compile_report.summarize(
        run.spec, figures.pop("compile_reports")
    )
    console.print(compile_line)
    check = figures.pop("check")
    summary = {**figures, "check": check.to_dict(), "compile": compile_section, **run.provenance}
    write_json(run.run_dir / "summary.json", summary)
    console.print(
        f"done ({summary['stop_reason'] or 'no stop criterion'}): "
        f"{summary['iterations']} iterations, {summary['env_steps'] or 0:,.0f} env steps, "
        f"{summary['wall_seconds']:.1f} s; results in {run.run_dir}"
    )
    check.raise_if_failed()


TASK = Task(name="train", settings=TrainSettings, run=run, check=check)
