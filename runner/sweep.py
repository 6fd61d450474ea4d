"""Sweeps (`python -m runner -m ...`): each job's status, and the sweep's own summary.

Every job leaves `job.json` (finished, failed with its one-line error, or dry_run) in its
dir. When Hydra's multirun ends, `SweepSummary` (a Hydra callback, see conf/config.yaml)
reads the job dirs and writes `summary.csv`, `summary.md` and plots into the sweep dir;
`python -m runner.sweep <sweep dir>` rebuilds them from any sweep dir.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from runner.errors import RunnerError, one_line
from runner.results import write_csv

JOB_FILE = "job.json"
# Set by SweepSummary when a multirun ends, read by __main__ for the exit code.
LAST_SUMMARY: list[dict[str, Any]] | None = None
COLUMNS = (
    "job",
    "overrides",
    "status",
    "error",
    "final_episode_return_mean",
    "env_steps_per_s",
    "compile",
    "wall_seconds",
    "speedup",
    "cpus",
    "gpus",
)


FIGURES = ("final_episode_return_mean", "env_steps_per_s", "wall_seconds")


def write_job(job_dir: Path, status: str, overrides: list[str], **fields: Any) -> None:
    """The job's outcome, read by the sweep summary and by a re-run of the sweep."""
    record = {"status": status, "overrides": overrides, **fields}
    (job_dir / JOB_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


def read_job(job_dir: Path) -> dict[str, Any] | None:
    path = job_dir / JOB_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def _overrides(job_dir: Path) -> list[str]:
    path = job_dir / ".hydra" / "overrides.yaml"
    return yaml.safe_load(path.read_text()) or [] if path.is_file() else []


def override_key(override: str) -> str:
    """'+a.b=1' -> 'a.b': the config key an override sets."""
    return override.split("=", 1)[0].lstrip("+~")


def _value(overrides: list[str], key: str) -> str | None:
    """The value `overrides` give `key`, or None."""
    for o in overrides:
        if override_key(o) == key:
            return o.split("=", 1)[1] if "=" in o else None
    return None


def _is_compile_override(override: str) -> bool:
    key = override_key(override)
    return key == "compile" or key.startswith("compile.")


def _compile_choice(overrides: list[str]) -> str:
    """The compile preset a job ran with: its compile=... override, else the default."""
    return _value(overrides, "compile") or "none"


def _compile_off(overrides: list[str]) -> bool:
    """True for a job that ran with compile=none and no compile.* setting of its own."""
    return _compile_choice(overrides) == "none" and not any(
        _is_compile_override(o) and override_key(o) != "compile" for o in overrides
    )


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def job_row(job_dir: Path) -> dict[str, Any]:
    """One job's row: its overrides and status, and the figures its task wrote."""
    job = read_job(job_dir) or {}
    overrides = job.get("overrides") or _overrides(job_dir)
    row: dict[str, Any] = {
        "job": job_dir.name,
        "overrides": " ".join(overrides),
        "status": job.get("status", "not finished"),
        "error": job.get("error")
        or "; ".join(f"preflight would fail: {p}" for p in job.get("preflight_problems", [])),
        "wall_seconds": job.get("wall_seconds"),
        "cpus": job.get("cpus"),
        "gpus": job.get("gpus"),
        "_overrides": overrides,
    }
    summary = _read_json(job_dir / "summary.json")
    if summary:
        comp = summary.get("compile") or {}
        row["final_episode_return_mean"] = summary.get("final_episode_return_mean")
        row["env_steps_per_s"] = summary.get("env_steps_per_s")
        row["compile"] = (
            f"{comp.get('backend')}/{comp.get('mode') or 'default'}"
            + (" applied" if comp.get("frames") else " not applied")
            if comp.get("requested")
            else "off"
        )
    bench = _read_json(job_dir / "bench.json")
    if bench.get("task") == "exploration_bench":
        row["env_steps_per_s"] = bench.get("compiled_env_steps_per_s")
        row["speedup"] = bench.get("speedup")
        row["compile"] = f"{bench['backend']}/{bench['mode']} vs eager"
    elif bench.get("task") == "inference_bench":
        row["compile"] = f"{bench['backend']}/{bench['mode']} vs eager"
        for r in bench.get("rows", []):
            row[f"speedup_b{r['batch_size']}"] = r["speedup"]
    return row


def _add_speedups(rows: list[dict[str, Any]]) -> None:
    """Speedup of env steps/s against the compile=none job with otherwise equal overrides."""
    baselines = {
        tuple(sorted(o for o in r["_overrides"] if not _is_compile_override(o))): r
        for r in rows
        if _compile_off(r["_overrides"]) and r.get("env_steps_per_s")
    }
    for r in rows:
        if r.get("speedup") is not None or not r.get("env_steps_per_s"):
            continue
        key = tuple(sorted(o for o in r["_overrides"] if not _is_compile_override(o)))
        base = baselines.get(key)
        if base is not None and base is not r:
            r["speedup"] = r["env_steps_per_s"] / base["env_steps_per_s"] - 1


def job_dirs(sweep_dir: Path) -> list[Path]:
    """The sweep's job dirs (those Hydra wrote a .hydra/ into), in job-number order."""
    dirs = [p.parent.parent for p in sweep_dir.glob("*/.hydra/overrides.yaml")]
    return sorted(dirs, key=lambda p: (int(p.name) if p.name.isdigit() else 1 << 30, p.name))


def summarize(sweep_dir: Path) -> list[dict[str, Any]]:
    """Write summary.csv, summary.md and the plots into `sweep_dir`; return the rows."""
    dirs = job_dirs(sweep_dir)
    if not dirs:
        raise RunnerError(f"sweep: no job dirs (*/.hydra/) under '{sweep_dir}'")
    rows = [job_row(d) for d in dirs]
    _add_speedups(rows)
    extra = {k for r in rows for k in r if k.startswith("speedup_b")}
    extra = sorted(extra, key=lambda k: int(k.removeprefix("speedup_b")))
    columns = [*COLUMNS, *extra]
    write_csv(sweep_dir / "summary.csv", rows, columns)
    (sweep_dir / "summary.md").write_text(markdown(rows, columns))
    plot(sweep_dir, rows)
    return rows


def _cell(column: str, value: Any) -> str:
    if value is None:
        return ""
    if column.startswith("speedup"):
        return f"{value:+.1%}"
    if isinstance(value, float):
        return f"{value:,.1f}" if column in FIGURES else f"{value:g}"
    return str(value).replace("|", "\\|")


def _values(rows: list[dict[str, Any]]) -> dict[str, set[str]]:
    """Every override key of the jobs, with the values it takes across them."""
    values: dict[str, set[str]] = {}
    for r in rows:
        for o in r["_overrides"]:
            values.setdefault(override_key(o), set()).add(o.partition("=")[2])
    return values


def swept(rows: list[dict[str, Any]]) -> set[str]:
    """Override keys whose values differ between the jobs: what the sweep varied."""
    return {k for k, v in _values(rows).items() if len(v) > 1 or len(rows) == 1}


def _label(row: dict[str, Any], keys: set[str]) -> str:
    return " ".join(o for o in row["_overrides"] if override_key(o) in keys) or "(defaults)"


def markdown(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """The summary table, jobs named by the overrides the sweep varied (all are in the CSV)."""
    keys = swept(rows)
    shown = [c for c in columns if any(r.get(c) not in (None, "") for r in rows)]
    lines = ["| " + " | ".join(shown) + " |", "|" + "---|" * len(shown)]
    for r in rows:
        cells = [_label(r, keys) if c == "overrides" else _cell(c, r.get(c)) for c in shown]
        lines.append("| " + " | ".join(cells) + " |")
    failed = sum(r["status"] == "failed" for r in rows)
    lines += ["", f"{len(rows)} jobs, {failed} failed."]
    return "\n".join(lines) + "\n"


def _swept_axes(rows: list[dict[str, Any]]) -> list[str]:
    """Scaling keys that take more than one value across the jobs."""
    return sorted(k for k, v in _values(rows).items() if k.startswith("scaling") and len(v) > 1)


def plot(sweep_dir: Path, rows: list[dict[str, Any]]) -> list[Path]:
    """Throughput against each swept scaling axis, and the speedups of every job."""
    from runner.bench import pyplot

    plt = pyplot()
    written = []
    done = [r for r in rows if r.get("env_steps_per_s")]
    keys = swept(rows)
    for axis in _swept_axes(done):
        # A line per combination of the other swept overrides (the compile preset among them).
        lines: dict[str, list[tuple[Any, float]]] = {}
        for r in done:
            others = _label(r, keys - {axis}) if keys - {axis} else "all jobs"
            lines.setdefault(others, []).append((_axis_value(r, axis), r["env_steps_per_s"]))
        fig, ax = plt.subplots(figsize=(6, 4))
        for label, points in sorted(lines.items()):
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points], "o-", label=label)
        ax.set(xlabel=axis, ylabel="env steps / s")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = sweep_dir / f"throughput_vs_{axis.replace('scaling.', '').replace('=', '')}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    # One bar per job and speedup column: vs compile=none for training jobs, vs eager per
    # batch size for the inference bench.
    columns = sorted(
        {k for r in rows for k in r if k.startswith("speedup") and r[k] is not None},
        key=lambda k: int(k.removeprefix("speedup_b")) if k != "speedup" else 0,
    )
    with_speedup = [r for r in rows if any(r.get(c) is not None for c in columns)]
    if with_speedup:
        fig, ax = plt.subplots(figsize=(7, 1.5 + 0.3 * len(with_speedup) * len(columns)))
        height = 0.8 / len(columns)
        for i, column in enumerate(columns):
            ax.barh(
                [y + i * height for y in range(len(with_speedup))],
                [100 * (r.get(column) or 0) for r in with_speedup],
                height=height,
                label=column,
            )
        ax.set_yticks(
            [y + 0.4 - height / 2 for y in range(len(with_speedup))],
            [_label(r, keys) for r in with_speedup],
            fontsize=7,
        )
        ax.axvline(0, color="black", linewidth=0.8)
        ax.invert_yaxis()
        ax.set_xlabel("speedup, % (vs compile=none; benchmarks: vs their eager copy)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = sweep_dir / "speedup.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def _axis_value(row: dict[str, Any], axis: str) -> float | str:
    value = _value(row["_overrides"], axis) or ""
    try:
        return float(value)
    except ValueError:
        return value


class SweepSummary(Callback):
    """Hydra callback: summarise the sweep dir when a multirun ends."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        global LAST_SUMMARY
        sweep_dir = Path(config.hydra.sweep.dir)
        if not sweep_dir.is_dir():
            return
        LAST_SUMMARY = summarize(sweep_dir)
        failed = [r for r in LAST_SUMMARY if r["status"] == "failed"]
        dry = [r for r in LAST_SUMMARY if r["status"] == "dry_run"]
        if dry or (failed and all(r["status"] in ("dry_run", "failed") for r in LAST_SUMMARY)):
            print(f"dry run: {len(LAST_SUMMARY)} jobs, {len(failed)} invalid")
            for r in LAST_SUMMARY:
                what = r["error"]
                if r["status"] != "failed":
                    what = f"{r['cpus']:g} CPUs, {r['gpus']:g} GPUs" + (f"; {what}" if what else "")
                print(f"  job {r['job']}: {r['overrides'] or '(defaults)'}: {what}")
        print(
            f"sweep: {len(LAST_SUMMARY)} jobs, {len(failed)} failed; "
            f"summary in {sweep_dir / 'summary.md'}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m runner.sweep",
        description="Rebuild summary.csv, summary.md and the plots of a sweep dir.",
    )
    parser.add_argument("sweep_dir", type=Path)
    args = parser.parse_args(argv)
    try:
        if not args.sweep_dir.is_dir():
            raise RunnerError(f"sweep: '{args.sweep_dir}' is not a directory")
        rows = summarize(args.sweep_dir)
    except (RunnerError, OSError, json.JSONDecodeError) as ex:
        print(f"error: {one_line(ex)}", file=sys.stderr)
        return 2
    print((args.sweep_dir / "summary.md").read_text(), end="")
    return 1 if any(r["status"] == "failed" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
