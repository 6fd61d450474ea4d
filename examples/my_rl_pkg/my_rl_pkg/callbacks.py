"""Callbacks of both kinds: RLlib's (inside the Algorithm: a metric of its own, how many
steps each episode took) and the runner's (watching the run from the loop: stop on a
plateau)."""

from __future__ import annotations

import json
from typing import Any

from ray.rllib.callbacks.callbacks import RLlibCallback

from runner.job.callbacks import Callback, Iteration


class EpisodeSteps(RLlibCallback):
    """`env_runners/episode_steps` in every iteration's results (metrics.jsonl)."""

    def on_episode_end(self, *, episode: Any, metrics_logger: Any = None, **kwargs: Any) -> None:
        metrics_logger.log_value("episode_steps", len(episode), reduce="mean")


def print_module_size(*, algorithm: Any, **kwargs: Any) -> None:
    """An on_algorithm_init function: the size of each module the Learner trains."""
    module = algorithm.get_module()
    size = sum(p.numel() for p in module.parameters())
    print(f"my_rl_pkg: {type(module).__name__} with {size} parameters")


class Plateau(Callback):
    """A run callback (runner/job/callbacks.py): stop when the training return mean has not
    improved by `min_delta` for `patience` iterations, and write plateau.json into the
    run dir with the best return and when it came."""

    def __init__(self, patience: int = 10, min_delta: float = 0.0) -> None:
        self.patience, self.min_delta = patience, min_delta
        self.best: float | None = None
        self.best_iteration = 0

    def on_iteration(self, training: Any, it: Iteration) -> str | None:
        value, iteration = it.row["last_episode_return_mean"], it.row["iteration"]
        if value is not None and (self.best is None or value > self.best + self.min_delta):
            self.best, self.best_iteration = value, iteration
        if self.best is not None and iteration - self.best_iteration >= self.patience:
            return f"plateau: no gain over {self.best:.2f} for {self.patience} iterations"
        return None

    def on_end(self, training: Any, outcome: dict[str, Any]) -> None:
        if training.run.run_dir is not None:
            best = {"best": self.best, "at_iteration": self.best_iteration}
            (training.run.run_dir / "plateau.json").write_text(json.dumps(best))
