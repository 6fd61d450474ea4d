"""A CartPole for fault tests: a NaN reward at a chosen step, a slow step, an error, or a
process that ends without one.

Runs import it as `env.entry_point=faulty_env:FaultyCartPole` with this dir on
PYTHONPATH (Ray's workers inherit the driver's environment)."""

from __future__ import annotations

import os
import sys
import time

import gymnasium as gym


class FaultyCartPole(gym.Wrapper):
    """`nan_at_step`: from that step on (counted over this env copy's life) rewards are NaN;
    `step_seconds`: every step sleeps this long; `fail_at_step`: from that step on, each
    step raises (a bug in the env); `exit_at_step`: at that step the process ends at once
    with exit code 3 after a line on stderr (a crash in an env's C code: no Python error)."""

    def __init__(self, config: dict | None = None) -> None:
        config = dict(config or {})
        super().__init__(gym.make("CartPole-v1"))
        self.nan_at_step = config.get("nan_at_step")
        self.step_seconds = float(config.get("step_seconds", 0.0))
        self.fail_at_step = config.get("fail_at_step")
        self.exit_at_step = config.get("exit_at_step")
        self.steps = 0

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.steps += 1
        if self.fail_at_step is not None and self.steps >= self.fail_at_step:
            raise ValueError(f"FaultyCartPole fails at step {self.steps} (fail_at_step)")
        if self.exit_at_step is not None and self.steps >= self.exit_at_step:
            print(f"FaultyCartPole exits at step {self.steps} (exit_at_step)", file=sys.stderr)
            sys.stderr.flush()
            os._exit(3)
        if self.step_seconds:
            time.sleep(self.step_seconds)
        if self.nan_at_step is not None and self.steps >= self.nan_at_step:
            reward = float("nan")
        return obs, reward, terminated, truncated, info
