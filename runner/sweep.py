"""The sweep summary (`python -m runner -m ...`): one row per job, tables and plots.

Every job leaves `job.json` (runner/results/jobs.py) in its dir. When Hydra's multirun
ends, `SweepSummary` (a Hydra callback, see conf/config.yaml) reads the job dirs and
writes `summary.csv`, `summary.md` and plots into the sweep dir (and, when it ran some
configuration with several seeds, `seeds.csv` and a learning curve per configuration:
runner/results/seeds.py), and ends the sweep with exit code 1 if a job failed;
`python -m runner.sweep <sweep dir>` rebuilds them from any sweep dir.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from runner.errors import RunnerError, tool_exit_code
from runner.results import plots, remote, seeds
from runner.results.files import BENCH, OVERRIDES, REFUSED, SUMMARY, read_overrides, write_csv
from runner.results.jobs import JOB_FILE, read_job
from runner.settings import overrides as ov

COMPARE = "compare"  # the comparison page's dir in a sweep dir (runner/compare.py)

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


def _compile_choice(overrides: list[str]) -> str:
    """The compile preset a job ran with: its compile=... override, else the default."""
    return ov.value(overrides, "compile") or "none"


def _compile_off(overrides: list[str]) -> bool:
    """True for a job that ran with compile=none and no compile.* setting of its own."""
    return _compile_choice(overrides) == "none" and not any(
        ov.is_compile(o) and ov.key(o) != "compile" for o in overrides
    )


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def job_row(job_dir: Path) -> dict[str, Any]:
    """One job's row: its overrides and status, and the figures its task wrote."""
    job = read_job(job_dir) or {}
    summary = _read_json(job_dir / SUMMARY)
    # A run refused before it wrote composed_overrides.yaml has them in its record.
    overrides = job.get("overrides") or read_overrides(job_dir) or summary.get("overrides") or []
    row: dict[str, Any] = {
        "job": job_dir.name,
        "overrides": " ".join(overrides),
        # A run outside a sweep has no job.json: its record's status (none: still running,
        # or killed before it wrote one).
        "status": job.get("status") or summary.get("status") or "not finished",
        "error": job.get("error")
        or summary.get("error")
        or "; ".join(f"preflight would fail: {p}" for p in job.get("preflight_problems", [])),
        "wall_seconds": job.get("wall_seconds"),
        "cpus": job.get("cpus"),
        "gpus": job.get("gpus"),
        "_overrides": overrides,
        "_dir": job_dir,
    }
    if summary:
        comp = summary.get("compile") or {}
        for kind in ("episode", "eval"):  # eval: a criterion on the evaluation's return
            for when in ("final", "best"):
                key = f"{when}_{kind}_return_mean"
                row[key] = summary.get(key)
        row["check"] = summary.get("check") or {}
        if row["wall_seconds"] is None:  # a run outside a sweep has no job.json
            row["wall_seconds"] = summary.get("wall_seconds")
        row["env_steps_per_s"] = summary.get("env_steps_per_s")
        row["compile"] = (
            f"{comp.get('backend')}/{comp.get('mode') or 'default'}"
            + (" applied" if comp.get("frames") else " not applied")
            if comp.get("requested")
            else "off"
        )
    bench = _read_json(job_dir / BENCH)
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
        tuple(sorted(o for o in r["_overrides"] if not ov.is_compile(o))): r
        for r in rows
        if _compile_off(r["_overrides"]) and r.get("env_steps_per_s")
    }
    for r in rows:
        if r.get("speedup") is not None or not r.get("env_steps_per_s"):
            continue
        key = tuple(sorted(o for o in r["_overrides"] if not ov.is_compile(o)))
        base = baselines.get(key)
        if base is not None and base is not r:
            r["speedup"] = r["env_steps_per_s"] / base["env_steps_per_s"] - 1


def job_dirs(sweep_dir: Path) -> list[Path]:
    """The sweep's job dirs (those a job recorded itself in), in job-number order."""
    recorded = (JOB_FILE, OVERRIDES, SUMMARY)
    dirs = [
        p
        for p in sweep_dir.iterdir()
        if p.is_dir() and any((p / name).is_file() for name in recorded)
    ]
    return sorted(dirs, key=lambda p: (int(p.name) if p.name.isdigit() else 1 << 30, p.name))


def summarize(sweep_dir: Path) -> list[dict[str, Any]]:
    """Write summary.csv, summary.md and the plots into `sweep_dir`; return the rows."""
    dirs = job_dirs(sweep_dir)
    if not dirs:
        raise RunnerError(f"sweep: no job dirs (*/{JOB_FILE}) under '{sweep_dir}'")
    rows = [job_row(d) for d in dirs]
    _add_speedups(rows)
    speedups = {k for r in rows for k in r if k.startswith("speedup_b")}
    extra = sorted(speedups, key=lambda k: int(k.removeprefix("speedup_b")))
    columns = [*COLUMNS, *extra]
    write_csv(sweep_dir / "summary.csv", rows, columns)
    text = markdown(rows, columns)
    if seeds.varies_seed(rows):
        groups = seeds.group(rows, sweep_dir, _configuration_label)
        write_csv(sweep_dir / "seeds.csv", groups, seeds.COLUMNS)
        text += "\n## Over seeds\n\n" + seeds_markdown(groups)
    from runner import compare  # numpy and scipy: not at the CLI's start

    if compare.find([sweep_dir]):  # training runs: the comparison page, linked
        compare.build([sweep_dir], sweep_dir / COMPARE, [], f"python -m runner.compare {sweep_dir}")
        text += f"\nComparison over seeds and envs: [{COMPARE}/compare.md]({COMPARE}/compare.md)\n"
    (sweep_dir / "summary.md").write_text(text)
    plot(sweep_dir, rows)
    return rows


def _configuration_label(row: dict[str, Any]) -> str:
    return " ".join(seeds.configuration(row["_overrides"])) or "(defaults)"


def seeds_markdown(groups: list[dict[str, Any]]) -> str:
    """One row per configuration: pass rate, IQMs and the median steps to threshold, each
    with its 95 % bootstrap interval in brackets."""
    lines = [
        "| configuration | seeds | passed | final return, IQM [95 % CI] | best return, IQM "
        "[95 % CI] | env steps to threshold, median [95 % CI] | wall s, median | curve |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for g in groups:
        passed = "" if g["passed"] is None else f"{g['passed']}/{g['seeds']}"
        wall = "" if g["wall_seconds_median"] is None else f"{g['wall_seconds_median']:,.0f}"
        curve = f"![]({g['curve']})" if g.get("curve") else ""
        cells = [
            g["configuration"],
            str(g["seeds"]),
            passed,
            seeds.interval_text(g, "final_return") + seeds.evaluated(g),
            seeds.interval_text(g, "best_return") + seeds.evaluated(g),
            seeds.interval_text(g, "steps_to_threshold", "median"),
            wall,
            curve,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


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
            values.setdefault(ov.key(o), set()).add(o.partition("=")[2])
    return values


def swept(rows: list[dict[str, Any]]) -> set[str]:
    """Override keys whose values differ between the jobs: what the sweep varied."""
    return {k for k, v in _values(rows).items() if len(v) > 1 or len(rows) == 1}


def _label(row: dict[str, Any], keys: set[str]) -> str:
    return " ".join(o for o in row["_overrides"] if ov.key(o) in keys) or "(defaults)"


def markdown(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """The summary table, jobs named by the overrides the sweep varied (all are in the CSV)."""
    keys = swept(rows)
    shown = [c for c in columns if any(r.get(c) not in (None, "") for r in rows)]
    lines = ["| " + " | ".join(shown) + " |", "|" + "---|" * len(shown)]
    for r in rows:
        cells = [_label(r, keys) if c == "overrides" else _cell(c, r.get(c)) for c in shown]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"{len(rows)} jobs, {counts(rows)}."]
    return "\n".join(lines) + "\n"


# The statuses of jobs that did not do their work: a sweep with any of them exits 1.
UNSUCCESSFUL = ("failed", REFUSED)


def counts(rows: list[dict[str, Any]]) -> str:
    """How many jobs failed and how many were refused (bad input, a shortfall), e.g.
    "1 failed, 2 refused"; "0 failed" when none."""
    parts = [f"{sum(r['status'] == s for r in rows)} {s}" for s in UNSUCCESSFUL]
    return ", ".join(p for p in parts if not p.startswith("0 ")) or "0 failed"


def _swept_axes(rows: list[dict[str, Any]]) -> list[str]:
    """Scaling keys that take more than one value across the jobs."""
    return sorted(k for k, v in _values(rows).items() if k.startswith("scaling") and len(v) > 1)


def plot(sweep_dir: Path, rows: list[dict[str, Any]]) -> list[Path]:
    """Throughput against each swept scaling axis, and the speedups of every job."""
    written = []
    done = [r for r in rows if r.get("env_steps_per_s")]
    keys = swept(rows)
    for axis in _swept_axes(done):
        # A line per combination of the other swept overrides (the compile preset among them).
        series: dict[str, list[tuple[Any, float]]] = {}
        for r in done:
            others = _label(r, keys - {axis}) if keys - {axis} else "all jobs"
            series.setdefault(others, []).append((_axis_value(r, axis), r["env_steps_per_s"]))
        name = f"throughput_vs_{axis.replace('scaling.', '').replace('=', '')}.png"
        written.append(plots.lines(sweep_dir / name, series, axis, "env steps / s"))
    # One bar per job and speedup column: vs compile=none for training jobs, vs eager per
    # batch size for the inference bench.
    columns = sorted(
        {k for r in rows for k in r if k.startswith("speedup") and r[k] is not None},
        key=lambda k: int(k.removeprefix("speedup_b")) if k != "speedup" else 0,
    )
    with_speedup = [r for r in rows if any(r.get(c) is not None for c in columns)]
    if with_speedup:
        path = plots.speedup_bars(
            sweep_dir / "speedup.png",
            [_label(r, keys) for r in with_speedup],
            {c: [r.get(c) for r in with_speedup] for c in columns},
            "speedup, % (vs compile=none; benchmarks: vs their eager copy)",
        )
        written.append(path)
    return written


def _axis_value(row: dict[str, Any], axis: str) -> float | str:
    value = ov.value(row["_overrides"], axis) or ""
    try:
        return float(value)
    except ValueError:
        return value


class FailedJobs(SystemExit):
    """Raised when a multirun ends with failed jobs. A SystemExit, because Hydra turns a
    callback's exceptions into warnings; `__main__` prints it and exits 1."""


class SweepSummary(Callback):
    """Hydra callback: summarise the sweep dir when a multirun ends."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if not sweep_dir.is_dir():
            return
        rows = summarize(sweep_dir)
        uri = OmegaConf.select(config, "results.uri")
        if uri:  # each job copied its own run dir; the sweep's own files join them
            mirror = remote.Mirror(uri, sweep_dir)
            mirror.push(top_only=True)
            print(f"sweep summary mirrored to {mirror.uri}")
        failed = [r for r in rows if r["status"] in UNSUCCESSFUL]
        dry = [r for r in rows if r["status"] == "dry_run"]
        if dry or (failed and all(r["status"] in ("dry_run", *UNSUCCESSFUL) for r in rows)):
            print(f"dry run: {len(rows)} jobs, {len(failed)} invalid")
            for r in rows:
                what = r["error"]
                if r["status"] not in UNSUCCESSFUL:
                    what = f"{r['cpus']:g} CPUs, {r['gpus']:g} GPUs" + (f"; {what}" if what else "")
                print(f"  job {r['job']}: {r['overrides'] or '(defaults)'}: {what}")
        print(f"sweep: {len(rows)} jobs, {counts(rows)}; summary in {sweep_dir / 'summary.md'}")
        if failed:
            jobs = ", ".join(r["job"] for r in failed)
            raise FailedJobs(
                f"{len(failed)} of {len(rows)} sweep jobs failed or were refused ({counts(rows)}: "
                f"job {jobs})"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m runner.sweep",
        description="Rebuild summary.csv, summary.md and the plots of a sweep dir.",
    )
    parser.add_argument("sweep_dir", type=Path)
    args = parser.parse_args(argv)

    def work() -> int:
        if not args.sweep_dir.is_dir():
            raise RunnerError(f"sweep: '{args.sweep_dir}' is not a directory")
        rows = summarize(args.sweep_dir)
        print((args.sweep_dir / "summary.md").read_text(), end="")
        return 1 if any(r["status"] in UNSUCCESSFUL for r in rows) else 0

    return tool_exit_code(work)


if __name__ == "__main__":
    sys.exit(main())
