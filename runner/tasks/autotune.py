"""task=autotune: compile=auto's measurement on its own, without training.

Every candidate in compile.auto.candidates is timed against eager for each component kind
in `task.components`, as compile=auto would time it for this env, algo, scaling and
hardware profile (always measured afresh; the figures also go into compile=auto's cache,
so a training run with the same settings decides from them). Writes autotune.json,
autotune.csv and autotune.png, and prints a table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from runner.console import console
from runner.errors import ConfigError
from runner.job.task import Task, TaskRun, own_settings
from runner.results import plots
from runner.results.files import write_csv, write_json
from runner.settings.schema import COMPONENT_KINDS, RunnerConfig, TaskSettings

if TYPE_CHECKING:  # light at import: the task's heavy modules load when it runs
    from runner.compile.settings import CompileSpec


COLUMNS = (
    "component",
    "preset",
    "status",
    "compile_seconds",
    "call_seconds",
    "call_speedup",
    "effective_call_seconds",
    "speedup",
    "max_rel_diff",
    "reason",
)


@dataclass
class AutotuneSettings(TaskSettings):
    """The component kinds to measure: env_runners (forward_exploration), learners
    (forward_train and its backward)."""

    name: ClassVar[str] = "autotune"

    components: list[str] = field(default_factory=lambda: list(COMPONENT_KINDS))


def check(settings: RunnerConfig, spec: CompileSpec | None) -> list[str]:
    from runner.compile import auto

    task = own_settings(settings, AutotuneSettings)
    unknown = sorted(set(task.components) - set(auto.KINDS))
    if unknown or not task.components:
        raise ConfigError(
            f"task.components must name some of {', '.join(auto.KINDS)}, got {task.components}"
        )
    auto.check(settings, list(task.components))
    return []


def rows(section: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per component kind and candidate, eager first."""
    from runner.compile import auto

    out = []
    for kind in auto.KINDS:
        if kind not in section:
            continue
        entry = section[kind]
        eager = {
            "preset": "eager",
            "status": "measured",
            "call_seconds": entry["eager_call_seconds"],
        }
        for row in [eager, *entry["candidates"]]:
            out.append({"component": kind, **row})
    return out


def _cell(value: Any, kind: str) -> str:
    if value is None:
        return ""
    return {
        "s": f"{value:.2f}",
        "ms": f"{value * 1e3:.3f}",
        "pct": f"{value:+.1%}",
    }[kind]


def print_table(section: dict[str, Any]) -> None:
    from rich import box
    from rich.table import Table

    from runner.compile import auto

    for kind in auto.KINDS:
        if kind not in section:
            continue
        entry = section[kind]
        table = Table(
            title=(
                f"{kind.replace('_', ' ')}: {auto.METHODS[kind]} at batch {entry['batch_size']}, "
                f"{entry['threads']} thread(s), {entry['device']}, "
                f"{entry['expected_calls']:,} expected calls"
            ),
            title_justify="left",
            box=box.SIMPLE_HEAD,
            pad_edge=False,
        )
        longest = max(len(row["preset"]) for row in rows({kind: entry}))
        for column in ("preset", "status", "compile s", "ms/call", "per call", "w/ compile"):
            width = longest if column == "preset" else max(len(column), 8)
            table.add_column(column, no_wrap=True, min_width=width)
        notes = []
        for row in rows({kind: entry}):
            table.add_row(
                row["preset"],
                row["status"],
                _cell(row.get("compile_seconds"), "s"),
                _cell(row.get("call_seconds"), "ms"),
                _cell(row.get("call_speedup"), "pct"),
                _cell(row.get("speedup"), "pct"),
            )
            if row.get("reason"):
                notes.append(f"{row['status']} {row['preset']}: {row['reason']}")
        console.print(table)
        for note in notes:
            console.print(note)
        console.print(f"choice: {entry['choice']} ({entry['why']})")


def run(run: TaskRun) -> None:
    """Measure, then write autotune.json, autotune.csv and autotune.png."""
    from runner.compile import auto

    settings = run.settings
    task = own_settings(settings, AutotuneSettings)
    section = auto.choose(settings, run.config, list(task.components), refresh=True)
    print_table(section)
    table = rows(section)
    result = {"task": "autotune", "env": settings.env.name, **section}
    write_json(run.files / "autotune.json", result)
    run.record["autotune"] = result
    write_csv(run.files / "autotune.csv", table, COLUMNS)
    presets = list(dict.fromkeys(r["preset"] for r in table if r["preset"] != "eager"))
    columns = {}
    for kind in task.components:
        mine = {r["preset"]: r for r in table if r["component"] == kind}
        columns[f"{kind}: per call"] = [mine.get(p, {}).get("call_speedup") for p in presets]
        columns[f"{kind}: with compile"] = [mine.get(p, {}).get("speedup") for p in presets]
    plots.speedup_bars(run.files / "autotune.png", presets, columns, "speedup over eager (%)")
    console.print(f"done: results in {run.files}")


TASK = Task(
    settings=AutotuneSettings,
    run=run,
    check=check,
    needs_ray=False,
    uses_compile=False,
)
