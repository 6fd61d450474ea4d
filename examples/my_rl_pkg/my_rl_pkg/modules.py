"""An RLModule of its own for PPO: a torch MLP policy and value head on a shared trunk."""

from __future__ import annotations

from typing import Any

import torch
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.apis import ValueFunctionAPI
from ray.rllib.core.rl_module.torch import TorchRLModule


class MLPModule(TorchRLModule, ValueFunctionAPI):
    """model_config: `hidden` (the trunk's widths, default [64, 64])."""

    def setup(self) -> None:
        widths = [self.observation_space.shape[0], *self.model_config.get("hidden", [64, 64])]
        layers: list[torch.nn.Module] = []
        for inputs, outputs in zip(widths[:-1], widths[1:], strict=True):
            layers += [torch.nn.Linear(inputs, outputs), torch.nn.Tanh()]
        self.trunk = torch.nn.Sequential(*layers)
        self.policy = torch.nn.Linear(widths[-1], self.action_space.n)
        self.value = torch.nn.Linear(widths[-1], 1)

    def _forward(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return {Columns.ACTION_DIST_INPUTS: self.policy(self.trunk(batch[Columns.OBS]))}

    def _forward_train(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        features = self.trunk(batch[Columns.OBS])
        return {Columns.ACTION_DIST_INPUTS: self.policy(features), Columns.EMBEDDINGS: features}

    def compute_values(self, batch: dict[str, Any], embeddings: Any = None) -> torch.Tensor:
        if embeddings is None:
            embeddings = self.trunk(batch[Columns.OBS])
        return self.value(embeddings).squeeze(-1)
