"""Every figure the runner draws, on matplotlib's file-only Agg backend.

The callers pick the data (which rows, which series, which labels); these functions only
draw it: lines over an axis, grouped speedup bars, and the two benchmark plots.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any


def pyplot() -> Any:
    """matplotlib.pyplot on the file-only Agg backend, without its debug logging."""
    import matplotlib

    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(plt: Any, fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def lines(path: Path, series: dict[str, list[tuple[Any, float]]], xlabel: str, ylabel: str) -> Path:
    """One line per labelled series of (x, y) points, sorted by x; integer x ticks."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, points in sorted(series.items()):
        points = sorted(points)
        ax.plot([p[0] for p in points], [p[1] for p in points], "o-", label=label)
    ax.set(xlabel=xlabel, ylabel=ylabel)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend(fontsize=7)
    return save(plt, fig, path)


def speedup_bars(
    path: Path, labels: list[str], columns: dict[str, list[float | None]], xlabel: str
) -> Path:
    """Horizontal bars in percent: a group per label, a bar per column (None counts as 0)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 1.5 + 0.3 * len(labels) * max(1, len(columns))))
    height = 0.8 / len(columns)
    for i, (name, values) in enumerate(columns.items()):
        ax.barh(
            [y + i * height for y in range(len(labels))],
            [100 * (v or 0) for v in values],
            height=height,
            label=name,
        )
    ax.set_yticks([y + 0.4 - height / 2 for y in range(len(labels))], labels, fontsize=7)
    ax.axvline(0, color="black", linewidth=0.8)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.legend(fontsize=7)
    return save(plt, fig, path)


def inference_bench(path: Path, rows: list[dict[str, Any]], title: str) -> Path:
    """Throughput per batch size, eager vs compiled, each compiled point with its speedup."""
    plt = pyplot()
    sizes = [r["batch_size"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(sizes, [r["eager_calls_per_s"] for r in rows], "o-", label="eager")
    label = f"{rows[0]['backend']}/{rows[0]['mode']}"
    ax.plot(sizes, [r["compiled_calls_per_s"] for r in rows], "s-", label=label)
    for r in rows:
        ax.annotate(f"{r['speedup']:+.0%}", (r["batch_size"], r["compiled_calls_per_s"]))
    ax.set(xscale="log", xlabel="batch size", ylabel="forward_exploration calls / s")
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.set_title(title)
    ax.legend()
    return save(plt, fig, path)


def exploration_bench(
    path: Path, rows: list[dict[str, Any]], copies: tuple[str, ...], title: str
) -> Path:
    """Env steps per second per iteration, one line per copy; warm-up iterations hollow."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, marker in zip(copies, "so", strict=True):
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
    return save(plt, fig, path)


def curve_band(
    path: Path,
    curve: tuple[Any, Any, Any, Any],
    title: str,
    threshold: float | None,
    center: str,
) -> Path:
    """A learning curve over seeds: the line `center` names (e.g. "IQM over 5 seeds") and
    its confidence interval as a band, with the check's threshold as a dashed line."""
    plt = pyplot()
    grid, mid, low, high = curve
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(grid, mid, "-", label=center)
    ax.fill_between(grid, low, high, alpha=0.3, label="95 % bootstrap CI")
    if threshold is not None:
        ax.axhline(threshold, color="black", linestyle="--", linewidth=0.8, label="threshold")
    ax.set(xlabel="env steps sampled", ylabel="episode return mean")
    ax.set_title(title, fontsize=8)
    ax.legend(fontsize=7)
    return save(plt, fig, path)


def curves_band(
    path: Path,
    series: dict[str, tuple[Any, Any, Any, Any]],
    xlabel: str,
    ylabel: str,
    title: str,
) -> Path:
    """Configurations overlaid: each one's line (over its seeds) with its band."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, (grid, mid, low, high) in series.items():
        (line,) = ax.plot(grid, mid, "-", label=label)
        ax.fill_between(grid, low, high, alpha=0.2, color=line.get_color())
    ax.set(xlabel=xlabel, ylabel=ylabel)
    ax.set_title(title, fontsize=8)
    ax.legend(fontsize=7)
    return save(plt, fig, path)


def learning_curve(
    path: Path,
    training: list[tuple[float, float]],
    evaluation: list[tuple[float, float]],
    threshold: float | None,
) -> Path:
    """A run's return against env steps: training's (last known) mean, evaluation's when
    it evaluated during training, and the check's threshold as a dashed line."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([x for x, _ in training], [y for _, y in training], label="training return mean")
    if evaluation:
        xs, ys = [x for x, _ in evaluation], [y for _, y in evaluation]
        ax.plot(xs, ys, "o-", label="evaluation return mean")
    if threshold is not None:
        ax.axhline(threshold, color="black", linestyle="--", linewidth=0.8, label="threshold")
    ax.set(xlabel="env steps", ylabel="episode return mean")
    ax.legend(fontsize=7)
    return save(plt, fig, path)
