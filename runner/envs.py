"""The env: what AlgorithmConfig.environment() gets, and one built in the driver first.

Three spellings reach every EnvRunner: a gymnasium id (RLlib calls `gym.make(id,
**env_config)` in each actor, and gymnasium imports `module` of a `module:EnvId` there
first), an env class or factory by import path (`env.entry_point`, pickled to the actors
and called with RLlib's EnvContext), and the Atari class below. `make_env` builds one in
the driver for the preflight, so a missing module, a wrong name or a constructor error
is one line before Ray starts.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from ray.rllib.env.env_context import EnvContext
from ray.rllib.env.multi_agent_env import MultiAgentEnv

from runner.errors import ConfigError, did_you_mean
from runner.schema import EnvConfig
from runner.user_code import import_module, locate


def _register_ale() -> None:
    """ALE's envs in gymnasium's registry; its banner off (bad input must stay one line)."""
    import ale_py

    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)
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


def setting(env: EnvConfig) -> str:
    """The env's setting as the user wrote it, for messages."""
    return f"env.entry_point={env.entry_point}" if env.entry_point else f"env.id={env.id}"


def _check_spelling(env: EnvConfig) -> None:
    if (env.id is None) == (env.entry_point is None):
        raise ConfigError(
            "set exactly one of env.id (a gymnasium id, e.g. CartPole-v1 or my_pkg:MyEnv-v0) "
            "and env.entry_point (an env class or factory, e.g. my_pkg.envs:MyEnv); "
            f"got env.id={env.id} and env.entry_point={env.entry_point}"
        )
    if env.atari and env.entry_point:
        raise ConfigError("env.atari=true wraps a gymnasium id: set env.id, not env.entry_point")


def environment_kwargs(env: EnvConfig) -> dict[str, Any]:
    """Keyword arguments for AlgorithmConfig.environment(); imports an entry point."""
    _check_spelling(env)
    if env.atari:
        env_config = {"game": env.id, "framestack": env.framestack, **env.env_config}
        return {"env": AtariEnv, "env_config": env_config, **env.environment}
    if env.entry_point:
        maker = locate(env.entry_point, "env.entry_point")
        if not callable(maker):
            raise ConfigError(
                f"env.entry_point={env.entry_point} is a {type(maker).__name__}, not an env "
                "class or factory"
            )
        return {"env": maker, "env_config": dict(env.env_config), **env.environment}
    return {"env": env.id, "env_config": dict(env.env_config), **env.environment}


def check_env_id(env_id: str) -> None:
    """Fail with one line if gymnasium does not know `env_id`, after importing the module
    of a `module:EnvId` id as gymnasium does (without building the env)."""
    module, _, name = env_id.rpartition(":")
    if module:
        import_module(module, f"env.id={env_id}")
    if name.startswith("ALE/"):
        try:
            _register_ale()
        except ImportError as ex:
            raise ConfigError(f"env.id={env_id} needs ale-py: pip install ale-py ({ex})") from ex
    if name not in gym.registry:
        registered = f"; '{module}' registers no env of that name" if module else ""
        raise ConfigError(
            f"unknown env.id '{env_id}'{did_you_mean(name, gym.registry)}{registered}; "
            "use a gymnasium id such as CartPole-v1 (or my_pkg:MyEnv-v0), "
            "env=cartpole|pendulum|breakout, or env.entry_point=my_pkg.envs:MyEnv"
        )


def make_env(maker: Any, env_config: dict, where: str) -> gym.Env | MultiAgentEnv:
    """One env as an EnvRunner makes it, in this process: `maker` and `env_config` as
    AlgorithmConfig.environment() got them; `where` names the setting in messages."""
    if isinstance(maker, str):
        check_env_id(maker)
    try:
        if isinstance(maker, str):
            built = gym.make(maker, **env_config)
        else:  # an env class or factory: RLlib passes an EnvContext
            built = maker(EnvContext(env_config, worker_index=0))
    except Exception as ex:
        raise ConfigError(f"{where}: making the env failed: {type(ex).__name__}: {ex}") from ex
    if not isinstance(built, gym.Env | MultiAgentEnv):
        raise ConfigError(
            f"{where} made a {type(built).__qualname__}, not a gymnasium.Env or an "
            "RLlib MultiAgentEnv"
        )
    return built


def random_rollout(env: Any, seed: int | None, n: int) -> dict[str, np.ndarray]:
    """n real transitions of the env, random actions: what a batch is made of."""
    env.action_space.seed(seed)
    obs, _ = env.reset(seed=seed)
    columns: dict[str, list] = {c: [] for c in ("obs", "next", "action", "reward", "done")}
    for _ in range(n):
        action = env.action_space.sample()
        next_obs, reward, terminated, truncated, _ = env.step(action)
        for column, value in zip(
            columns.values(), (obs, next_obs, action, reward, terminated), strict=True
        ):
            column.append(value)
        obs = env.reset()[0] if terminated or truncated else next_obs
    return {name: np.asarray(values) for name, values in columns.items()}
