"""A trained policy as ONNX, with what it takes to run it anywhere (task=export).

policy.onnx is the module's inference forward (RLlib's `forward_inference`: what a greedy
EnvRunner calls): observations in, the action distribution's inputs out (DQN: the greedy
actions), a dynamic batch dimension, the weights as constants (onnxruntime pre-packs
those). policy.json says what goes in (the observation space, dtype, and the env wrappers
and connectors that made the observation, e.g. Atari's frame stacking) and how to turn
the outputs into the env's action. Parity with the torch module on real observations at
each of `task.batch_sizes` must be within `task.tolerance`, else nothing is kept.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Any, cast

import gymnasium as gym
import numpy as np
import onnxruntime as ort
import torch
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.connectors.connector_pipeline_v2 import ConnectorPipelineV2
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.rl_module import RLModule
from ray.rllib.core.rl_module.torch import TorchRLModule
from torch.onnx import symbolic_helper

from runner.algorithms import trained
from runner.console import console
from runner.envs import make_env, random_rollout, wraps_atari
from runner.errors import ConfigError, RunnerError
from runner.job.task import TaskRun
from runner.results.files import POLICY, versions, write_json
from runner.settings.schema import RunnerConfig

INPUT = "obs"
NANMEAN_OPSET = 15  # CastLike, and ReduceSum's axes as an input, need 15


class ExportFailed(RunnerError):
    """The module did not export, or the export disagrees with torch."""


class InferenceForward(torch.nn.Module):
    """`forward_inference` as a plain module: observations in, a tuple of tensors out."""

    def __init__(self, module: RLModule, outputs: list[str]) -> None:
        super().__init__()
        self.module, self.outputs = module, outputs

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.module.forward_inference({Columns.OBS: obs})
        return tuple(out[name] for name in self.outputs)


def observations(config: AlgorithmConfig, settings: RunnerConfig, module: RLModule, n: int):
    """`n` observations as the module sees them: the env's own (random actions from a
    seeded reset) when the module takes them unchanged, else samples of its space."""
    space, _ = trained.spaces_of(module)
    env = make_env(config)
    try:
        if env.observation_space.shape != space.shape:
            return np.stack([space.sample() for _ in range(n)]).astype(np.float32)
        return random_rollout(env, 0, n)["obs"].astype(np.float32)
    finally:
        env.close()


@symbolic_helper.parse_args("v", "is", "i", "none")
def _nanmean(g: Any, x: Any, dim: list[int], keepdim: int, dtype: Any) -> Any:
    """aten::nanmean, which the TorchScript exporter lacks and RLlib's dueling DQN head
    uses: the sum of the non-NaN entries over their count."""
    nan = g.op("IsNaN", x)
    zero = g.op("CastLike", g.op("Constant", value_t=torch.tensor(0.0)), x)
    axes = g.op("Constant", value_t=torch.tensor(dim, dtype=torch.long))
    total = g.op("ReduceSum", g.op("Where", nan, zero, x), axes, keepdims_i=keepdim)
    count = g.op("ReduceSum", g.op("CastLike", g.op("Not", nan), x), axes, keepdims_i=keepdim)
    return g.op("Div", total, count)


def add_onnx_conversions() -> None:
    """The conversions RLlib's default modules need beyond torch's own (process-wide)."""
    torch.onnx.register_custom_op_symbolic("aten::nanmean", _nanmean, NANMEAN_OPSET)


def _export(forward: InferenceForward, obs: torch.Tensor, path: Path, opset: int | None) -> None:
    add_onnx_conversions()
    batch = {0: "batch"}
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                forward,
                (obs,),
                str(path),
                dynamo=False,
                input_names=[INPUT],
                output_names=forward.outputs,
                dynamic_axes={INPUT: batch, **{name: batch for name in forward.outputs}},
                opset_version=opset,
            )
    except Exception as ex:
        reason = (str(ex).strip().splitlines() or [""])[0]
        raise ExportFailed(
            f"{type(forward.module).__name__} cannot be exported to ONNX: "
            f"{type(ex).__name__}: {reason} (an operator ONNX lacks: export a module "
            "built from ONNX-supported ops, or raise task.opset)"
        ) from ex


def parity(
    forward: InferenceForward, session: ort.InferenceSession, obs: np.ndarray, sizes: list[int]
) -> dict[str, float]:
    """The largest absolute gap between torch and onnxruntime at each batch size."""
    gaps = {}
    for size in sizes:
        batch = np.resize(obs, (size, *obs.shape[1:]))  # repeats the real ones past len(obs)
        with torch.no_grad():
            ours = [t.numpy() for t in forward(torch.from_numpy(batch))]
        theirs = session.run(forward.outputs, {INPUT: batch})
        gaps[str(size)] = max(
            float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
            for a, b in zip(ours, theirs, strict=True)
        )
    return gaps


def _bounds(values: np.ndarray) -> list[float | str]:
    return [float(v) if np.isfinite(v) else str(float(v)) for v in values.ravel()]


def describe_space(space: gym.Space) -> dict[str, Any]:
    found: dict[str, Any] = {"type": type(space).__name__, "dtype": str(space.dtype)}
    if isinstance(space, gym.spaces.Discrete):
        found.update(n=int(space.n), start=int(space.start))
    elif isinstance(space, gym.spaces.Box):
        found.update(shape=list(space.shape))
        if space.shape and int(np.prod(space.shape)) <= 64:  # JSON has no infinity: "inf"
            found.update(low=_bounds(space.low), high=_bounds(space.high))
        else:
            found.update(low=float(space.low.min()), high=float(space.high.max()))
    return found


def to_action(module: RLModule, outputs: list[str], config: AlgorithmConfig) -> dict[str, Any]:
    """How the outputs become the env's action, greedy and sampled (RLlib's own steps:
    the distribution, then NormalizeAndClipActions)."""
    space = module.action_space
    if "actions" in outputs:  # DQN: its inference forward takes the argmax itself
        steps = {"greedy": "actions", "sample": "actions (epsilon-greedy only while training)"}
        return {"distribution": None, **steps, "to_env": "the action as is"}
    dist = module.get_inference_action_dist_cls().__name__
    n = space.shape[0] if isinstance(space, gym.spaces.Box) else None
    steps = {
        "TorchCategorical": {
            "greedy": "argmax(action_dist_inputs, axis=-1)",
            "sample": "a draw from softmax(action_dist_inputs)",
        },
        "TorchDiagGaussian": {
            "greedy": f"action_dist_inputs[:, :{n}] (the mean)",
            "sample": f"mean + exp(action_dist_inputs[:, {n}:]) * standard normal noise",
        },
        "TorchSquashedGaussian": {
            "greedy": f"tanh(action_dist_inputs[:, :{n}])",
            "sample": f"tanh(mean + exp(action_dist_inputs[:, {n}:]) * standard normal noise)",
        },
    }.get(dist, {"greedy": f"the mode of {dist}", "sample": f"a draw from {dist}"})
    bounded = isinstance(space, gym.spaces.Box) and space.is_bounded()
    if bounded and config.normalize_actions:
        to_env = "clip(low + (a + 1) * (high - low) / 2, low, high)  (the action space's bounds)"
    elif bounded and config.clip_actions:
        to_env = "clip(a, low, high)"
    else:
        to_env = "the action as is"
    return {"distribution": dist, **steps, "to_env": to_env}


def describe_env(settings: RunnerConfig, pipeline: ConnectorPipelineV2) -> dict[str, Any]:
    """What makes an observation: the env, its wrappers, the EnvRunner's connectors."""
    env = settings.env
    found: dict[str, Any] = {"id": env.id, "entry_point": env.entry_point}
    found["env_config"] = dict(env.env_config)
    if wraps_atari(env):
        found["wrapper"] = (
            "ray.rllib.env.wrappers.atari_wrappers.wrap_atari_for_new_api_stack"
            f"(env, framestack={env.framestack}): 64x64 grayscale frames scaled to [0, 1], "
            f"frameskip 4, the last {env.framestack} frames stacked on the last axis"
        )
    found["env_to_module"] = [type(piece).__name__ for piece in pipeline.connectors]
    return found


def _exported_within_tolerance(
    forward: InferenceForward, obs: np.ndarray, final: Path, task: Any
) -> tuple[dict[str, float], float]:
    """`final` written only if onnxruntime's outputs match torch's within task.tolerance
    at every batch size (exported beside it first); the gap per batch size, and the
    export's seconds."""
    temporary = final.with_name(f".{final.name}.tmp")
    started = time.perf_counter()
    _export(forward, torch.from_numpy(obs[:1]), temporary, task.opset)
    export_seconds = time.perf_counter() - started
    try:
        session = ort.InferenceSession(str(temporary), providers=["CPUExecutionProvider"])
        gaps = parity(forward, session, obs, task.batch_sizes)
        worst = max(gaps.values())
        if worst > task.tolerance:
            raise ExportFailed(
                f"the ONNX policy differs from the torch module by {worst:.3g} (batch sizes "
                f"{gaps}), more than task.tolerance={task.tolerance:g}: nothing was kept"
            )
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    temporary.rename(final)
    return gaps, export_seconds


def export(run: TaskRun) -> None:
    """policy.onnx and policy.json in the run dir, or nothing if the export disagrees."""
    settings, run_dir = run.settings, run.files
    task: Any = settings.task  # task=export's ExportSettings
    assert run.checkpoint is not None  # app.run resolves checkpoint= before the task runs
    modules = trained.load_modules(run.checkpoint)
    config = run.config
    pipeline = trained.check_fits(modules, config, settings.env)
    if pipeline is None or len(modules) != 1:
        raise ConfigError(
            f"task=export writes one single-agent policy; this checkpoint holds "
            f"{len(modules)} module(s) ({', '.join(modules.keys())}) of a multi-agent run: "
            "multi-agent export is not supported"
        )
    module_id, built = next(iter(modules.items()))
    # RLlib's torch framework builds TorchRLModules; the checkpoint's are typed RLModule.
    module = cast(TorchRLModule, built).eval()
    obs = observations(config, settings, module, max(task.batch_sizes))
    with torch.no_grad():
        sample = module.forward_inference({Columns.OBS: torch.from_numpy(obs[:1])})
    outputs = sorted(k for k, v in sample.items() if isinstance(v, torch.Tensor))
    forward = InferenceForward(module, outputs)
    final = run_dir / "policy.onnx"
    gaps, export_seconds = _exported_within_tolerance(forward, obs, final, task)
    shapes = {name: list(sample[name].shape[1:]) for name in outputs}
    described = {
        "onnx": final.name,
        "module_id": module_id,
        "module_class": f"{type(module).__module__}.{type(module).__qualname__}",
        "algo": settings.algo.name,
        "input": {"name": INPUT, "dtype": "float32", "shape": ["batch", *obs.shape[1:]]},
        "outputs": [{"name": n, "shape": ["batch", *shapes[n]]} for n in outputs],
        "observation_space": describe_space(trained.spaces_of(module)[0]),
        "action_space": describe_space(trained.spaces_of(module)[1]),
        "action": to_action(module, outputs, config),
        "env": describe_env(settings, pipeline),
        "parity": {"max_abs_diff": gaps, "tolerance": task.tolerance},
        "export_seconds": export_seconds,
        "checkpoint": str(run.checkpoint.resolve()),
        "versions": {**versions(), "onnxruntime": ort.__version__},
    }
    write_json(run_dir / POLICY, described)
    run.record["export"] = described
    console.print(
        f"exported {type(module).__name__} to {final}: max abs diff to torch "
        + ", ".join(f"{g:.2g} at batch {b}" for b, g in gaps.items())
        + f"; how to use it: {run_dir / POLICY}"
    )
