"""The machine's facts: CPU model, the GPUs this process sees (names, compute
capabilities, torch's kernels), and what a local Ray or a cluster offers.

Below preflight, compile=auto and the report, which all read them; imports nothing of
the runner but the schema.
"""

from __future__ import annotations

import os
import platform
import re
from dataclasses import dataclass, field
from typing import Any, TypedDict

from runner.settings.schema import RayConfig


@dataclass
class Resources:
    """What the run can use: this machine, or a Ray cluster; and the GPUs this process
    (the driver) sees through torch.cuda, where the main process's share runs."""

    where: str
    cpus: float
    gpus: float
    gpu_names: list[str]
    cpu_model: str = ""
    local: bool = False  # a local Ray, whose CPU count ray.num_cpus sets
    nodes: int = 1  # a cluster's alive Ray nodes
    slurm: dict[str, Any] | None = None  # the SLURM job's allocation (slurm.Allocation)
    # By CUDA index: names and compute capabilities ("8.0"); and the kernels torch has.
    driver_gpus: list[str] = field(default_factory=list)
    driver_capabilities: list[str] = field(default_factory=list)
    torch_cuda_archs: list[str] = field(default_factory=list)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class DriverCuda(TypedDict, total=False):
    """Resources' fields for the GPUs this process sees (none without CUDA)."""

    driver_gpus: list[str]
    driver_capabilities: list[str]
    torch_cuda_archs: list[str]


def driver_cuda() -> DriverCuda:
    """The GPUs this process sees through torch.cuda, their compute capabilities, and the
    CUDA architectures this torch build has kernels for."""
    import torch  # here: a check of the settings alone imports no torch

    if not torch.cuda.is_available():
        return {}
    count = torch.cuda.device_count()
    return {
        "driver_gpus": [torch.cuda.get_device_name(i) for i in range(count)],
        "driver_capabilities": [
            "{}.{}".format(*torch.cuda.get_device_capability(i)) for i in range(count)
        ],
        "torch_cuda_archs": torch.cuda.get_arch_list(),
    }


def local_resources(ray_cfg: RayConfig) -> Resources:
    """This machine as a local Ray would see it: ray.num_cpus / ray.num_gpus where set,
    else a SLURM job's allocation (runner/machine/slurm.py), else the machine's own."""
    from runner.machine import slurm

    cuda = driver_cuda()
    names = cuda.get("driver_gpus", [])
    cpus, gpus = slurm.local_size(ray_cfg.num_cpus, ray_cfg.num_gpus)
    granted = slurm.allocation()
    return Resources(
        where="this machine" if granted is None else granted.describe(),
        cpus=float(cpus if cpus is not None else os.cpu_count() or 1),
        gpus=float(gpus if gpus is not None else len(names)),
        gpu_names=names,
        cpu_model=cpu_model(),
        local=True,
        slurm=slurm.describe(),
        **cuda,
    )


def cluster_resources(address: str) -> Resources:
    """The connected Ray cluster's totals; GPU names from Ray's accelerator_type resources."""
    import ray

    from runner.machine import slurm

    total = ray.cluster_resources()
    names = [k.split(":", 1)[1] for k in total if k.startswith("accelerator_type:")]
    return Resources(
        where=f"the Ray cluster at {address}",
        cpus=float(total.get("CPU", 0)),
        gpus=float(total.get("GPU", 0)),
        gpu_names=names,
        cpu_model=cpu_model(),
        # Each node offers one `node:<its ip>` (nodes on one host, as a SLURM job's tasks
        # may be, add to one key).
        nodes=int(sum(v for k, v in total.items() if k.startswith("node:") and "__" not in k)),
        slurm=slurm.describe(),
        **driver_cuda(),
    )


def is_gpu_of(name: str, family: str) -> bool:
    """Whether `name` (torch's or Ray's name of a GPU) is of `family`, as a whole model
    number: A100-SXM4-80GB and V100S are, an RTX A1000 is no A100 and a GH200 no H200."""
    return re.search(rf"(?<![A-Za-z0-9]){re.escape(family)}(?![0-9])", name, re.I) is not None


def capability_tuple(text: str) -> tuple[int, int]:
    major, minor = text.split(".")
    return int(major), int(minor)


def has_kernels(capability: str, archs: list[str]) -> bool:
    """Whether a device of `capability` ("7.0") runs a torch built for `archs`
    (torch.cuda.get_arch_list()): binary sm_XY kernels run on the same major version at
    minor Y or above; PTX (compute_XY) is compiled for any device from X.Y up."""
    major, minor = capability_tuple(capability)
    for arch in archs:
        kind, _, digits = arch.partition("_")
        number = re.match(r"\d+", digits)
        if number is None:
            continue
        arch_major, arch_minor = divmod(int(number.group()), 10)
        if kind == "sm" and arch_major == major and arch_minor <= minor:
            return True
        if kind == "compute" and (arch_major, arch_minor) <= (major, minor):
            return True
    return False
