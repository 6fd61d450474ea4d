"""A callback that logs a metric of its own: how many steps each episode took."""

from __future__ import annotations

from typing import Any

from ray.rllib.callbacks.callbacks import RLlibCallback


class EpisodeSteps(RLlibCallback):
    """`env_runners/episode_steps` in every iteration's results (metrics.jsonl)."""

    def on_episode_end(self, *, episode: Any, metrics_logger: Any = None, **kwargs: Any) -> None:
        metrics_logger.log_value("episode_steps", len(episode), reduce="mean")


def print_module_size(*, algorithm: Any, **kwargs: Any) -> None:
    """An on_algorithm_init function: the size of each module the Learner trains."""
    module = algorithm.get_module()
    size = sum(p.numel() for p in module.parameters())
    print(f"my_rl_pkg: {type(module).__name__} with {size} parameters")
