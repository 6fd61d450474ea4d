"""What a run leaves on disk: JSON and CSV files, metrics.jsonl and TensorBoard events
(checkpoints: runner/results/checkpoints.py).

Every file is written as the run goes (metrics each iteration), whole or not at all: JSON
files through a temporary file and a rename, metrics.jsonl a whole line at a time. A
crash, a signal or a full disk loses at most the iteration in flight.
"""

from __future__ import annotations

import csv
import enum
import json
import math
import numbers
import os
import platform
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

# Files that mark a run dir as holding results: never written into twice.
RESULT_FILES = (
    "metrics.jsonl",
    "summary.json",
    "checkpoints",
    "bench.json",
    "eval.json",
    "policy.onnx",
)

# The headline figures of one iteration, taken from RLlib's result dict.
HEADLINE = {
    "episode_return_mean": ("env_runners", "episode_return_mean"),
    "env_steps": ("env_runners", "num_env_steps_sampled_lifetime"),
    "env_steps_this_iter": ("env_runners", "num_env_steps_sampled"),
    "iteration_seconds": ("time_this_iter_s",),
    # Per module (policy) id: in a multi-agent run, each policy's own return.
    "module_episode_returns_mean": ("env_runners", "module_episode_returns_mean"),
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


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to a temporary file beside `path`, then rename it over `path`: a
    reader (or a run killed half-way) sees the old file or the new one, never a part."""
    temporary = path.with_name(f".{path.name}.tmp")
    with temporary.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)


def write_json(path: Path, data: Any) -> None:
    write_atomic(path, json.dumps(json_safe(data), indent=2, sort_keys=True) + "\n")


def write_csv(path: Path, rows: list[dict[str, Any]], columns: Any = None) -> None:
    """`rows` as CSV: `columns` (default: the first row's keys); other keys are left out."""
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns or rows[0]), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def flatten_numbers(result: dict, prefix: str = "") -> dict[str, float]:
    """{'a/b/c': number} for every finite number in a nested result dict."""
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
            flat[name] = float(value)
    return flat


def _dig(result: dict, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(result, dict) or key not in result:
            return None
        result = result[key]
    return result


def headline(result: dict, wall_seconds: float) -> dict[str, Any]:
    """One iteration's figures, as printed and as the first fields of metrics.jsonl."""
    row: dict[str, Any] = {"iteration": int(result["training_iteration"])}
    row.update({name: json_safe(_dig(result, path)) for name, path in HEADLINE.items()})
    seconds = row["iteration_seconds"]
    steps = row["env_steps_this_iter"]
    row["env_steps_per_s"] = steps / seconds if steps and seconds else None
    row["wall_seconds"] = wall_seconds
    return row


class MetricsLog:
    """metrics.jsonl (one line per iteration) and TensorBoard events, side by side.

    Each line goes to the file in one `os.write`; a write cut short (a full disk) is
    truncated away, so the file only ever holds whole lines."""

    def __init__(self, run_dir: Path, history: Sequence[str] = ()) -> None:
        self._fd = os.open(run_dir / "metrics.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        for line in history:  # an interrupted sweep job's iterations up to its checkpoint
            self._append(line)
        from tensorboardX import SummaryWriter  # here: its import costs every other job

        self._tb = SummaryWriter(logdir=str(run_dir / "tensorboard"), flush_secs=10)

    def _append(self, line: str) -> None:
        data = (line.rstrip("\n") + "\n").encode()
        size = os.fstat(self._fd).st_size
        try:
            written = os.write(self._fd, data)
        except OSError:
            os.ftruncate(self._fd, size)
            raise
        if written != len(data):
            os.ftruncate(self._fd, size)
            raise OSError(f"metrics.jsonl: wrote {written} of {len(data)} bytes (disk full?)")

    def write(self, row: dict[str, Any], metrics: dict[str, float]) -> None:
        """One iteration: its headline `row` and RLlib's result as `flatten_numbers` gives it."""
        self._append(json.dumps({**row, "metrics": metrics}))
        for name, value in metrics.items():
            self._tb.add_scalar(name, value, global_step=row["iteration"])
        self._tb.flush()

    def close(self) -> None:
        os.close(self._fd)
        self._tb.close()


def versions() -> dict[str, str]:
    import ray
    import torch

    return {
        "runner": metadata.version("rllib-runner"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "ray": ray.__version__,
    }
