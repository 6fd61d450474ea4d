"""The runner's overhead: the main job through `python -m runner` against the same
AlgorithmConfig in a hand-written RLlib script (benchmarks/plain_rllib.py).

Both run as fresh processes, alternated, for a fixed number of iterations. Figures:
- time to the first finished iteration, from process launch to the moment its line is
  printed (read by this script, so both are timed the same way);
- env steps per second: env steps sampled / RLlib's own iteration seconds, all iterations.
The ratios (runner / plain) are of medians over the repeats of one invocation.

    python benchmarks/overhead.py --iterations 10 --repeats 3
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

HERE = Path(__file__).resolve().parent


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
    return {"first_iteration_s": first, "env_steps_per_s": _steps_per_s(rows), "dir": run_dir}


def run_plain(work: Path, iterations: int, tag: str) -> dict:
    config_out = work / f"plain_{tag}.json"
    cmd = [
        sys.executable, str(HERE / "plain_rllib.py"),
        "--iterations", str(iterations), "--config-out", str(config_out),
    ]  # fmt: skip
    first, lines = _timed_lines(cmd, work)
    rows = [json.loads(line) for line in lines if line.startswith("{")]
    return {"first_iteration_s": first, "env_steps_per_s": _steps_per_s(rows), "config": config_out}


def config_differences(runner_json: Path, plain_json: Path) -> list[str]:
    """Keys whose plain JSON values differ (values that are objects are compared by type)."""
    ours, theirs = json.loads(runner_json.read_text()), json.loads(plain_json.read_text())
    primitive = (int, float, bool, str, type(None), list)
    return sorted(
        k
        for k in ours.keys() | theirs.keys()
        if isinstance(ours.get(k), primitive)
        and isinstance(theirs.get(k), primitive)
        and not (isinstance(theirs.get(k), str) and theirs[k].startswith("<"))
        and ours.get(k) != theirs.get(k)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        runner, plain = [], []
        for i in range(args.repeats):
            runner.append(run_runner(work, args.iterations, str(i)))
            plain.append(run_plain(work, args.iterations, str(i)))
        differences = config_differences(
            runner[0]["dir"] / "algorithm_config.json", plain[0]["config"]
        )

    print(f"main job, {args.iterations} iterations, {args.repeats} alternated repeats each")
    print(f"{'figure (median)':<28}{'runner':>10}{'plain RLlib':>14}{'ratio':>9}")
    for key, label in (
        ("first_iteration_s", "first iteration (s)"),
        ("env_steps_per_s", "env steps per second"),
    ):
        a = statistics.median(r[key] for r in runner)
        b = statistics.median(r[key] for r in plain)
        print(f"{label:<28}{a:>10.2f}{b:>14.2f}{a / b:>9.3f}")
    print(
        "AlgorithmConfig differences (runner vs plain): "
        + (", ".join(differences) if differences else "none")
    )


if __name__ == "__main__":
    main()
