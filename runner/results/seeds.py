"""A sweep's jobs grouped over seeds: one row per configuration, with intervals.

Jobs whose overrides differ only in `seed` are one configuration. With a handful of seeds
a mean and a standard deviation say little, so each figure is the interquartile mean
(IQM) with a 95 % percentile bootstrap confidence interval from scipy (the estimators
rliable recommends for few runs); env steps to the check's threshold is a median over
the seeds that reached it, with its own interval.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from runner.results import plots
from runner.results.files import return_points
from runner.settings import overrides as ov

CONFIDENCE = 0.95
RESAMPLES = 2000
CURVE_POINTS = 50

COLUMNS = (
    "configuration",
    "seeds",
    "passed",
    "pass_rate",
    "threshold",
    "baseline_return",
    "baseline_stds",
    "env_steps_budget",
    "source",
    "final_return_iqm",
    "final_return_low",
    "final_return_high",
    "best_return_iqm",
    "best_return_low",
    "best_return_high",
    "steps_to_threshold_median",
    "steps_to_threshold_low",
    "steps_to_threshold_high",
    "wall_seconds_median",
    "curve",
)


def iqm(values: np.ndarray, axis: int = -1) -> np.ndarray:
    """Interquartile mean: the mean of the middle half (a plain mean below 4 values)."""
    from scipy import stats  # here: scipy only when seeds are summarised

    return stats.trim_mean(values, 0.25, axis=axis)


def median(values: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.median(values, axis=axis)


def interval(
    values: list[float | None], statistic: Callable[..., np.ndarray]
) -> tuple[float | None, float | None, float | None]:
    """(statistic, low, high): the 95 % bootstrap interval; a single value is its own."""
    data = np.asarray([v for v in values if v is not None], dtype=float)
    if data.size == 0:
        return None, None, None
    point = float(statistic(data))
    if data.size < 2 or np.all(data == data[0]):
        return point, point, point
    from scipy import stats

    result = stats.bootstrap(
        (data,),
        statistic,
        confidence_level=CONFIDENCE,
        n_resamples=RESAMPLES,
        method="percentile",
        rng=np.random.default_rng(0),
    )
    ci = result.confidence_interval
    return point, float(ci.low), float(ci.high)


# Below this many seeds an interquartile mean trims nothing: it is a plain mean, and says so.
IQM_SEEDS = 4


def center(seeds: int) -> str:
    """What an IQM over `seeds` seeds is, in a plot's legend: below IQM_SEEDS it trims
    nothing and is the mean, as the tables mark it."""
    return f"{'IQM' if seeds >= IQM_SEEDS else 'mean'} over {seeds} seed{'s' * (seeds != 1)}"


def interval_text(group: dict[str, Any], name: str, center: str = "iqm") -> str:
    """A group's figure with its interval, e.g. "412 [380, 450]" ("-": none); an IQM over
    fewer than IQM_SEEDS seeds is marked "(mean)"."""
    point, low, high = (group[f"{name}_{part}"] for part in (center, "low", "high"))
    if point is None:
        return "-"
    digits = 0 if abs(point) >= 100 else 1 if abs(point) >= 1 else 2
    plain = " (mean)" if center == "iqm" and group["seeds"] < IQM_SEEDS else ""
    return f"{point:,.{digits}f} [{low:,.{digits}f}, {high:,.{digits}f}]{plain}"


def configuration(overrides: list[str]) -> tuple[str, ...]:
    """A job's configuration: its overrides without the seed."""
    return tuple(sorted(o for o in overrides if ov.key(o) != "seed"))


def varies_seed(rows: list[dict[str, Any]]) -> bool:
    """True when some configuration ran with more than one seed."""
    seen: dict[tuple[str, ...], set[str]] = {}
    for r in rows:
        seen.setdefault(configuration(r["_overrides"]), set()).add(
            ov.value(r["_overrides"], "seed") or "0"
        )
    return any(len(s) > 1 for s in seen.values())


def curve(job_dir: Path, x: str = "env_steps") -> tuple[np.ndarray, np.ndarray]:
    """(`x`: env steps or wall_seconds, last known return mean) per iteration, from the
    job's metrics.jsonl."""
    path = job_dir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.is_file() else []
    points = return_points((json.loads(line) for line in lines), x)
    data = np.asarray(points, dtype=float).reshape(-1, 2)
    return data[:, 0], data[:, 1]


def band(
    curves: list[tuple[np.ndarray, np.ndarray]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """IQM and its interval over seeds on a common grid (env steps, or seconds). A run is
    read between its first and last point; one that stopped early (it passed) holds its
    last value."""
    curves = [c for c in curves if c[0].size]
    end = max(float(x[-1]) for x, _ in curves)
    grid = np.linspace(min(float(x[0]) for x, _ in curves), end, CURVE_POINTS)
    values = np.full((len(curves), grid.size), np.nan)
    for i, (x, y) in enumerate(curves):
        values[i] = np.where(grid >= x[0], np.interp(grid, x, y), np.nan)
    mid, low, high = (np.full(grid.size, np.nan) for _ in range(3))
    for j in range(grid.size):
        column = values[~np.isnan(values[:, j]), j]
        if column.size:
            mid[j], low[j], high[j] = interval(list(column), iqm)
    return grid, mid, low, high


def evaluated(row: dict[str, Any]) -> str:
    """A table's mark on a configuration's returns when they are its evaluation's, or
    another metric's (its criterion is on them): " (evaluation)", " (evaluation win_rate)"."""
    of = row.get("return_of")
    return "" if of in (None, "training") else f" ({of})"


def last_value(job_dir: Path, metric: str) -> float | None:
    """The newest value of `metric` (a flattened path, e.g. evaluation/env_runners/win_rate)
    in the job's metrics.jsonl; None where no iteration has it."""
    path = job_dir / "metrics.jsonl"
    for line in reversed(path.read_text().splitlines() if path.is_file() else []):
        value = json.loads(line).get("metrics", {}).get(metric)
        if value is not None:
            return float(value)
    return None


def judged_returns(
    done: list[dict[str, Any]], checks: list[dict[str, Any]]
) -> tuple[str, list[Any], list[Any]]:
    """The return the criterion is on, and each seed's final and best: a check on
    evaluation (check.on=evaluation) judges the evaluation's return, and so does the
    table; a criterion on another metric (a win rate) puts that metric in its place."""
    metric = str(checks[0].get("metric", "")) if checks else ""
    on_evaluation = metric.startswith("evaluation/")
    if metric and not metric.endswith("episode_return_mean"):
        name = metric.split("/")[-1]
        finals = [last_value(Path(r["_dir"]), metric) if r.get("_dir") else None for r in done]
        bests = [r["check"].get("best") for r in done]
        return (f"evaluation {name}" if on_evaluation else name), finals, bests
    kind = "eval" if on_evaluation else "episode"
    finals = [r.get(f"final_{kind}_return_mean") for r in done]
    bests = [r.get(f"best_{kind}_return_mean") for r in done]
    return ("evaluation" if on_evaluation else "training"), finals, bests


def group(rows: list[dict[str, Any]], out_dir: Path, label: Callable[[dict], str]) -> list[dict]:
    """One row per configuration (in first-job order), and its learning-curve plot in
    `out_dir`; `label` names a configuration by one of its jobs' rows (the sweep summary's,
    runner/sweep.py). A seed that wrote no summary counts as not passed."""
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(configuration(r["_overrides"]), []).append(r)
    out = []
    for n, jobs in enumerate(groups.values()):
        done = [r for r in jobs if "check" in r]  # those that wrote a summary.json
        checks = [r["check"] for r in done if r["check"].get("enabled")]
        reached = [c["env_steps_to_threshold"] for c in checks if c.get("passed")]
        # A threshold measured from a random policy differs by seed: their mean.
        thresholds = [c["threshold"] for c in checks if c.get("threshold") is not None]
        baselines = [c["baseline"] for c in checks if c.get("baseline")]
        row: dict[str, Any] = {
            "configuration": label(jobs[0]),
            "seeds": len(jobs),
            "passed": len(reached) if checks else None,
            "pass_rate": len(reached) / len(jobs) if checks else None,
            "threshold": float(np.mean(thresholds)) if thresholds else None,
            "baseline_return": (
                float(np.mean([b["return_mean"] for b in baselines])) if baselines else None
            ),
            "baseline_stds": baselines[0]["stds"] if baselines else None,
            "env_steps_budget": checks[0]["env_steps_budget"] if checks else None,
            "source": checks[0].get("source") if checks else None,
        }
        row["return_of"], finals, bests = judged_returns(done, checks)
        for name, values in (("final_return", finals), ("best_return", bests)):
            point, low, high = interval(values, iqm)
            row.update({f"{name}_iqm": point, f"{name}_low": low, f"{name}_high": high})
        point, low, high = interval(reached, median)
        row.update(
            steps_to_threshold_median=point,
            steps_to_threshold_low=low,
            steps_to_threshold_high=high,
        )
        walls = [r["wall_seconds"] for r in jobs if r.get("wall_seconds") is not None]
        row["wall_seconds_median"] = float(np.median(walls)) if walls else None
        curves = [curve(r["_dir"]) for r in jobs if r.get("_dir")]
        if any(x.size for x, _ in curves):
            path = out_dir / f"learning_curve_{n}.png"
            plots.curve_band(
                path, band(curves), row["configuration"], row["threshold"], center(len(curves))
            )
            row["curve"] = path.name
        out.append(row)
    return out
