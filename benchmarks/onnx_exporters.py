"""The onnxrt backend's exporter choice: torch's TorchScript exporter against its dynamo
exporter (which needs onnxscript), on the graph dynamo captures from Breakout's default
PPO module.

For each exporter: the seconds to export, then the model with the weights as initializers
(as the backend runs it), its largest gap to eager, and its calls per second at batch 16,
the two sessions' calls alternated. Without onnxscript the dynamo exporter is skipped.

    python benchmarks/onnx_exporters.py
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
import warnings

import onnxruntime as ort
import torch
from hydra import compose, initialize_config_dir
from ray.rllib.core.columns import Columns

from runner import CONFIG_DIR
from runner.api import register_configs
from runner.compile import onnxrt
from runner.job.app import prepare
from runner.settings.schema import typed
from runner.tasks.inference_bench import build_module


def captured_graph(batch_size: int) -> tuple:
    """Breakout's module, the FX graph dynamo hands a backend, its inputs and their names."""
    register_configs()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("config", overrides=["env=breakout"])
    module, obs = build_module(prepare(typed(cfg)).config)
    seen = {}

    def grab(gm, example_inputs):
        seen["gm"], seen["inputs"] = gm, example_inputs
        return gm

    batch = {Columns.OBS: obs.unsqueeze(0).repeat(batch_size, *[1] * obs.dim())}
    with torch.no_grad():
        reference = torch.compile(module._forward_exploration, backend=grab, dynamic=False)(batch)
    inputs = seen["inputs"]
    names = [
        f"param_{i}" if isinstance(x, torch.nn.Parameter) else f"input_{i}"
        for i, x in enumerate(inputs)
    ]
    expected = [v for v in reference.values() if torch.is_tensor(v)]
    return seen["gm"], inputs, names, expected


def dynamo_export(gm, inputs, names) -> bytes:
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(gm, tuple(inputs), dynamo=True, input_names=names)
    return program.model_proto.SerializeToString()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    args = parser.parse_args()
    gm, inputs, names, expected = captured_graph(16)
    params = {n: inputs[i] for i, n in enumerate(names) if n.startswith("param_")}
    exporters = {"torchscript": lambda: onnxrt._export(gm, inputs, names)[0]}
    if importlib.util.find_spec("onnxscript"):
        exporters["dynamo"] = lambda: dynamo_export(gm, inputs, names)
    else:
        print("dynamo exporter: skipped, it needs onnxscript (pip install onnxscript)")
    sessions, feeds = {}, {}
    for name, export in exporters.items():
        start = time.perf_counter()
        model, _ = onnxrt._weights_as_initializers(export(), params)
        seconds = time.perf_counter() - start
        session = ort.InferenceSession(
            model.SerializeToString(), onnxrt._session_options(), ["CPUExecutionProvider"]
        )
        used = {i.name for i in session.get_inputs()}
        feeds[name] = {n: inputs[i].detach().numpy() for i, n in enumerate(names) if n in used}
        outputs = session.run(None, feeds[name])
        gap = max(
            float((torch.from_numpy(y) - e).abs().max())
            for y, e in zip(outputs, expected, strict=True)
        )
        sessions[name] = session
        print(f"{name:<12} export {seconds:6.2f} s | max |onnx - eager| {gap:.1e}")
    times: dict[str, list[float]] = {name: [] for name in sessions}
    for call in range(args.calls + args.calls // 10):
        for name, session in sessions.items():
            start = time.perf_counter()
            session.run(None, feeds[name])
            if call >= args.calls // 10:  # after a warm-up tenth
                times[name].append(time.perf_counter() - start)
    for name, values in times.items():
        print(f"{name:<12} batch 16: {1 / statistics.median(values):8.1f} calls/s")


if __name__ == "__main__":
    main()
