"""Per-component compile reports: what compile did in each EnvRunner and Learner.

Each report is made inside the component's own process (the counters live there), then
gathered by the driver into summary.json's `compile` section and one printed line.
"""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch._dynamo.utils import counters

from runner.compile.apply import CompiledCall, plain_values
from runner.compile.settings import CompileSpec, uses_cuda_graphs

SUMMED = (
    "frames",
    "unique_graphs",
    "recompiles",
    "cache_hits",
    "cache_misses",
    "cudagraph_skips",
    "cudagraph_recordings",
    "session_rebuilds",
    "rebuild_seconds",
    "calls",
)


@dataclass
class ComponentReport:
    component: str
    pid: int
    device: str
    device_name: str | None  # the GPU this component's module ran on
    # Inductor's compile worker threads in this process (null: inductor never loaded).
    compile_threads: int | None
    took_effect: bool
    compile_seconds: float | None
    frames: int
    unique_graphs: int
    recompiles: int
    cache_hits: int
    cache_misses: int
    cudagraph_skips: int
    cudagraph_recordings: int
    cudagraph_skip_reasons: list[str]
    session_rebuilds: int
    rebuild_seconds: float
    calls: int
    process_frames: int
    max_abs_diff: float | None
    methods: dict[str, dict[str, Any]]


def _device(owner: Any) -> torch.device:
    """Where the component's module sits (its first parameter's device)."""
    module = getattr(owner, "module", None)
    params = module.parameters() if isinstance(module, torch.nn.Module) else iter(())
    first = next(params, None)
    return first.device if first is not None else torch.device("cpu")


def component_report(owner: Any, component: str, verify: bool) -> dict[str, Any]:
    """What compile did in this component (EnvRunner or Learner), from inside its process."""
    calls: dict[str, CompiledCall] = getattr(owner, "_runner_compiled", {})
    methods = {name: call.stats() for name, call in calls.items()}
    diffs = (
        [d for d in (c.max_abs_diff() for c in calls.values()) if d is not None] if verify else []
    )
    seconds = [s["first_call_seconds"] for s in methods.values() if s["first_call_seconds"]]
    device = _device(owner)
    inductor_config = sys.modules.get("torch._inductor.config")
    return asdict(
        ComponentReport(
            component=component,
            pid=os.getpid(),
            device=str(device),
            device_name=torch.cuda.get_device_name(device) if device.type == "cuda" else None,
            compile_threads=getattr(inductor_config, "compile_threads", None),
            took_effect=any(s["frames"] > 0 for s in methods.values()),
            compile_seconds=sum(seconds) if seconds else None,
            **{key: sum(s[key] for s in methods.values()) for key in SUMMED},
            cudagraph_skip_reasons=sorted(
                {r for s in methods.values() for r in s["cudagraph_skip_reasons"]}
            ),
            process_frames=counters["frames"]["ok"],
            max_abs_diff=max(diffs) if diffs else None,
            methods=methods,
        )
    )


def _env_runner_report(env_runner: Any, verify: bool) -> dict[str, Any]:
    return component_report(env_runner, f"env_runner/{env_runner.worker_index}", verify)


def _learner_report(learner: Any) -> dict[str, Any]:
    return component_report(learner, "learner", verify=False)


def env_runner_reports(algorithm: Any, verify: bool) -> list[dict[str, Any]]:
    """Reports of every EnvRunner, local first.

    With `verify`, each compiled method replays its last real input through the compiled
    and the eager code (same weights: after the latest weight sync).
    """
    return list(
        algorithm.env_runner_group.foreach_env_runner(
            functools.partial(_env_runner_report, verify=verify)
        )
    )


def collect(algorithm: Any, verify: bool) -> list[dict[str, Any]]:
    """Per-component reports of every EnvRunner and every Learner."""
    learners = plain_values(algorithm.learner_group.foreach_learner(_learner_report))
    for i, report in enumerate(learners):
        report["component"] = f"learner/{i}"
    return env_runner_reports(algorithm, verify) + learners


def summarize(
    spec: CompileSpec | None, reports: list[dict[str, Any]], chosen: bool = False
) -> tuple[dict, str]:
    """summary.json's compile section and the one line the progress output prints;
    `chosen`: compile=auto made `spec` (its figures: the record's compile_auto)."""
    used = [r for r in reports if r["calls"] > 0]
    took = [r for r in used if r["took_effect"]]
    seconds = [r["compile_seconds"] for r in took if r["compile_seconds"] is not None]
    section = {
        "backend": spec.backend if spec else None,
        "mode": spec.mode if spec else None,
        "requested": spec is not None,
        "applied": bool(took),
        "frames": sum(r["frames"] for r in reports),
        "process_frames": {str(r["pid"]): r["process_frames"] for r in reports},
        "max_abs_diff": max_diff(reports),
        "components": reports,
    }
    prefix = "compile=auto chose " if chosen else "compile "
    if spec is None:
        frames = sum(section["process_frames"].values())
        off = f"{prefix}eager everywhere" if chosen else "compile off"
        return section, f"{off}: {frames} dynamo frames in {len(reports)} component(s)"

    def count(kind: str) -> str:
        n_took = sum(r["component"].startswith(kind) for r in took)
        return f"{n_took}/{sum(r['component'].startswith(kind) for r in used)}"

    line = (
        f"{prefix}{spec.preset}: took effect on "
        f"{count('env_runner')} EnvRunner(s) and {count('learner')} Learner(s) that ran; "
        f"{section['frames']} frames, {sum(r['recompiles'] for r in reports)} recompiles, "
        f"{sum(seconds):.1f} s in first calls"
    )
    recordings = sum(r["cudagraph_recordings"] for r in reports)
    skips = sum(r["cudagraph_skips"] for r in reports)
    if uses_cuda_graphs(spec) or recordings or skips:
        reasons = sorted({reason for r in reports for reason in r["cudagraph_skip_reasons"]})
        line += f", CUDA graphs recorded {recordings} and skipped {skips}" + (
            f" ({'; '.join(reasons)})" if reasons else ""
        )
    rebuilds = sum(r["session_rebuilds"] for r in reports)
    if rebuilds:
        rebuild_seconds = sum(r["rebuild_seconds"] for r in reports)
        line += f", {rebuilds} onnxrt session rebuilds after weight syncs ({rebuild_seconds:.2f} s)"
    if section["max_abs_diff"] is not None:
        line += f", max |compiled - eager| {section['max_abs_diff']:.1e}"
    return section, line


def gpus_used(reports: list[dict[str, Any]]) -> dict[str, str]:
    """Each component that ran on a GPU, with that GPU's name."""
    return {r["component"]: r["device_name"] for r in reports if r["device_name"]}


def max_diff(reports: list[dict[str, Any]]) -> float | None:
    """The largest compiled-vs-eager gap over the reports that checked one."""
    diffs = [r["max_abs_diff"] for r in reports if r["max_abs_diff"] is not None]
    return max(diffs) if diffs else None
