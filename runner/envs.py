"""Env construction and env-id checks.

Atari games are built by an env class, handed to RLlib as the env (RLlib constructs a
gym.Env subclass with its EnvContext), so no registry has to be filled in every actor.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from runner.errors import ConfigError, did_you_mean


def _register_ale() -> None:
    import ale_py

    gym.register_envs(ale_py)


class AtariEnv(gym.Wrapper):
    """An ALE game wrapped as RLlib wraps Atari for the new API stack.

    A class rather than a function: RLlib's Algorithm takes an env class or a registered
    id, and a class needs no registration in every actor.
    """

    def __init__(self, env_context: dict[str, Any]) -> None:
        from ray.rllib.env.wrappers.atari_wrappers import wrap_atari_for_new_api_stack

        _register_ale()
        kwargs = dict(env_context)
        game = kwargs.pop("game")
        framestack = kwargs.pop("framestack")
        env = gym.make(game, **kwargs)
        super().__init__(wrap_atari_for_new_api_stack(env, framestack=framestack))


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
