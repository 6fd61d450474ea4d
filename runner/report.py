"""The report, from saved results: reproductions (published vs measured, side by side)
and the verification table (runs with a pass criterion, over seeds).

    python -m runner.report outputs/                        # report.md, report.csv, report.png
    python -m runner.report outputs/ --doc docs/reproductions.md   # also refresh that page

Every bench.json under the given paths that came from a reproduction (conf/experiment/) is
matched with the figures it carries; the latest run of each experiment and scale is
shown. Each experiment also gets the ways its machine and method differ from the
published run, so a gap between the two columns can be read for what it is.

Every summary.json with an enabled `check` (a tuned experiment, or any run given one) is
a seed of its configuration; the verification table has a row per configuration: pass
rate, env steps to the threshold, final return and wall time over the seeds
(runner/results/seeds.py), in verification.md, verification.csv and a learning curve
each.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from runner import docs
from runner.errors import RunnerError, one_line, tool_exit_code
from runner.machine import is_gpu_of
from runner.results import plots, remote, seeds
from runner.results.files import OVERRIDES, write_csv
from runner.settings import overrides as ov
from runner.sweep import job_row

COLUMNS = (
    "experiment",
    "scale",
    "kind",
    "backend",
    "mode",
    "batch_size",
    "published_speedup",
    "measured_speedup",
    "published_eager",
    "published_compiled",
    "measured_eager",
    "measured_compiled",
    "published_on",
    "measured_on",
    "differences",
    "run_dir",
)


def _load(path: Path) -> dict[str, Any]:
    """A bench.json, or one clear error if it is not one this runner wrote."""
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as ex:
        raise RunnerError(f"report: {path} is not valid JSON ({one_line(ex)})") from ex
    repro = data.get("reproduction") if isinstance(data, dict) else None
    if repro:
        missing = [k for k in ("hardware", "versions") if k not in data]
        missing += [k for k in ("name", "kind", "published") if k not in repro]
        if missing:
            raise RunnerError(
                f"report: {path} lacks {', '.join(missing)}: not a bench.json this runner wrote"
            )
    return data if isinstance(data, dict) else {}


def find_results(paths: list[Path]) -> tuple[list[tuple[Path, dict[str, Any]]], int]:
    """(run dir, bench.json) of the latest run of each reproduction and scale; and how many
    bench.json files were not reproductions."""
    latest: dict[tuple[str, str], tuple[float, Path, dict[str, Any]]] = {}
    others = 0
    for root in paths:
        for path in sorted(root.rglob("bench.json")) if root.is_dir() else [root]:
            data = _load(path)
            repro = data.get("reproduction")
            if not repro:
                others += 1
                continue
            key = (repro["name"], data.get("scale") or "published")
            mtime = path.stat().st_mtime
            if key not in latest or mtime > latest[key][0]:
                latest[key] = (mtime, path.parent, data)
    found = sorted(latest.values(), key=lambda t: (t[2]["reproduction"]["name"], t[1]))
    return [(run_dir, data) for _, run_dir, data in found], others


def _gpu(data: dict[str, Any]) -> str | None:
    """The GPU a bench ran on: its own record (older files: the machine's first GPU)."""
    if not data.get("device", "cpu").startswith("cuda"):
        return None
    return data.get("device_name") or next(iter(data["hardware"].get("gpu_names", [])), None)


def measured_on(data: dict[str, Any]) -> str:
    hw = data["hardware"]
    where = _gpu(data) or f"{hw.get('cpu_model') or 'CPU'} ({hw['cpus']:g} CPUs)"
    return f"{where}, torch {data['versions']['torch']}"


def _cuda_graph_notes(data: dict[str, Any]) -> list[str]:
    """What a CUDA-graph run did that the published torch 2.0.1 runs did not."""
    repro, rows = data["reproduction"], data.get("rows", [])
    if not _gpu(data):
        return []  # on a CPU, as published: no CUDA graphs
    notes = []
    skipped = sum(r.get("cudagraph_skips", 0) for r in rows)
    if skipped and not sum(r.get("cudagraph_recordings", 0) for r in rows):
        notes.append(f"no CUDA graph ran: torch skipped them {skipped} time(s)")
    if repro["backend"] == "cudagraphs" and data.get("parameters_as_graph_inputs"):
        notes.append(
            "cudagraphs: this torch passes the parameters as ordinary graph inputs (dynamo's "
            "inline_inbuilt_nn_modules), so the backend copies every weight into its graph's "
            "buffers on each replay; torch 2.0.1 lifted them as fixed inputs, which it did "
            "not copy"
        )
    return notes


def differences(data: dict[str, Any]) -> list[str]:
    """How this run's machine, software and method differ from the published run."""
    repro = data["reproduction"]
    hw = data["hardware"]
    out = []
    on_gpu = data.get("device", "cpu").startswith("cuda") or (hw.get("gpus", 0) > 0)
    if repro["kind"] == "inference":
        if repro["hardware"] == "CPU":
            out.append(
                f"CPU: published model not stated by the source; measured on "
                f"{hw.get('cpu_model') or 'an unnamed CPU'} with {data.get('threads')} torch "
                "thread(s)"
            )
        elif not data.get("device", "cpu").startswith("cuda"):
            out.append(f"published on an NVIDIA {repro['hardware']} GPU, measured on the CPU")
        elif (gpu := _gpu(data)) and not is_gpu_of(gpu, repro["hardware"]):
            out.append(f"published on {repro['hardware']}, measured on {gpu}")
    elif not on_gpu:
        out.append("published with a GPU Learner, measured with a CPU Learner")
    torch_here = data["versions"]["torch"]
    if torch_here.split("+")[0] != repro["torch"].split("+")[0]:
        out.append(f"torch {torch_here} vs {repro['torch']}")
    if repro["backend"] == "onnxrt":
        out.append("onnxrt is the runner's own onnxruntime backend (torch's was removed in 2.9)")
    cpu = hw.get("cpu_model") or ""
    if repro["backend"] == "ipex" and "AMD" in cpu:
        out.append("ipex is Intel's extension, run here on an AMD CPU")
    out += _cuda_graph_notes(data)
    for key, value in repro.get("method", {}).items():
        if key in data and data[key] != value:
            out.append(f"{key} {data[key]:g} vs {value:g}")
    return out


def rows_for(run_dir: Path, data: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per published figure: its batch size for inference, one for exploration."""
    repro = data["reproduction"]
    common = {
        "experiment": repro["name"],
        "scale": data.get("scale") or "published",
        "kind": repro["kind"],
        "backend": repro["backend"],
        "mode": repro["mode"],
        "published_on": f"{repro['hardware']}, torch {repro['torch']}",
        "measured_on": measured_on(data),
        "differences": "; ".join(differences(data)),
        "run_dir": str(run_dir),
    }
    rows = []
    if repro["kind"] == "exploration":
        pub = repro["published"][0]
        rows.append(
            {
                **common,
                "published_speedup": pub["speedup"],
                "measured_speedup": data.get("speedup"),
                "measured_eager": data.get("eager_env_steps_per_s"),
                "measured_compiled": data.get("compiled_env_steps_per_s"),
            }
        )
        return rows
    measured = {r["batch_size"]: r for r in data["rows"]}
    for pub in repro["published"]:
        mine = measured.get(pub["batch_size"], {})
        rows.append(
            {
                **common,
                "batch_size": pub["batch_size"],
                "published_speedup": pub["speedup"],
                "measured_speedup": mine.get("speedup"),
                "published_eager": pub.get("eager_calls_per_s"),
                "published_compiled": pub.get("compiled_calls_per_s"),
                "measured_eager": mine.get("eager_calls_per_s"),
                "measured_compiled": mine.get("compiled_calls_per_s"),
            }
        )
    return rows


def _number(value: float | None) -> str:
    return "" if value is None else f"{value:,.0f}"


def markdown(rows: list[dict[str, Any]], command: str) -> str:
    """The side-by-side table, then each experiment's differences from the published run."""
    lines = [
        f"Generated by `{command}`. Speedup = compiled / eager - 1; inference figures are "
        "forward_exploration calls per second, exploration figures env steps sampled per "
        "second.",
        "",
        "| experiment | scale | batch | published | measured | measured eager → compiled "
        "| published on | measured on |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['experiment']} | {r['scale']} | {r.get('batch_size') or ''} | "
            f"{docs.speedup_text(r['published_speedup'])} | "
            f"{docs.speedup_text(r['measured_speedup'])} | "
            f"{_number(r['measured_eager'])} → {_number(r['measured_compiled'])} | "
            f"{r['published_on']} | {r['measured_on']} |"
        )
    lines += ["", "Where each run differs from the published one:", ""]
    seen = set()
    for r in rows:
        key = (r["experiment"], r["scale"])
        if key not in seen:
            seen.add(key)
            lines.append(f"- {r['experiment']} ({r['scale']}): {r['differences'] or 'nothing'}")
    return "\n".join(lines) + "\n"


def plot(path: Path, rows: list[dict[str, Any]]) -> Path:
    """Published vs measured speedup, one pair of bars per row."""
    labels = [
        r["experiment"] + (f" b{r['batch_size']}" if r.get("batch_size") else "") for r in rows
    ]
    columns = {
        "published": [r["published_speedup"] for r in rows],
        "measured": [r["measured_speedup"] for r in rows],
    }
    return plots.speedup_bars(path, labels, columns, "speedup, % (compiled / eager - 1)")


# Overrides that name or place a configuration rather than change what it learns.
NOT_SETTINGS = ("experiment", "seed", "ray.num_cpus", "check.source")


def checked_runs(paths: list[Path]) -> list[dict[str, Any]]:
    """A sweep-summary row (runner/sweep.py) for every run under `paths` with a check."""
    rows = []
    for root in paths:
        for path in sorted(root.rglob("summary.json")) if root.is_dir() else []:
            row = job_row(path.parent)
            if row.get("check", {}).get("enabled") and (path.parent / OVERRIDES).is_file():
                rows.append(row)
    return rows


def configuration_label(row: dict[str, Any]) -> str:
    """The experiment's name (the main job: `python -m runner`) and any other setting."""
    overrides = row["_overrides"]
    name = ov.value(overrides, "experiment") or "python -m runner"
    rest = [o for o in overrides if ov.key(o) not in NOT_SETTINGS]
    return " ".join([name, *sorted(rest)])


def criterion(group: dict[str, Any]) -> str:
    """The threshold, and where a random policy set it, that policy's return beside it."""
    if group["threshold"] is None:  # every seed ended before it measured its random policy
        return "not measured"
    if group.get("baseline_return") is None:
        return f"{group['threshold']:g}"
    return (
        f"{group['threshold']:.1f} (a random policy's {group['baseline_return']:.1f} "
        f"+ {group['baseline_stds']:g} std)"
    )


def verification_markdown(groups: list[dict[str, Any]], command: str) -> str:
    """One row per configuration: its criterion, and how its seeds did against it."""
    lines = [
        f"Generated by `{command}`. Figures over seeds: env steps to the threshold as a "
        "median, returns as an interquartile mean (a plain mean, marked so, below 4 seeds), "
        "each with its 95 % bootstrap confidence interval.",
        "",
        "| experiment | criterion | seeds passed | env steps to threshold | final return "
        "| wall s (median) | source |",
        "|---|---|---|---|---|---|---|",
    ]
    for g in sorted(groups, key=lambda g: g["configuration"]):
        budget = f" within {g['env_steps_budget']:,}" if g["env_steps_budget"] else ""
        wall = "-" if g["wall_seconds_median"] is None else f"{g['wall_seconds_median']:,.0f}"
        lines.append(
            f"| {g['configuration']} | {criterion(g)}{budget} | {g['passed']}/{g['seeds']} "
            f"| {seeds.interval_text(g, 'steps_to_threshold', 'median')} "
            f"| {seeds.interval_text(g, 'final_return')}{seeds.evaluated(g)} | {wall} "
            f"| {g['source'] or ''} |"
        )
    return "\n".join(lines) + "\n"


def build(paths: list[Path], out: Path, command: str) -> tuple[str | None, str | None]:
    """Write the reproduction report (report.md, report.csv, report.png) and the
    verification table (verification.md, verification.csv, learning curves) into `out`,
    for whichever results `paths` hold; return the Markdown of each (None: no results)."""
    for root in paths:
        if not root.exists():
            raise RunnerError(f"report: '{root}' does not exist; pass run or sweep dirs")
    results, others = find_results(paths)
    checked = checked_runs(paths)
    if not results and not checked:
        raise RunnerError(
            f"report: no reproduction results (bench.json with a reproduction) and no run "
            f"with a check under {', '.join(map(str, paths))}; run e.g. python -m runner "
            "experiment=inference_cpu_201_inductor_default or bash "
            "benchmarks/tuned_experiments.sh first"
        )
    out.mkdir(parents=True, exist_ok=True)
    text = verification = None
    if results:
        rows = [row for run_dir, data in results for row in rows_for(run_dir, data)]
        text = markdown(rows, command)
        (out / "report.md").write_text(text)
        write_csv(out / "report.csv", rows, COLUMNS)
        plot(out / "report.png", rows)
        skipped = f"; {others} other bench.json skipped" if others else ""
        print(f"{len(results)} reproduction run(s), {len(rows)} rows{skipped}: {out}/report.md")
    if checked:
        groups = seeds.group(checked, out, configuration_label)
        verification = verification_markdown(groups, command)
        (out / "verification.md").write_text(verification)
        write_csv(out / "verification.csv", groups, seeds.COLUMNS)
        print(f"{len(checked)} run(s) with a check, {len(groups)} rows: {out}/verification.md")
    return text, verification


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m runner.report",
        description="Published vs measured (bench.json files) and the verification table "
        "(runs with a check) under PATHs.",
    )
    parser.add_argument(
        "paths", nargs="+", help="run dirs, or dirs holding them; local or under a results.uri"
    )
    parser.add_argument("--out", type=Path, default=Path("outputs/report"))
    parser.add_argument(
        "--doc",
        "--readme",
        type=Path,
        help="also refresh this page's generated blocks (e.g. docs/reproductions.md)",
    )
    args = parser.parse_args(argv)
    shown = ["python -m runner.report", *map(str, args.paths)]
    if args.out != Path("outputs/report"):
        shown += ["--out", str(args.out)]
    if args.doc:
        shown += ["--doc", str(args.doc)]

    def work() -> int:
        paths = [
            remote.Pulled(p, "report").local if remote.is_uri(p) else Path(p) for p in args.paths
        ]
        text, verification = build(paths, args.out, " ".join(shown))
        if args.doc:
            docs.refresh(args.doc, measured=text, verification=verification)
        return 0

    return tool_exit_code(work)


if __name__ == "__main__":
    sys.exit(main())
