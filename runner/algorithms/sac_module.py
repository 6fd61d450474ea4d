"""SAC's RLModule with Stable-Baselines3's Q networks, for flat observations and actions.

RLlib's SAC module (Ray 2.60) encodes a continuous action's Q input in two streams, the
observation and the action each through its own `fcnet_hiddens` layers, and fuses them
through one more layer before the head: with `fcnet_hiddens=[256]` and
`head_fcnet_hiddens=[256]` a Q network is 3->256 and 1->256, 512->256, 256->256->1, about
three times the multiply-adds of SB3's 4->256->256->1 (issue 60). `SB3QSAC` feeds the Q
networks the observation and action concatenated through one MLP encoder
(`fcnet_hiddens`) into RLlib's head (`head_fcnet_hiddens`), SB3's `ContinuousCritic`; the
policy is RLlib's own. Its training forward pass is RLlib's, with the next state's policy
and target Q values computed without recording gradients, which RLlib's loss detaches
anyway. The losses, optimizers and target updates are RLlib's SAC Learner's.

Named from YAML as a module class (conf/tuned/sac_pendulum.yaml):

    algo.rl_module.rl_module_spec:
      _target_: ray.rllib.core.rl_module.rl_module.RLModuleSpec
      module_class: runner.algorithms.sac_module:SB3QSAC
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import torch
from ray.rllib.algorithms.sac.sac_catalog import SACCatalog
from ray.rllib.algorithms.sac.sac_learner import QF_PREDS, QF_TWIN_PREDS
from ray.rllib.algorithms.sac.torch.default_sac_torch_rl_module import DefaultSACTorchRLModule
from ray.rllib.core.columns import Columns
from ray.rllib.core.models.base import ENCODER_OUT, Encoder, Model
from ray.rllib.core.models.configs import MLPEncoderConfig

from runner.errors import ConfigError

NEXT_INPUTS = "action_dist_inputs_next"  # sac_learner.ACTION_DIST_INPUTS_NEXT


def _width(space: gym.Space) -> int | None:
    """A flat Box's size (None for any other space)."""
    flat = isinstance(space, gym.spaces.Box) and len(space.shape) == 1
    return space.shape[0] if flat and space.shape else None


class SB3QCatalog(SACCatalog):
    """SACCatalog whose continuous Q encoder is one MLP over [observation, action]."""

    def _build_qf_encoder_continuous(self, framework: str) -> Encoder:
        obs, actions = self.observation_space, self.action_space
        widths = (_width(obs), _width(actions))
        if None in widths:
            raise ConfigError(
                "runner.algorithms.sac_module:SB3QSAC takes flat Box observations and actions, "
                f"not {obs} and {actions}: drop algo.rl_module.rl_module_spec for RLlib's SAC "
                "module"
            )
        hiddens = list(self._model_config_dict["fcnet_hiddens"])
        activation = self._model_config_dict["fcnet_activation"]
        config = MLPEncoderConfig(
            input_dims=(sum(w or 0 for w in widths),),
            hidden_layer_dims=hiddens[:-1],
            hidden_layer_activation=activation,
            output_layer_dim=self.latent_dims[0],
            output_layer_activation=activation,
        )
        return config.build(framework=framework)


class SB3QSAC(DefaultSACTorchRLModule):
    """RLlib's SAC module on SB3QCatalog's Q encoders (see the module's docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("catalog_class") is None:  # RLModuleSpec passes None for the default
            kwargs["catalog_class"] = SB3QCatalog
        super().__init__(*args, **kwargs)

    def _continuous(self) -> bool:
        return isinstance(self.action_space, gym.spaces.Box)

    def _qf_forward_train_helper(
        self, batch: dict[str, Any], encoder: Encoder, head: Model, squeeze: bool = True
    ) -> Any:
        if not self._continuous():
            return super()._qf_forward_train_helper(batch, encoder, head, squeeze=squeeze)
        joined = torch.cat([batch[Columns.OBS], batch[Columns.ACTIONS]], dim=-1)
        # RLlib types its torch Encoder and Model abstractly; both are nn.Modules here.
        out = head(encoder({Columns.OBS: joined})[ENCODER_OUT])  # type: ignore[operator]
        return out.squeeze(-1) if squeeze else out

    def _forward_train_continuous(self, batch: dict[str, Any]) -> dict[str, Any]:
        """RLlib's continuous forward pass (default_sac_torch_rl_module.py), the next
        state's parts without gradients."""
        obs, actions = batch[Columns.OBS], batch[Columns.ACTIONS]
        current = {Columns.OBS: obs, Columns.ACTIONS: actions}
        output: dict[str, Any] = {
            QF_PREDS: self._qf_forward_train_helper(current, self.qf_encoder, self.qf)
        }
        if self.twin_q:
            output[QF_TWIN_PREDS] = self._qf_forward_train_helper(
                current, self.qf_twin_encoder, self.qf_twin
            )
        logits = self.pi(self.pi_encoder({Columns.OBS: obs})[ENCODER_OUT])
        output[Columns.ACTION_DIST_INPUTS] = logits
        dist_class = self.get_train_action_dist_cls()
        resampled, output["logp_resampled"] = dist_class.from_logits(logits).rsample_and_logp()
        with torch.no_grad():
            next_obs = batch[Columns.NEXT_OBS]
            next_logits = self.pi(self.pi_encoder({Columns.OBS: next_obs})[ENCODER_OUT])
            output[NEXT_INPUTS] = next_logits
            next_actions, output["logp_next_resampled"] = dist_class.from_logits(
                next_logits
            ).sample_and_logp()
            output["q_target_next"] = self.forward_target(
                {Columns.OBS: next_obs, Columns.ACTIONS: next_actions}
            )
        # The policy's gradient through the Q networks, not the Q networks' own (RLlib's
        # straight-through pass).
        q_params = [p for net in self._q_networks() for p in net.parameters()]
        for param in q_params:
            param.requires_grad_(False)
        output["q_curr"] = self.compute_q_values({Columns.OBS: obs, Columns.ACTIONS: resampled})
        for param in q_params:
            param.requires_grad_(True)
        return output

    def _q_networks(self) -> list[torch.nn.Module]:
        nets = [self.qf_encoder, self.qf]
        return nets + [self.qf_twin_encoder, self.qf_twin] if self.twin_q else nets
