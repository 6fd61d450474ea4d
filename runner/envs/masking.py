"""Action masks and a random opponent, from YAML.

An env whose observation is a Dict with an `action_mask` beside the observation proper
(PettingZoo's classic games: `observation`/`action_mask`; RLlib's own examples:
`observations`/`action_mask`) gets it as RLlib's action-masking RLModule expects it:
`{"observations": float32 vector, "action_mask": float32 0/1}` (the observation flattened
and, when it is integer, scaled to [0, 1] by its bounds), and `MaskedPPO`, PPO's module as
RLlib's action-masking example masks it (PPO's: the only one RLlib has), adds log(mask)
to the action logits, so a masked action has probability 0 when exploring, when greedy
and in the loss.

`env.opponent: random` plays a multi-agent game against uniformly random *legal* moves: one
trained policy, `main`, takes one seat per episode (which one alternates by episode), the
`random` module the others; the EnvRunners log main's `win_rate` and `loss_rate` (a game
main ends with a positive return is won, a negative one lost), over the last 100 games.
"""

from __future__ import annotations

import zlib
from collections.abc import Hashable
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module import DefaultPPOTorchRLModule
from ray.rllib.core.columns import Columns
from ray.rllib.env.multi_agent_env import MultiAgentEnv
from ray.rllib.examples.rl_modules.classes.random_rlm import RandomRLModule
from ray.rllib.utils.torch_utils import FLOAT_MIN

MASK = "action_mask"
OBSERVATIONS = "observations"
MAIN, RANDOM = "main", "random"
WINDOW = 100  # games the win rate is over, as RLlib's self-play example counts them


def observation_key(space: gym.Space) -> str | None:
    """The key of the observation proper in a masked observation space (a Dict with
    `action_mask` and one other key); None for a space without a mask."""
    if not isinstance(space, gym.spaces.Dict) or MASK not in space.spaces:
        return None
    others = [k for k in space.spaces if k != MASK]
    return others[0] if len(others) == 1 else None


def is_masked(space: gym.Space) -> bool:
    """Whether `space` holds an action mask the runner can apply (see observation_key)."""
    return observation_key(space) is not None


class MaskedObservation:
    """One agent's masked observation as RLlib's action-masking module takes it: a
    picklable function of the observation, and the space it makes."""

    def __init__(self, space: gym.spaces.Dict) -> None:
        key = observation_key(space)
        if key is None:
            raise ValueError(f"{space} has no `action_mask` beside one observation")
        inner, mask = space.spaces[key], space.spaces[MASK]
        if not isinstance(inner, gym.spaces.Box) or not isinstance(mask, gym.spaces.Box):
            raise ValueError(f"{space}: the observation and its action_mask must be Boxes")
        self.key = key
        low = inner.low.astype(np.float32).ravel()
        high = inner.high.astype(np.float32).ravel()
        self.scaled = bool(np.issubdtype(inner.dtype, np.integer))
        self.low = low if self.scaled else np.zeros_like(low)
        span = high - low
        span[span <= 0] = 1.0
        self.span = span if self.scaled else np.ones_like(low)
        box = (
            gym.spaces.Box(0.0, 1.0, shape=low.shape, dtype=np.float32)
            if self.scaled
            else gym.spaces.Box(low, high, dtype=np.float32)
        )
        self.space = gym.spaces.Dict(
            {
                OBSERVATIONS: box,
                MASK: gym.spaces.Box(0.0, 1.0, shape=mask.shape, dtype=np.float32),
            }
        )

    def __call__(self, obs: dict[str, Any]) -> dict[str, np.ndarray]:
        flat = np.asarray(obs[self.key], dtype=np.float32).ravel()
        return {
            OBSERVATIONS: (flat - self.low) / self.span,
            MASK: np.asarray(obs[MASK], dtype=np.float32),
        }


def masked_env(env: gym.Env) -> gym.Env:
    """A single-agent env's masked observations as the masking module takes them."""
    space = env.observation_space
    assert isinstance(space, gym.spaces.Dict)  # env_is_masked said so
    transform = MaskedObservation(space)
    return gym.wrappers.TransformObservation(env, transform, transform.space)


class MaskedAgents(MultiAgentEnv):
    """A multi-agent env whose agents' masked observations are as the masking module takes
    them (RLlib's PettingZoo wrappers pass PettingZoo's dicts as they are)."""

    def __init__(self, env: MultiAgentEnv) -> None:
        super().__init__()
        self.env = env
        self.agents, self.possible_agents = env.agents, env.possible_agents
        self._transforms = {
            agent: MaskedObservation(space)
            for agent in env.possible_agents
            if isinstance(space := env.get_observation_space(agent), gym.spaces.Dict)
            and is_masked(space)
        }
        self.observation_spaces = {
            agent: self._transforms[agent].space
            if agent in self._transforms
            else env.get_observation_space(agent)
            for agent in env.possible_agents
        }
        self.action_spaces = {a: env.get_action_space(a) for a in env.possible_agents}
        # RLlib's own PettingZoo wrappers key these by agent id as well.
        self.observation_space = gym.spaces.Dict(self.observation_spaces)  # type: ignore[arg-type]
        self.action_space = gym.spaces.Dict(self.action_spaces)  # type: ignore[arg-type]

    def _observe(self, observations: dict[Any, Any]) -> dict[Any, Any]:
        self.agents = self.env.agents
        return {
            agent: self._transforms[agent](obs) if agent in self._transforms else obs
            for agent, obs in observations.items()
        }

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        observations, infos = self.env.reset(seed=seed, options=options)
        return self._observe(observations), infos

    def step(self, action_dict: dict[Any, Any]) -> tuple:
        observations, *rest = self.env.step(action_dict)
        return (self._observe(observations), *rest)

    def close(self) -> None:
        self.env.close()


def with_masks(env: Any) -> Any:
    """`env` with its masked observations as the masking module takes them."""
    return MaskedAgents(env) if isinstance(env, MultiAgentEnv) else masked_env(env)


def env_is_masked(env: Any) -> bool:
    """Whether any of `env`'s agents (or the single-agent env) has a masked observation."""
    if isinstance(env, MultiAgentEnv):
        return any(is_masked(env.get_observation_space(a)) for a in env.possible_agents)
    return is_masked(env.observation_space)


class MaskedPPO(DefaultPPOTorchRLModule):
    """PPO's RLModule with the action mask applied: log(mask) added to the action logits
    in every forward pass, as RLlib's action-masking example does it
    (rllib/examples/rl_modules/classes/action_masking_rlm.py), on PPO's current default
    module (the example's base class is deprecated) and without changing the batch it is
    given (the example pops the mask out of the caller's dict, so an input given twice,
    as compile's parity check replays one, would hold no mask). Its encoders are built
    for the observation without the mask."""

    def __init__(self, *, observation_space: gym.Space | None = None, **kwargs: Any) -> None:
        if not isinstance(observation_space, gym.spaces.Dict) or set(observation_space.spaces) != {
            OBSERVATIONS,
            MASK,
        }:
            raise ValueError(
                f"MaskedPPO takes {{'{OBSERVATIONS}': ..., '{MASK}': ...}} observations, "
                f"not {observation_space}"
            )
        self.observation_space_with_mask = observation_space
        super().__init__(observation_space=observation_space[OBSERVATIONS], **kwargs)

    def setup(self) -> None:
        super().setup()  # the encoders, for the observation alone
        self.observation_space = self.observation_space_with_mask

    def _forward(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return _masked(super()._forward(_without_mask(batch), **kwargs), batch)

    def _forward_train(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return _masked(super()._forward_train(_without_mask(batch), **kwargs), batch)

    def compute_values(self, batch: dict[str, Any], embeddings: Any = None) -> Any:
        return super().compute_values(_without_mask(batch), embeddings)


def _without_mask(batch: dict[str, Any]) -> dict[str, Any]:
    """A new batch whose observation is the observation alone (the given one unchanged)."""
    obs = batch[Columns.OBS]
    return {**batch, Columns.OBS: obs[OBSERVATIONS]} if isinstance(obs, dict) else batch


def _masked(out: dict[str, Any], batch: dict[str, Any]) -> dict[str, Any]:
    """`out`'s action logits with the batch's masked actions at FLOAT_MIN: probability 0."""
    mask = batch[Columns.OBS][MASK]
    logits = out[Columns.ACTION_DIST_INPUTS]
    out[Columns.ACTION_DIST_INPUTS] = logits + torch.clamp(torch.log(mask), min=FLOAT_MIN)
    return out


class RandomLegalMoves(RandomRLModule):
    """The opponent: a uniformly random legal move (among the action mask's ones), or any
    action for an observation without a mask. Not trained (RLlib's RandomRLModule)."""

    def _forward(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        obs = batch[Columns.OBS]
        if not isinstance(obs, dict) or MASK not in obs:
            return super()._forward(batch, **kwargs)
        mask = torch.as_tensor(obs[MASK], dtype=torch.float32)
        return {Columns.ACTIONS: torch.multinomial(mask, 1).squeeze(-1)}


class Seats:
    """policy_mapping_fn for a game against the opponent: per episode, `main` takes one
    seat (agent), chosen by the episode's id so that it plays every seat in turn over
    many games, and `random` the others. Picklable: it goes to every EnvRunner."""

    def __init__(self, agents: list[Hashable]) -> None:
        self.agents = [str(a) for a in agents]

    def __call__(self, agent_id: Hashable, episode: Any = None, **_: Any) -> str:
        seat = zlib.crc32(str(getattr(episode, "id_", "")).encode()) % len(self.agents)
        return MAIN if str(agent_id) == self.agents[seat] else RANDOM


def episode_return(episode: Any) -> float:
    """A finished episode's return as the run counts it: in a game against the opponent,
    `main`'s; else RLlib's (the sum over agents)."""
    mains = [a for a in getattr(episode, "agent_ids", ()) if episode.module_for(a) == MAIN]
    if not mains:
        return float(episode.get_return())
    return float(sum(episode.agent_episodes[a].get_return() for a in mains))


def log_game(*, episode: Any, metrics_logger: Any, **_: Any) -> None:
    """An on_episode_end callback: whether `main` won or lost the game that ended."""
    if not any(episode.module_for(a) == MAIN for a in episode.agent_ids):
        return
    result = episode_return(episode)
    metrics_logger.log_value("win_rate", float(result > 0), reduce="mean", window=WINDOW)
    metrics_logger.log_value("loss_rate", float(result < 0), reduce="mean", window=WINDOW)
