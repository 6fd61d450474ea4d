"""Image observations of a size RLlib's catalog has no conv stack for, as uint8 pixels.

Runs import it as `env.entry_point=image_env:TinyImages` with this dir on PYTHONPATH."""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class TinyImages(gym.Env):
    """`size`x`size` frames of `channels` (none: 2-D frames), random uint8 pixels; the
    reward is 1 for naming the brighter half (left 0, right 1); 10 steps an episode."""

    def __init__(self, config: dict | None = None) -> None:
        config = dict(config or {})
        self.size = int(config.get("size", 16))
        channels = config.get("channels", 3)
        shape = (self.size, self.size) + (() if channels is None else (int(channels),))
        self.observation_space = gym.spaces.Box(0, 255, shape, np.uint8)
        self.action_space = gym.spaces.Discrete(2)
        self.rng = np.random.default_rng(0)
        self.steps = 0

    def _frame(self) -> np.ndarray:
        self.frame = self.rng.integers(0, 256, self.observation_space.shape, dtype=np.uint8)
        return self.frame

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.steps = 0
        return self._frame(), {}

    def step(self, action):
        half = self.size // 2
        brighter = int(self.frame[:, half:].mean() > self.frame[:, :half].mean())
        reward = float(int(action) == brighter)
        self.steps += 1
        return self._frame(), reward, False, self.steps >= 10, {}
