"""An `onnxrt` torch.compile backend on onnxruntime (torch removed its own in 2.9).

Dynamo hands the backend a captured FX graph whose inputs include the module's
parameters (nn.Module parameters are graph inputs since inline_inbuilt_nn_modules). The
graph is exported to ONNX once, and the parameters become initializers: constants that
onnxruntime folds and pre-packs when it creates a session. Fed as inputs on every call
instead, they cannot be pre-packed (Breakout's module ran 57 % slower than eager at batch
16 that way, 29 % faster as initializers).

A weight sync writes the parameters in place. Each call compares the parameters' version
counters and storage with those the session was built from; on a change it first builds a
new session from the same export with the new weights written into its initializers (no
new export: a few milliseconds). Rebuilds and their seconds are counted
in dynamo's `counters["onnxrt"]`, which the component reports read.

The batch dimension of every other input is dynamic. Inference only: nothing flows back
for gradients.
"""

from __future__ import annotations

import io
import time
import warnings
from collections.abc import Callable, Sequence

import onnx
import onnxruntime as ort
import torch
import torch._dynamo
from onnx import numpy_helper
from torch._dynamo.utils import counters
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


def _export(
    gm: GraphModule, example_inputs: Sequence[torch.Tensor], names: list[str]
) -> tuple[bytes, bool]:
    """The graph as ONNX (the TorchScript exporter), every non-parameter input and every
    output with a dynamic batch dimension; and whether the graph returns one tensor."""
    with torch.no_grad():
        sample = gm(*example_inputs)
    outputs = [sample] if isinstance(sample, torch.Tensor) else list(sample)
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
            buffer,  # type: ignore[arg-type]  # TorchScript's exporter writes file objects too
            dynamo=False,
            input_names=names,
            output_names=out_names,
            dynamic_axes=dynamic_axes,
        )
    return buffer.getvalue(), isinstance(sample, torch.Tensor)


def _weights_as_initializers(
    model_bytes: bytes, params: dict[str, torch.Tensor]
) -> tuple[onnx.ModelProto, dict[str, onnx.TensorProto]]:
    """The model with the parameter inputs turned into initializers, and those by name
    (the exporter drops inputs the graph does not use)."""
    model = onnx.load_from_string(model_bytes)
    graph = model.graph
    baked = {}
    for name in sorted({i.name for i in graph.input} & params.keys()):
        baked[name] = numpy_helper.from_array(params[name].detach().cpu().numpy(), name)
        graph.initializer.append(baked[name])
    kept = [i for i in graph.input if i.name not in baked]
    del graph.input[:]
    graph.input.extend(kept)
    return model, {t.name: t for t in graph.initializer if t.name in baked}


class OnnxrtGraph:
    """One captured graph on onnxruntime, its weights baked in, rebuilt when they change."""

    def __init__(self, gm: GraphModule, example_inputs: Sequence[torch.Tensor]) -> None:
        if any(not isinstance(x, torch.Tensor) for x in example_inputs):
            raise ConfigError(
                "the onnxrt backend takes tensor inputs only; use compile.dynamic=false"
            )
        if any(x.device.type != "cpu" for x in example_inputs):
            raise ConfigError(
                "the onnxrt backend runs on onnxruntime's CPU provider: it compiles modules "
                "on the CPU only; pick another backend for a GPU module"
            )
        names = [
            f"param_{i}" if _is_parameter(x) else f"input_{i}" for i, x in enumerate(example_inputs)
        ]
        params = {n: example_inputs[i] for i, n in enumerate(names) if n.startswith("param_")}
        exported, self.single = _export(gm, example_inputs, names)
        self.model, self.weights = _weights_as_initializers(exported, params)
        self.param_slots = {n: names.index(n) for n in self.weights}
        self.session = self._session(example_inputs)
        used = {i.name for i in self.session.get_inputs()}  # the exporter drops unused ones
        self.feeds_for = [(n, i) for i, n in enumerate(names) if n in used]
        self.out_names = [o.name for o in self.session.get_outputs()]
        self.built_from = self._stamp(example_inputs)
        counters["onnxrt"]["sessions"] += 1

    def _stamp(self, args: Sequence[torch.Tensor]) -> tuple:
        """What changes when a parameter is written: its version counter or its storage."""
        return tuple((args[i]._version, args[i].data_ptr()) for i in self.param_slots.values())

    def _session(self, args: Sequence[torch.Tensor]) -> ort.InferenceSession:
        """A session with the parameters' current values written into the model's
        initializers (embedded: onnxruntime pre-packs embedded initializers, not ones it
        is handed as external initializers, which measured 43 % slower at batch 16)."""
        for name, i in self.param_slots.items():
            self.weights[name].raw_data = args[i].detach().cpu().numpy().tobytes()
        return ort.InferenceSession(
            self.model.SerializeToString(), _session_options(), providers=["CPUExecutionProvider"]
        )

    def __call__(self, *args: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        stamp = self._stamp(args)
        if stamp != self.built_from:
            start = time.perf_counter()
            self.session = self._session(args)
            self.built_from = stamp
            counters["onnxrt"]["rebuilds"] += 1
            # dynamo's counters are typed as int Counters; the seconds are a float beside.
            counters["onnxrt"]["rebuild_seconds"] += time.perf_counter() - start  # type: ignore[assignment]
        feeds = {n: args[i].detach().cpu().contiguous().numpy() for n, i in self.feeds_for}
        results = [torch.from_numpy(y) for y in self.session.run(self.out_names, feeds)]
        return results[0] if self.single else tuple(results)


def onnxrt_backend(gm: GraphModule, example_inputs: Sequence[torch.Tensor]) -> Callable:
    """Export `gm` to ONNX once and run it with onnxruntime on every call."""
    return OnnxrtGraph(gm, example_inputs)


def register() -> None:
    """Make `backend="onnxrt"` resolve to this backend in this process (idempotent)."""
    if NAME not in torch._dynamo.list_backends(exclude_tags=()):
        torch._dynamo.register_backend(onnxrt_backend, name=NAME)
