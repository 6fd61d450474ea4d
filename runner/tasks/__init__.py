"""The task registry: every module in this package defines one `TASK` (the
`Task` interface: runner/job/task.py).

Adding a task is a module here and a YAML file in conf/task/; `task.name` picks it.
"""

from __future__ import annotations

import importlib
import pkgutil

from runner.errors import ConfigError, did_you_mean
from runner.job.task import Task


def _discover() -> dict[str, Task]:
    found: dict[str, Task] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        task: Task = importlib.import_module(f"{__name__}.{info.name}").TASK
        found[task.name] = task
    return found


TASKS = _discover()


def get(name: str) -> Task:
    """The task called `name`, or one line naming the closest."""
    if name not in TASKS:
        raise ConfigError(
            f"unknown task.name '{name}'{did_you_mean(name, TASKS)}; use one of: {', '.join(TASKS)}"
        )
    return TASKS[name]
