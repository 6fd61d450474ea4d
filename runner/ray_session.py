"""The Ray a job runs on: a local one of its own, or the cluster at `ray.address`."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import ray

from runner.schema import LogLevel, RayConfig


def quiet_ray(level_name: LogLevel) -> int:
    """Set Ray's and RLlib's loggers (each has its own handler) to `level_name`."""
    level = getattr(logging, level_name.value)
    for name in ("ray", "ray.rllib", "ray.tune"):
        logging.getLogger(name).setLevel(level)
    return level


def start_ray(ray_cfg: RayConfig, compile_cache_dir: str | None = None) -> None:
    """A local Ray sized to this machine (no dashboard, quiet), or the cluster at ray.address.

    `compile_cache_dir` becomes TORCHINDUCTOR_CACHE_DIR here and in every actor.
    """
    level = quiet_ray(ray_cfg.log_level)
    if ray.is_initialized():
        return
    common: dict[str, Any] = {"logging_level": level, "log_to_driver": level <= logging.INFO}
    if compile_cache_dir:
        cache = str(Path(compile_cache_dir).resolve())
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        common["runtime_env"] = {"env_vars": {"TORCHINDUCTOR_CACHE_DIR": cache}}
    if ray_cfg.address:
        ray.init(address=ray_cfg.address, **common)
    else:
        # "local": a new Ray of its own, never a cluster that happens to run on this machine.
        ray.init(
            address="local",
            num_cpus=ray_cfg.num_cpus,
            num_gpus=ray_cfg.num_gpus,
            include_dashboard=False,
            **common,
        )


def stop_ray() -> None:
    """Leave no Ray behind: the next job of a sweep (same process under the basic and the
    joblib launcher) starts its own, with its own ray.address and ray.num_cpus."""
    if ray.is_initialized():
        ray.shutdown()
