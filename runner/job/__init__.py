"""One job, as its entry point composed it: the CLI (`python -m runner`, Hydra's app) or
the Python API (`runner.run`, Hydra's compose API). Everything below the entry point
reads this, never Hydra's global state, so the runner works the same from both."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

# The entry point's composition: overrides -> (composed config, group choices). The core
# asks it for another config (resume= composes the earlier run's overrides again; a
# search's best trial is written against its groups' config) and never calls Hydra.
Composer = Callable[[list[str]], tuple[DictConfig, dict[str, Any]]]


@dataclass
class Job:
    cfg: DictConfig  # the composed config, without Hydra's own node
    run_dir: Path
    overrides: list[str]  # as given (a sweep job's: its own values)
    # The group choices Hydra composed (experiment, scale, task, ...).
    choices: dict[str, Any] = field(default_factory=dict)
    sweep_dir: Path | None = None  # in a `-m` sweep
    number: int | None = None  # the job's number in its sweep
    compose: Composer | None = None  # None: a job that composes nothing more (a test's)
    # What the entry point spent before the job, in seconds (summary.json's `startup`):
    # the interpreter's start (python_s), torch's and RLlib's import (imports_s) and Ray's
    # start (ray_start_s), the last two overlapped where Ray starts early.
    startup: dict[str, float | None] = field(default_factory=dict)

    @property
    def display_name(self) -> str:
        """A tracked run's name: the run dir's, or a sweep job's number and overrides."""
        if self.sweep_dir is None:
            return self.run_dir.name
        shown = [o for o in self.overrides if not o.startswith("logger")]
        return f"job {self.number}: {' '.join(shown)}"
