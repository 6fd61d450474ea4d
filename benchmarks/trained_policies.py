"""Train, evaluate and export every shipped algo on every env it runs on, briefly.

For each (algo, env) pair: `python -m runner` for `--iterations` iterations, then
task=evaluate (`--episodes` greedy episodes and a one-episode video) and task=export on
its checkpoint. Prints one Markdown row per pair: the evaluation's return mean and
episodes, the video's frames and frame size (decoded back), the export's largest gap to
torch at batch 1 and 16, and the export's seconds. A pair that fails prints its error
line. Breakout's episodes are capped at `--atari-frames` frames (an untrained greedy policy
may never lose its last life).

    python benchmarks/trained_policies.py --pairs ppo:cartpole sac:pendulum
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import imageio.v2 as imageio

PAIRS = [
    "ppo:cartpole",
    "appo:cartpole",
    "impala:cartpole",
    "dqn:cartpole",
    "ppo:pendulum",
    "sac:pendulum",
    "ppo:breakout",
    "appo:breakout",
    "impala:breakout",
    "dqn:breakout",
]


def _runner(cwd: Path, *overrides: str) -> tuple[bool, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "runner", *overrides],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    lines = proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines() or [""]
    return proc.returncode == 0, lines[-1]


def measure(pair: str, iterations: int, episodes: int, atari_frames: int, root: Path) -> str:
    algo, env = pair.split(":")
    cwd = root / f"{algo}_{env}"
    cwd.mkdir()
    extra = [f"+env.env_config.max_num_frames_per_episode={atari_frames}"] * (env == "breakout")
    steps = [
        ("train", [f"algo={algo}", f"env={env}", f"stop.iterations={iterations}", *extra]),
        (
            "evaluate",
            ["task=evaluate", "checkpoint=train", f"task.episodes={episodes}", "task.video=true"],
        ),
        ("export", ["task=export", "checkpoint=train"]),
    ]
    for name, overrides in steps:
        ok, last = _runner(cwd, *overrides, f"hydra.run.dir={name}")
        if not ok:
            return f"| {algo} | {env} | {name} failed: {last} | | | | | |"
    found = json.loads((cwd / "evaluate" / "eval.json").read_text())
    reader = imageio.get_reader(cwd / "evaluate" / found["videos"][0], format="FFMPEG")
    frames, (height, width, _) = reader.count_frames(), reader.get_data(0).shape
    reader.close()
    policy = json.loads((cwd / "export" / "policy.json").read_text())
    gaps = policy["parity"]["max_abs_diff"]
    return (
        f"| {algo} | {env} | {found['episode_return_mean']:.2f} | {found['episodes']} "
        f"| {frames} x {width}x{height} | {gaps['1']:.2g} | {gaps['16']:.2g} "
        f"| {policy['export_seconds']:.2f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", nargs="+", default=PAIRS, help="algo:env pairs")
    parser.add_argument("--iterations", type=int, default=1)
    parser.add_argument("--episodes", type=int, default=3)
    parser.add_argument("--atari-frames", type=int, default=4000)
    args = parser.parse_args()
    print(f"{args.iterations} training iteration(s), {args.episodes} greedy evaluation episodes")
    print("| algo | env | eval return mean | episodes | video | export gap b1 | b16 | export s |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for pair in args.pairs:
            row = measure(pair, args.iterations, args.episodes, args.atari_frames, Path(tmp))
            print(row, flush=True)


if __name__ == "__main__":
    main()
