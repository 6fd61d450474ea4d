"""Reward scaling for PPO as Stable-Baselines3's VecNormalize does it (`normalize: true` in
RL Zoo's hyperparameters, rewards part; RLlib's MeanStdFilter covers the observations).

Each env's discounted return runs on (`ret = ret * gamma + reward`, reset when its
episode ends), a running mean and variance of those returns is kept, and every reward is
divided by that standard deviation and clipped. Only the Learner sees the scaled rewards:
the EnvRunners' episode returns, the metrics and the evaluation stay the env's own.

`ScaleRewards` is a Learner connector piece that runs first in the pipeline, on the
episodes as the EnvRunners sent them (an episode's chunks arrive in order, each carrying
its episode's id, so its running return continues across train batches).
`RewardScaling` puts the piece in front of a PPO Learner's pipeline (RLlib's, or the fast
step's in runner/algorithms/fast_step.py) and its statistics in the Learner's state, so they are in
every checkpoint and restored with it (RLlib does not keep a Learner connector's state).

One difference from VecNormalize: it updates the statistics at every env step and scales
that step's reward by them; here they are updated once per train batch (with the same
parallel mean/variance merge, which gives the same statistics over the same returns) and
the batch's rewards scaled by the updated ones.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.algorithms.ppo.ppo import PPO
from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
from ray.rllib.connectors.connector_v2 import ConnectorV2

from runner.algorithms.fast_step import FastPPOLearner, learner_refusal, rllib_algorithm
from runner.errors import ConfigError
from runner.settings.schema import RewardScalingConfig

STATE_KEY = "runner_reward_scaling"
# Learner config keys carrying the settings to the Learners (RLlib's dict for them).
SETTINGS_KEY = "runner_reward_scaling"


class ScaleRewards(ConnectorV2):
    """Learner connector piece: the episodes' rewards divided by the running standard
    deviation of their discounted returns and clipped (see the module's docstring)."""

    def __init__(
        self,
        input_observation_space: Any = None,
        input_action_space: Any = None,
        *,
        gamma: float,
        clip: float = 10.0,
        epsilon: float = 1e-8,
    ) -> None:
        super().__init__(input_observation_space, input_action_space)
        self.gamma, self.clip, self.epsilon = gamma, clip, epsilon
        # SB3's RunningMeanStd starts at mean 0, variance 1, a count of 1e-4.
        self.mean, self.var, self.count = 0.0, 1.0, 1e-4
        self.running: dict[str, float] = {}  # unfinished episodes' discounted returns

    def __call__(self, *, episodes: list[Any], batch: dict[str, Any], **kwargs: Any) -> Any:
        # The pipeline's own copies, which the pieces after this one read: a local
        # EnvRunner keeps the chunks it returned and sums their rewards into its episode
        # returns (the metrics), and a remote one's arrive read-only (Ray's object store).
        episodes[:] = [copy.deepcopy(episode) for episode in episodes]
        chunks = list(self.single_agent_episode_iterator(episodes, agents_that_stepped_only=False))
        returns = []
        for episode in chunks:
            ret = self.running.pop(episode.id_, 0.0) if episode.t_started else 0.0
            discounted = np.empty(len(episode))
            for t, reward in enumerate(episode.get_rewards()):
                ret = ret * self.gamma + float(reward)
                discounted[t] = ret
            if not episode.is_done:
                self.running[episode.id_] = ret
            returns.append(discounted)
        if returns:
            self.update(np.concatenate(returns))
        scale = np.sqrt(self.var + self.epsilon)
        for episode in chunks:
            rewards = np.asarray(episode.get_rewards(), dtype=np.float64)
            scaled = np.clip(rewards / scale, -self.clip, self.clip).astype(np.float32)
            episode.set_rewards(new_data=scaled if episode.is_numpy else list(scaled))
        return batch

    def update(self, values: np.ndarray) -> None:
        """SB3's RunningMeanStd.update: the parallel merge of the running moments with
        those of `values`."""
        count = values.size
        delta = float(values.mean()) - self.mean
        total = self.count + count
        m2 = self.var * self.count + float(values.var()) * count
        m2 += delta**2 * self.count * count / total
        self.mean += delta * count / total
        self.var, self.count = m2 / total, total

    def get_state(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {"mean": self.mean, "var": self.var, "count": self.count}

    def set_state(self, state: dict[str, Any]) -> None:
        self.mean, self.var, self.count = state["mean"], state["var"], state["count"]


class RewardScaling:
    """PPO Learner mixin: ScaleRewards first in its connector pipeline and the piece's
    statistics in its state (and so in checkpoints)."""

    config: Any
    _learner_connector: Any

    def build(self) -> None:
        super().build()  # type: ignore[misc]  # a mixin: the Learner comes next in the MRO
        settings = self.config.learner_config_dict[SETTINGS_KEY]
        self.reward_scaling = ScaleRewards(**settings)
        pipeline = self._learner_connector
        assert pipeline is not None, "RLlib builds a Learner connector for every PPO Learner"
        pipeline.prepend(self.reward_scaling)

    def get_state(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        state = super().get_state(*args, **kwargs)  # type: ignore[misc]  # as above
        return {**state, STATE_KEY: self.reward_scaling.get_state()}

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)  # type: ignore[misc]  # as above
        if STATE_KEY in state:
            self.reward_scaling.set_state(state[STATE_KEY])


class RewardScalingPPOLearner(RewardScaling, PPOTorchLearner):
    """RLlib's PPO Learner with reward scaling."""


class RewardScalingFastPPOLearner(RewardScaling, FastPPOLearner):
    """The fast step's PPO Learner (runner/algorithms/fast_step.py) with reward scaling."""


# The Learner each of the classes the runner gives PPO becomes with reward scaling.
SCALED: dict[Any, type] = {
    PPOTorchLearner: RewardScalingPPOLearner,
    FastPPOLearner: RewardScalingFastPPOLearner,
}


def choose(config: AlgorithmConfig, settings: RewardScalingConfig) -> None:
    """Give `config` the reward-scaling Learner where `algo.reward_scaling.enabled`, or
    one ConfigError line on why it cannot have it."""
    if not settings.enabled:
        return
    why = _unsupported(config)
    if why:
        raise ConfigError(f"algo.reward_scaling.enabled=true: {why}; drop it for this run")
    gamma = config.gamma if settings.gamma is None else settings.gamma
    own = {
        **config.learner_config_dict,
        SETTINGS_KEY: {"gamma": gamma, "clip": settings.clip, "epsilon": settings.epsilon},
    }
    config.learners(learner_class=SCALED[config.learner_class], learner_config_dict=own)


def describe(config: AlgorithmConfig) -> str | None:
    """The run's start line on its rewards where they are scaled (None: they are not)."""
    if not issubclass(config.learner_class, RewardScaling):
        return None
    settings = config.learner_config_dict[SETTINGS_KEY]
    return (
        "rewards: scaled for the Learner as SB3's VecNormalize does (gamma "
        f"{settings['gamma']:g}, clip {settings['clip']:g}; algo.reward_scaling), the metrics "
        "the env's own"
    )


def _unsupported(config: AlgorithmConfig) -> str | None:
    algorithm = rllib_algorithm(config.algo_class)
    if algorithm is not PPO:
        return f"it scales PPO's rewards, not {getattr(algorithm, '__name__', '?')}'s"
    if config.is_multi_agent:
        return "a multi-agent run's rewards are per agent, which it does not scale"
    if config.num_learners > 1:
        return f"scaling.num_learners={config.num_learners}: each would keep its own statistics"
    return learner_refusal(config, SCALED)
