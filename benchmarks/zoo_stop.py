"""The stop vs_zoo.py gives RL Zoo's own training (`python -m rl_zoo3.train`, through its
`callback` hyperparameter): the rolling mean of the last `window` training episodes'
returns reaching `threshold`, the criterion the runner's check applies to RLlib's
`env_runners/episode_return_mean`; or `max_seconds` of training, as the runner's
stop.seconds. What the run reached, when, and how many gradient updates it made go to
`out` as JSON, whether it stopped there, at its time or at its budget."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm


class StopAtReturn(BaseCallback):
    def __init__(self, threshold: float, window: int, out: str, max_seconds: float) -> None:
        super().__init__()
        self.threshold, self.window, self.out = threshold, window, Path(out)
        self.max_seconds = max_seconds
        self.started = 0.0
        self.best: float | None = None
        self.hit_at: tuple[int, float] | None = None  # env steps, seconds of training

    def _on_training_start(self) -> None:
        self.started = time.perf_counter()
        if self.window > self.model.ep_info_buffer.maxlen:  # type: ignore[union-attr]
            raise ValueError(f"window {self.window} > SB3's stats window")

    def _on_step(self) -> bool:
        if time.perf_counter() - self.started > self.max_seconds:
            return False
        returns = [info["r"] for info in self.model.ep_info_buffer or []][-self.window :]
        if len(returns) < self.window:
            return True
        mean = sum(returns) / len(returns)
        self.best = mean if self.best is None else max(self.best, mean)
        if mean >= self.threshold:
            self.hit_at = (self.num_timesteps, time.perf_counter() - self.started)
            return False
        return True

    def _updates(self) -> int:
        """Gradient steps: SB3's on-policy count is epochs, each of several minibatches."""
        model = self.model
        if isinstance(model, OnPolicyAlgorithm):
            batch = model.n_steps * model.n_envs
            minibatch = getattr(model, "batch_size", batch)  # A2C: the whole rollout
            return model._n_updates * math.ceil(batch / minibatch)  # type: ignore[attr-defined]
        return model._n_updates  # type: ignore[attr-defined]

    def _on_training_end(self) -> None:
        seconds = time.perf_counter() - self.started
        self.out.write_text(
            json.dumps(
                {
                    "passed": self.hit_at is not None,
                    "env_steps_to_threshold": self.hit_at[0] if self.hit_at else None,
                    "env_steps": self.num_timesteps,
                    "train_seconds": seconds,
                    "updates": self._updates(),
                    "best": self.best,
                }
            )
        )
