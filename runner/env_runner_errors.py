"""Errors raised in EnvRunners, carried to the driver.

When a call on a remote EnvRunner raises (the env's step, a connector, the module's
forward pass), RLlib's EnvRunner logs the error with its traceback, sleeps
`delay_between_env_runner_restarts_s` and exits its process; the driver sees only a lost
actor, which Ray restarts, and a deterministic error repeats in every restart. The env
factory calls `report_from_here` in each EnvRunner's process: a handler on RLlib's log of
that error hands the traceback to a named actor of the driver's Ray job (`ErrorBox`, no
CPU, made by the first error only), which the driver reads (`take`) on any node of a
cluster: the EnvRunnerErrors callback (runner/callbacks.py) fails the run on an error
that comes back. A Ray job's runs one after another (a sweep's jobs in one process) each
empty the box when they end (`close`).
"""

from __future__ import annotations

import logging
import traceback
from typing import Any

import ray

NAMESPACE = "rllib-runner"
LOGGER = "ray.rllib.utils.actor_manager"  # RLlib's FaultTolerantActor logs the error here
MARK = "Worker exception caught during `apply()`"


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
