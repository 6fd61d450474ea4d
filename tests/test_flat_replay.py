"""The flat replay buffer (runner/algorithms/flat_replay.py) against RLlib's own buffers on the same
episodes: the same n-step transitions (returns, next observations, terminations at
episode ends, chunks of one episode joined), uniform counts, prioritized proportions and
importance weights. RLlib's buffers run for real; no Ray needed."""

from __future__ import annotations

import numpy as np
import pytest
from episodes import chunks
from ray.rllib.utils.replay_buffers import PrioritizedEpisodeReplayBuffer
from scipy.stats import chisquare

from runner.algorithms.flat_replay import FlatReplay

GAMMA = 0.9


def filled(
    calls, alpha: float | None, seed: int = 0
) -> tuple[FlatReplay, PrioritizedEpisodeReplayBuffer]:
    flat = FlatReplay(10_000, alpha=alpha, seed=seed)
    ours = PrioritizedEpisodeReplayBuffer(capacity=10_000, alpha=alpha or 1.0)
    for call in calls:
        flat.add(call)
        ours.add(call)
    return flat, ours


def key(obs: np.ndarray, n: int) -> tuple[bytes, int]:
    return np.asarray(obs, np.float32).tobytes(), int(n)


def rllib_items(buffer, count: int, n_step, beta: float = 0.0) -> dict:
    """RLlib's transitions by (o_t, n): return, o_t+n, terminated, truncated, weight."""
    items = {}
    for e in buffer.sample(num_items=count, n_step=n_step, gamma=GAMMA, beta=beta):
        n = e.get_extra_model_outputs("n_step")[0]
        items[key(e.get_observations(0), n)] = (
            float(e.get_rewards()[0]),
            np.asarray(e.get_observations(1), np.float32).tobytes(),
            e.is_terminated,
            e.is_truncated,
            float(e.get_extra_model_outputs("weights")[0]),
        )
    return items


def flat_items(flat: FlatReplay, count: int, n_step, beta: float = 0.0) -> dict:
    batch = flat.sample(count, n_step, GAMMA, beta)
    assert batch is not None
    c = batch.columns
    return {
        key(c["obs"][i], c["n_step"][i]): (
            float(c["rewards"][i]),
            np.asarray(c["new_obs"][i], np.float32).tobytes(),
            bool(c["terminateds"][i]),
            bool(c["truncateds"][i]),
            float(c["weights"][i]),
        )
        for i in range(count)
    }


def test_n_step_transitions_are_rllibs():
    """Every n-step transition either buffer can give (n drawn from RLlib's range
    [2, 5), chunks joined, none running past an episode's steps so far) is the same in
    both: the discounted return, the observation n steps on, the episode's flags where
    the n steps reach its end (terminated, and truncated at CartPole's step limit)."""
    calls = chunks(seed=1, steps=240, chunk=7)
    flat, ours = filled(calls, alpha=None)
    assert len(flat) == ours.get_num_timesteps() == 2 * 7 * (240 // 7)
    # ~1,300 (step, n) pairs: 30,000 draws miss one with a chance of about 1e-9.
    theirs = rllib_items(ours, 30_000, (2, 5))
    mine = flat_items(flat, 30_000, (2, 5))
    assert mine.keys() == theirs.keys()
    for k, (ret, nxt, term, trunc, _) in theirs.items():
        assert mine[k][0] == pytest.approx(ret, rel=1e-5, abs=1e-5)
        assert mine[k][1:4] == (nxt, term, trunc)
    assert any(v[2] for v in theirs.values()) and any(v[3] for v in theirs.values())


def test_uniform_draws_every_step_equally():
    calls = chunks(seed=2, steps=120, chunk=10)
    flat, _ = filled(calls, alpha=None)
    batch = flat.sample(60_000, 1, GAMMA)
    assert batch is not None
    counts = np.bincount(batch.rows, minlength=flat.capacity)[flat.is_step]
    assert len(counts) == len(flat) and counts.min() > 0
    assert chisquare(counts).pvalue > 1e-3
    assert (batch.columns["weights"] == 1.0).all()


def test_prioritized_proportions_and_weights_are_rllibs():
    """Priorities set from the TD errors of sampled items: both buffers then draw each
    step in proportion to priority**alpha (a chi-square test each), and give each item
    the same importance weight for beta=0.4."""
    alpha, beta = 0.6, 0.4
    calls = chunks(seed=3, steps=60, chunk=10)
    flat, ours = filled(calls, alpha=alpha)

    def priority(obs: np.ndarray) -> float:  # a fixed "TD error" per step
        return 0.05 + abs(float(np.asarray(obs).sum()))

    batch = flat.sample(4000, 1, GAMMA)
    assert batch is not None
    flat.update_priorities(batch.rows, np.array([priority(o) for o in batch.columns["obs"]]))
    episodes = ours.sample(num_items=4000, n_step=1, gamma=GAMMA)
    ours.update_priorities(np.array([priority(e.get_observations(0)) for e in episodes]))

    steps = np.flatnonzero(flat.is_step)
    expected = np.array([priority(flat.arrays["obs"][r]) for r in steps]) ** alpha
    expected /= expected.sum()
    drawn = flat.sample(40_000, 1, GAMMA, beta)
    assert drawn is not None
    counts = np.bincount(drawn.rows, minlength=flat.capacity)[steps]
    assert chisquare(counts, expected * counts.sum()).pvalue > 1e-3

    by_obs = {key(flat.arrays["obs"][r], 1): i for i, r in enumerate(steps)}
    rllib_counts = np.zeros(len(steps))
    for e in ours.sample(num_items=20_000, n_step=1, gamma=GAMMA):
        rllib_counts[by_obs[key(e.get_observations(0), 1)]] += 1
    assert chisquare(rllib_counts, expected * rllib_counts.sum()).pvalue > 1e-3

    theirs = rllib_items(ours, 3000, 1, beta)
    mine = flat_items(flat, 3000, 1, beta)
    shared = mine.keys() & theirs.keys()
    assert len(shared) > 0.9 * len(steps)
    for k in shared:
        assert mine[k][4] == pytest.approx(theirs[k][4], rel=1e-5)
    assert min(v[4] for v in mine.values()) < 0.9  # the weights do differ


def test_a_full_buffer_overwrites_its_oldest_steps():
    """At capacity, new chunks overwrite the oldest rows: the steps stored stay within
    capacity, sampling never reaches an overwritten step, and an episode whose first
    steps were overwritten still gives its later ones."""
    calls = chunks(seed=4, steps=300, chunk=9)
    flat = FlatReplay(101, alpha=0.6, seed=0)
    newest: set[bytes] = set()
    for call in calls:
        flat.add(call)
    for call in calls[-5:]:
        for e in call:
            newest.update(np.asarray(o, np.float32).tobytes() for o in e.get_observations())
    assert 0 < len(flat) <= 101
    batch = flat.sample(2000, (2, 5), GAMMA)
    assert batch is not None
    stored = {np.asarray(o, np.float32).tobytes() for o in flat.arrays["obs"][flat.is_step]}
    assert {np.asarray(o, np.float32).tobytes() for o in batch.columns["obs"]} <= stored
    assert len(stored & newest) > 0


def test_no_complete_transition_yet_is_none():
    """Before any step has its n steps stored, sampling gives None (RLlib's buffer
    would draw forever); after, transitions."""
    flat = FlatReplay(100, alpha=None, seed=0)
    first = chunks(seed=5, steps=2, chunk=2)
    flat.add(first[0])
    assert flat.sample(8, 3, GAMMA) is None
    assert flat.sample(8, 1, GAMMA) is not None


def test_state_round_trip_samples_the_same():
    calls = chunks(seed=6, steps=60, chunk=6)
    flat, _ = filled(calls, alpha=0.6, seed=3)
    state = flat.get_state()
    again = FlatReplay(10_000, alpha=0.6)
    again.set_state(state)
    one, two = flat.sample(64, (2, 5), GAMMA, 0.4), again.sample(64, (2, 5), GAMMA, 0.4)
    assert one is not None and two is not None
    for name in one.columns:
        np.testing.assert_array_equal(one.columns[name], two.columns[name])
