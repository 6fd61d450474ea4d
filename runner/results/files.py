"""What a run leaves on disk: JSON and CSV files, metrics.jsonl, TensorBoard events, and
where its checkpoints go.

Every file is written as the run goes (metrics flushed each iteration), so a crash or a
Ctrl-C loses at most the iteration in flight.
"""

from __future__ import annotations

import csv
import enum
import json
import math
import numbers
import platform
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch
from tensorboardX import SummaryWriter

# Files that mark a run dir as holding results: never written into twice.
RESULT_FILES = ("metrics.jsonl", "summary.json", "checkpoints", "bench.json")
CHECKPOINT_FILE = "rllib_checkpoint.json"

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
    if isinstance(value, np.ndarray | torch.Tensor):
        return json_safe(value.tolist())
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        value = float(value)
        return value if math.isfinite(value) else None
    if isinstance(value, type) or callable(value):
        name = getattr(value, "__qualname__", type(value).__qualname__)
        return f"{getattr(value, '__module__', '')}.{name}"
    return repr(value)


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(json_safe(data), indent=2, sort_keys=True) + "\n")


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
    """metrics.jsonl (one line per iteration, flushed) and TensorBoard events, side by side."""

    def __init__(self, run_dir: Path) -> None:
        self._jsonl = (run_dir / "metrics.jsonl").open("w", buffering=1)
        self._tb = SummaryWriter(logdir=str(run_dir / "tensorboard"), flush_secs=10)

    def write(self, row: dict[str, Any], result: dict) -> None:
        metrics = flatten_numbers({k: v for k, v in result.items() if k != "config"})
        self._jsonl.write(json.dumps({**row, "metrics": metrics}) + "\n")
        for name, value in metrics.items():
            self._tb.add_scalar(name, value, global_step=row["iteration"])
        self._tb.flush()

    def close(self) -> None:
        self._jsonl.close()
        self._tb.close()


def versions() -> dict[str, str]:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "ray": ray.__version__,
    }


def checkpoint_dir(run_dir: Path, iteration: int) -> Path:
    return run_dir / "checkpoints" / f"iter_{iteration:06d}"


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = sorted((run_dir / "checkpoints").glob(f"*/{CHECKPOINT_FILE}"))
    return found[-1].parent if found else None
