"""The training loop: build the Algorithm, train until a stop criterion, keep the results."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import ray
from omegaconf import DictConfig
from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from rich.console import Console

from runner import compile as compile_settings
from runner import compiled
from runner.results import MetricsLog, headline

console = Console(highlight=False, soft_wrap=True)
CHECKPOINT_FILE = "rllib_checkpoint.json"


def quiet_ray(level_name: str) -> int:
    """Set Ray's and RLlib's loggers (each has its own handler) to `level_name`."""
    level = getattr(logging, level_name)
    for name in ("ray", "ray.rllib", "ray.tune"):
        logging.getLogger(name).setLevel(level)
    return level


def start_ray(ray_cfg: DictConfig, compile_cache_dir: str | None = None) -> None:
    """A local Ray sized to this machine (no dashboard, quiet), or the cluster at ray.address.

    `compile_cache_dir` becomes TORCHINDUCTOR_CACHE_DIR here and in every actor.
    """
    level = quiet_ray(ray_cfg.log_level)
    if ray.is_initialized():
        return
    common: dict[str, Any] = {"logging_level": level, "log_to_driver": level <= logging.INFO}
    if compile_cache_dir:
        cache = str(Path(compile_cache_dir).expanduser().resolve())
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        common["runtime_env"] = {"env_vars": {"TORCHINDUCTOR_CACHE_DIR": cache}}
    if ray_cfg.address:
        ray.init(address=ray_cfg.address, **common)
    else:
        # "local": a new Ray of its own, never a cluster that happens to run on this machine.
        ray.init(
            address="local",
            num_cpus=ray_cfg.num_cpus,
            num_gpus=ray_cfg.num_gpus,
            include_dashboard=False,
            **common,
        )


def stop_reason(stop: DictConfig, row: dict[str, Any], train_seconds: float) -> str | None:
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


def print_row(row: dict[str, Any]) -> None:
    console.print(
        f"iter {row['iteration']:>4} | env steps {_fmt(row['env_steps'], ',.0f'):>10} | "
        f"return mean {_fmt(row['episode_return_mean'], '8.2f')} | "
        f"{_fmt(row['env_steps_per_s'], ',.0f'):>7} steps/s | {row['wall_seconds']:7.1f} s"
    )


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = sorted((run_dir / "checkpoints").glob(f"*/{CHECKPOINT_FILE}"))
    return found[-1].parent if found else None


def _checkpoint_dir(run_dir: Path, algo: Algorithm) -> Path:
    return run_dir / "checkpoints" / f"iter_{algo.iteration:06d}"


def max_diff(reports: list[dict[str, Any]]) -> float | None:
    diffs = [r["max_abs_diff"] for r in reports if r["max_abs_diff"] is not None]
    return max(diffs) if diffs else None


def env_runner_nodes(algo: Algorithm) -> list[str]:
    """The Ray node id of each remote EnvRunner (on a cluster: where they were placed)."""
    return algo.env_runner_group.foreach_env_runner(
        lambda _: ray.get_runtime_context().get_node_id(), local_env_runner=False
    )


def train(
    cfg: DictConfig,
    config: AlgorithmConfig,
    run_dir: Path,
    checkpoint: Path | None,
    start_time: float,
) -> dict[str, Any]:
    """Train until a stop criterion holds; return this run's figures for summary.json.

    With compile on the EnvRunners, every iteration (after the weight sync) replays each
    compiled module's last input through compiled and eager code: `compile_max_abs_diff`.
    """
    verify = compile_settings.is_enabled(cfg.compile) and cfg.compile.env_runners
    algo = config.build_algo()
    if checkpoint is not None:
        algo.restore_from_path(str(checkpoint.resolve()))
        console.print(f"resumed from {checkpoint} at iteration {algo.iteration}")
    metrics = MetricsLog(run_dir)
    train_start = time.perf_counter()
    best = None
    rows: list[dict[str, Any]] = []
    reason = ""
    try:
        while True:
            result = algo.train()
            row = headline(result, time.perf_counter() - start_time)
            if verify:
                row["compile_max_abs_diff"] = max_diff(compiled.env_runner_reports(algo, True))
            rows.append(row)
            metrics.write(row, result)
            print_row(row)
            ret = row["episode_return_mean"]
            if ret is not None and (best is None or ret > best):
                best = ret
            every = cfg.checkpoint.every
            if every and algo.iteration % every == 0:
                algo.save_to_path(str(_checkpoint_dir(run_dir, algo).resolve()))
            reason = stop_reason(cfg.stop, row, time.perf_counter() - train_start) or ""
            if reason:
                break
    except KeyboardInterrupt:
        reason = "interrupted (Ctrl-C)"
    finally:
        metrics.close()
        reports = compiled.collect(algo, verify=verify) if rows else []
        nodes = env_runner_nodes(algo)
        final = _checkpoint_dir(run_dir, algo)
        if rows and cfg.checkpoint.at_end and not final.exists():
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
        "final_episode_return_mean": last.get("episode_return_mean"),
        "best_episode_return_mean": best,
        "wall_seconds": time.perf_counter() - start_time,
        "train_seconds": train_seconds,
        "env_steps_per_s": steps_this_run / train_seconds if train_seconds else None,
        "first_iteration_seconds": rows[0]["wall_seconds"] if rows else None,
        "resumed_from": str(checkpoint) if checkpoint else None,
        "checkpoint": str(latest_checkpoint(run_dir) or ""),
        "compile_reports": reports,
        "env_runner_nodes": nodes,
    }
