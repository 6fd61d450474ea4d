"""A flat numpy replay buffer with RLlib's n-step sampling, for the fast off-policy step.

RLlib's `PrioritizedEpisodeReplayBuffer.sample` builds one `SingleAgentEpisode` per item
in a Python loop and its Learner runs a connector pipeline over them; sampling 256 items
and batching them costs more than SB3's whole update (issue 60). This buffer keeps the
same data in preallocated arrays and samples a whole batch with a few numpy operations.

Layout: one row per env step (o_t, a_t, r_t), written as the EnvRunners' episode chunks
arrive, each pointing at the row of its episode's next step. Each chunk ends in a row
holding the episode's latest observation, which the episode's next chunk turns into its
first step, so each observation is stored once and chunks from different sample calls
join up. A transition is a row and the n rows after it along those links. Rows are
overwritten oldest first; a row's successors are always written after it, so a live
row's chain is live too.

Sampling follows RLlib's prioritized buffer (Ray 2.60) item for item:
- an item is a step drawn uniformly, or in proportion to priority**alpha;
- its n is `n_step`, or drawn per item from `range(*n_step)` where n_step is a pair;
- an item whose n steps run past what its episode has so far (its end, or the last
  step sampled yet) is drawn again;
- reward: the n rewards discounted by gamma; next observation: the one n steps on;
  terminated/truncated: the episode's flags where those n steps reach its end;
- importance weight: (N * P(i)) ** -beta over its maximum, N the steps stored;
- new steps take the highest priority seen so far; an update sets |TD error| (at least
  1e-12) as the priority.
RLlib's uniform `EpisodeReplayBuffer` shortens the n-step at an episode's end yet
discounts by the full n; this buffer resamples those items as the prioritized one does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

NO_ROW = -1


class SumTree:
    """Priorities on a binary sum tree: set and prefix-sum search for whole batches."""

    def __init__(self, capacity: int) -> None:
        self.size = 1 << max(1, (capacity - 1).bit_length())
        self.nodes = np.zeros(2 * self.size)

    @property
    def total(self) -> float:
        return float(self.nodes[1])

    def set(self, rows: np.ndarray, values: np.ndarray) -> None:
        nodes = rows + self.size
        self.nodes[nodes] = values
        nodes = np.unique(nodes // 2)
        while nodes[0] >= 1:
            self.nodes[nodes] = self.nodes[2 * nodes] + self.nodes[2 * nodes + 1]
            nodes = np.unique(nodes // 2)

    def get(self, rows: np.ndarray) -> np.ndarray:
        return self.nodes[rows + self.size]

    def find(self, masses: np.ndarray) -> np.ndarray:
        """For each mass in [0, total): the row whose span of the prefix sum holds it."""
        nodes = np.ones(len(masses), dtype=np.int64)
        masses = masses.copy()
        while nodes[0] < self.size:
            left = self.nodes[2 * nodes]
            right = masses >= left
            masses -= np.where(right, left, 0.0)
            nodes = 2 * nodes + right
        return nodes - self.size


@dataclass
class Batch:
    """Sampled transitions as the Learner's columns, with the rows they start at."""

    rows: np.ndarray
    columns: dict[str, np.ndarray] = field(default_factory=dict)


class FlatReplay:
    """Env-step rows in preallocated arrays; uniform or prioritized (`alpha` set)."""

    def __init__(self, capacity: int, alpha: float | None = None, seed: int | None = None) -> None:
        if capacity < 2:
            raise ValueError(f"capacity must be at least 2, not {capacity}")
        self.capacity = capacity
        self.alpha = 1.0 if alpha is None else alpha  # used only where prioritized
        self.rng = np.random.default_rng(seed)
        self.rows_written = 0
        self.steps = 0
        self.max_priority = 1.0
        self.tree = SumTree(capacity) if alpha is not None else None
        self.arrays: dict[str, np.ndarray] = {}
        # Per row: the next row of its episode (NO_ROW: none yet), whether it is a step
        # (a row holding only an episode's latest observation is not), the episode's
        # flags where a row holds its last observation, and the write that made it.
        self.next_row = np.full(capacity, NO_ROW, dtype=np.int64)
        self.is_step = np.zeros(capacity, dtype=bool)
        self.terminated = np.zeros(capacity, dtype=bool)
        self.truncated = np.zeros(capacity, dtype=bool)
        self.written_at = np.full(capacity, NO_ROW, dtype=np.int64)
        # Each unfinished episode's latest-observation row (and its write), which the
        # episode's next chunk turns into a step.
        self.open_episodes: dict[str, tuple[int, int]] = {}

    def __len__(self) -> int:
        """Steps stored: what RLlib's buffers count as their timesteps."""
        return self.steps

    def _allocate(self, obs: np.ndarray, actions: np.ndarray) -> None:
        for name, like in (("obs", obs[0]), ("actions", actions[0])):
            like = np.asarray(like)
            self.arrays[name] = np.zeros((self.capacity, *like.shape), like.dtype)
        self.arrays["rewards"] = np.zeros(self.capacity, np.float32)

    def _take_rows(self, count: int) -> np.ndarray:
        """The next `count` rows in write order, what they held forgotten."""
        if count > self.capacity:
            raise ValueError(
                f"an episode chunk of {count} steps does not fit a replay buffer of "
                f"{self.capacity}: raise its capacity"
            )
        rows = (self.rows_written + np.arange(count)) % self.capacity
        self.steps -= int(self.is_step[rows].sum())
        self.written_at[rows] = self.rows_written + np.arange(count)
        self.rows_written += count
        self.next_row[rows] = NO_ROW
        self.is_step[rows] = self.terminated[rows] = self.truncated[rows] = False
        if self.tree is not None:
            self.tree.set(rows, np.zeros(count))
        return rows

    def add(self, episodes: list[Any]) -> int:
        """Append SingleAgentEpisode chunks (an EnvRunner's sample); returns steps added."""
        added = 0
        for episode in episodes:
            length = len(episode)
            if length == 0:
                continue
            obs = np.asarray(episode.get_observations())
            actions = np.asarray(episode.get_actions())
            if not self.arrays:
                self._allocate(obs, actions)
            row, write = self.open_episodes.pop(episode.id_, (NO_ROW, NO_ROW))
            if row != NO_ROW and self.written_at[row] == write:
                # The episode's latest observation (this chunk's first) has its row.
                rows = np.concatenate([[row], self._take_rows(length)])
            else:
                rows = self._take_rows(length + 1)
                self.arrays["obs"][rows[0]] = obs[0]
            step_rows = rows[:-1]
            self.arrays["obs"][rows[1:]] = obs[1:]
            self.arrays["actions"][step_rows] = actions
            self.arrays["rewards"][step_rows] = np.asarray(episode.get_rewards())
            self.next_row[step_rows] = rows[1:]
            self.is_step[step_rows] = True
            self.steps += length
            last = int(rows[-1])
            if episode.is_done:
                self.terminated[last] = episode.is_terminated
                self.truncated[last] = episode.is_truncated
            else:
                self.open_episodes[episode.id_] = (last, int(self.written_at[last]))
            if self.tree is not None:
                self.tree.set(step_rows, np.full(length, self.max_priority**self.alpha))
            added += length
        return added

    def sample(
        self, count: int, n_step: int | tuple[int, int], gamma: float, beta: float = 0.0
    ) -> Batch | None:
        """`count` n-step transitions drawn as RLlib's prioritized buffer draws them
        (module docstring); None while no step has its n steps stored yet (RLlib's
        buffer would draw forever)."""
        if self.steps == 0:
            return None
        rows = np.empty(0, dtype=np.int64)
        ns = np.empty(0, dtype=np.int64)
        while len(rows) < count:
            drawn = self._draw(count - len(rows))
            if isinstance(n_step, int):
                n = np.full(len(drawn), n_step, dtype=np.int64)
            else:
                n = self.rng.integers(n_step[0], n_step[1], size=len(drawn))
            ok = self.follow(drawn, n, gamma)[2]
            if not ok.any() and not self.follow(*self._every_step(n_step), gamma)[2].any():
                return None
            rows = np.concatenate([rows, drawn[ok]])
            ns = np.concatenate([ns, n[ok]])
        return self.transitions(rows, ns, gamma, beta)

    def _every_step(self, n_step: int | tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
        """Every step row with the smallest n: if none of these is complete, none is."""
        rows = np.flatnonzero(self.is_step)
        least = n_step if isinstance(n_step, int) else n_step[0]
        return rows, np.full(len(rows), least, dtype=np.int64)

    def transitions(
        self, rows: np.ndarray, n: np.ndarray, gamma: float, beta: float = 0.0
    ) -> Batch:
        """The n-step transitions starting at `rows` (each complete), as the Learner's
        columns: OBS, ACTIONS, REWARDS, NEXT_OBS, TERMINATEDS, TRUNCATEDS, n_step and
        weights (RLlib's names)."""
        ends, returns, ok = self.follow(rows, n, gamma)
        if not ok.all():
            raise ValueError("transitions() takes complete n-step transitions only")
        columns = {
            "obs": self.arrays["obs"][rows],
            "actions": self.arrays["actions"][rows],
            "rewards": returns.astype(np.float32),
            "new_obs": self.arrays["obs"][ends],
            "terminateds": self.terminated[ends],
            "truncateds": self.truncated[ends],
            "n_step": n,
            "weights": self._weights(rows, beta),
        }
        return Batch(rows, columns)

    def _draw(self, count: int) -> np.ndarray:
        if self.tree is None:
            steps = np.flatnonzero(self.is_step)
            return steps[self.rng.integers(len(steps), size=count)]
        return self.tree.find(self.rng.random(count) * self.tree.total)

    def follow(
        self, rows: np.ndarray, n: np.ndarray, gamma: float
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each row's row n links on, its discounted n-step reward, and whether all n
        steps are there (a step row at each of the n, a row after the last)."""
        at = rows.copy()
        reward = np.zeros(len(rows))
        ok = np.ones(len(rows), dtype=bool)
        for k in range(int(n.max())):
            going = ok & (k < n)
            step = going & self.is_step[at]
            ok &= step | ~going
            reward = np.where(step, reward + gamma**k * self.arrays["rewards"][at], reward)
            nxt = self.next_row[at]
            ok &= (nxt != NO_ROW) | ~going
            at = np.where(going & ok, nxt, at)
        return at, reward, ok

    def _weights(self, rows: np.ndarray, beta: float) -> np.ndarray:
        if self.tree is None or beta == 0.0:
            return np.ones(len(rows), dtype=np.float32)
        total = self.tree.total
        leaves = self.tree.get(np.flatnonzero(self.is_step))
        p_min = leaves.min() / total
        n = self.steps
        weights = (self.tree.get(rows) / total * n) ** -beta / (p_min * n) ** -beta
        return weights.astype(np.float32)

    def update_priorities(self, rows: np.ndarray, td_errors: np.ndarray) -> None:
        """Priorities from the TD errors of the items sampled at `rows`, in order."""
        if self.tree is None:
            return
        priorities = np.maximum(np.abs(np.asarray(td_errors, dtype=np.float64)), 1e-12)
        # A row sampled twice takes its last priority, as RLlib's loop does.
        last = len(rows) - 1 - np.unique(rows[::-1], return_index=True)[1]
        live = self.is_step[rows[last]]
        self.tree.set(rows[last][live], priorities[last][live] ** self.alpha)
        self.max_priority = max(self.max_priority, float(priorities.max()))

    STATE = (
        "rows_written",
        "steps",
        "max_priority",
        "arrays",
        "next_row",
        "is_step",
        "terminated",
        "truncated",
        "written_at",
        "open_episodes",
    )

    def get_state(self) -> dict[str, Any]:
        """Everything sampling depends on, the RNG included (a checkpoint's component)."""
        state = {key: getattr(self, key) for key in self.STATE}
        state["tree"] = None if self.tree is None else self.tree.nodes
        state["rng"] = self.rng.bit_generator.state
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        for key in self.STATE:
            setattr(self, key, state[key])
        if self.tree is not None and state["tree"] is not None:
            self.tree.nodes = state["tree"]
        self.rng.bit_generator.state = state["rng"]
