"""Aggregate performance over seeds and envs as rliable defines it (Agarwal et al., 2021,
"Deep Reinforcement Learning at the Edge of the Statistical Precipice"; the definitions of
google-research/rliable's metrics.py and library.py), in numpy and scipy. rliable itself
is archived and pins arch<8: its 1.2.0 installs beside the project's pins, but arch 7.2
then fails to import beside pandas 3 (pandas' `deprecate_kwarg` changed), so the runner
has its own (tests/test_stats.py checks it against rliable's own test values).

Scores are matrices of runs x tasks (seeds x envs), each env's scores normalized by its
random and reference returns (`normalized`) so that envs are comparable. The aggregates
take such a matrix; `interval` gives a point estimate and a stratified bootstrap
confidence interval (runs resampled within each task, tasks kept; the percentile method),
`profile` the run score distribution (the fraction of runs above each threshold) with its
band, and `probability_of_improvement` P(X > Y) per task averaged over tasks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import scipy.stats

Scores = np.ndarray  # runs x tasks
# Bootstrap replications: rliable's performance profiles use 2000.
REPS = 2000


def normalized(returns: Sequence[float], random: float, reference: float) -> np.ndarray:
    """(return - random) / (reference - random): 0 is the random policy, 1 the reference."""
    return (np.asarray(returns, dtype=float) - random) / (reference - random)


def iqm(scores: Scores) -> Any:
    """The interquartile mean over every run and task: the 25 % trimmed mean."""
    flat = scores.reshape(*scores.shape[:-2], -1)
    return scipy.stats.trim_mean(flat, proportiontocut=0.25, axis=-1)


def median(scores: Scores) -> Any:
    """The median over tasks of each task's mean over runs."""
    return np.median(np.mean(scores, axis=-2), axis=-1)


def mean(scores: Scores) -> Any:
    """The mean over tasks of each task's mean over runs."""
    return np.mean(np.mean(scores, axis=-2), axis=-1)


def optimality_gap(scores: Scores, gamma: float = 1.0) -> Any:
    """How far the runs fall short of `gamma` (the reference), scores above it clipped."""
    return gamma - np.mean(np.minimum(scores, gamma), axis=(-2, -1))


AGGREGATES: dict[str, Callable[[Scores], Any]] = {
    "iqm": iqm,
    "median": median,
    "mean": mean,
    "optimality_gap": optimality_gap,
}


def probability_of_improvement(x: Scores, y: Scores) -> Any:
    """P(X > Y) (ties count a half) per task, the Mann-Whitney U statistic over the runs'
    pairs divided by their number, averaged over tasks; `x` and `y` may have different
    numbers of runs."""
    a, b = x[..., :, None, :], y[..., None, :, :]  # every pair of runs, per task
    return np.mean(np.mean((a > b) + 0.5 * (a == b), axis=(-3, -2)), axis=-1)


def resample(scores: Scores, rng: np.random.Generator, reps: int | None = None) -> Scores:
    """Stratified bootstrap samples: within each task, its runs drawn with replacement;
    `reps` of them stacked first (one, unstacked, by default)."""
    runs, tasks = scores.shape[-2:]
    shape = (runs, tasks) if reps is None else (reps, runs, tasks)
    return scores[rng.integers(0, runs, size=shape), np.arange(tasks)]


def interval(
    scores: Scores | tuple[Scores, ...],
    func: Callable[..., Any],
    reps: int = REPS,
    size: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float]:
    """`func`'s point estimate and its `size` percentile interval over `reps` stratified
    bootstrap samples, all computed at once (each statistic here takes stacked samples); a
    tuple of score matrices (probability of improvement) is resampled each on its own."""
    group = scores if isinstance(scores, tuple) else (scores,)
    rng = np.random.default_rng(seed)
    samples = func(*(resample(s, rng, reps) for s in group))
    low, high = np.percentile(samples, [50 * (1 - size), 50 * (1 + size)])
    return float(func(*group)), float(low), float(high)


def profile(
    scores: Scores, taus: Sequence[float], reps: int = REPS, size: float = 0.95, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The run score distribution: for each threshold, the fraction of runs (over every
    task) scoring above it; with its stratified bootstrap band."""
    thresholds = np.asarray(taus, dtype=float)

    def above(s: Scores) -> np.ndarray:
        flat = s.reshape(*s.shape[:-2], -1, 1)
        return np.mean(flat > thresholds, axis=-2)

    samples = above(resample(scores, np.random.default_rng(seed), reps))
    low, high = np.percentile(samples, [50 * (1 - size), 50 * (1 + size)], axis=0)
    return above(scores), low, high
