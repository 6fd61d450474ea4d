"""Env construction and env-id checks.

Atari games are built by a plain function, handed to RLlib as the env (RLlib calls a
callable env with its EnvContext), so no registry has to be filled in every actor.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from runner.errors import ConfigError, did_you_mean


def _register_ale() -> None:
    import ale_py

    gym.register_envs(ale_py)


def atari_env_creator(env_context: dict[str, Any]) -> gym.Env:
    """An ALE game wrapped as RLlib wraps Atari for the new API stack."""
    from ray.rllib.env.wrappers.atari_wrappers import wrap_atari_for_new_api_stack

    _register_ale()
    kwargs = dict(env_context)
    game = kwargs.pop("game")
    framestack = kwargs.pop("framestack")
    return wrap_atari_for_new_api_stack(gym.make(game, **kwargs), framestack=framestack)


def check_env_id(env_id: str, atari: bool) -> None:
    """Fail with one line if gymnasium does not know `env_id` (without building the env)."""
    if atari or env_id.startswith("ALE/"):
        try:
            _register_ale()
        except ImportError as ex:
            raise ConfigError(f"env.id={env_id} needs ale-py: pip install ale-py ({ex})") from ex
    if env_id not in gym.registry:
        raise ConfigError(
            f"unknown env.id '{env_id}'{did_you_mean(env_id, gym.registry)}; "
            "use a gymnasium id such as CartPole-v1, or env=cartpole|pendulum|breakout"
        )
