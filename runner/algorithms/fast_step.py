"""The fast off-policy training step: DQN and SAC on a flat replay buffer, several
minibatch updates per Learner call; and the same cheap Learner updates for PPO.

RLlib's step (Ray 2.60) samples its replay buffer one episode object per item, batches
them through the Learner's connector pipeline and makes one Learner call, one weight
sync, per gradient update; at SB3's model sizes that bookkeeping is most of an update's
time (issue 60). This step keeps RLlib's algorithm, Learner, losses, EnvRunners and
metrics and replaces only that bookkeeping, through RLlib's own extension points
(`Algorithm.training_step` and `config.learners(learner_class=...)`):

- the EnvRunners sample `updates_per_call` updates' worth of env steps in one call, at
  the configured replay ratio (RLlib's: one train batch per `rollout_fragment_length` x
  envs x EnvRunners env steps, scaled by `training_intensity`);
- the steps go into a `FlatReplay` (runner/algorithms/flat_replay.py), which samples RLlib's
  n-step transitions for all those updates at once;
- the Learner takes them as one batch (`learner_group.update(batch=...,
  minibatch_size=train_batch_size)`): one gradient step per minibatch, the target
  networks updated (`after_gradient_based_update`) after each as RLlib does after each
  of its calls, at the env-step count that minibatch stands for;
- priorities are updated from every minibatch's TD errors, and the weights go to the
  EnvRunners once per call.

PPO keeps RLlib's training step and takes only the Learner's part (`FastPPOLearner`):
its minibatches of SB3's size (64) make a gradient step's bookkeeping most of its cost.

`unsupported` says which configs it cannot run; those run RLlib's own step and Learner.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterator
from typing import Any, cast

import numpy as np
import torch
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.algorithms.dqn.dqn import DQN, calculate_rr_weights
from ray.rllib.algorithms.dqn.torch.dqn_torch_learner import DQNTorchLearner
from ray.rllib.algorithms.ppo.ppo import PPO
from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
from ray.rllib.algorithms.sac.sac import SAC
from ray.rllib.algorithms.sac.torch.sac_torch_learner import SACTorchLearner
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.core.rl_module.apis import TargetNetworkAPI
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.metrics import (
    ALL_MODULES,
    ENV_RUNNER_RESULTS,
    ENV_RUNNER_SAMPLING_TIMER,
    LAST_TARGET_UPDATE_TS,
    LEARNER_RESULTS,
    LEARNER_UPDATE_TIMER,
    NUM_AGENT_STEPS_SAMPLED_LIFETIME,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    NUM_TARGET_UPDATES,
    REPLAY_BUFFER_ADD_DATA_TIMER,
    REPLAY_BUFFER_SAMPLE_TIMER,
    REPLAY_BUFFER_UPDATE_PRIOS_TIMER,
    SYNCH_WORKER_WEIGHTS_TIMER,
    TD_ERROR_KEY,
    TIMERS,
)
from ray.rllib.utils.torch_utils import clip_gradients

from runner.algorithms.flat_replay import FlatReplay
from runner.settings.schema import FastStepConfig

# The env-step count each minibatch of a call stands for, passed to the Learner.
MINIBATCH_TIMESTEPS = "runner_minibatch_timesteps"
# Where the config carries algo.fast_step.updates_per_call: RLlib's dict for a custom
# Learner's or Algorithm's own settings.
UPDATES_PER_CALL = "runner_updates_per_call"
# The replay buffer types the flat buffer stands in for: prioritized or not.
BUFFERS = {"EpisodeReplayBuffer": False, "PrioritizedEpisodeReplayBuffer": True}


class FastUpdates:
    """Learner mixin: RLlib's update, its bookkeeping made cheap without changing a result.

    - What RLlib does after each Learner call (target network updates, learning-rate
      schedules) is done after each minibatch's gradient step instead, at that
      minibatch's env-step count; RLlib's DQNLearner does it once per call.
    - The target networks' Polyak step is one fused lerp.
    - Adam runs fused (one kernel over all parameters, the same arithmetic); RLlib's
      runs one parameter at a time on the CPU.
    - The gradients' finiteness is one check over all of them; RLlib's checks each
      gradient twice. Where one is not finite, or RLlib's gradient scalers or schedulers
      are in use, RLlib's own `apply_gradients` runs (its warnings, its zeroing).
    - Clipping by the global norm takes the gradients' norms in one call and scales them
      in another (`clip_by_global_norm`); RLlib's takes and scales one at a time.
    """

    _minibatch_timesteps: Iterator[int] | None = None
    _params: Any
    _named_optimizers: dict[str, torch.optim.Optimizer]
    _grad_scalers: Any
    _lr_scheduler_classes: Any
    config: Any
    module: Any
    metrics: Any
    last_update_ts_by_mid: Any

    def register_optimizer(self, *, optimizer: torch.optim.Optimizer, **kwargs: Any) -> None:
        one_group = len(optimizer.param_groups) == 1
        if type(optimizer) is torch.optim.Adam and one_group and not optimizer.state:
            group = optimizer.param_groups[0]
            settings = {k: v for k, v in optimizer.defaults.items() if k not in _ADAM_PATHS}
            optimizer = torch.optim.Adam(group["params"], **settings, fused=True)
        super().register_optimizer(optimizer=optimizer, **kwargs)  # type: ignore[misc]  # a mixin: the Learner comes next in the MRO

    def before_gradient_based_update(self, *, timesteps: dict[str, Any]) -> None:
        super().before_gradient_based_update(timesteps=timesteps)  # type: ignore[misc]  # as above
        given = timesteps.get(MINIBATCH_TIMESTEPS)
        self._minibatch_timesteps = None if given is None else iter(given)

    def _create_iterator_if_necessary(self, *, training_data: Any, **kwargs: Any) -> Any:
        """The fast step's K minibatches: contiguous slices of its batch, in order, as
        RLlib's MiniBatchCyclicIterator gives them for one epoch unshuffled, without that
        iterator's copy of each one (`concat_samples` of a single slice). Other calls
        (RLlib's step, PPO's epochs, a batch its minibatches do not divide, a module left
        out of training) get RLlib's. The fast step is single-agent: one module."""
        size, given = kwargs.get("minibatch_size"), training_data.batch
        if (
            self._minibatch_timesteps is None
            or kwargs.get("num_epochs", 1) != 1
            or not isinstance(given, MultiAgentBatch)
            or not size
            or {len(b) % size for b in given.policy_batches.values()} != {0}
            or not all(self.should_module_be_updated(m, given) for m in given.policy_batches)  # type: ignore[attr-defined]  # the Learner's
        ):
            return super()._create_iterator_if_necessary(training_data=training_data, **kwargs)  # type: ignore[misc]  # as above
        batch = self._make_batch_if_necessary(training_data=training_data)  # type: ignore[attr-defined]  # the Learner's, numpy to tensors
        return _in_order(batch, size)

    def apply_gradients(self, gradients_dict: dict[Any, Any]) -> None:
        if self._finite_without_extras(gradients_dict):
            for optimizer in self._named_optimizers.values():
                optimizer.step()
        else:
            super().apply_gradients(gradients_dict)  # type: ignore[misc]  # as above
        if self._minibatch_timesteps is not None:
            self._after_minibatch(next(self._minibatch_timesteps))

    def _after_minibatch(self, at: int) -> None:
        """RLlib's DQNLearner.after_gradient_based_update at `at` env steps (the learning
        rates' schedules, then the target networks every `target_network_update_freq`
        env steps), its Polyak step one fused lerp over all the target tensors where
        RLlib's builds and loads a state dict per network."""
        TorchLearner.after_gradient_based_update(
            self,  # type: ignore[arg-type]  # a mixin, always of a TorchLearner
            timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: at},
        )
        for module_id, module in self.module._rl_modules.items():
            config = self.config.get_config_for_module(module_id)
            net = module.unwrapped()
            since = at - self.last_update_ts_by_mid[module_id]
            if since < config.target_network_update_freq or not isinstance(net, TargetNetworkAPI):
                continue
            targets, mains = [], []
            for main, target in net.get_target_network_pairs():
                targets += [*target.parameters(), *target.buffers()]
                mains += [*main.parameters(), *main.buffers()]
            with torch.no_grad():
                torch._foreach_lerp_(targets, mains, config.tau)
            self.metrics.log_value((module_id, NUM_TARGET_UPDATES), 1, reduce="lifetime_sum")
            self.last_update_ts_by_mid[module_id] = at
            self.metrics.log_value((module_id, LAST_TARGET_UPDATE_TS), at, reduce="max")

    def _finite_without_extras(self, gradients: dict[Any, Any]) -> bool:
        """Whether RLlib's `apply_gradients` would just step every optimizer: no scaler,
        no scheduler, each gradient the parameter's own and finite (or NaN allowed)."""
        if self._grad_scalers is not None or self._lr_scheduler_classes is not None:
            return False
        if any(self._params[pid].grad is not grad for pid, grad in gradients.items()):
            return False
        if self.config.torch_skip_nan_gradients:
            return True
        grads = [g for g in gradients.values() if g is not None]
        return bool(torch.stack(torch._foreach_norm(grads)).isfinite().all()) if grads else True

    def after_gradient_based_update(self, *, timesteps: dict[str, Any]) -> None:
        if self._minibatch_timesteps is None:
            super().after_gradient_based_update(timesteps=timesteps)  # type: ignore[misc]  # as above

    @staticmethod
    def _get_clip_function() -> Any:
        return clip_by_global_norm


def clip_by_global_norm(
    gradients_dict: dict[Any, Any], *, grad_clip: float | None = None, grad_clip_by: str = "value"
) -> Any:
    """RLlib's `clip_gradients` with its global-norm arithmetic (each norm made finite,
    the coefficient clamped to 1, the gradients scaled in place) in two fused calls;
    RLlib's own for the other modes."""
    grads = [g for g in gradients_dict.values() if g is not None]
    if grad_clip is None or grad_clip_by != "global_norm" or not grads:
        return clip_gradients(gradients_dict, grad_clip=grad_clip, grad_clip_by=grad_clip_by)
    norms = [n.nan_to_num(neginf=-10e8, posinf=10e8) for n in torch._foreach_norm(grads)]
    total = torch.norm(torch.stack(norms), 2.0).nan_to_num(neginf=-10e8, posinf=10e8)
    coefficient = torch.clamp(grad_clip / torch.clamp(total + 1e-6, min=grad_clip), max=1.0)
    torch._foreach_mul_(grads, coefficient)
    return total


def _in_order(batch: MultiAgentBatch, size: int) -> Iterator[MultiAgentBatch]:
    """`batch` in contiguous minibatches of `size` (SampleBatch slices: views, not
    copies), each standing for the whole batch's env steps, as RLlib's iterator's do."""
    steps = len(batch)
    for start in range(0, len(next(iter(batch.policy_batches.values()))), size):
        parts = {
            mid: cast(SampleBatch, b[start : start + size])  # a slice of a SampleBatch is one
            for mid, b in batch.policy_batches.items()
        }
        yield MultiAgentBatch(parts, steps)


# Adam's settings that choose its implementation, not its arithmetic.
_ADAM_PATHS = {"foreach", "fused", "capturable", "differentiable"}


class FastDQNLearner(FastUpdates, DQNTorchLearner):
    """RLlib's DQN Learner with FastUpdates."""


class FastSACLearner(FastUpdates, SACTorchLearner):  # type: ignore[misc]  # RLlib's SACLearner and TorchLearner type remove_module apart
    """RLlib's SAC Learner with FastUpdates, its gradients from one backward pass.

    RLlib's SAC Learner runs one backward pass per optimizer (Q, twin Q, policy,
    temperature) through the shared graph. Each loss reaches only its own optimizer's
    parameters (the targets, the policy's Q values and the temperature's log-probs are
    detached, and the Q networks' parameters are frozen for the policy's Q values), so
    one backward pass of their sum gives every parameter the same gradient."""

    def compute_gradients(self, loss_per_module: dict[Any, Any], **kwargs: Any) -> Any:
        self._temp_losses.clear()  # the per-optimizer losses RLlib's passes would take
        return TorchLearner.compute_gradients(self, loss_per_module, **kwargs)


class FastPPOLearner(FastUpdates, PPOTorchLearner):
    """RLlib's PPO Learner with FastUpdates (RLlib's training step: one Learner call
    per train batch, its epochs and minibatches RLlib's)."""


def env_steps_per_update(config: AlgorithmConfig) -> float:
    """Env steps sampled per train batch at RLlib's replay ratio (DQN's training_step:
    `store_weight` sample calls of fragment x envs x EnvRunners steps, then
    `sample_and_train_weight` updates)."""
    store, train = calculate_rr_weights(config)
    fragment = config.get_rollout_fragment_length()
    per_call = fragment * config.num_envs_per_env_runner * max(config.num_env_runners, 1)
    return store * per_call / train


class FastStep:
    """Algorithm mixin: `training_step` on a FlatReplay (see the module's docstring)."""

    config: Any
    metrics: Any
    env_runner_group: Any
    learner_group: Any
    local_replay_buffer: Any

    def setup(self, config: Any) -> None:  # Trainable's and Algorithm's types differ
        super().setup(config)  # type: ignore[misc]  # a mixin: the Algorithm comes next
        buffer = dict(self.config.replay_buffer_config)
        prioritized = BUFFERS[_buffer_name(buffer.get("type"))]
        self.flat_replay = FlatReplay(
            int(buffer["capacity"]),
            alpha=float(buffer.get("alpha", 1.0)) if prioritized else None,
            seed=self.config.seed,
        )
        self.local_replay_buffer = None  # RLlib's, which this step does not use
        self.beta = float(buffer.get("beta", 0.0)) if prioritized else 0.0
        self.per_update = env_steps_per_update(self.config)
        self.updates_owed = 0.0

    def training_step(self) -> None:
        config = self.config
        with self.metrics.log_time((TIMERS, ENV_RUNNER_SAMPLING_TIMER)):
            per_call = config.learner_config_dict[UPDATES_PER_CALL] * self.per_update
            episodes, stats = self._sample(math.ceil(per_call))
        self.metrics.aggregate(stats, key=ENV_RUNNER_RESULTS)
        with self.metrics.log_time((TIMERS, REPLAY_BUFFER_ADD_DATA_TIMER)):
            added = self.flat_replay.add(episodes)
        # Not under RLlib's replay_buffer key, which its step aggregates into (a
        # checkpoint's metrics go from one step to the other).
        self.metrics.log_value(
            ("flat_replay", "num_env_steps_stored"), len(self.flat_replay), window=1
        )
        sampled = self.metrics.peek((ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME), default=0)
        if sampled < config.num_steps_sampled_before_learning_starts:
            return
        self.updates_owed += added / self.per_update
        updates = int(self.updates_owed)
        if updates == 0:
            return
        self.updates_owed -= updates
        size = config.total_train_batch_size
        with self.metrics.log_time((TIMERS, REPLAY_BUFFER_SAMPLE_TIMER)):
            drawn = self.flat_replay.sample(updates * size, config.n_step, config.gamma, self.beta)
        if drawn is None:  # no complete n-step transition yet: the updates wait
            self.updates_owed += updates
            return
        batch = MultiAgentBatch(
            {DEFAULT_MODULE_ID: SampleBatch(drawn.columns)}, env_steps=updates * size
        )
        # The env-step count each minibatch stands for: RLlib's step would have made
        # it after sampling `per_update` more env steps than the minibatch before.
        at = [int(sampled - (updates - 1 - k) * self.per_update) for k in range(updates)]
        with self.metrics.log_time((TIMERS, LEARNER_UPDATE_TIMER)):
            results = self.learner_group.update(
                batch=batch,
                minibatch_size=size,
                num_epochs=1,
                timesteps={
                    NUM_ENV_STEPS_SAMPLED_LIFETIME: sampled,
                    NUM_AGENT_STEPS_SAMPLED_LIFETIME: self.metrics.peek(
                        (ENV_RUNNER_RESULTS, NUM_AGENT_STEPS_SAMPLED_LIFETIME), default={}
                    ),
                    MINIBATCH_TIMESTEPS: at,
                },
            )
            # Each minibatch's TD errors, in order (kept out of the logged results).
            td_errors = results[0][DEFAULT_MODULE_ID].pop(TD_ERROR_KEY).peek()
            self.metrics.aggregate(results, key=LEARNER_RESULTS)
        with self.metrics.log_time((TIMERS, REPLAY_BUFFER_UPDATE_PRIOS_TIMER)):
            errors = np.concatenate([np.asarray(e) for e in _as_list(td_errors)])
            self.flat_replay.update_priorities(drawn.rows, errors)
        with self.metrics.log_time((TIMERS, SYNCH_WORKER_WEIGHTS_TIMER)):
            self.env_runner_group.sync_weights(
                from_worker_or_learner_group=self.learner_group,
                policies=set(results[0]) - {ALL_MODULES},
                inference_only=True,
            )

    def _sample(self, env_steps: int) -> tuple[list[Any], list[dict[str, Any]]]:
        """`env_steps` env steps from the EnvRunners, shared out among the healthy remote
        ones (the local one where there are none), with their metrics."""
        group = self.env_runner_group
        if group.num_remote_env_runners() <= 0:
            runner = group.local_env_runner
            return runner.sample(num_timesteps=env_steps), [runner.get_metrics()]
        each = math.ceil(env_steps / max(group.num_healthy_remote_workers(), 1))
        replies = group.foreach_env_runner(
            lambda w: (w.sample(num_timesteps=each), w.get_metrics()),
            local_env_runner=False,
            timeout_seconds=self.config.sample_timeout_s,
        )
        return [e for episodes, _ in replies for e in episodes], [m for _, m in replies]


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


class FastDQN(FastStep, DQN):
    """RLlib's DQN with the fast training step."""


class FastSAC(FastStep, SAC):
    """RLlib's SAC with the fast training step."""


# Each algorithm's (Algorithm, Learner) under the fast step.
FAST: dict[Any, tuple[type, type]] = {
    DQN: (FastDQN, FastDQNLearner),
    SAC: (FastSAC, FastSACLearner),
    PPO: (PPO, FastPPOLearner),
}


def _buffer_name(kind: Any) -> str:
    return kind if isinstance(kind, str) else getattr(kind, "__name__", str(kind))


def learner_refusal(config: AlgorithmConfig, ours: Collection[type] = ()) -> str | None:
    """Why the runner cannot swap its own Learner class in for `config`'s (None: it can):
    it replaces RLlib's default and `ours`, never a class of the user's."""
    if config.framework_str != "torch":
        return f"framework={config.framework_str}: the runner's Learners are torch's"
    if config.learner_class not in (config.get_default_learner_class(), *ours):
        return f"algo.learners.learner_class={config.learner_class.__name__} is the user's own"
    return None


def rllib_algorithm(algo_class: Any) -> Any:
    """The RLlib algorithm `algo_class` is, or stands in for under the fast step."""
    if not isinstance(algo_class, type):
        return algo_class
    return next((algo for algo in FAST if issubclass(algo_class, algo)), algo_class)


def unsupported(config: AlgorithmConfig) -> str | None:
    """Why the fast step cannot run `config` (None: it can)."""
    if config.algo_class not in FAST:
        return f"{getattr(config.algo_class, '__name__', config.algo_class)} is not DQN, SAC or PPO"
    why = learner_refusal(config)
    if why is not None or config.algo_class is PPO:  # PPO keeps RLlib's step
        return why
    if config.is_multi_agent:
        return "a multi-agent run samples RLlib's multi-agent replay buffer"
    kind = _buffer_name((getattr(config, "replay_buffer_config", None) or {}).get("type"))
    if kind not in BUFFERS:
        return (
            f"algo.training.replay_buffer_config.type={kind}: the flat buffer stands in "
            f"for {' and '.join(BUFFERS)} only"
        )
    if config.num_learners > 1:
        return f"scaling.num_learners={config.num_learners}: the fast step updates one Learner"
    if config.model_config.get("use_lstm") or config.model_config.get("use_attention"):
        return "a stateful module samples sequences, which the flat buffer does not"
    if (
        config._learner_connector is not None
        or not config.add_default_connectors_to_learner_pipeline
    ):
        return "the Learner connector pipeline is the user's, which the fast step does not run"
    return None


def choose(config: AlgorithmConfig, settings: FastStepConfig) -> None:
    """Give `config` the fast step's Algorithm and Learner where it can run it."""
    if not settings.enabled or unsupported(config) is not None:
        return
    algorithm, learner = FAST[config.algo_class]
    config.algo_class = algorithm
    own = {**config.learner_config_dict, UPDATES_PER_CALL: settings.updates_per_call}
    config.learners(learner_class=learner, learner_config_dict=own)


def describe(config: AlgorithmConfig, settings: FastStepConfig) -> str | None:
    """The run's start line on its training step (None for other algorithms)."""
    if isinstance(config.algo_class, type) and issubclass(config.algo_class, FastStep):
        return (
            f"training step: the runner's fast off-policy step ({settings.updates_per_call} "
            "updates per Learner call on a flat replay buffer; algo.fast_step.enabled=false: "
            "RLlib's own)"
        )
    if config.algo_class not in FAST:
        return None
    if config.algo_class is PPO and issubclass(config.learner_class, FastPPOLearner):
        return (
            "training step: RLlib's, its Learner's updates the runner's fast ones (fused Adam, "
            "one finiteness check, fused clipping; algo.fast_step.enabled=false: RLlib's own)"
        )
    if not settings.enabled:
        return "training step: RLlib's own (algo.fast_step.enabled=false)"
    reason = unsupported(config)
    return f"training step: RLlib's own, as the fast step cannot run this config: {reason}"
