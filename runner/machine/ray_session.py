"""The Ray a job runs on: a local one of its own, or the cluster at `ray.address`."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from runner.errors import ConfigError, PreflightError
from runner.machine import slurm
from runner.settings.schema import LogLevel, RayConfig


def quiet_ray(level_name: LogLevel) -> int:
    """Set Ray's and RLlib's loggers (each has its own handler) to `level_name`."""

    level = getattr(logging, level_name.value)
    for name in ("ray", "ray.rllib", "ray.tune"):
        logging.getLogger(name).setLevel(level)
    return level


# The signals whose handlers ray.init may replace (runner/machine/shutdown.py handles these).
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

# A local Ray starts no idle Python workers ahead of need: a run without EnvRunner or
# Learner actors (the default) uses none, and on a small machine their start takes CPU
# from the job's own start-up.
LOCAL_SYSTEM_CONFIG = {"enable_worker_prestart": False, "prestart_worker_first_driver": False}

# The settings of the Ray this process started, or USERS for one it found running.
USERS = "started by the user"
_started: str | None = None
# Whether that Ray is a local one this process's ray.init started (its processes are ours).
_local = False


# ray.address=local: a Ray of the run's own, even inside a Ray job.
LOCAL = "local"


def cluster_address(ray_cfg: RayConfig) -> str | None:
    """The cluster a job joins: ray.address, else RAY_ADDRESS (a Ray job's, which
    `ray job submit` sets); None: a local Ray of its own (ray.address=local forces it)."""
    address = ray_cfg.address or os.environ.get("RAY_ADDRESS") or None
    return None if address == LOCAL else address


def joined_by_environment(ray_cfg: RayConfig) -> str | None:
    """The line a run starts with when RAY_ADDRESS, not its settings, chose its cluster."""
    address = cluster_address(ray_cfg)
    if ray_cfg.address or address is None:
        return None
    return (
        f"ray: joining the cluster at RAY_ADDRESS={address} "
        "(ray.address=local runs a Ray of its own)"
    )


_NO_CLUSTER_FIX = (
    "start one (ray start --head) or pass ray.address=local for a Ray of the run's own"
)


def _named(ray_cfg: RayConfig, address: str) -> str:
    return f"ray.address={address}" if ray_cfg.address else f"RAY_ADDRESS={address}"


def _check_reachable(ray_cfg: RayConfig, address: str) -> None:
    """Something answers at the cluster's address: ray.init waits without end (and past
    SIGTERM) for a cluster on this machine that is not there."""
    from ray._private.services import canonicalize_bootstrap_address_or_die

    named = _named(ray_cfg, address)
    try:
        if address.startswith("ray://"):
            host, _, port = address.removeprefix("ray://").rpartition(":")
        else:
            bootstrap = canonicalize_bootstrap_address_or_die(address)
            host, _, port = bootstrap.rpartition(":")
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except ValueError:
        raise ConfigError(
            f"{named} is not host:port (nor auto, local or ray://host:port)"
        ) from None
    except (ConnectionError, OSError) as e:
        raise ConfigError(
            f"{named}: no Ray cluster answers there ({e}): {_NO_CLUSTER_FIX}"
        ) from None


def _ray_key(ray_cfg: RayConfig, compile_cache_dir: str | None) -> str:
    """What a Ray is started with: a job asking for the same may run on the one running."""
    cache = str(Path(compile_cache_dir).resolve()) if compile_cache_dir else None
    fields = (cluster_address(ray_cfg), ray_cfg.num_cpus, ray_cfg.num_gpus, ray_cfg.log_level.value)
    return json.dumps([*fields, ray_cfg.runtime_env, cache], sort_keys=True, default=str)


def _check_users_ray(ray_cfg: RayConfig, compile_cache_dir: str | None) -> None:
    """A Ray the user started keeps its own settings: refuse the ones it cannot take."""
    asked = {
        "ray.address": ray_cfg.address,
        "ray.num_cpus": ray_cfg.num_cpus,
        "ray.num_gpus": ray_cfg.num_gpus,
        "ray.runtime_env": ray_cfg.runtime_env or None,
        "compile.cache_dir": compile_cache_dir,
    }
    named = [name for name, value in asked.items() if value is not None]
    if named:
        raise ConfigError(
            f"Ray is already running in this process (started outside the runner), so "
            f"{', '.join(named)} cannot apply: pass them to your ray.init, or call "
            "ray.shutdown() first"
        )


def start_ray(ray_cfg: RayConfig, compile_cache_dir: str | None = None) -> None:
    """A local Ray sized to this machine or its SLURM allocation (no dashboard, quiet), or
    the cluster at ray.address.

    Every actor gets `ray.runtime_env` (e.g. the user's package as `py_modules`), and
    `compile_cache_dir` as TORCHINDUCTOR_CACHE_DIR, here and in every actor. A Ray already
    running is used as it is when the user started it (ray.init in a notebook), or when
    this process started it for an earlier job with the same settings (a sweep's jobs
    share one); one started with other settings is stopped first. ray.init sets a SIGTERM
    handler of its own (a C++ stack dump, exit 15): the handlers set before it (the
    runner's: runner/machine/shutdown.py) are set again after it.
    """
    main = threading.current_thread() is threading.main_thread()  # where handlers are set
    handlers = {s: signal.getsignal(s) for s in (*SIGNALS, slurm.PREEMPT)} if main else {}
    try:
        if main:  # Ray's processes inherit it ignored: SLURM signals every process of a job
            signal.signal(slurm.PREEMPT, signal.SIG_IGN)
        with _a_process_group_of_their_own(cluster_address(ray_cfg) is None):
            _init(ray_cfg, compile_cache_dir)
    finally:
        for signum, handler in handlers.items():
            if handler is not None:  # None: set outside Python, nothing to put back
                signal.signal(signum, handler)


@contextlib.contextmanager
def _a_process_group_of_their_own(local: bool) -> Iterator[None]:
    """The processes a local ray.init starts, in a process group that is not this one's, so
    a signal to the job's group (`timeout`, `kill -TERM -<pgid>`, Ctrl-C) reaches the driver
    alone and its Ray stays up for the checkpoint: the driver joins a new group for the
    while ray.init spawns them (they inherit it), then goes back. Ray keeps their fate tied
    to the driver's (they die with it) and `kill_local_ray` still finds them. A session
    leader cannot change its group (a container's PID 1): there Ray's processes share it,
    and a group SIGTERM kills the GCS under the driver (which then waits out Ray's 60 s
    reconnect and leaves no record: not handled yet). The GCS and the raylet set their own
    SIGTERM handler, so an inherited SIG_IGN would not keep them. A group signal sent during
    those seconds of ray.init reaches neither (one to the driver's PID does)."""
    home = os.getpgrp()
    if not local or os.getsid(0) == os.getpid():
        yield
        return
    # A group's id is its first member's pid: a process that sleeps leads the new one.
    try:
        leader = subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL, preexec_fn=os.setpgrp)
    except OSError:  # no sleep(1) on this machine: Ray's processes share the group
        yield
        return
    try:
        os.setpgid(0, leader.pid)
        try:
            yield
        finally:
            try:
                os.setpgid(0, home)
            except OSError:  # the group ended meanwhile: one of the driver's own, not Ray's
                os.setpgid(0, 0)
    finally:
        leader.kill()
        leader.wait()


def _init(ray_cfg: RayConfig, compile_cache_dir: str | None) -> None:
    import ray

    global _started, _local
    level = quiet_ray(ray_cfg.log_level)
    key = _ray_key(ray_cfg, compile_cache_dir)
    if ray.is_initialized():
        if _started is None:
            _started = USERS
        if _started == USERS:
            _check_users_ray(ray_cfg, compile_cache_dir)
        if _started in (USERS, key):
            return
        stop_ray()
    common: dict[str, Any] = {"logging_level": level, "log_to_driver": level <= logging.INFO}
    runtime_env = dict(ray_cfg.runtime_env)
    if compile_cache_dir:
        cache = str(Path(compile_cache_dir).resolve())
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        env_vars = {**runtime_env.get("env_vars", {}), "TORCHINDUCTOR_CACHE_DIR": cache}
        runtime_env["env_vars"] = env_vars
    if runtime_env:
        common["runtime_env"] = runtime_env
    address = cluster_address(ray_cfg)
    if address:
        _check_reachable(ray_cfg, address)
        try:
            ray.init(address=address, **common)
        except ConnectionError as e:
            named = _named(ray_cfg, address)
            raise ConfigError(f"{named}: {e}: {_NO_CLUSTER_FIX}") from None
    else:
        # "local": a new Ray of its own, never a cluster that happens to run on this machine
        # (nor the RAY_ADDRESS that ray.address=local overrides).
        num_cpus, num_gpus = slurm.local_size(ray_cfg.num_cpus, ray_cfg.num_gpus)
        ray.init(
            address="local",
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            include_dashboard=False,
            _system_config=LOCAL_SYSTEM_CONFIG,
            **common,
        )
    _started, _local = key, address is None


class _DriverGPUs:
    """An actor of no CPU that holds the driver's GPUs in Ray's books while a run lasts."""

    def gpu_ids(self) -> list[str]:
        import ray

        return [str(i) for i in ray.get_gpu_ids()]


_held: list[Any] = []  # the holders of this process's running job


def reserve_driver_gpus(gpus: float, timeout: float = 10.0) -> int:
    """Reserve `gpus` GPUs of the driver's node for the main process (a local Learner):
    Ray never schedules the driver, so without this it would hand the same GPU to an
    actor, or to another job on the same Ray (a sweep's). Returns the torch index of the
    GPU Ray gave (RLlib's `local_gpu_idx`); one line if none frees up within `timeout`."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node = ray.get_runtime_context().get_node_id()
    # Any: Ray types options().remote() as the class or a handle, and no handle's methods.
    holder: Any = (
        ray.remote(_DriverGPUs)
        .options(
            num_cpus=0,
            num_gpus=gpus,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
        )
        .remote()
    )
    ready, _ = ray.wait([holder.gpu_ids.remote()], timeout=timeout)
    if not ready:
        pending = waiting_for()
        ray.kill(holder)
        raise PreflightError(
            f"the main process (a local Learner) needs {gpus:g} GPU of this node, and Ray "
            f"gave none within {timeout:g} s ({pending}): another run or actor holds them; "
            "wait for it, or lower scaling.num_gpus_per_learner (a fraction shares a GPU)"
        )
    _held.append(holder)
    (first, *_) = ray.get(ready[0])
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    order = visible.split(",") if visible else []
    return order.index(first) if first in order else int(first)


def release_driver_gpus() -> None:
    """The end of the job that reserved them (a sweep's next job reserves its own)."""
    import ray

    while _held:
        holder = _held.pop()
        if ray.is_initialized():
            ray.kill(holder)


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
    """Stop the Ray this process started (a Ray the user started stays theirs), so the
    next job, or a process this one starts, gets its own."""
    import ray

    global _started, _local
    if ray.is_initialized() and _started == USERS:
        return
    if ray.is_initialized():
        if _local:
            _kill_autoscaler_monitor(ray.get_runtime_context().gcs_address)
        ray.shutdown()
    _started, _local = None, False


# The script of the autoscaler monitor a local `ray.init` starts.
_MONITOR = "autoscaler/_private/monitor.py"


def _kill_autoscaler_monitor(gcs_address: str) -> None:
    """Kill the autoscaler monitor of the local Ray at `gcs_address` (this process's)
    before `ray.shutdown()`, which stops it after the GCS: its SIGTERM handler then reports
    to the gone GCS until Ray's 1 s grace runs out (1.0 of the 1.3 s a shutdown takes
    here). A local Ray has nothing to autoscale; the monitor keeps no state."""
    for pid in descendants(os.getpid()):
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_text(errors="replace").split("\0")
            if any(a.endswith(_MONITOR) for a in argv) and f"--gcs-address={gcs_address}" in argv:
                os.kill(pid, signal.SIGKILL)


def _resources(bundle: dict[str, float]) -> str:
    return ", ".join(f"{v:g} {k}" for k, v in sorted(bundle.items()) if v)


def waiting_for() -> str:
    """What Ray cannot place yet, from its GCS tables (the state API proper needs the
    dashboard, which the runner's local Ray leaves off): this job's actors pending
    creation and pending placement groups with the resources they ask for, beside what is
    free. A stall with nothing pending is a component that is busy or hung."""
    import ray
    from ray._private import state  # the GCS actor table behind `ray list actors`

    job = ray.JobID.from_hex(ray.get_runtime_context().get_job_id())
    pending = Counter(
        a["ActorClassName"]
        for a in state.actors(job_id=job).values()
        if a["State"] in ("PENDING_CREATION", "DEPENDENCIES_UNREADY")
    )
    groups = [
        " + ".join(_resources(b) for b in pg["bundles"].values())
        for pg in ray.util.placement_group_table().values()
        if pg["state"] == "PENDING"
    ]
    free, total = ray.available_resources(), ray.cluster_resources()
    have = ", ".join(
        f"{free.get(k, 0):g} of {total[k]:g} {k}" for k in ("CPU", "GPU") if k in total
    )
    what = [f"{n} {name} actor{'s' if n > 1 else ''}" for name, n in sorted(pending.items())]
    what += [f"a placement group of {g}" for g in groups]
    if not what:
        return (
            f"Ray has nothing pending ({have} free): an actor or the driver is busy or "
            "hung; its logs are under Ray's session dir (/tmp/ray/session_latest/logs)"
        )
    return f"Ray is waiting to place {', '.join(what)}; free: {have}"


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, from /proc (Ray's agents outlive a killed raylet)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
        except (OSError, ValueError):
            continue
        if entry.name.isdigit():
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        children = [c for c, p in parents.items() if p == parent]
        found += children
        todo += children
    return found


def kill_local_ray() -> None:
    """Kill every process this one started (its local Ray: GCS, raylet, agents, actors)
    at once, for a second signal; a cluster reaps a driver's actors itself."""
    for pid in descendants(os.getpid()):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
