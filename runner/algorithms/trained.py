"""A trained checkpoint's policy, and whether it fits the env this command composes.

task=evaluate and task=export read the RLModules a run's Learner saved (RLlib's own
checkpoint format), and refuse, with one line, a checkpoint whose module takes other
observations or actions than the env gives: a module trained on CartPole would otherwise
fail deep inside an EnvRunner, or export a policy for the wrong env.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

import gymnasium as gym
from gymnasium.vector.utils import batch_space
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.connectors.connector_pipeline_v2 import ConnectorPipelineV2
from ray.rllib.core.rl_module.multi_rl_module import MultiRLModule
from ray.rllib.core.rl_module.rl_module import RLModule

from runner.envs import make_env, setting
from runner.errors import ConfigError
from runner.machine.short_stack import on_short_stack
from runner.settings.schema import EnvConfig

# Where RLlib's Algorithm checkpoint keeps the Learner's modules (one dir per module id).
MODULES = Path("learner_group", "learner", "rl_module")


def load_modules(checkpoint: Path) -> MultiRLModule:
    """The Learner's modules from `checkpoint`, on the CPU."""
    path = (checkpoint / MODULES).resolve()  # RLlib reads a relative path as a bad URI
    if not path.is_dir():
        raise ConfigError(
            f"checkpoint {checkpoint} holds no RLModule ({MODULES} is missing): pass a run "
            "dir or checkpoint dir this runner wrote"
        )
    try:
        return MultiRLModule.from_checkpoint(path)
    except Exception as ex:
        raise ConfigError(
            f"checkpoint {checkpoint}: loading its RLModule failed: {type(ex).__name__}: {ex}"
        ) from ex


def spaces_of(module: RLModule) -> tuple[gym.Space, gym.Space]:
    """A trained module's observation and action spaces (RLModule types them optional: a
    spec may leave them to the env; a checkpoint's module was built with both)."""
    obs, act = module.observation_space, module.action_space
    if obs is None or act is None:
        raise ConfigError(
            f"the checkpoint's {type(module).__name__} has no observation or action space: "
            "pass a run dir or checkpoint dir this runner wrote"
        )
    return obs, act


def _describe(space: gym.Space) -> str:
    shape = getattr(space, "shape", None)
    n = getattr(space, "n", None)
    return f"{type(space).__name__}({n if n is not None else shape})"


def _same_kind(a: gym.Space, b: gym.Space) -> bool:
    return type(a) is type(b) and a.shape == b.shape and getattr(a, "n", 0) == getattr(b, "n", 0)


def env_to_module(config: AlgorithmConfig, env: EnvConfig) -> tuple[ConnectorPipelineV2, gym.Space]:
    """The config's env-to-module connector pipeline for the env (made here, in the
    driver), and the env's action space."""
    built = make_env(config)
    try:
        obs, act = built.observation_space, built.action_space
    finally:
        built.close()
    spaces = {"__env__": (batch_space(obs, 1), batch_space(act, 1)), "__env_single__": (obs, act)}
    # RLlib builds a pipeline, and types it as the ConnectorV2 base.
    pipeline = on_short_stack(config.build_env_to_module_connector, spaces=spaces)
    return cast(ConnectorPipelineV2, pipeline), act


def check_fits(
    modules: MultiRLModule, config: AlgorithmConfig, env: EnvConfig
) -> ConnectorPipelineV2 | None:
    """One line if the (single-agent) policy was trained on other observations or actions;
    else the env-to-module pipeline it was checked through (None for multi-agent runs,
    whose modules get their spaces from the policies' own mapping)."""
    if config.is_multi_agent:
        return None
    module = next(m for _, m in modules.items())
    pipeline, act = env_to_module(config, env)
    kinds, ours_all = ("observations", "actions"), (pipeline.observation_space, act)
    for what, theirs, ours in zip(kinds, spaces_of(module), ours_all, strict=True):
        if not _same_kind(theirs, ours):
            raise ConfigError(
                f"the checkpoint's policy was trained on {what} {_describe(theirs)}, but "
                f"{setting(env)} gives {_describe(ours)}: use the env it was trained on "
                "(its run's env is composed unless this command overrides env)"
            )
    return pipeline
