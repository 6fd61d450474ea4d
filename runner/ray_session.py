"""The Ray a job runs on: a local one of its own, or the cluster at `ray.address`."""

from __future__ import annotations

import logging
import os
import sys
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

    Every actor gets `ray.runtime_env` (e.g. the user's package as `py_modules`), and
    `compile_cache_dir` as TORCHINDUCTOR_CACHE_DIR, here and in every actor.
    """
    level = quiet_ray(ray_cfg.log_level)
    if ray.is_initialized():
        return
    common: dict[str, Any] = {"logging_level": level, "log_to_driver": level <= logging.INFO}
    runtime_env = dict(ray_cfg.runtime_env)
    if compile_cache_dir:
        cache = str(Path(compile_cache_dir).resolve())
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        env_vars = {**runtime_env.get("env_vars", {}), "TORCHINDUCTOR_CACHE_DIR": cache}
        runtime_env["env_vars"] = env_vars
    if runtime_env:
        common["runtime_env"] = runtime_env
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


def import_py_modules_here(runtime_env: dict[str, Any]) -> None:
    """The driver imports the user's code from the same `py_modules` dirs the actors get
    (the preflight builds an env and the RLModule spec here), so both see one version."""
    for entry in runtime_env.get("py_modules", []):
        path = Path(str(entry)).expanduser()
        if path.is_dir():
            parent = str(path.resolve().parent)
            if parent not in sys.path:
                sys.path.insert(0, parent)


def stop_ray() -> None:
    """Leave no Ray behind: the next job of a sweep (same process under the basic and the
    joblib launcher) starts its own, with its own ray.address and ray.num_cpus."""
    if ray.is_initialized():
        ray.shutdown()
