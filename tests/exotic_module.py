"""PPO's default RLModule plus an op the ONNX exporter has no conversion for (erfinv):
torch and inductor run it, the onnxrt backend fails to compile it. Runs name it as
`module_class: exotic_module:ErfinvPPOModule` with this dir on PYTHONPATH."""

from __future__ import annotations

from typing import Any

import torch
from ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module import (
    DefaultPPOTorchRLModule,
)
from ray.rllib.core.columns import Columns


class ErfinvPPOModule(DefaultPPOTorchRLModule):
    def _forward(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        out = super()._forward(batch, **kwargs)
        logits = out[Columns.ACTION_DIST_INPUTS]
        out[Columns.ACTION_DIST_INPUTS] = logits + 0.01 * torch.special.erfinv(
            0.5 * torch.tanh(logits)
        )
        return out
