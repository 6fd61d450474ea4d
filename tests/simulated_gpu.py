"""A simulated GPU machine, for tests on a machine with none (this one, CI's).

`simulate` makes the CUDA driver answer at the lowest layer the runner's code reaches:
torch's C entry points (`torch._C._cuda_getDeviceCount`, `_cuda_getArchFlags`, the device
properties `_lazy_init` would load) and the NVML calls through which Ray counts a node's
GPUs and names its accelerator type. Everything above runs for real: torch.cuda's own
`is_available`, `device_count`, `get_device_name`, `get_device_capability` and
`get_arch_list`, the runner's `machine.driver_cuda` -> plan -> preflight -> compile device
rules -> AlgorithmConfig, and a local Ray's GPU count. `simulate_cluster` answers
`ray.cluster_resources()` as a connected cluster of such GPUs would (a test with a real
local Ray shows a simulated node reports the same).

Nothing here runs a CUDA kernel, and no test that uses it may go that far: this torch is a
CPU build, whose first kernel would fail.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch._dynamo  # noqa: F401  # imported first: at import it asks the real CPU build


@dataclass(frozen=True)
class Model:
    """A GPU model as torch and NVML name it."""

    name: str
    capability: tuple[int, int]
    memory_gib: int
    multiprocessors: int


MODELS = {
    "t4": Model("Tesla T4", (7, 5), 15, 40),
    "v100": Model("Tesla V100-SXM2-16GB", (7, 0), 16, 80),
    "a100": Model("NVIDIA A100-SXM4-80GB", (8, 0), 80, 108),
    "h100": Model("NVIDIA H100 80GB HBM3", (9, 0), 80, 132),
    "h200": Model("NVIDIA H200", (9, 0), 141, 132),
}
# torch.cuda.get_arch_list() of PyTorch's CUDA 13 wheels (no Volta: CUDA 13 dropped sm_70)
# and of its CUDA 12.6 wheels (Maxwell to Hopper).
CUDA13_ARCHS = ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120")
CUDA126_ARCHS = ("sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90")


@dataclass(frozen=True)
class _Properties:
    """The fields of torch._C._CudaDeviceProperties that torch.cuda reads."""

    name: str
    major: int
    minor: int
    total_memory: int
    multi_processor_count: int


def simulate(
    monkeypatch: pytest.MonkeyPatch,
    model: str | Model | list[str | Model],
    count: int | None = None,
    archs: tuple[str, ...] = CUDA13_ARCHS,
    cpus: int = 16,
) -> list[Model]:
    """This process sees `count` GPUs of `model` (a key of MODELS, or a Model; or a list,
    one per device) through torch.cuda and NVML, with a CUDA 13 build of torch that has
    kernels for `archs`, on a machine of `cpus` CPUs (os.cpu_count, which a local Ray and
    the plan read)."""
    listed = model if isinstance(model, list) else [model] * (count or 0)
    gpus = [MODELS[m] if isinstance(m, str) else m for m in listed]
    props = [
        _Properties(g.name, *g.capability, g.memory_gib * 2**30, g.multiprocessors) for g in gpus
    ]

    def properties(index: int) -> _Properties:
        return props[index]

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: cpus)
    monkeypatch.setattr(torch._C, "_cuda_getDeviceCount", lambda: len(gpus), raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getArchFlags", lambda: " ".join(archs), raising=False)
    monkeypatch.setattr(torch.cuda, "_lazy_init", lambda: None)
    monkeypatch.setattr(torch.cuda, "_get_device_properties", properties, raising=False)
    monkeypatch.setattr(torch.cuda, "_cached_device_count", None)
    monkeypatch.setattr(torch.version, "cuda", "13.0")

    import ray._private.thirdparty.pynvml as pynvml

    monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: len(gpus))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda index: index)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetName", lambda handle: gpus[handle].name)
    return gpus


def accelerator_type(model: str | Model) -> str:
    """The accelerator type Ray gives a node of these GPUs (Ray's own name mapping)."""
    from ray._private.accelerators.nvidia_gpu import NvidiaGPUAcceleratorManager

    gpu = MODELS[model] if isinstance(model, str) else model
    kind = NvidiaGPUAcceleratorManager._gpu_name_to_accelerator_type(gpu.name)
    assert kind is not None
    return kind


def simulate_cluster(
    monkeypatch: pytest.MonkeyPatch, model: str | Model, gpus: int, cpus: int = 64
) -> dict[str, Any]:
    """`ray.cluster_resources()` of a connected cluster with `gpus` GPUs of `model` and
    `cpus` CPUs (the driver, whatever it sees, is not one of its nodes unless simulated)."""
    import ray

    kind = f"accelerator_type:{accelerator_type(model)}"
    total = {"CPU": float(cpus), "GPU": float(gpus), kind: 1.0}
    monkeypatch.setattr(ray, "cluster_resources", lambda: dict(total))
    return total
