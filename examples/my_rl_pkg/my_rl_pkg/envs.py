"""A corridor of `length` cells: walk right from the left end to the exit.

Each step costs 0.01 and the exit pays 1, so the best return is 1 - 0.01 * (length - 1).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np


class Corridor(gym.Env):
    """Observation: the position as a fraction of the length; actions: 0 left, 1 right.

    Takes RLlib's EnvContext (a dict, from `env.env_config`) or gymnasium's keyword
    arguments (`gym.make("MyRL/Corridor-v0", length=...)`).
    """

    def __init__(self, config: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        settings = {**(config or {}), **kwargs}
        self.length = int(settings.get("length", 10))
        self.max_steps = int(settings.get("max_steps", 100))
        self.observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.position = 0
        self.steps = 0

    def _obs(self) -> np.ndarray:
        return np.array([self.position / (self.length - 1)], np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.position, self.steps = 0, 0
        return self._obs(), {}

    def step(self, action: int):
        self.position = max(0, self.position + (1 if action == 1 else -1))
        self.steps += 1
        at_exit = self.position >= self.length - 1
        reward = 1.0 if at_exit else -0.01
        return self._obs(), reward, at_exit, self.steps >= self.max_steps, {}
