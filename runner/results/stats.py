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

import numpy as np
import scipy.stats

Scores = np.ndarray  # runs x tasks
# Bootstrap replications: rliable's performance profiles use 2000.
REPS = 2000


def normalized(returns: Sequence[float], random: float, reference: float) -> np.ndarray:
    """(return - random) / (reference - random): 0 is the random policy, 1 the reference."""
    return (np.asarray(returns, dtype=float) - random) / (reference - random)


def iqm(scores: Scores) -> float:
    """The interquartile mean over every run and task: the 25 % trimmed mean."""
    return float(scipy.stats.trim_mean(scores, proportiontocut=0.25, axis=None))


def median(scores: Scores) -> float:
    """The median over tasks of each task's mean over runs."""
    return float(np.median(np.mean(scores, axis=0)))


def mean(scores: Scores) -> float:
    """The mean over tasks of each task's mean over runs."""
    return float(np.mean(np.mean(scores, axis=0)))


def optimality_gap(scores: Scores, gamma: float = 1.0) -> float:
    """How far the runs fall short of `gamma` (the reference), scores above it clipped."""
    return float(gamma - np.mean(np.minimum(scores, gamma)))


AGGREGATES: dict[str, Callable[[Scores], float]] = {
    "iqm": iqm,
    "median": median,
    "mean": mean,
    "optimality_gap": optimality_gap,
}


def probability_of_improvement(x: Scores, y: Scores) -> float:
    """P(X > Y) (ties count a half) per task, the Mann-Whitney U statistic over the runs'
    pairs divided by their number, averaged over tasks; `x` and `y` may have different
    numbers of runs."""
    a, b = x[:, None, :], y[None, :, :]  # every pair of runs, per task
    per_task = np.mean((a > b) + 0.5 * (a == b), axis=(0, 1))
    return float(np.mean(per_task))


def resample(scores: Scores, rng: np.random.Generator) -> Scores:
    """One stratified bootstrap sample: within each task, its runs drawn with replacement."""
    runs, tasks = scores.shape[:2]
    return scores[rng.integers(0, runs, size=(runs, tasks)), np.arange(tasks)]


def interval(
    scores: Scores | tuple[Scores, ...],
    func: Callable[..., float],
    reps: int = REPS,
    size: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float]:
    """`func`'s point estimate and its `size` percentile interval over `reps` stratified
    bootstrap samples; a tuple of score matrices (probability of improvement) is
    resampled each on its own."""
    group = scores if isinstance(scores, tuple) else (scores,)
    rng = np.random.default_rng(seed)
    samples = [func(*(resample(s, rng) for s in group)) for _ in range(reps)]
    low, high = np.percentile(samples, [50 * (1 - size), 50 * (1 + size)])
    return func(*group), float(low), float(high)


def profile(
    scores: Scores, taus: Sequence[float], reps: int = REPS, size: float = 0.95, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The run score distribution: for each threshold, the fraction of runs (over every
    task) scoring above it; with its stratified bootstrap band."""
    thresholds = np.asarray(taus, dtype=float)

    def above(s: Scores) -> np.ndarray:
        return np.mean(s.reshape(-1, 1) > thresholds, axis=0)

    rng = np.random.default_rng(seed)
    samples = np.stack([above(resample(scores, rng)) for _ in range(reps)])
    low, high = np.percentile(samples, [50 * (1 - size), 50 * (1 + size)], axis=0)
    return above(scores), low, high
