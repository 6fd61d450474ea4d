"""The runner's overhead: the main job through `python -m runner` against the same
AlgorithmConfig in a hand-written RLlib script (benchmarks/plain_rllib.py).

Both run as fresh processes, alternated (runner first in even repeats, plain first in odd
ones, so neither always gets the warmer machine), for a fixed number of iterations. Figures:
- time to the first finished iteration, from process launch to the moment its line is
  printed (read by this script, so both are timed the same way);
- env steps per second: env steps sampled / RLlib's own iteration seconds, all iterations.
One iteration here ranges 2,700-5,300 env steps/s, so a single ratio moves by +-10 %: each
figure is shown as min / median / max over at least 5 repeats, with the ratio of medians
and the runner / plain ratio of each alternated pair (min / median / max). Fewer repeats
(a quick check that both sides run) show medians only.
The two AlgorithmConfigs are compared key by key, nested dicts included.

    python benchmarks/overhead.py --iterations 10 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# Fewer repeats give a min / median / max that says nothing about the spread: not shown.
MIN_REPEATS = 5
FIGURES = {"first_iteration_s": "first iteration (s)", "env_steps_per_s": "env steps per second"}
# Config keys that may differ between the runner and plain RLlib, each with its reason.
# None for the main job: both sides write classes and functions by name, not by identity.
# A key listed here is still printed, marked allowed, when it differs; add one only with
# its reason (e.g. callbacks a runner task adds to the AlgorithmConfig).
ALLOWED: dict[str, str] = {}
# The value of a key one side of a config comparison lacks.
ABSENT = object()


def _timed_lines(cmd: list[str], cwd: Path) -> tuple[float | None, list[str]]:
    """Run cmd; return (seconds from launch to its first iteration line, stdout lines)."""
    start = time.perf_counter()
    first = None
    lines = []
    with subprocess.Popen(
        cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    ) as proc:
        for line in proc.stdout:
            lines.append(line)
            if first is None and (line.startswith("iter ") or line.startswith('{"iteration"')):
                first = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[:4]} failed with exit code {proc.returncode}")
    return first, lines


def _steps_per_s(rows: list[dict]) -> float:
    return sum(r["env_steps_this_iter"] for r in rows) / sum(r["iteration_seconds"] for r in rows)


def run_runner(work: Path, iterations: int, tag: str) -> dict:
    run_dir = work / f"runner_{tag}"
    cmd = [
        sys.executable, "-m", "runner",
        f"stop.iterations={iterations}", "stop.episode_return_mean=null", "stop.seconds=null",
        "checkpoint.every=0", "checkpoint.at_end=false", f"hydra.run.dir={run_dir}",
    ]  # fmt: skip
    first, _ = _timed_lines(cmd, work)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {
        "first_iteration_s": first,
        "env_steps_per_s": _steps_per_s(rows),
        "config": run_dir / "algorithm_config.json",
    }


def run_plain(work: Path, iterations: int, tag: str) -> dict:
    config_out = work / f"plain_{tag}.json"
    cmd = [
        sys.executable, str(HERE / "plain_rllib.py"),
        "--iterations", str(iterations), "--config-out", str(config_out),
    ]  # fmt: skip
    first, lines = _timed_lines(cmd, work)
    rows = [json.loads(line) for line in lines if line.startswith("{")]
    return {"first_iteration_s": first, "env_steps_per_s": _steps_per_s(rows), "config": config_out}


def spread(values: list[float]) -> dict[str, float]:
    """min / median / max: a median alone hides that one run may be twice another."""
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def summarize(runner: list[dict], plain: list[dict]) -> dict[str, dict]:
    """Per figure: each side's spread, the ratio of medians, and the spread of the
    runner / plain ratios of alternated pairs (a pair ran under the same load of the moment,
    which worst against best pairing ignores)."""
    summary = {}
    for key in FIGURES:
        ours, theirs = [r[key] for r in runner], [p[key] for p in plain]
        summary[key] = {
            "runner": spread(ours),
            "plain": spread(theirs),
            "ratio_of_medians": statistics.median(ours) / statistics.median(theirs),
            "pair_ratio": spread([a / b for a, b in zip(ours, theirs, strict=True)]),
        }
    return summary


def flatten(config: dict, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as dotted keys, so a difference inside e.g. model_config is named down to
    its leaf; lists and empty dicts stay values (an empty dict against None still differs)."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def config_differences(runner: dict, plain: dict) -> list[tuple[str, Any, Any]]:
    """(key, runner value, plain value) for every flattened key whose values differ; a key
    one side lacks has the value ABSENT there. Nothing is skipped: see ALLOWED."""
    ours, theirs = flatten(runner), flatten(plain)
    return [
        (key, ours.get(key, ABSENT), theirs.get(key, ABSENT))
        for key in sorted(ours.keys() | theirs.keys())
        if ours.get(key, ABSENT) != theirs.get(key, ABSENT)
    ]


def print_table(summary: dict[str, dict], repeats: int) -> None:
    """The figures; min and max only over MIN_REPEATS repeats or more."""
    shown = ("min", "median", "max") if repeats >= MIN_REPEATS else ("median",)
    print(f"{'figure':<22}{'':<18}{'min':>10}{'median':>10}{'max':>10}")
    for key, label in FIGURES.items():
        fig = summary[key]
        for name, side in (
            ("runner", fig["runner"]),
            ("plain RLlib", fig["plain"]),
            ("runner / plain", fig["pair_ratio"]),
        ):
            digits = 3 if name == "runner / plain" else 2
            cells = "".join(
                f"{side[s]:>10.{digits}f}" if s in shown else f"{'-':>10}"
                for s in ("min", "median", "max")
            )
            print(f"{label:<22}{name:<18}{cells}")
            label = ""
        print(f"{'':<22}{'ratio of medians':<18}{'':>10}{fig['ratio_of_medians']:>10.3f}")
    print("(runner / plain: the ratio of each alternated pair)")
    if len(shown) == 1:
        print(
            f"(min and max left out: {repeats} repeat(s) say nothing of the spread; "
            f"use --repeats {MIN_REPEATS} or more)"
        )


def _shown(value: Any) -> str:
    return "absent" if value is ABSENT else json.dumps(value)


def print_differences(differences: list[tuple[str, Any, Any]]) -> None:
    unexpected = [d for d in differences if d[0] not in ALLOWED]
    print(f"AlgorithmConfig differences (runner vs plain): {len(unexpected) or 'none'}")
    for key, ours, theirs in differences:
        why = f"  [allowed: {ALLOWED[key]}]" if key in ALLOWED else ""
        print(f"  {key}: runner {_shown(ours)}, plain {_shown(theirs)}{why}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=MIN_REPEATS)
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.iterations < 1:
        print("overhead.py: --repeats and --iterations take 1 or more", file=sys.stderr)
        raise SystemExit(2)

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        runner, plain = [], []
        for i in range(args.repeats):
            pair = (run_runner, runner), (run_plain, plain)
            for run, results in pair if i % 2 == 0 else reversed(pair):
                results.append(run(work, args.iterations, str(i)))
        differences = config_differences(
            json.loads(runner[0]["config"].read_text()), json.loads(plain[0]["config"].read_text())
        )

    print(f"main job, {args.iterations} iterations, {args.repeats} alternated repeats each")
    print_table(summarize(runner, plain), args.repeats)
    print_differences(differences)


if __name__ == "__main__":
    main()
