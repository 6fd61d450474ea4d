"""runner/results/stats.py against rliable's definitions: the values rliable's own tests
assert (google-research/rliable, tests/rliable/metrics_test.py and library_test.py), and
values computed here by hand."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats

from runner.results import stats

# rliable's metrics_test.py: runs x tasks.
X = np.array([[1, 2], [2, 2], [1, 1], [2, 1]])
Y = np.array([[1, 1], [2, 2], [3, 3]])
# rliable's library_test.py: 5 runs of 16 tasks, and the runs flipped.
LX = np.arange(5 * 16).reshape(5, 16)
LY = np.flip(LX, axis=0)


def test_aggregates_give_rliables_values():
    assert (stats.median(X), stats.mean(X), stats.iqm(X)) == (1.5, 1.5, 1.5)
    assert (stats.median(Y), stats.mean(Y), stats.iqm(Y)) == (2, 2, 2)
    assert stats.probability_of_improvement(X, Y) == pytest.approx(1 / 3)


def test_aggregates_by_hand():
    scores = np.array([[0.0, 10.0], [1.0, 2.0], [3.0, 4.0], [-5.0, 6.0]])
    # 8 scores sorted: -5 0 1 2 3 4 6 10; the middle half: 1 2 3 4.
    assert stats.iqm(scores) == 2.5
    assert stats.mean(scores) == np.mean([-0.25, 5.5])
    assert stats.median(np.array([[1.0, 5.0, 9.0]])) == 5.0
    assert stats.optimality_gap(np.array([[0.5, 2.0], [1.0, 0.0]])) == pytest.approx(
        1 - (0.5 + 1 + 1 + 0) / 4
    )
    assert list(stats.normalized([0.0, 50.0, 100.0], 0.0, 100.0)) == [0.0, 0.5, 1.0]
    assert list(stats.normalized([-1000.0, -200.0], -1200.0, -200.0)) == [0.2, 1.0]


def test_probability_of_improvement_orders_the_better_runs_first():
    better, worse = np.array([[3.0, 5.0], [4.0, 6.0]]), np.array([[1.0, 2.0], [2.0, 4.0]])
    assert stats.probability_of_improvement(better, worse) == 1.0
    assert stats.probability_of_improvement(worse, better) == 0.0
    assert stats.probability_of_improvement(better, better) == 0.5
    # Task 0: X above in all 4 pairs; task 1: X below in 3, one tie (a half): 0.5 / 4.
    mixed = np.array([[2.0, 1.0], [3.0, 2.0]]), np.array([[1.0, 2.0], [0.0, 3.0]])
    assert stats.probability_of_improvement(*mixed) == pytest.approx((1 + 0.5 / 4) / 2)


@pytest.mark.parametrize("name", list(stats.AGGREGATES))
def test_intervals_hold_the_point_estimate_as_rliables_do(name: str):
    """library_test.py's test_interval_estimation (percentile method): the interval is
    strictly below and above the point estimate, for each aggregate and both matrices."""
    for scores in (LX, LY):
        point, low, high = stats.interval(scores, stats.AGGREGATES[name], reps=200)
        assert point == stats.AGGREGATES[name](scores)
        assert low < point < high


def test_improvement_interval_and_profile_as_rliables_do():
    point, low, high = stats.interval((LX, LY), stats.probability_of_improvement, reps=200)
    assert point == stats.probability_of_improvement(LX, LY)
    assert low < point < high
    taus = [0.0, 0.25, 0.5, 1.0, 40.0]
    fractions, lower, upper = stats.profile(LX.astype(float), taus, reps=200)
    assert list(fractions) == sorted(fractions, reverse=True) and len(fractions) == len(taus)
    assert fractions[-1] == np.mean(LX > 40) and fractions[0] == 79 / 80
    assert lower.shape == upper.shape == (len(taus),)
    assert all(lower <= fractions) and all(fractions <= upper)


def test_the_bootstrap_resamples_runs_within_each_task():
    rng = np.random.default_rng(0)
    sample = stats.resample(LX, rng)
    assert sample.shape == LX.shape
    for task in range(LX.shape[1]):
        assert set(sample[:, task]) <= set(LX[:, task])  # never another task's runs


def test_probability_of_improvement_is_the_mann_whitney_statistic():
    """rliable computes it with scipy's Mann-Whitney U, per task: the same on random data
    with ties, runs of unequal counts."""
    rng = np.random.default_rng(1)
    x, y = rng.integers(0, 5, size=(7, 3)), rng.integers(0, 5, size=(4, 3))
    by_scipy = np.mean(
        [
            scipy.stats.mannwhitneyu(x[:, t], y[:, t], alternative="greater").statistic / (7 * 4)
            for t in range(3)
        ]
    )
    assert stats.probability_of_improvement(x, y) == pytest.approx(by_scipy)
