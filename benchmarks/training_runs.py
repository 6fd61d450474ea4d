"""The benchmarks' training runs (compile_auto.py, scaling_auto.py, offpolicy_profile.py):
one fresh `python -m runner` process per run, a set number of iterations with no other
stop, no check and no checkpoints; what a run measured is its run dir. And the generated
block of a docs page that a benchmark's `--readme` fills (main_job.py's and vs_zoo.py's
too)."""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from pathlib import Path

from runner.docs import replace_block
from runner.errors import RunnerError

WORKLOADS = {
    "main": ("the main job (CartPole PPO)", []),
    "breakout": ("Breakout PPO, scale=local", ["env=breakout", "scale=local"]),
}


def train(run_dir: Path, overrides: list[str], iterations: int, label: str) -> dict:
    """One run with `overrides` (a workload's, then the benchmark's) in `run_dir`; its
    summary.json. A failure ends the benchmark with the run's last line, named by `label`."""
    cmd = [
        sys.executable, "-m", "runner", *overrides,
        f"stop.iterations={iterations}", "stop.episode_return_mean=null", "stop.seconds=null",
        "check.enabled=false", "checkpoint.every=0", "checkpoint.at_end=false",
        f"hydra.run.dir={run_dir}",
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=run_dir.parent, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"{label} failed ({done.returncode}): {tail}")
    return json.loads((run_dir / "summary.json").read_text())


def check_block(page: Path | None, name: str) -> None:
    """A page without the block fails now, in one line, not after the runs."""
    if page is None:
        return
    try:
        replace_block(page.read_text(), name, "", page)
    except (OSError, RunnerError) as ex:
        raise SystemExit(f"error: {ex}") from None


def write_block(page: Path | None, name: str, markdown: str) -> None:
    if page is None:
        return
    page.write_text(replace_block(page.read_text(), name, markdown, page))
    print(f"refreshed {page}")


def seeds(text: str) -> list[int]:
    """`--seeds 0,1,2` as argparse's type: a typo is argparse's one-line error."""
    try:
        return [int(s) for s in text.split(",")]
    except ValueError:
        message = f"{text!r} is not a comma-separated list of integers"
        raise argparse.ArgumentTypeError(message) from None


def updates(run_dir: Path) -> int:
    """Gradient updates: the Learner's module steps trained over the samples per update
    (PPO's minibatch, DQN's and SAC's train batch)."""
    with open(run_dir / "progress.csv") as f:
        last = list(csv.DictReader(f))[-1]
    trained = float(last["learners/__all_modules__/num_module_steps_trained_lifetime"])
    config = json.loads((run_dir / "algorithm_config.json").read_text())
    per_update = config.get("minibatch_size") or config["_train_batch_size_per_learner"]
    return round(trained / per_update)
