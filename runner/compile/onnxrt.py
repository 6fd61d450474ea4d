"""An `onnxrt` torch.compile backend on onnxruntime (torch removed its own in 2.9).

Dynamo hands the backend a captured FX graph whose inputs include the module's
parameters (nn.Module parameters are graph inputs since inline_inbuilt_nn_modules), so
the ONNX model takes the weights as inputs on every call: a weight sync that writes the
parameters in place is seen by the next call without re-exporting. The batch dimension of
every non-parameter input is dynamic. Inference only: nothing flows back for gradients.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable, Sequence

import onnxruntime as ort
import torch
import torch._dynamo
from torch.fx import GraphModule

from runner.errors import ConfigError

NAME = "onnxrt"


def _is_parameter(value: object) -> bool:
    return isinstance(value, torch.nn.Parameter)


def _session_options() -> ort.SessionOptions:
    """As many threads as torch has here, none spinning between calls.

    onnxruntime's default is a thread per core that busy-waits after each run: in a 1-CPU
    EnvRunner that oversubscribes the machine, and it steals the cores eager torch code runs
    on next (the inference bench measured eager 5x slower beside it at batch 16).
    """
    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


def onnxrt_backend(gm: GraphModule, example_inputs: Sequence[torch.Tensor]) -> Callable:
    """Export `gm` to ONNX once and run it with onnxruntime on every call."""
    if any(not isinstance(x, torch.Tensor) for x in example_inputs):
        raise ConfigError("the onnxrt backend takes tensor inputs only; use compile.dynamic=false")
    names = [f"input_{i}" for i in range(len(example_inputs))]
    with torch.no_grad():
        sample = gm(*example_inputs)
    single = isinstance(sample, torch.Tensor)
    outputs = [sample] if single else list(sample)
    if any(not isinstance(y, torch.Tensor) for y in outputs):
        raise ConfigError("the onnxrt backend supports graphs that return tensors only")
    out_names = [f"output_{i}" for i in range(len(outputs))]
    batch = {0: "batch"}
    dynamic_axes = {
        name: batch
        for name, x in zip(names, example_inputs, strict=True)
        if x.dim() > 0 and not _is_parameter(x)
    }
    dynamic_axes.update(
        {name: batch for name, y in zip(out_names, outputs, strict=True) if y.dim() > 0}
    )

    buffer = io.BytesIO()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            gm,
            tuple(example_inputs),
            buffer,
            dynamo=False,
            input_names=names,
            output_names=out_names,
            dynamic_axes=dynamic_axes,
        )
    session = ort.InferenceSession(
        buffer.getvalue(), _session_options(), providers=["CPUExecutionProvider"]
    )
    used = {i.name for i in session.get_inputs()}  # the exporter drops unused inputs
    feeds_for = [(name, i) for i, name in enumerate(names) if name in used]

    def run(*args: torch.Tensor):
        feeds = {name: args[i].detach().cpu().contiguous().numpy() for name, i in feeds_for}
        results = [torch.from_numpy(y) for y in session.run(out_names, feeds)]
        return results[0] if single else tuple(results)

    return run


def register() -> None:
    """Make `backend="onnxrt"` resolve to this backend in this process (idempotent)."""
    if NAME not in torch._dynamo.list_backends(exclude_tags=()):
        torch._dynamo.register_backend(onnxrt_backend, name=NAME)
