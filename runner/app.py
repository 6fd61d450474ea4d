"""The Hydra task: config -> AlgorithmConfig -> plan -> preflight -> train -> results."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import yaml
from hydra import compose
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from rich.console import Console
from rich.table import Table

from runner import bench, compiled, exploration, preflight
from runner import compile as compile_settings
from runner.compose import build_algorithm_config, default_config_for
from runner.errors import ConfigError, PreflightError, did_you_mean
from runner.plan import Plan, make_plan
from runner.results import RESULT_FILES, json_safe, versions, write_json
from runner.sweep import override_key
from runner.train import (
    CHECKPOINT_FILE,
    latest_checkpoint,
    quiet_ray,
    start_ray,
    train,
)

log = logging.getLogger("runner")
console = Console(highlight=False, soft_wrap=True)
# Overrides that concern one invocation and are never carried into a resumed run.
_PER_INVOCATION = ("resume", "dry_run")
OVERRIDES_FILE = "composed_overrides.yaml"
TASKS = ("train", "inference_bench", "exploration_bench")


def _merge_overrides(saved: list[str], current: list[str]) -> list[str]:
    """Saved overrides with the current ones on top (one value per key, later wins)."""
    merged: dict[str, str] = {}
    for override in saved + current:
        key = override_key(override)
        if key not in _PER_INVOCATION:
            merged[key] = override
    return list(merged.values())


def find_checkpoint(path_text: str) -> tuple[Path, Path | None]:
    """(checkpoint dir, the run dir it belongs to) for a run dir or a checkpoint dir."""
    path = Path(path_text).expanduser()
    if not path.exists():
        raise ConfigError(
            f"resume path '{path}' does not exist; pass a run dir (one with checkpoints/) "
            "or a checkpoint dir"
        )
    if (path / CHECKPOINT_FILE).is_file():
        run_dir = path.parent.parent
        return path, run_dir if (run_dir / ".hydra").is_dir() else None
    checkpoint = latest_checkpoint(path)
    if checkpoint is None:
        raise ConfigError(
            f"resume path '{path}' holds no checkpoint (no checkpoints/*/{CHECKPOINT_FILE}); "
            "pass a run dir of this runner or an RLlib checkpoint dir"
        )
    return checkpoint, path


def _saved_overrides(run_dir: Path) -> list[str]:
    for name in (OVERRIDES_FILE, ".hydra/overrides.yaml"):
        if (run_dir / name).is_file():
            return yaml.safe_load((run_dir / name).read_text()) or []
    return []


def compose_for_resume(cfg: DictConfig) -> tuple[DictConfig, Path, list[str]]:
    """The resumed run's config: the original run's overrides, then this command's."""
    checkpoint, old_run_dir = find_checkpoint(cfg.resume)
    current = list(HydraConfig.get().overrides.task)
    if old_run_dir is None:
        return cfg, checkpoint, current
    overrides = _merge_overrides(_saved_overrides(old_run_dir), current)
    resumed = compose(config_name="config", overrides=overrides)
    return resumed, checkpoint, overrides


def _changed_settings(config: AlgorithmConfig, algo_name: str) -> dict[str, Any]:
    """The AlgorithmConfig entries that differ from RLlib's defaults for this algorithm."""
    ours = json_safe(config.to_dict())
    default = json_safe(default_config_for(algo_name).to_dict())
    return {k: v for k, v in ours.items() if default.get(k) != v}


def print_plan(plan: Plan, report: preflight.Report, res: preflight.Resources) -> None:
    table = Table(title="resource plan", title_justify="left")
    for column in ("role", "count", "CPUs each", "GPUs each", "hosts"):
        table.add_column(column)
    for g in plan.groups:
        table.add_row(g.role, str(g.count), f"{g.cpus_each:g}", f"{g.gpus_each:g}", g.note)
    table.add_row("total", "", f"{plan.total_cpus:g}", f"{plan.total_gpus:g}", "")
    console.print(table)
    console.print(
        f"available on {res.where}: {res.cpus:g} CPUs, {res.gpus:g} GPUs"
        + (f" ({', '.join(res.gpu_names)})" if res.gpu_names else "")
    )
    for problem in report.problems:
        console.print(f"preflight would fail: {problem}")


def provenance(cfg: DictConfig, resources: preflight.Resources) -> dict[str, Any]:
    """Where and with what a result was measured, and what it reproduces (for the report)."""
    choices = HydraConfig.get().runtime.choices
    reproduction = cfg.get("reproduction")
    return {
        "hardware": {"profile": cfg.hardware.name, **vars(resources)},
        "versions": versions(),
        "experiment": choices.get("experiment"),
        "scale": choices.get("scale"),
        "reproduction": OmegaConf.to_container(reproduction) if reproduction else None,
    }


def run(cfg: DictConfig, start_time: float) -> dict[str, Any]:
    """Compose, plan, check, then dry-run or train; every file lands in Hydra's run dir.

    Returns the plan's CPU and GPU totals, for the job's record in a sweep.
    """
    quiet_ray(cfg.ray.log_level)
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    if any((run_dir / name).exists() for name in RESULT_FILES):
        raise ConfigError(f"run dir '{run_dir}' already holds a run's results; use a new one")
    checkpoint = None
    overrides = list(HydraConfig.get().overrides.task)
    if cfg.resume:
        cfg, checkpoint, overrides = compose_for_resume(cfg)
    (run_dir / OVERRIDES_FILE).write_text(yaml.safe_dump(overrides))

    if cfg.task.name not in TASKS:
        raise ConfigError(
            f"unknown task.name '{cfg.task.name}'{did_you_mean(cfg.task.name, TASKS)}; "
            f"use one of: {', '.join(TASKS)}"
        )
    if cfg.task.name == "inference_bench" and not compile_settings.is_enabled(cfg.compile):
        raise ConfigError(bench.NEEDS_COMPILE)
    config = build_algorithm_config(cfg)
    plan = make_plan(config)
    if cfg.task.name == "exploration_bench":
        eager_config = build_algorithm_config(exploration.eager_twin(cfg))
        plan = plan.copies(2, "x2: an eager and a compiled copy at once")
    if cfg.ray.address:
        start_ray(cfg.ray, cfg.compile.cache_dir)
        resources = preflight.cluster_resources(cfg.ray.address)
    else:
        resources = preflight.local_resources(cfg.ray)
    report = preflight.check(cfg, config, plan, resources)
    write_json(run_dir / "algorithm_config.json", config.to_dict())
    write_json(run_dir / "plan.json", {**plan.to_dict(), "preflight": report.to_dict()})
    for warning in report.warnings:
        log.warning(warning)
    totals = {"cpus": plan.total_cpus, "gpus": plan.total_gpus}

    if cfg.dry_run:
        console.rule("resolved config")
        console.print(OmegaConf.to_yaml(cfg, resolve=True), end="")
        console.rule(f"AlgorithmConfig ({type(config).__name__}): settings that differ from RLlib")
        console.print(json.dumps(_changed_settings(config, cfg.algo.name), indent=2))
        console.rule("plan")
        print_plan(plan, report, resources)
        console.print(f"dry run: nothing started; files in {run_dir}")
        return {**totals, "preflight_problems": report.problems}
    if not report.ok:
        raise PreflightError("; ".join(report.problems))
    if cfg.task.name == "inference_bench":
        bench.inference_bench(cfg, config, run_dir, provenance(cfg, resources))
        console.print(f"done: results in {run_dir}")
        return totals

    start_ray(cfg.ray, cfg.compile.cache_dir)
    if cfg.task.name == "exploration_bench":
        exploration.exploration_bench(
            cfg, config, eager_config, run_dir, provenance(cfg, resources), start_time
        )
        console.print(f"done: results in {run_dir}")
        return totals
    figures = train(cfg, config, run_dir, checkpoint, start_time)
    compile_section, compile_line = compiled.summarize(
        compile_settings.spec(cfg.compile), figures.pop("compile_reports")
    )
    console.print(compile_line)
    summary = {**figures, "compile": compile_section, **provenance(cfg, resources)}
    write_json(run_dir / "summary.json", summary)
    steps = summary["env_steps"]
    console.print(
        f"done ({summary['stop_reason'] or 'no stop criterion'}): "
        f"{summary['iterations']} iterations, {steps or 0:,.0f} env steps, "
        f"{summary['wall_seconds']:.1f} s; results in {run_dir}"
    )
    return totals
