"""The main job written by hand against RLlib, with no runner: the overhead baseline.

Mirrors conf/ defaults (algo=ppo, env=cartpole, scaling=default, seed 0) so that
benchmarks/overhead.py can compare it with `python -m runner`; overhead.py checks that
the two AlgorithmConfigs agree. Prints one JSON line per iteration.
"""

from __future__ import annotations

import argparse
import json
import logging
import time

START = time.perf_counter()

import ray  # noqa: E402
from ray.rllib.algorithms.ppo import PPOConfig  # noqa: E402


def _by_name(value: object) -> str:
    """A class or function as module.qualname, as the runner writes algorithm_config.json, so
    overhead.py compares what they name rather than reprs that hold object addresses."""
    if isinstance(value, type) or callable(value):
        name = getattr(value, "__qualname__", type(value).__qualname__)
        return f"{getattr(value, '__module__', '')}.{name}"
    return repr(value)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--config-out", help="write the AlgorithmConfig's to_dict() here")
    args = parser.parse_args()

    config = (
        PPOConfig()
        .environment("CartPole-v1", env_config={})
        .env_runners(num_env_runners=0, num_envs_per_env_runner=8, num_cpus_per_env_runner=1)
        .learners(num_learners=0, num_gpus_per_learner=0)
        .training(
            lr=0.005,
            gamma=0.99,
            lambda_=0.95,
            train_batch_size_per_learner=1000,
            minibatch_size=250,
            num_epochs=10,
            clip_param=0.2,
            vf_loss_coeff=1.0,
            vf_clip_param=1000.0,
            entropy_coeff=0.0,
        )
        .rl_module(model_config={"fcnet_hiddens": [64, 64]})
        .debugging(seed=0, log_level="ERROR")
    )
    if args.config_out:
        with open(args.config_out, "w") as f:
            json.dump(config.to_dict(), f, default=_by_name)
    ray.init(
        address="local", include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False
    )
    algo = config.build_algo()
    for _ in range(args.iterations):
        result = algo.train()
        row = {
            "iteration": result["training_iteration"],
            "env_steps_this_iter": result["env_runners"]["num_env_steps_sampled"],
            "iteration_seconds": result["time_this_iter_s"],
            "wall_seconds": time.perf_counter() - START,
        }
        print(json.dumps(row), flush=True)
    algo.stop()
    ray.shutdown()


if __name__ == "__main__":
    main()
