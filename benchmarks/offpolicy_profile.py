"""Where an off-policy preset's time goes, on RLlib's training step and on the runner's
fast step (runner/algorithms/fast_step.py) side by side: RLlib's timers of each phase of the step,
read from the run's progress.csv.

Each preset trains as a fresh `python -m runner experiment=<preset>` process for
`--iterations` iterations of its own size (RLlib's `min_sample_timesteps_per_iteration`:
1,000 env steps for DQN, 100 for SAC; no check, no checkpoints), once with
`algo.fast_step.enabled=false` (RLlib's step) and once with the fast step, `--rounds`
times, the two alternated (the order swapped each round); `--steps fast` (or `rllib`)
runs one. Both steps time every phase
(`timers/*`: the mean seconds per entry, smoothed over the entries): sampling from the
env, adding to and sampling from the replay buffer, the Learner's update, the priorities'
update and the weights' sync to the EnvRunners. RLlib's step makes one gradient update per
Learner call (as many calls per training-step call as its replay ratio asks), the fast one
several per call, so the table gives each phase in milliseconds per gradient update (its
time per entry x entries per iteration / updates per iteration) and its share of the
step's whole time per update, with the gradient updates per training-step call; the
phases' sum as a share of it (RLlib smooths each timer on its own, so the sum strays from
100 % by the noise; well under 100 %: the step's own bookkeeping, metrics and checks,
take the rest). Medians over the second half of
each run's iterations (after the buffer's warm-up), then over the rounds, with the range;
and the runs' env steps and gradient updates per second of training. `--readme
docs/benchmarks.md` writes the table into that page's `offpolicy-profile` block.

    python benchmarks/offpolicy_profile.py --iterations 12 --rounds 3 --readme docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import tempfile
from pathlib import Path

import training_runs

PRESETS = {
    "tuned_dqn_cartpole": "DQN CartPole",
    "tuned_dqn_acrobot": "DQN Acrobot",
    "tuned_sac_pendulum": "SAC Pendulum",
}
# RLlib's timer of each phase of DQN's training_step (ray.rllib.utils.metrics).
PHASES = {
    "env_runner_sampling_timer": "sampling",
    "replay_buffer_add_data_timer": "buffer add",
    "replay_buffer_sampling_timer": "buffer sample",
    "learner_update_timer": "Learner update",
    "replay_buffer_update_prios_timer": "priorities",
    "synch_weights": "weights sync",
}
# How often each phase's timer is entered per training-step call on RLlib's step (DQN's,
# which SAC's runs too): the sampling side `store_weight` times, the update side
# `sample_and_train_weight` times (its loops, calculate_rr_weights), the sync once.
SAMPLE_SIDE = ("env_runner_sampling_timer", "replay_buffer_add_data_timer")
UPDATE_SIDE = (
    "replay_buffer_sampling_timer",
    "learner_update_timer",
    "replay_buffer_update_prios_timer",
)
STEP = "training_step"
# The two training steps: their overrides and their names in the table.
STEPS = {"rllib": "algo.fast_step.enabled=false", "fast": "algo.fast_step.enabled=true"}
LABELS = {"rllib": "RLlib's", "fast": "fast"}
UPDATE = "ms per update"


def entries_per_call(preset: str, step: str) -> dict[str, int]:
    """Each phase's timer entries per training-step call: the fast step enters each once;
    RLlib's as its loops do for the preset's replay ratio (its own calculate_rr_weights on
    the AlgorithmConfig the runner builds for the preset)."""
    if step == "fast":
        return dict.fromkeys(PHASES, 1)
    from ray.rllib.algorithms.dqn.dqn import calculate_rr_weights

    from runner import compose
    from runner.job.app import prepare
    from runner.machine.ray_session import quiet_ray
    from runner.settings.schema import LogLevel

    quiet_ray(LogLevel.ERROR)  # RLlib's notes on the config it builds
    store, train = calculate_rr_weights(prepare(compose([f"experiment={preset}"])).config)
    return {
        **dict.fromkeys(SAMPLE_SIDE, store),
        **dict.fromkeys(UPDATE_SIDE, train),
        "synch_weights": 1,
    }


def profile(work: Path, preset: str, step: str, iterations: int) -> dict[str, float]:
    """One run's phases in ms per gradient update, with its rates."""
    run_dir = work / f"{preset}-{step}-{len(list(work.iterdir()))}"
    summary = training_runs.train(
        run_dir, [f"experiment={preset}", STEPS[step]], iterations, f"{preset} ({step} step)"
    )
    with open(run_dir / "progress.csv") as f:
        rows = list(csv.DictReader(f))
    late = rows[len(rows) // 2 :]
    trained = "learners/__all_modules__/num_module_steps_trained_lifetime"
    config = json.loads((run_dir / "algorithm_config.json").read_text())
    batch = config["_train_batch_size_per_learner"]
    # Updates and training-step calls per iteration, over the second half.
    updates = (float(late[-1][trained]) - float(rows[len(rows) // 2 - 1][trained])) / batch
    if updates <= 0:
        raise SystemExit(
            f"{preset} ({step} step) made no gradient update in its last {len(late)} "
            "iteration(s): raise --iterations past the replay buffer's warm-up"
        )
    calls = sum(float(r["num_training_step_calls_per_iteration"]) for r in late)
    entries = {**entries_per_call(preset, step), STEP: 1}

    def ms(timer: str) -> float:
        values = [float(r[f"timers/{timer}"]) for r in late if r.get(f"timers/{timer}")]
        return (
            1000 * statistics.median(values) * entries[timer] * calls / updates if values else 0.0
        )

    seconds = sum(float(r["time_this_iter_s"]) for r in late)
    return {
        UPDATE: 1000 * seconds / updates,
        STEP: ms(STEP),
        **{timer: ms(timer) for timer in PHASES},
        "env_steps_per_s": summary["env_steps_per_s"],
        "updates_per_s": training_runs.updates(run_dir) / summary["train_seconds"],
        "updates_per_call": updates / calls,
    }


def spread(values: list[float], digits: int = 2) -> str:
    """The median, and the range where there is more than one round."""
    mid = f"{statistics.median(values):,.{digits}f}"
    return (
        mid if len(values) == 1 else f"{mid} ({min(values):,.{digits}f}-{max(values):,.{digits}f})"
    )


def table(results: dict[tuple[str, str], list[dict[str, float]]], iterations: int) -> str:
    rounds = max(len(r) for r in results.values())
    lines = [
        f"Generated by benchmarks/offpolicy_profile.py ({iterations} iterations per run, "
        f"{rounds} round(s), the two steps alternated; RLlib's timers, medians over each run's "
        "second half, then over the rounds (range); ms per gradient update and share of the "
        "step's time per update).",
        "",
        "| preset | step | env steps/s | updates/s | updates / step call | ms per update | "
        + " | ".join(PHASES.values())
        + " | phases' sum |",
        "|---" * (len(PHASES) + 7) + "|",
    ]
    for (preset, step), runs in results.items():
        whole = statistics.median(r[UPDATE] for r in runs)
        phases = sum(statistics.median(r[t] for r in runs) for t in PHASES)
        cells = [
            f"{spread([r[t] for r in runs])} ({statistics.median(r[t] for r in runs) / whole:.0%})"
            for t in PHASES
        ]
        lines.append(
            f"| {PRESETS[preset]} (`experiment={preset}`) | {LABELS[step]} | "
            f"{spread([r['env_steps_per_s'] for r in runs], 0)} | "
            f"{spread([r['updates_per_s'] for r in runs], 0)} | "
            f"{statistics.median(r['updates_per_call'] for r in runs):.0f} | "
            f"{spread([r[UPDATE] for r in runs])} | "
            + " | ".join(cells)
            + f" | {phases / whole:.0%} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=1, help="runs per preset and step")
    parser.add_argument("--steps", default=",".join(STEPS), help=f"of {', '.join(STEPS)}")
    parser.add_argument("--presets", default=",".join(PRESETS), help=f"of {', '.join(PRESETS)}")
    parser.add_argument(
        "--readme", type=Path, help="write the table into this page's offpolicy-profile block"
    )
    args = parser.parse_args()
    presets = args.presets.split(",")
    unknown = [p for p in presets if p not in PRESETS]
    if unknown:
        raise SystemExit(f"error: unknown preset {unknown[0]!r}: pick from {', '.join(PRESETS)}")
    steps = args.steps.split(",")
    wrong = [s for s in steps if s not in STEPS]
    if wrong:
        raise SystemExit(f"error: unknown step {wrong[0]!r}: pick from {', '.join(STEPS)}")
    training_runs.check_block(args.readme, "offpolicy-profile")
    results: dict[tuple[str, str], list[dict[str, float]]] = {
        (p, step): [] for p in presets for step in steps
    }
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            order = steps if round_ % 2 == 0 else steps[::-1]
            for preset in presets:
                for step in order:
                    results[preset, step].append(profile(Path(tmp), preset, step, args.iterations))
    markdown = table(results, args.iterations)
    print(markdown, end="")
    training_runs.write_block(args.readme, "offpolicy-profile", markdown)


if __name__ == "__main__":
    main()
