"""The exploration benchmark task: training with compiled EnvRunners vs the same run eager.

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

import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from rich.console import Console

from runner import compile as compile_settings
from runner import compiled
from runner.errors import ConfigError
from runner.results import headline, write_csv, write_json
from runner.train import max_diff

console = Console(highlight=False, soft_wrap=True)
NEEDS_ENV_RUNNER_COMPILE = (
    "task=exploration_bench compares compiled with eager EnvRunners: pick a compile preset "
    "and keep compile.env_runners=true, e.g. compile=inductor_default"
)
COPIES = ("compiled", "eager")


def validate(cfg: DictConfig) -> None:
    """Bad exploration_bench settings, caught before anything is built or started."""
    if not (compile_settings.is_enabled(cfg.compile) and cfg.compile.env_runners):
        raise ConfigError(NEEDS_ENV_RUNNER_COMPILE)
    if cfg.task.timed_iterations < 1 or cfg.task.warmup_iterations < 0:
        raise ConfigError(
            "task.timed_iterations must be >= 1 and task.warmup_iterations >= 0, got "
            f"{cfg.task.timed_iterations} and {cfg.task.warmup_iterations}"
        )


def eager_twin(cfg: DictConfig) -> DictConfig:
    """The same composed config with compile off: the benchmark's eager copy."""
    validate(cfg)
    twin = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    twin.compile.backend = None
    twin.compile.env_runners = False
    twin.compile.learners = False
    return twin


def _run_rounds(
    algos: dict[str, Any], warmup: int, timed: int, start_time: float
) -> list[dict[str, Any]]:
    rows = []
    for i in range(warmup + timed):
        order = COPIES if i % 2 == 0 else COPIES[::-1]
        for name in order:
            start = time.perf_counter()
            result = algos[name].train()
            seconds = time.perf_counter() - start
            head = headline(result, time.perf_counter() - start_time)
            steps = head["env_steps_this_iter"] or 0
            row = {
                "iteration": head["iteration"],
                "copy": name,
                "timed": i >= warmup,
                "env_steps": steps,
                "seconds": seconds,
                "env_steps_per_s": steps / seconds,
                "episode_return_mean": head["episode_return_mean"],
                "compile_max_abs_diff": (
                    max_diff(compiled.env_runner_reports(algos[name], True))
                    if name == "compiled"
                    else None
                ),
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


def exploration_bench(
    cfg: DictConfig,
    config: AlgorithmConfig,
    eager_config: AlgorithmConfig,
    run_dir: Path,
    provenance: dict[str, Any],
    start_time: float,
) -> dict[str, Any]:
    """task=exploration_bench: run both copies, then write bench.json, bench.csv, bench.png."""
    task = cfg.task
    spec = compile_settings.spec(cfg.compile)
    algos = {"compiled": config.build_algo(), "eager": eager_config.build_algo()}
    try:
        rows = _run_rounds(algos, task.warmup_iterations, task.timed_iterations, start_time)
        reports = compiled.collect(algos["compiled"], verify=True)
    finally:
        for algo in algos.values():
            algo.stop()
    compile_section, compile_line = compiled.summarize(spec, reports)
    console.print(compile_line)
    result = {
        "task": "exploration_bench",
        "env": cfg.env.id,
        "algo": cfg.algo.name,
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
        **provenance,
    }
    write_json(run_dir / "bench.json", result)
    write_csv(run_dir / "bench.csv", rows)
    preset = f"{spec.backend}/{spec.mode or 'default'}"
    plot(run_dir / "bench.png", rows, f"{cfg.env.id} {cfg.algo.name}: {preset} EnvRunners vs eager")
    console.print(
        f"env steps/s over {task.timed_iterations} timed iteration(s): compiled "
        f"{result['compiled_env_steps_per_s']:,.0f}, eager {result['eager_env_steps_per_s']:,.0f}"
        f", speedup {result['speedup']:+.1%}"
    )
    return result


def plot(path: Path, rows: list[dict[str, Any]], title: str) -> None:
    """Env steps per second per iteration, eager vs compiled; warm-up iterations hollow."""
    from runner.bench import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, marker in zip(COPIES, "so", strict=True):
        mine = [r for r in rows if r["copy"] == name]
        line = ax.plot(
            [r["iteration"] for r in mine], [r["env_steps_per_s"] for r in mine], "-", label=name
        )[0]
        for r in mine:
            ax.plot(
                r["iteration"],
                r["env_steps_per_s"],
                marker,
                color=line.get_color(),
                fillstyle="full" if r["timed"] else "none",
            )
    ax.set(xlabel="training iteration (hollow: warm-up)", ylabel="env steps sampled / s")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
