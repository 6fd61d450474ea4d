"""summary.json, the run record: one writer, one schema, every task.

Each job's run dir gets one, however the job ended (finished, failed, interrupted,
stalled; refused before it ran anything; a second signal's abort writes what it has
before the exit). Every record has
`task`, `status`, `stop_reason`, `error` (one line, or null), `wall_seconds`, what
composed the job (`overrides`, `choices`) and where it ran (`hardware`, `versions`,
...: app.provenance); then the task's own part: task=train its figures at the top level
(iterations, env_steps, returns, checkpoints, check, compile, ...), task=tune the
search's, any other task a section named after it holding its result. The schema, key
by key: docs/architecture.md ("The run record").
"""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path
from typing import Any

from runner.results.files import REFUSED, SUMMARY, json_safe, write_json

# The keys every record has, whatever the task.
COMMON = ("task", "status", "stop_reason", "error", "wall_seconds")


def write(run_dir: Path, record: dict[str, Any]) -> dict[str, Any]:
    """summary.json from `record` (the common keys defaulted), written whole (atomically);
    returned as written (JSON's types)."""
    whole = json_safe({"stop_reason": "", "error": None, **record})
    missing = [k for k in COMMON if k not in whole]
    if missing:
        raise ValueError(f"a run record without {', '.join(missing)}")  # the runner's own bug
    write_json(run_dir / SUMMARY, whole)
    return whole


def ended_early(
    run_dir: Path,
    task: str,
    error: BaseException,
    wall_seconds: float,
    known: dict[str, Any],
) -> None:
    """The record of a job that ended before its task ran, where no record is there yet
    (a task writes its own): `refused` for bad input or a shortfall the preflight found,
    `interrupted` for a signal (during scaling=auto's or compile=auto's measurement, a
    build), `failed` otherwise. A run dir that holds another run's results gets nothing;
    a disk that refuses the record leaves the job's own error the one shown."""
    from runner.errors import ConfigError, PreflightError, RunDirUsed, one_line
    from runner.machine.shutdown import interrupted

    if isinstance(error, RunDirUsed) or (run_dir / SUMMARY).exists():
        return
    fields: dict[str, Any] = {"status": "failed", "error": one_line(error)}
    if isinstance(error, ConfigError | PreflightError):
        fields["status"] = REFUSED
    elif isinstance(error, KeyboardInterrupt):
        stop = interrupted(error)
        name = signal.Signals(stop.signum).name
        fields = {"status": "interrupted", "stop_reason": str(stop), "signal": name}
    with contextlib.suppress(OSError):
        write(run_dir, {"task": task, **fields, "wall_seconds": wall_seconds, **known})


def aborted(
    run_dir: Path, task: str, signum: int, wall_seconds: float, known: dict[str, Any]
) -> dict[str, Any]:
    """The record a second signal leaves before the process exits: what is `known`."""
    name = signal.Signals(signum).name
    return write(
        run_dir,
        {
            "task": task,
            "status": "aborted",
            "stop_reason": f"aborted by a second {name}",
            "wall_seconds": wall_seconds,
            "signal": name,
            **known,
        },
    )
