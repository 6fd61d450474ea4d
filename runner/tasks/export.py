"""task=export: a trained policy as ONNX, with what it takes to run it anywhere.

    python -m runner task=export checkpoint=<run dir or checkpoint dir>

The export itself is runner/algorithms/onnx_export.py (loaded when the task runs): policy.onnx is
the module's `forward_inference` with the weights as constants, policy.json says what
goes in and how to act on what comes out, and parity with torch at each of
`task.batch_sizes` must be within `task.tolerance`, else nothing is kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from runner.errors import ConfigError
from runner.job.task import Task, TaskRun, own_settings
from runner.settings.schema import ReadsCheckpoint, RunnerConfig

if TYPE_CHECKING:
    from runner.compile.settings import CompileSpec


@dataclass
class ExportSettings(ReadsCheckpoint):
    """The checkpoint's policy as policy.onnx + policy.json, checked against torch."""

    name: ClassVar[str] = "export"

    batch_sizes: list[int] = field(default_factory=lambda: [1, 16])
    tolerance: float = 1e-5  # largest absolute gap to the torch module allowed
    opset: int | None = None  # ONNX opset (null: the exporter's default)


def check(settings: RunnerConfig, spec: CompileSpec | None) -> list[str]:
    task = own_settings(settings, ExportSettings)
    if not task.batch_sizes or min(task.batch_sizes) < 1:
        raise ConfigError(f"task.batch_sizes={task.batch_sizes}: give sizes of at least 1")
    return []


def run(run: TaskRun) -> None:
    from runner.algorithms.onnx_export import export

    export(run)


TASK = Task(
    settings=ExportSettings,
    run=run,
    check=check,
    needs_ray=False,
    uses_compile=False,
)
