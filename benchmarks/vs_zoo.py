"""The runner against RL Baselines3 Zoo (Stable-Baselines3) on this machine: time to a
return threshold, env steps to it, env steps and gradient updates per second.

Per pair, each seed runs both sides as fresh processes, the side that goes first swapping
each seed (`pip install -e '.[peers]'` brings Zoo and SB3 at the versions pinned there):
- runner: `python -m runner <the pair's preset> seed=S` with its check set to the pair's
  criterion (on training returns, evaluation off);
- Zoo: `python -m rl_zoo3.train --algo A --env E --seed S` with Zoo's own hyperparameters
  (hyperparams/A.yml), evaluation off, and benchmarks/zoo_stop.py as its `callback`.
Both stop when the rolling mean of the last `window` training episodes' returns reaches
the threshold (RLlib's env_runners/episode_return_mean with
metrics_num_episodes_for_smoothing = window; SB3's episode buffer), at the pair's env step
budget (the larger of the two sources' budgets, so neither side is cut short), or after
`--max-seconds` of training (the runner's stop.seconds; Zoo's in its callback). Time to
threshold is from launch to exit, start-up and teardown counted; per side the table gives
hits / seeds and, over the hits, the median (min-max) seconds and median env steps; env
steps/s and updates/s are over each run's training seconds, all runs. `--readme
docs/benchmarks.md` writes the table into that page's `vs-zoo` block.

    python benchmarks/vs_zoo.py --seeds 0,1,2 --readme docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import training_runs

HERE = Path(__file__).resolve().parent
SIDES = ("runner", "zoo")
# A run that measured nothing (it failed, or was killed 2 minutes past --max-seconds).
MISS = {"passed": False, "env_steps_to_threshold": None, "env_steps": None}
MISS |= {"train_seconds": None, "updates": None}


@dataclass(frozen=True)
class Pair:
    label: str
    runner: tuple[str, ...]  # the preset's overrides; () is the main job
    zoo: tuple[str, str]  # Zoo's --algo and --env
    threshold: float
    window: int
    budget: int
    source: str  # where the threshold and the budget come from


PAIRS = {
    "ppo_cartpole": Pair(
        "PPO CartPole", (), ("ppo", "CartPole-v1"), 450, 100, 100_000,
        "RLlib's tuned examples' CartPole criterion; Zoo's ppo.yml budget",
    ),
    "dqn_cartpole": Pair(
        "DQN CartPole", ("experiment=tuned_dqn_cartpole",), ("dqn", "CartPole-v1"), 450, 100,
        200_000, "rllib/examples/algorithms/dqn/cartpole_dqn.py (Zoo's dqn.yml: 50,000 steps)",
    ),
    "sac_pendulum": Pair(
        "SAC Pendulum", ("experiment=tuned_sac_pendulum",), ("sac", "Pendulum-v1"), -250, 5,
        20_000, "rllib/examples/algorithms/sac/pendulum_sac.py (Zoo's sac.yml: 20,000 steps; "
        "the runner's preset takes the Zoo's hyperparameters, on [128, 128] networks)",
    ),
    "ppo_acrobot": Pair(
        "PPO Acrobot", ("experiment=tuned_ppo_acrobot",), ("ppo", "Acrobot-v1"), -100, 100,
        1_000_000, "gymnasium's Acrobot-v1 reward_threshold; Zoo's ppo.yml budget",
    ),
    "dqn_acrobot": Pair(
        # The Zoo's dqn.yml values at half its replay ratio, on a [128, 128] network
        # (conf/tuned/dqn_acrobot.yaml).
        "DQN Acrobot", ("algo=dqn", "env=acrobot"),
        ("dqn", "Acrobot-v1"), -100, 100, 100_000,
        "gymnasium's Acrobot-v1 reward_threshold; Zoo's dqn.yml budget",
    ),
}  # fmt: skip


def _launch(cmd: list[str], cwd: Path, timeout: float, env: dict[str, str] | None = None) -> float:
    """Run `cmd`; seconds from launch to exit (its output kept beside it for a post-mortem)."""
    start = time.perf_counter()
    # At the timeout: no result file, or one without a hit: a miss.
    with open(cwd / "output.txt", "w") as out, contextlib.suppress(subprocess.TimeoutExpired):
        subprocess.run(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, env=env)
    return time.perf_counter() - start


def run_runner(pair: Pair, seed: int, work: Path, max_seconds: float) -> dict:
    run_dir = work / "run"
    cmd = [
        sys.executable, "-m", "runner", *pair.runner, f"seed={seed}",
        "check.enabled=true", "check.on=training",
        "check.metric=env_runners/episode_return_mean",
        f"check.threshold={pair.threshold}", f"check.env_steps={pair.budget}",
        f"++algo.reporting.metrics_num_episodes_for_smoothing={pair.window}", "eval.every=0",
        "stop.iterations=null", "stop.env_steps=null", "stop.episode_return_mean=null",
        f"stop.seconds={max_seconds}", f"hydra.run.dir={run_dir}",
    ]  # fmt: skip
    seconds = _launch(cmd, work, max_seconds + 120)
    if not (run_dir / "summary.json").exists():  # a miss, its last line printed
        lines = (work / "output.txt").read_text().strip().splitlines() or ["no output"]
        print(f"runner {pair.label} seed {seed}: no summary: {lines[-1]}", flush=True)
        return MISS | {"seconds": seconds}
    summary = json.loads((run_dir / "summary.json").read_text())
    check = summary["check"]
    return {
        "passed": bool(check["passed"]),
        "seconds": seconds,
        "env_steps_to_threshold": check["env_steps_to_threshold"],
        "env_steps": summary["env_steps"],
        "train_seconds": summary["train_seconds"],
        "updates": training_runs.updates(run_dir),
    }


def run_zoo(pair: Pair, seed: int, work: Path, max_seconds: float) -> dict:
    algo, env_id = pair.zoo
    out = work / "zoo_stop.json"
    criterion = {"threshold": pair.threshold, "window": pair.window, "out": str(out)}
    criterion["max_seconds"] = max_seconds
    stop = {"zoo_stop.StopAtReturn": criterion}
    cmd = [
        sys.executable, "-m", "rl_zoo3.train", "--algo", algo, "--env", env_id,
        "--seed", str(seed), "-n", str(pair.budget), "--eval-freq", "-1", "--verbose", "0",
        "--device", "cpu", "-f", str(work / "logs"), "-params", f"callback:[{stop!r}]",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    seconds = _launch(cmd, work, max_seconds + 120, env)
    if not out.exists():  # failed, or killed
        return MISS | {"seconds": seconds}
    return {"seconds": seconds, **json.loads(out.read_text())}


RUN = {"runner": run_runner, "zoo": run_zoo}


def _median_span(values: list[float], fmt: str) -> str:
    if not values:
        return "-"
    text = format(statistics.median(values), fmt)
    return text if len(values) == 1 else f"{text} ({min(values):{fmt}}-{max(values):{fmt}})"


def _rate(runs: list[dict], key: str) -> float | None:
    done = [r for r in runs if r["train_seconds"]]
    if not done:
        return None
    return sum(r[key] for r in done) / sum(r["train_seconds"] for r in done)


def _side(runs: list[dict]) -> str:
    hits = [r for r in runs if r["passed"]]
    steps = [r["env_steps_to_threshold"] for r in hits]
    steps_text = f"{statistics.median(steps) / 1000:.1f}k" if steps else "-"
    seconds = _median_span([r["seconds"] for r in hits], ".1f")
    return f"{len(hits)}/{len(runs)}, {seconds} s, {steps_text}"


def _ratio(runner: list[dict], zoo: list[dict]) -> str:
    mine = [r["seconds"] for r in runner if r["passed"]]
    theirs = [r["seconds"] for r in zoo if r["passed"]]
    if mine and theirs:
        ratio = statistics.median(theirs) / statistics.median(mine)
        return f"**{ratio:.2f}x** ({'runner' if ratio > 1 else 'Zoo'} ahead)"
    if mine:
        return "runner reaches it, Zoo does not"
    return "Zoo reaches it, the runner does not" if theirs else "neither reaches it"


def _rates(runner: list[dict], zoo: list[dict], key: str) -> str:
    mine, theirs = _rate(runner, key), _rate(zoo, key)
    if mine is None or theirs is None:
        return "-"
    return f"{mine:,.0f} vs {theirs:,.0f} ({mine / theirs:.2f}x)"


def table(
    results: dict[str, dict[str, list[dict]]], seeds: list[int], max_seconds: float, versions: str
) -> str:
    lines = [
        f"Generated by benchmarks/vs_zoo.py (seeds {','.join(map(str, seeds))}, each side a "
        f"fresh process, alternated, at most {max_seconds:g} s of training a run; {versions}). "
        "Time: launch to exit at the threshold, median (min-max) over the hits; rates over "
        "training seconds, runner vs Zoo.",
        "",
        "| pair (threshold, window, budget) | runner: hits, s to threshold, env steps | "
        "Zoo: hits, s, env steps | Zoo time / runner time | env steps/s | updates/s |",
        "|---|---|---|---|---|---|",
    ]
    for name, runs in results.items():
        pair = PAIRS[name]
        runner, zoo = runs["runner"], runs["zoo"]
        lines.append(
            f"| {pair.label} ({pair.threshold:g}, {pair.window}, {pair.budget:,}) | "
            f"{_side(runner)} | {_side(zoo)} | {_ratio(runner, zoo)} | "
            f"{_rates(runner, zoo, 'env_steps')} | {_rates(runner, zoo, 'updates')} |"
        )
    lines.append("")
    lines.append(
        "Criteria (both sides): the rolling mean of the last `window` training episodes' "
        "returns >= threshold within the budget; the thresholds and budgets from:"
    )
    lines += [f"- {PAIRS[name].label}: {PAIRS[name].source}" for name in results]
    return "\n".join(lines) + "\n"


def versions() -> str:
    import rl_zoo3
    import stable_baselines3
    from ray import __version__ as ray_version

    return f"Ray {ray_version}, RL Zoo {rl_zoo3.__version__}, SB3 {stable_baselines3.__version__}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=training_runs.seeds, default="0,1,2")
    parser.add_argument("--pairs", default=",".join(PAIRS), help=f"of {', '.join(PAIRS)}")
    parser.add_argument(
        "--max-seconds", type=float, default=300, help="of training per run; then a miss"
    )
    parser.add_argument("--readme", type=Path, help="write the table into this page's vs-zoo block")
    args = parser.parse_args()
    names = args.pairs.split(",")
    unknown = [n for n in names if n not in PAIRS]
    if unknown:
        raise SystemExit(f"error: unknown pair {unknown[0]!r}: pick from {', '.join(PAIRS)}")
    try:
        found = versions()
    except ImportError as ex:
        raise SystemExit(f"error: {ex.name} is missing: pip install -e '.[peers]'") from None
    training_runs.check_block(args.readme, "vs-zoo")
    results: dict[str, dict[str, list[dict]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            runs: dict[str, list[dict]] = {side: [] for side in SIDES}
            for i, seed in enumerate(args.seeds):
                for side in SIDES if i % 2 == 0 else SIDES[::-1]:
                    work = Path(tmp) / f"{name}_{side}_{seed}"
                    work.mkdir()
                    result = RUN[side](PAIRS[name], seed, work, args.max_seconds)
                    runs[side].append(result)
                    print(f"{name} seed {seed} {side}: {json.dumps(result)}", flush=True)
            results[name] = runs
    markdown = table(results, args.seeds, args.max_seconds, found)
    print(markdown, end="")
    training_runs.write_block(args.readme, "vs-zoo", markdown)


if __name__ == "__main__":
    main()
