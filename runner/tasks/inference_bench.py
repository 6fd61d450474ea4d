"""task=inference_bench, after RLlib's published method (run_inference_bm.py).

The env's default PPO RLModule is built as the runner builds it for the EnvRunners, once
eager and once compiled as the runner compiles EnvRunner modules. As published (a process
per batch size), each batch size gets a fresh compiled copy with static shapes, dynamo's
caches emptied before it: one graph per batch size, none shared or recompiled with a
symbolic batch dimension. One real observation is repeated to each batch size; after a
burn-in, eager and compiled `forward_exploration` calls alternate one by one under
no_grad, so both see the same machine. Throughput = 1 / median seconds per call (calls per
second, not samples); speedup = compiled / eager - 1.
"""

from __future__ import annotations

import contextlib
import copy
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar, cast

from runner.console import console, progress
from runner.errors import ConfigError
from runner.job.task import Task, TaskRun, own_settings
from runner.results import plots
from runner.results.files import BENCH, write_csv, write_json
from runner.settings.schema import Accelerator, RunnerConfig, TaskSettings

if TYPE_CHECKING:  # light at import: the task's heavy modules load when it runs
    import torch._dynamo
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
    from ray.rllib.core.rl_module.torch import TorchRLModule

    from runner.compile.settings import CompileSpec
    from runner.machine.plan import Plan


NEEDS_COMPILE = (
    "task=inference_bench compares an eager with a compiled module: pick a compile preset, "
    "e.g. compile=inductor_default"
)


@dataclass
class InferenceBenchSettings(TaskSettings):
    """Timed forward_exploration calls per module and batch size."""

    name: ClassVar[str] = "inference_bench"

    batch_sizes: list[int] = field(default_factory=lambda: [1, 4, 16])
    iterations: int = 300
    burn_in: int = 30
    threads: int | None = 1  # torch threads (1: what Ray gives a 1-CPU EnvRunner; null: torch's)


def check(settings: RunnerConfig, spec: CompileSpec | None) -> list[str]:
    """Bad bench settings fail before anything is built; CUDA graphs on a CPU module warn."""
    from runner.compile.settings import check_placement

    task = own_settings(settings, InferenceBenchSettings)
    if spec is None:
        raise ConfigError(NEEDS_COMPILE)
    if settings.algo.multi_agent:
        raise ConfigError(
            "task=inference_bench times one RLModule; drop algo.multi_agent, or time a "
            "multi-agent run's EnvRunners with task=exploration_bench"
        )
    if not task.batch_sizes or min(task.batch_sizes) < 1:
        raise ConfigError(f"task.batch_sizes must be whole numbers >= 1, got {task.batch_sizes}")
    if task.iterations < 1 or task.burn_in < 0:
        raise ConfigError(
            "task.iterations must be >= 1 and task.burn_in >= 0, got "
            f"{task.iterations} and {task.burn_in}"
        )
    if task.threads is not None and task.threads < 1:
        raise ConfigError(
            f"task.threads must be >= 1 (or null: torch's default), got {task.threads}"
        )
    return check_placement(spec, {"benchmarked module": bench_device(settings)}, settings.algo.name)


def bench_device(settings: RunnerConfig) -> str:
    """Where the bench puts the module: the hardware profile's accelerator."""
    return "cuda" if settings.hardware.accelerator == Accelerator.cuda else "cpu"


def driver_only(plan: Plan, settings: RunnerConfig) -> Plan:
    """The bench starts no actor: the module runs here, on the GPU for a GPU profile."""
    from runner.machine.plan import Group, Plan

    gpus = 1.0 if bench_device(settings) == "cuda" else 0.0
    note = f"the driver: the benchmarked module, on {bench_device(settings)}"
    return Plan(groups=[Group("main", 1, 1.0, gpus, note)], strategy=plan.strategy)


def build_module(config: AlgorithmConfig) -> tuple[TorchRLModule, torch.Tensor]:
    """The EnvRunner's RLModule for this config, and one real observation of its env."""
    import torch._dynamo

    from runner.algorithms.algorithm_config import build_module
    from runner.envs import make_env

    env = make_env(config)
    try:
        obs, _ = env.reset(seed=config.seed)
        # RLlib's torch framework builds a TorchRLModule (single-agent: checked by `check`).
        module = cast("TorchRLModule", build_module(config, env, inference_only=True)).eval()
    finally:
        env.close()
    return module, torch.as_tensor(obs)


def _timed(module: TorchRLModule, batch: dict, cuda: bool) -> float:
    import torch._dynamo

    start = time.perf_counter()
    module.forward_exploration(batch)
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start


@contextlib.contextmanager
def _inductor_cache(cache_dir: str | None) -> Iterator[None]:
    """TORCHINDUCTOR_CACHE_DIR set to `cache_dir`, or to a fresh dir removed afterwards."""
    previous = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="inductor-") as fresh:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir or fresh
        try:
            yield
        finally:
            if previous is None:
                del os.environ["TORCHINDUCTOR_CACHE_DIR"]
            else:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = previous


def measure(
    module: torch.nn.Module,
    obs: torch.Tensor,
    spec: CompileSpec,
    batch_sizes: list[int],
    iterations: int,
    burn_in: int,
    cache_dir: str | None = None,
) -> list[dict[str, Any]]:
    """Eager vs compiled forward_exploration per batch size, calls alternated one by one.

    Each batch size compiles a fresh copy after a dynamo reset, and inductor gets a fresh
    cache (unless `cache_dir`), so each first compiled call's seconds are a cold compile.
    The module's device is used as it is.
    """
    with _inductor_cache(cache_dir):
        return _measure(module, obs, spec, batch_sizes, iterations, burn_in)


# Process-wide counters read around each batch size's calls: what compiling it did.
COMPILE_COUNTS = ("frames", "unique_graphs", "cudagraph_skips", "cudagraph_recordings")


def _compiled_copy(module: TorchRLModule, spec: CompileSpec) -> TorchRLModule:
    """A copy of `module` whose forward_exploration compiles afresh, with static shapes."""
    import torch._dynamo

    from runner.compile.apply import compile_function

    torch._dynamo.reset()  # dynamo caches per code object: the copies share theirs
    twin = copy.deepcopy(module)
    # Compiled in place of the method, as RLlib's own torch_compile does.
    twin._forward_exploration = compile_function(  # type: ignore[method-assign]
        replace(spec, dynamic=False), twin._forward_exploration
    )
    return twin


def _measure(module, obs, spec, batch_sizes, iterations, burn_in) -> list[dict[str, Any]]:
    import torch._dynamo
    from ray.rllib.core.columns import Columns

    from runner.compile.apply import counts

    device = next(module.parameters()).device
    cuda = device.type == "cuda"
    rows = []
    calls = 1 + burn_in + iterations  # per batch size: the first (compiling) call, then pairs
    with progress("inference bench calls", len(batch_sizes) * calls) as done:
        for n, batch_size in enumerate(batch_sizes):
            repeated = obs.unsqueeze(0).repeat(batch_size, *[1] * obs.dim())
            batch = {Columns.OBS: repeated.to(device)}
            compiled_module = _compiled_copy(module, spec)
            before = counts()
            with torch.no_grad():
                first_call = _timed(compiled_module, batch, cuda)
                compiled_once = counts()
                for _ in range(burn_in):
                    _timed(module, batch, cuda)
                    _timed(compiled_module, batch, cuda)
                done(n * calls + 1 + burn_in)
                eager, compiled = [], []
                for i in range(iterations):
                    eager.append(_timed(module, batch, cuda))
                    compiled.append(_timed(compiled_module, batch, cuda))
                    if i % 100 == 99:
                        done(n * calls + 1 + burn_in + i + 1)
            after = counts()
            done((n + 1) * calls)
            eager_tp = 1 / statistics.median(eager)
            compiled_tp = 1 / statistics.median(compiled)
            rows.append(
                {
                    "backend": spec.backend,
                    "mode": spec.mode or "default",
                    "batch_size": batch_size,
                    "first_call_seconds": first_call,
                    "eager_calls_per_s": eager_tp,
                    "compiled_calls_per_s": compiled_tp,
                    "speedup": compiled_tp / eager_tp - 1,
                    **{key: after[key] - before[key] for key in COMPILE_COUNTS},
                    "recompiles": after["frames"] - compiled_once["frames"],
                }
            )
    return rows


def run(run: TaskRun) -> None:
    """Measure, then write bench.json, bench.csv and bench.png."""
    import torch._dynamo

    settings, spec = run.settings, run.spec
    assert spec is not None  # check() refused compile off
    task = own_settings(settings, InferenceBenchSettings)
    if task.threads is not None:
        torch.set_num_threads(task.threads)
    module, obs = build_module(run.config)
    module.to(bench_device(settings))
    rows = measure(
        module,
        obs,
        spec,
        list(task.batch_sizes),
        task.iterations,
        task.burn_in,
        settings.compile.cache_dir,
    )
    used = next(module.parameters()).device
    for row in rows:
        console.print(
            f"batch {row['batch_size']:>3} | first call {row['first_call_seconds']:6.2f} s | "
            f"eager {row['eager_calls_per_s']:9.1f}/s | compiled "
            f"{row['compiled_calls_per_s']:9.1f}/s | speedup {row['speedup']:+.1%}"
        )
    result = {
        "task": "inference_bench",
        "env": settings.env.name,
        "backend": spec.backend,
        "mode": spec.mode or "default",
        "iterations": task.iterations,
        "burn_in": task.burn_in,
        "threads": torch.get_num_threads(),
        "device": str(used),
        # The GPU measured on, as torch names it (a machine may hold several models).
        "device_name": torch.cuda.get_device_name(used) if used.type == "cuda" else None,
        # Parameters as ordinary graph inputs (dynamo's inline_inbuilt_nn_modules): the
        # cudagraphs backend then copies every weight into its graphs on each replay.
        "parameters_as_graph_inputs": torch._dynamo.config.inline_inbuilt_nn_modules,
        "rows": rows,
    }
    result.update(run.provenance)  # bench.json stands alone: the report reads it
    write_json(run.files / BENCH, result)
    run.record["inference_bench"] = result
    write_csv(run.files / "bench.csv", rows)
    title = f"{settings.env.name}: {spec.preset} vs eager, torch {torch.__version__}"
    plots.inference_bench(run.files / "bench.png", rows, title)
    console.print(f"done: results in {run.files}")


TASK = Task(
    settings=InferenceBenchSettings,
    run=run,
    check=check,
    scale_plan=driver_only,
    needs_ray=False,
)
