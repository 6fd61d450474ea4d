"""A single-agent env whose observation holds an action mask, and which fails on a masked
action: a masking module that ever picks one fails the run (tests/test_masks.py)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

ACTIONS = 6


class MaskedChoice(gym.Env):
    """Each step two to five of six actions are legal; the largest legal one earns 1.
    Observations: the mask's legal actions as integer codes 0..3 and the mask itself
    (int8), as PettingZoo's classic games give them (`observation`, `action_mask`)."""

    def __init__(self, config: Any = None) -> None:
        self.observation_space = gym.spaces.Dict(
            {
                "observation": gym.spaces.Box(0, 3, (ACTIONS,), np.int64),
                "action_mask": gym.spaces.Box(0, 1, (ACTIONS,), np.int8),
            }
        )
        self.action_space = gym.spaces.Discrete(ACTIONS)
        self._rng = np.random.default_rng(0)
        self._t = 0
        self._mask = np.ones(ACTIONS, np.int8)

    def _observe(self) -> dict[str, np.ndarray]:
        legal = self._rng.choice(ACTIONS, size=self._rng.integers(2, 6), replace=False)
        self._mask = np.zeros(ACTIONS, np.int8)
        self._mask[legal] = 1
        return {"observation": self._mask.astype(np.int64) * 3, "action_mask": self._mask}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._t = 0
        return self._observe(), {}

    def step(self, action: int) -> tuple:
        if not self._mask[action]:
            raise ValueError(f"masked action {action} taken; legal: {np.flatnonzero(self._mask)}")
        reward = float(action == np.flatnonzero(self._mask).max())
        self._t += 1
        return self._observe(), reward, False, self._t >= 20, {}
