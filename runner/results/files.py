"""What a run leaves on disk: JSON and CSV files, metrics.jsonl, progress.csv and
TensorBoard events (checkpoints: runner/results/checkpoints.py).

Every file is written as the run goes (metrics each iteration), whole or not at all: JSON
files through a temporary file and a rename, metrics.jsonl a whole line at a time. A
crash, a signal or a full disk loses at most the iteration in flight.
"""

from __future__ import annotations

import csv
import enum
import io
import json
import math
import numbers
import os
import platform
from collections.abc import Iterable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import yaml

# The files a run dir holds, named once here.
SUMMARY = "summary.json"  # the run record (runner/results/record.py), every task
CONFIG = "config.yaml"  # the config the job ran with, resolved, as the runner composed it
OVERRIDES = "composed_overrides.yaml"  # the overrides it was composed from (resume's input)
PLAN = "plan.json"
METRICS = "metrics.jsonl"
PROGRESS = "progress.csv"
CHECKPOINTS = "checkpoints"
EVAL = "eval.json"
BENCH = "bench.json"
POLICY = "policy.json"
ONNX = "policy.onnx"
ENV_RUNNER_ERROR = "env_runner_error.txt"  # the traceback of an EnvRunner error that repeated
# Files that mark a run dir as holding results: never written into twice.
RESULT_FILES = (METRICS, SUMMARY, CHECKPOINTS, BENCH, EVAL, ONNX)


def refuse_used(run_dir: Path) -> None:
    """A run dir holding a run's results is never written into again: one line naming it.
    A refused run's record alone is no result (nothing ran): the same command, fixed,
    may use the dir."""
    from runner.errors import RunDirUsed

    used = [name for name in RESULT_FILES if (run_dir / name).exists()]
    if used == [SUMMARY] and read_status(run_dir) == REFUSED:
        return
    if used:
        raise RunDirUsed(
            f"run dir '{run_dir}' already holds a run's results; choose a new hydra.run.dir, "
            f"or continue that run with resume={run_dir}"
        )


# The status of a job the runner refused before it ran anything (bad input, a shortfall).
REFUSED = "refused"


def write_overrides(run_dir: Path, overrides: list[str]) -> None:
    """The overrides a run dir's job was composed from: what resume= composes again and
    a sweep's summary names its jobs by."""
    (run_dir / OVERRIDES).write_text(yaml.safe_dump(overrides))


def read_overrides(run_dir: Path) -> list[str]:
    """write_overrides' list; none where the run dir holds none."""
    path = run_dir / OVERRIDES
    return (yaml.safe_load(path.read_text()) or []) if path.is_file() else []


def read_status(run_dir: Path) -> str | None:
    """The status summary.json records, or None where there is none (or it is unreadable)."""
    try:
        return json.loads((run_dir / SUMMARY).read_text()).get("status")
    except (OSError, ValueError, AttributeError):
        return None


# The headline figures of one iteration, taken from RLlib's result dict.
HEADLINE = {
    "episode_return_mean": ("env_runners", "episode_return_mean"),
    "env_steps": ("env_runners", "num_env_steps_sampled_lifetime"),
    "env_steps_this_iter": ("env_runners", "num_env_steps_sampled"),
    "iteration_seconds": ("time_this_iter_s",),
    # Per module (policy) id: in a multi-agent run, each policy's own return.
    "module_episode_returns_mean": ("env_runners", "module_episode_returns_mean"),
    # Evaluation during training (eval.every): absent from the iterations without one.
    "eval_return_mean": ("evaluation", "env_runners", "episode_return_mean"),
}


def json_safe(value: Any) -> Any:
    """Recursively turn RLlib/numpy/torch values into JSON: classes and functions by name."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [json_safe(v) for v in value]
    if isinstance(value, enum.Enum):
        return json_safe(value.value)
    if isinstance(value, bool | str) or value is None:
        return value
    if isinstance(value, np.ndarray) or type(value).__module__.startswith("torch"):
        return json_safe(value.tolist())  # a tensor: torch is not imported for this
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        value = float(value)
        return value if math.isfinite(value) else None
    if isinstance(value, type) or callable(value):
        name = getattr(value, "__qualname__", type(value).__qualname__)
        return f"{getattr(value, '__module__', '')}.{name}"
    return repr(value)


def write_atomic_bytes(path: Path, data: bytes) -> None:
    """Write `data` to a temporary file beside `path`, then rename it over `path`: a
    reader (or a run killed half-way) sees the old file or the new one, never a part."""
    temporary = path.with_name(f".{path.name}.tmp")
    try:
        with temporary.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except OSError:
        temporary.unlink(missing_ok=True)
        raise
    os.replace(temporary, path)


def write_atomic(path: Path, text: str) -> None:
    write_atomic_bytes(path, text.encode())


def write_json(path: Path, data: Any) -> None:
    write_atomic(path, json.dumps(json_safe(data), indent=2, sort_keys=True) + "\n")


def write_csv(path: Path, rows: list[dict[str, Any]], columns: Any = None) -> None:
    """`rows` as CSV: `columns` (default: the first row's keys); other keys are left out."""
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns or rows[0]), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def flatten_numbers(result: dict, prefix: str = "") -> dict[str, float]:
    """{'a/b/c': number} for every finite number in a nested result dict (counts stay
    whole)."""
    flat: dict[str, float] = {}
    for key, value in result.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten_numbers(value, f"{name}/"))
        elif (
            isinstance(value, numbers.Real)
            and not isinstance(value, bool)
            and math.isfinite(float(value))
        ):
            flat[name] = int(value) if isinstance(value, numbers.Integral) else float(value)
    return flat


def _dig(result: dict, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(result, dict) or key not in result:
            return None
        result = result[key]
    return result


def env_step(row: dict[str, Any]) -> int:
    """A logged iteration's step (TensorBoard's, MLflow's, W&B's): the env steps so far."""
    return int(row["env_steps"] or 0)


def return_points(
    rows: Iterable[dict[str, Any]], x: str = "env_steps"
) -> list[tuple[float, float]]:
    """(`x`: env steps, or wall seconds, and the last known training return mean) for each
    iteration row with both: a learning curve's points (a row written before
    `last_episode_return_mean`: its mean)."""
    points = []
    for row in rows:
        ret = row.get("last_episode_return_mean", row.get("episode_return_mean"))
        if row.get(x) is not None and ret is not None:
            points.append((row[x], ret))
    return points


def headline(result: dict, wall_seconds: float, focus: str | None = None) -> dict[str, Any]:
    """One iteration's figures, as printed and as the first fields of metrics.jsonl.
    `focus`: the policy whose return is the run's (a game against an opponent: the
    trained one's; the agents' sum, RLlib's episode_return_mean, is 0 in a zero-sum game)."""
    paths = dict(HEADLINE)
    if focus is not None:
        for name in ("episode_return_mean", "eval_return_mean"):
            paths[name] = (*paths[name][:-1], "module_episode_returns_mean", focus)
    row: dict[str, Any] = {"iteration": int(result["training_iteration"])}
    row.update({name: json_safe(_dig(result, path)) for name, path in paths.items()})
    seconds = row["iteration_seconds"]
    steps = row["env_steps_this_iter"]
    row["env_steps_per_s"] = steps / seconds if steps and seconds else None
    row["wall_seconds"] = wall_seconds
    return row


def append_whole(fd: int, data: bytes, name: str) -> None:
    """`data` at the end of the file open at `fd` in one `os.write`, or not at all: a write
    cut short (a full disk) is truncated away, so the file holds only whole lines."""
    size = os.fstat(fd).st_size
    try:
        written = os.write(fd, data)
    except OSError:
        os.ftruncate(fd, size)
        raise
    if written != len(data):
        os.ftruncate(fd, size)
        raise OSError(f"{name}: wrote {written} of {len(data)} bytes (disk full?)")


def _csv_text(rows: list[dict[str, Any]], columns: list[str], header: bool) -> bytes:
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=columns, extrasaction="ignore")
    if header:
        writer.writeheader()
    writer.writerows(rows)
    return text.getvalue().encode()


class MetricsLog:
    """metrics.jsonl (one line per iteration, the headline row and RLlib's metrics) and
    progress.csv (a row per iteration, a column per RLlib metric, for pandas).

    Both files only ever hold whole lines (`append_whole`). progress.csv gets a row
    appended while its columns hold, and is rewritten whole (through a rename) when an
    iteration brings a metric the earlier ones lacked (the first evaluation, the first
    episode's end)."""

    def __init__(self, run_dir: Path, history: Sequence[str] = ()) -> None:
        self._fd = os.open(run_dir / METRICS, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        self._csv = run_dir / PROGRESS
        self._csv_fd: int | None = None
        self._rows: list[dict[str, float]] = []
        self._columns: list[str] = []
        for line in history:  # an interrupted sweep job's iterations up to its checkpoint
            self._append(line)
            self._rows.append(json.loads(line)["metrics"])
        if self._rows:
            self._rewrite_csv()

    def _append(self, line: str) -> None:
        append_whole(self._fd, (line.rstrip("\n") + "\n").encode(), "metrics.jsonl")

    def write(self, row: dict[str, Any], metrics: dict[str, float]) -> None:
        """One iteration: its headline `row` and RLlib's result as `flatten_numbers` gives it."""
        self._append(json.dumps({**row, "metrics": metrics}))
        self._rows.append(metrics)
        if self._csv_fd is not None and metrics.keys() <= set(self._columns):
            append_whole(self._csv_fd, _csv_text([metrics], self._columns, False), "progress.csv")
        else:
            self._rewrite_csv()

    def _rewrite_csv(self) -> None:
        """progress.csv whole, its columns every metric seen so far (in first-seen order)."""
        self._columns = list(dict.fromkeys(k for metrics in self._rows for k in metrics))
        if self._csv_fd is not None:
            os.close(self._csv_fd)
            self._csv_fd = None
        write_atomic_bytes(self._csv, _csv_text(self._rows, self._columns, True))
        self._csv_fd = os.open(self._csv, os.O_WRONLY | os.O_APPEND)

    def close(self) -> None:
        os.close(self._fd)
        if self._csv_fd is not None:
            os.close(self._csv_fd)


def versions() -> dict[str, str]:
    import ray
    import torch

    return {
        "runner": metadata.version("rllib-runner"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "ray": ray.__version__,
    }
