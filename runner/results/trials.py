"""A search's results, read back from its Ray Tune experiment (task=tune).

trials.csv has one row per trial: its sampled values, its final and best objective, its
env steps and how it ended (finished by stop.*, stopped early by ASHA, error, or not
finished when the search was interrupted). The best trial becomes an experiment file,
<run dir>/experiment/best.yaml, usable with `experiment=best` through Hydra's search path;
two plots show the objective against each searched key and the best so far.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf

from runner.job import Composer
from runner.results import plots
from runner.results.files import json_safe, write_atomic, write_csv
from runner.settings import search
from runner.settings.schema import Distribution, RunnerConfig

FINISHED, EARLY, ERROR, NOT_FINISHED = "finished", "early_stopped", "error", "not_finished"
# The groups a best experiment file names; the rest of what the search ran with is
# written out as values.
GROUPS = ("hardware", "compile", "scaling", "algo", "env")
NOT_IN_EXPERIMENT = ("task", "search", "logger", "resume", "dry_run", "reproduction")
EXPERIMENT_FILE = Path("experiment") / "best.yaml"


def _status(tune_status: str, last: dict[str, Any]) -> str:
    if tune_status == "ERROR":
        return ERROR
    if tune_status == "TERMINATED" and last:
        return FINISHED if last.get("stop_reason") else EARLY
    return NOT_FINISHED


def _error(trial: Any) -> str:
    path = Path(getattr(trial, "error_file", None) or "")
    if not path.is_file():
        return ""
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    return lines[-1].strip()[:300] if lines else ""


def _number(tag: str) -> int:
    """A trial's number from Tune's tag for it: "3_algo...", or "3@perturbed[...]" once
    PBT changed its values."""
    found = re.match(r"\d+", tag)
    if found is None:
        raise ValueError(f"Ray Tune's trial tag {tag!r} starts with no trial number")
    return int(found.group())


def read(tune_dir: Path, metric: str) -> list[dict[str, Any]]:
    """Every trial Tune created, in the order it created them."""
    from ray.tune import ExperimentAnalysis

    rows = []
    for t in ExperimentAnalysis(str(tune_dir.resolve())).trials:
        last = t.last_result or {}
        status = _status(t.status, last)
        rows.append(
            {
                "trial": _number(str(t.experiment_tag)),
                "trial_id": t.trial_id,
                "status": status,
                **{key: json_safe(value) for key, value in t.config.items()},
                "objective": last.get(metric),
                "best_objective": (t.metric_analysis.get(metric) or {}).get("max"),
                "env_steps": last.get("env_steps"),
                "iterations": last.get("training_iteration"),
                "seconds": last.get("time_total_s"),
                "check": last.get("check") or "",
                "stop_reason": last.get("stop_reason")
                or ("stopped early by ASHA" if status == EARLY else ""),
                "error": _error(t) if status == ERROR else "",
            }
        )
    return sorted(rows, key=lambda r: r["trial"])


def best_row(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The highest final objective among trials that ran their whole budget (else among
    the early-stopped ones): a trial ASHA cut short was compared at less budget."""
    for wanted in ((FINISHED,), (FINISHED, EARLY)):
        scored = [r for r in rows if r["status"] in wanted and r["objective"] is not None]
        if scored:
            return max(scored, key=lambda r: r["objective"])
    return None


def importances(
    rows: list[dict[str, Any]], space: dict[str, Distribution]
) -> dict[str, float] | None:
    """Each searched key's share of the final objective's variance, by Optuna's fANOVA
    (its default evaluator, the one optuna-dashboard draws) over the trials that ended with
    one, early-stopped included (their objective came at less budget); None with fewer
    than 3 of them. Trials of a population (PBT) changed values as they ran: none there."""
    import optuna
    from optuna.importance import FanovaImportanceEvaluator, get_param_importances
    from ray.tune.search.optuna import OptunaSearch

    scored = [r for r in rows if r["status"] in (FINISHED, EARLY) and r["objective"] is not None]
    if len(scored) < 3:
        return None
    distributions = OptunaSearch.convert_search_space(search.to_tune(space))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    study.add_trials(
        optuna.trial.create_trial(
            params={k: r[k] for k in space}, distributions=distributions, value=r["objective"]
        )
        for r in scored
    )
    found = get_param_importances(study, evaluator=FanovaImportanceEvaluator(seed=0))
    return {key: round(float(share), 4) for key, share in found.items()}


def write(
    run_dir: Path,
    rows: list[dict[str, Any]],
    space: dict[str, Distribution],
    metric: str,
    preset: dict[str, Any] | None,
    fixed: bool = True,
) -> dict[str, Any]:
    """trials.csv and the plots; returns the search's summary (`fixed`: each trial ran
    with the values it was given, so their importances mean something)."""
    keys = list(space)
    columns = ["trial", "trial_id", "status", *keys, "objective", "best_objective"]
    columns += ["env_steps", "iterations", "seconds", "check", "stop_reason", "error"]
    write_csv(run_dir / "trials.csv", rows, columns)
    _plot(run_dir, rows, space)
    best = best_row(rows)
    first = rows[0] if rows else None
    preset_row = (
        first if preset and first and all(first[k] == v for k, v in preset.items()) else None
    )
    return {
        "metric": metric,
        "mode": "max",
        "trials": len(rows),
        "trials_by_status": dict(Counter(r["status"] for r in rows)),
        "best": best and _brief(best, keys),
        "preset": preset_row and _brief(preset_row, keys),
        "importances": importances(rows, space) if fixed else None,
    }


def _brief(row: dict[str, Any], keys: list[str]) -> dict[str, Any]:
    return {
        "trial": row["trial"],
        "values": {k: row[k] for k in keys},
        "objective": row["objective"],
        "env_steps": row["env_steps"],
        "status": row["status"],
    }


def _plot(run_dir: Path, rows: list[dict[str, Any]], space: dict[str, Distribution]) -> None:
    scored = [r for r in rows if r["objective"] is not None]
    if not scored:
        return
    plt = plots.pyplot()
    fig, axes = plt.subplots(1, len(space), figsize=(4 * len(space), 3.5), squeeze=False)
    for ax, (key, dist) in zip(axes[0], space.items(), strict=True):
        for status, marker in ((FINISHED, "o"), (EARLY, "x"), (NOT_FINISHED, "^")):
            chosen = [r for r in scored if r["status"] == status]
            if chosen:
                ax.scatter(
                    [str(r[key]) if dist.choice else r[key] for r in chosen],
                    [r["objective"] for r in chosen],
                    marker=marker,
                    label=status.replace("_", " "),
                )
        if search.kind(key, dist)[0] == "loguniform":
            ax.set_xscale("log")
        ax.set(xlabel=key, ylabel="objective")
    axes[0][0].legend(fontsize=7)
    plots.save(plt, fig, run_dir / "trials_objective.png")
    best, so_far = None, []
    for r in scored:
        best = r["objective"] if best is None else max(best, r["objective"])
        so_far.append((r["trial"], best))
    plots.lines(
        run_dir / "trials_best_so_far.png",
        {"best so far": so_far, "trial": [(r["trial"], r["objective"]) for r in scored]},
        "trial",
        "objective",
    )


def _diff(base: Any, new: Any) -> Any:
    """What `new` sets that `base` does not hold: nested dicts of changed values."""
    if not isinstance(base, dict) or not isinstance(new, dict):
        return new
    out = {}
    for key, value in new.items():
        if key not in base:
            out[key] = value
        elif base[key] != value:
            out[key] = _diff(base[key], value)
    return out


def write_experiment(
    run_dir: Path,
    choices: dict[str, Any],
    settings: RunnerConfig,
    values: dict[str, Any],
    summary: dict[str, Any],
    compose: Composer,
) -> Path:
    """The best trial as an experiment file: the search's group choices, then every value
    that trial ran with that those groups do not already set (the search's budget, this
    command's overrides, an experiment's settings, the sampled values)."""
    groups = {g: choices[g] for g in GROUPS if choices.get(g)}
    base, _ = compose([f"{g}={c}" for g, c in groups.items()])
    trial = OmegaConf.structured(search.with_values(settings, values))
    base_data = OmegaConf.to_container(base, resolve=True, enum_to_str=True)
    trial_data = OmegaConf.to_container(trial, resolve=True, enum_to_str=True)
    changed = {k: v for k, v in _diff(base_data, trial_data).items() if k not in NOT_IN_EXPERIMENT}
    for key, value in values.items():  # the searched keys always, even where unchanged
        *parents, leaf = key.split(".")
        node = changed
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    best = summary["best"]
    path = run_dir / EXPERIMENT_FILE
    path.parent.mkdir(exist_ok=True)
    header = (
        "# @package _global_\n"
        f"# The best trial ({best['trial']}) of the search in {run_dir}: {summary['metric']} "
        f"{best['objective']:.2f} at {best['env_steps']:,.0f} env steps.\n"
        f"#   {run_command(run_dir)}\n"
    )
    body = {"defaults": [{f"override /{g}": c} for g, c in groups.items()], **changed}
    write_atomic(path, header + yaml.safe_dump(body, sort_keys=False))
    return path


def run_command(run_dir: Path) -> str:
    return f"python -m runner experiment=best 'hydra.searchpath=[file://{run_dir.resolve()}]'"


def _figure(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def describe(summary: dict[str, Any], run_dir: Path) -> str:
    counts = ", ".join(f"{n} {s.replace('_', ' ')}" for s, n in summary["trials_by_status"].items())
    text = f"search: {summary['trials']} trials ({counts})"
    best, preset, metric = summary["best"], summary["preset"], summary["metric"]
    if best:
        values = " ".join(f"{k}={v}" for k, v in best["values"].items())
        text += f"; best: trial {best['trial']}, {metric} {_figure(best['objective'])} ({values})"
    if preset:
        text += f"; the preset's values (trial {preset['trial']}): {_figure(preset['objective'])}"
    if summary.get("importances"):
        shares = ", ".join(f"{k} {v:.2f}" for k, v in summary["importances"].items())
        text += f"\nparameter importances (fANOVA): {shares}"
    if summary.get("study"):
        text += f"\nthe study: optuna-dashboard {summary['study']['storage']}"
    if best:
        text += f"\nbest as an experiment: {run_command(run_dir)}"
    return text + f"\nresults in {run_dir}"
