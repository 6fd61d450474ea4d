"""The published torch.compile figures (runner/data/*.csv) and the experiments built from them.

The CSVs are copied as published; every reproduction file in conf/experiment/ is generated
from them by `python -m runner.published --write`, and a test checks the files on disk still
equal what this module generates, so a figure is never typed twice.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from runner import CONFIG_DIR

DATA = Path(__file__).parent / "data"
SOURCE = "Ray repository, rllib/benchmarks/torch_compile/README.md"
INFERENCE_METHOD = (
    "Breakout default PPO RLModule; one real observation repeated to the batch size; "
    "500 burn-in then 5000 timed forward_exploration calls under no_grad; median calls/s"
)
EXPLORATION_METHOD = (
    "PPO on ALE/Breakout-v5, EnvRunners compiled vs not, both copies at once; env steps "
    "sampled per second of training iteration at iteration 10; 64 EnvRunners x 1 env, "
    "1 Learner with 1 GPU, train batch 16000, minibatch 2000, 10 epochs"
)
# Published settings of run_ppo_with_inference_bm.py (runner/data/README.md).
EXPLORATION_TRAINING = {
    "lambda_": 0.95,
    "kl_coeff": 0.5,
    "vf_clip_param": 10.0,
    "entropy_coeff": 0.01,
    "train_batch_size_per_learner": 16000,
    "minibatch_size": 2000,
    "num_epochs": 10,
    "vf_loss_coeff": 0.01,
    "clip_param": 0.1,
    "lr": 0.0001,
    "grad_clip": 100,
    "grad_clip_by": "global_norm",
}
# Published method settings the report holds against each run's own.
INFERENCE_SETTINGS = {"iterations": 5000, "burn_in": 500}
EXPLORATION_SETTINGS = (
    "num_env_runners",
    "num_envs_per_env_runner",
    "num_learners",
    "num_gpus_per_learner",
    "train_batch_size",
    "iterations",
)
MODE_SHORT = {"default": "default", "reduce-overhead": "ro", "max-autotune": "ma"}
HARDWARE_PROFILE = {"CPU": "cpu", "T4": "t4", "V100": "v100", "A100": "a100"}
EXPERIMENT_DIR = Path(CONFIG_DIR) / "experiment"


def _torch_tag(version: str) -> str:
    """'2.0.1+cu118' -> '201'; '2.1.0.dev20230614+cu118' or '2.1.0 nightly' -> '21n'."""
    if "dev" in version or "nightly" in version:
        return "".join(version.split(".")[:2]) + "n"
    return version.split("+")[0].replace(".", "")


def _number(text: str) -> int | float:
    value = float(text)
    return int(value) if value.is_integer() else value


def _read(name: str) -> list[dict[str, str]]:
    with (DATA / name).open(newline="") as f:
        return list(csv.DictReader(f))


@dataclass(frozen=True)
class Table:
    """One published inference table: a (hardware, torch, backend, mode) and its rows."""

    hardware: str
    torch: str
    backend: str
    mode: str
    rows: tuple[dict[str, float], ...]

    @property
    def name(self) -> str:
        return (
            f"inference_{self.hardware.lower()}_{_torch_tag(self.torch)}_"
            f"{self.backend}_{MODE_SHORT[self.mode]}"
        )


@cache
def inference_tables() -> tuple[Table, ...]:
    """The appendix, grouped into tables in the order published."""
    grouped: dict[tuple[str, str, str, str], list[dict[str, float]]] = {}
    for r in _read("torch_compile_inference_published.csv"):
        key = (r["hardware"], r["torch"], r["backend"], r["mode"])
        grouped.setdefault(key, []).append(
            {
                "batch_size": int(r["batch_size"]),
                "eager_calls_per_s": float(r["eager_throughput"]),
                "compiled_calls_per_s": float(r["compiled_throughput"]),
                "speedup": float(r["speedup"]),
            }
        )
    return tuple(Table(*key, rows=tuple(rows)) for key, rows in grouped.items())


def headline_matches(hardware: str, torch_version: str, percent: float) -> list[Table]:
    """Appendix tables of that hardware and torch whose batch-1 speedup is the headline."""
    tag = _torch_tag(torch_version)
    return [
        t
        for t in inference_tables()
        if t.hardware == hardware
        and _torch_tag(t.torch) == tag
        and any(r["batch_size"] == 1 and round(r["speedup"] * 100, 2) == percent for r in t.rows)
    ]


def _headline_note(row: dict[str, str], percent: float) -> str:
    preset = f"{row['backend']} + {row['mode']}"
    matches = headline_matches(row["hardware"], row["torch"], percent)
    if not matches:
        return "No appendix table of this hardware and torch has this figure."
    names = ", ".join(f"{t.backend} + {t.mode}" for t in matches)
    same = any((t.backend, t.mode) == (row["backend"], row["mode"]) for t in matches)
    if same:
        return f"The summary names no batch size: the figure is the batch-1 row of {names}."
    return (
        f"The summary says {preset}, but the appendix has this figure at batch 1 under "
        f"{names}; the run uses {preset}, as the summary says."
    )


def _inference_experiment(hardware: str, backend: str, mode: str) -> dict:
    return {
        "defaults": [
            {"override /hardware": HARDWARE_PROFILE[hardware]},
            {"override /compile": f"{backend}_{MODE_SHORT[mode]}"},
            {"override /task": "inference_bench"},
        ],
        # Published: 500 burn-in, 5000 timed calls; threads as torch sets them by default.
        "task": {**INFERENCE_SETTINGS, "threads": None},
    }


Experiments = dict[str, tuple[str, dict[str, Any]]]


def experiments() -> Experiments:
    """{name: (title, config)} for every checked-in reproduction."""
    return {**_appendix_experiments(), **_headline_experiments(), **_exploration_experiments()}


def _appendix_experiments() -> Experiments:
    """One per appendix table of inference speedups by batch size."""
    found: Experiments = {}
    for t in inference_tables():
        cfg = _inference_experiment(t.hardware, t.backend, t.mode)
        cfg["task"]["batch_sizes"] = [r["batch_size"] for r in t.rows]
        cfg["reproduction"] = {
            "name": t.name,
            "kind": "inference",
            "source": f"{SOURCE}, appendix",
            "hardware": t.hardware,
            "torch": t.torch,
            "backend": t.backend,
            "mode": t.mode,
            "settings": INFERENCE_METHOD,
            "method": dict(INFERENCE_SETTINGS),
            "note": "",
            "published": [dict(r) for r in t.rows],
        }
        title = f"appendix table: {t.hardware}, torch {t.torch}, {t.backend} + {t.mode}"
        found[t.name] = (title, cfg)
    return found


def _headline_experiments() -> Experiments:
    """One per headline of the inference summary table that has a figure."""
    found: Experiments = {}
    for row in _read("torch_compile_inference_summary_published.csv"):
        if not row["speedup_percent"]:
            continue  # printed as "x" in the source: nothing to reproduce
        percent = float(row["speedup_percent"])
        name = f"headline_{row['hardware'].lower()}_{_torch_tag(row['torch'])}"
        cfg = _inference_experiment(row["hardware"], row["backend"], row["mode"])
        cfg["task"]["batch_sizes"] = [1]
        cfg["reproduction"] = {
            "name": name,
            "kind": "inference",
            "source": f"{SOURCE}, inference summary table",
            "hardware": row["hardware"],
            "torch": row["torch"],
            "backend": row["backend"],
            "mode": row["mode"],
            "settings": INFERENCE_METHOD,
            "method": dict(INFERENCE_SETTINGS),
            "note": _headline_note(row, percent),
            "published": [{"batch_size": 1, "speedup": round(percent / 100, 6)}],
        }
        title = (
            f"summary headline: {row['hardware']}, torch {row['torch']}, "
            f"{row['backend']} + {row['mode']}"
        )
        found[name] = (title, cfg)
    return found


def _exploration_experiments() -> Experiments:
    """One per row of the PPO exploration table."""
    found: Experiments = {}
    for row in _read("torch_compile_ppo_exploration_published.csv"):
        name = f"exploration_{row['backend']}_{MODE_SHORT[row['mode']]}"
        cfg = {
            "defaults": [
                {"override /algo": "ppo"},
                {"override /env": "breakout"},
                {"override /scaling": "published_exploration"},
                {"override /hardware": "gpu"},
                {"override /compile": f"{row['backend']}_{MODE_SHORT[row['mode']]}"},
                {"override /task": "exploration_bench"},
            ],
            "algo": {
                "training": dict(EXPLORATION_TRAINING),
                "env_runners": {
                    "batch_mode": "truncate_episodes",
                    "rollout_fragment_length": "auto",
                },
            },
            # Only the EnvRunners compile; the figure is the 10th iteration's, as published.
            "compile": {"env_runners": True, "learners": False},
            "task": {"warmup_iterations": int(row["iterations"]) - 1, "timed_iterations": 1},
            "reproduction": {
                "name": name,
                "kind": "exploration",
                "source": f"{SOURCE}, exploration table",
                "hardware": "64 CPU EnvRunners + 1 GPU Learner",
                "torch": "not stated (the inference tables used 2.0.1 and 2.1.0 nightly)",
                "backend": row["backend"],
                "mode": row["mode"],
                "settings": EXPLORATION_METHOD,
                "method": {k: _number(row[k]) for k in EXPLORATION_SETTINGS},
                "note": "",
                "published": [{"speedup": round(float(row["speedup_percent"]) / 100, 6)}],
            },
        }
        found[name] = (f"PPO exploration: {row['backend']} + {row['mode']}", cfg)
    return found


def render(name: str, title: str, cfg: dict[str, Any]) -> str:
    """The YAML file of one reproduction: a header saying how to run it, then the data."""
    header = (
        "# @package _global_\n"
        f"# Reproduces the published {title}.\n"
        "# Generated by `python -m runner.published --write` from runner/data/: edit those.\n"
        f"#   python -m runner experiment={name}\n"
        f"#   python -m runner experiment={name} scale=local   # on one CPU machine\n"
        "#   python -m runner.report outputs/   # published vs measured\n"
    )
    return header + yaml.safe_dump(cfg, sort_keys=False, width=100)


def write(directory: Path = EXPERIMENT_DIR) -> list[Path]:
    """Write every reproduction file; remove generated files no longer published."""
    wanted = {name: render(name, *spec) for name, spec in experiments().items()}
    for old in directory.glob("*.yaml"):
        if old.stem not in wanted and "runner.published --write" in old.read_text():
            old.unlink()
    paths = []
    for name, text in wanted.items():
        path = directory / f"{name}.yaml"
        path.write_text(text)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m runner.published",
        description="List the checked-in reproductions, or regenerate conf/experiment/.",
    )
    parser.add_argument("--write", action="store_true", help="regenerate conf/experiment/")
    args = parser.parse_args(argv)
    if args.write:
        paths = write()
        print(f"wrote {len(paths)} reproduction files to {EXPERIMENT_DIR}")
        return 0
    listing = "\n".join(f"{name:40} {title}" for name, (title, _) in experiments().items())
    try:
        print(listing, flush=True)
    except BrokenPipeError:  # `| head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
