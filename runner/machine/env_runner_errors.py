"""Why a remote EnvRunner failed, carried to the driver, which sees only a lost actor.

Two ways an EnvRunner's process ends, and how each reaches the driver:

- a call raised (the env's step, a connector, the module's forward pass): RLlib's EnvRunner
  logs the error with its traceback, sleeps `delay_between_env_runner_restarts_s` and
  exits. The env factory calls `report_from_here` in each EnvRunner's process: a handler
  on RLlib's log of that error hands the traceback to a named actor of the driver's Ray
  job (`ErrorBox`, no CPU, made by the first error only), which the driver reads (`take`)
  on any node of a cluster;
- the process ended without a Python error (`os._exit` in the env, a segfault in its C
  code, the OOM killer): Ray's GCS keeps each worker's exit (`exits`), and the worker's
  stderr log on its node holds its last words (Ray's faulthandler prints a crash's stack
  there), which the driver reads where that node is its own.

The EnvRunnerFaults callback (runner/job/callbacks.py) fails a run on either. A Ray job's runs
one after another (a sweep's jobs in one process) each empty the box when they end
(`close`).
"""

from __future__ import annotations

import logging
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

NAMESPACE = "rllib-runner"
LOGGER = "ray.rllib.utils.actor_manager"  # RLlib's FaultTolerantActor logs the error here
MARK = "Worker exception caught during `apply()`"
# The actor classes of RLlib's EnvRunners, as a worker's log names its actor.
ENV_RUNNER_CLASSES = ("SingleAgentEnvRunner", "MultiAgentEnvRunner")
# Lines of a dead worker's stderr log kept as its traceback.
LOG_TAIL_LINES = 40


@ray.remote(num_cpus=0)
class ErrorBox:
    """The tracebacks EnvRunners reported, until the driver takes them."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def add(self, text: str) -> None:
        self.errors.append(text)

    def take(self) -> list[str]:
        taken, self.errors = self.errors, []
        return taken


def _name() -> str:
    return f"env-runner-errors-{ray.get_runtime_context().get_job_id()}"


class _Report(logging.Handler):
    """RLlib's log of an EnvRunner's error, its traceback to the job's box."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info is None or not record.getMessage().startswith(MARK):
            return
        text = "".join(traceback.format_exception(*record.exc_info))
        try:
            box = ErrorBox.options(  # type: ignore[attr-defined]  # ray.remote's class
                name=_name(), namespace=NAMESPACE, lifetime="detached", get_if_exists=True
            ).remote()
            ray.get(box.add.remote(text), timeout=30)
        except Exception:  # the driver still sees the lost actor, without its cause
            return


_reporting = False


def report_from_here() -> None:
    """In a Ray worker's process (an EnvRunner's, where the env is built), once: its
    EnvRunner's errors to the job's box. Nothing in the driver, or without Ray."""
    global _reporting
    if _reporting or not ray.is_initialized():
        return
    if ray.get_runtime_context().worker.mode != ray.WORKER_MODE:
        return
    logging.getLogger(LOGGER).addHandler(_Report())
    _reporting = True


def _box() -> Any:
    try:
        return ray.get_actor(_name(), namespace=NAMESPACE)
    except ValueError:  # none yet: no EnvRunner has reported an error
        return None


def take() -> list[str]:
    """The tracebacks reported since the last call (the driver's)."""
    box = _box()
    return [] if box is None else ray.get(box.take.remote(), timeout=30)


def close() -> None:
    """The box gone at the run's end: the job's next run starts with none."""
    box = _box()
    if box is not None:
        ray.kill(box)


@dataclass(frozen=True)
class Exit:
    """A worker process of this Ray job that ended: Ray's words, and its stderr log's last
    lines where the log is on this node (None elsewhere)."""

    pid: int
    node: str  # the node's IP address
    detail: str
    log: Path | None
    tail: list[str] | None

    @property
    def last_words(self) -> str:
        """The last line the process wrote that is not Ray's own marker, or ''."""
        lines = [line for line in self.tail or [] if line.strip() and not line.startswith(":")]
        return lines[-1].strip() if lines else ""

    def describe(self) -> str:
        """One line: the process, Ray's first sentence on its end, and its last words."""
        reason = self.detail.split(". ", 1)[0].rstrip(".")
        where = "" if self.log is not None else f" on node {self.node}"
        said = f"; its last output: {self.last_words}" if self.last_words else ""
        return f"an EnvRunner's process (pid {self.pid}{where}) exited: {reason}{said}"

    def text(self) -> str:
        """What is kept as its traceback: the last lines of its log, or Ray's words."""
        if not self.tail:
            return f"{self.describe()}\n\nRay: {self.detail}\n"
        return f"{self.describe()}\n\nThe last lines of {self.log}:\n" + "\n".join(self.tail) + "\n"


def _log_tail(logs: Path, worker_id: str, pid: int) -> tuple[Path | None, list[str] | None]:
    """The worker's stderr log (Ray names it worker-<id>-<job>-<pid>.err) and its last
    lines, or (None, None) when it is not on this node or names no EnvRunner."""
    found = sorted(logs.glob(f"worker-{worker_id}-*-{pid}.err"))
    if not found:
        return None, None
    lines = found[0].read_text(errors="replace").splitlines()
    header = lines[:5]  # Ray's markers: ":job_id:...", ":actor_name:<class>"
    names = [line.removeprefix(":actor_name:") for line in header]
    if not any(name in ENV_RUNNER_CLASSES for name in names):
        return found[0], []
    return found[0], lines[-LOG_TAIL_LINES:]


def exits(since_ms: int) -> list[Exit]:
    """This job's worker processes that ended since `since_ms` (epoch milliseconds) other
    than by the runner's or Ray's choice, oldest first, from the GCS's worker table (the
    dashboard's state API, which reads the same, is off in the runner's local Ray). Where
    a log on this node names its actor, only EnvRunners'."""
    from ray._private import state  # the GCS tables behind `ray list workers`
    from ray._private import worker as ray_worker
    from ray.core.generated import common_pb2, gcs_pb2

    common: Any = common_pb2  # generated protobuf modules: no stubs
    gcs: Any = gcs_pb2
    job = ray.get_runtime_context().get_job_id()
    node = ray_worker._global_node
    assert node is not None  # a connected driver has its node
    logs = Path(node.get_logs_dir_path())
    here = ray.get_runtime_context().get_node_id()
    intended = (common.INTENDED_USER_EXIT, common.INTENDED_SYSTEM_EXIT)
    found = []
    for raw in state.state._connect_and_get_accessor().get_worker_table():
        worker = gcs.WorkerTableData.FromString(raw)
        if (
            worker.is_alive
            or worker.worker_type != common.WORKER
            or worker.job_id.hex() != job
            or worker.end_time_ms < since_ms
            or worker.exit_type in intended
        ):
            continue
        address = worker.worker_address
        log, tail = None, None
        if address.node_id.hex() == here:
            log, tail = _log_tail(logs, address.worker_id.hex(), worker.pid)
            if tail == []:  # another actor's process (a Learner's is checked apart)
                continue
        ended = Exit(worker.pid, address.ip_address, worker.exit_detail, log, tail)
        found.append((worker.end_time_ms, ended))
    return [e for _, e in sorted(found, key=lambda pair: pair[0])]
