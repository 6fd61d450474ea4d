"""Training through the CLI: experiment values, a GPU profile's dry run, determinism; and
the progress line of iterations that end no episode. (Every result file, resume and a
remote EnvRunner: tests/test_faults.py, whose runs are interrupted and resumed.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import runner
from runner.job.callbacks import print_row
from runner.job.loop import carry_last_return


def test_experiment_values_override_the_root_config():
    """An experiment's `stop` wins over conf/config.yaml's (the root comes first)."""
    from conftest import compose_config

    assert compose_config([]).stop.seconds == 90
    assert compose_config(["experiment=tuned_sac_pendulum"]).stop.seconds is None


def test_dry_run_of_a_gpu_profile_on_this_machine(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    overrides = ["hardware=a100", "compile=inductor_ro", "scaling.num_learners=2"]
    run_dir = Path(runner.run([*overrides, "dry_run=true"])["run_dir"])
    config = json.loads((run_dir / "algorithm_config.json").read_text())
    assert (config["num_learners"], config["num_gpus_per_learner"]) == (2, 1)
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["total"]["gpus"] == 2
    assert plan["preflight"]["ok"] is False
    assert not (run_dir / "metrics.jsonl").exists()
    assert "resource plan" in capsys.readouterr().out


def test_iterations_without_an_episode_carry_the_last_known_return(capsys):
    """SAC and DQN often end no episode in an iteration: the row keeps the last return mean
    and its age, and the progress line says how old it is."""
    rows: list[dict] = []
    for iteration, ret in enumerate([None, -900.0, None, None, -700.0], start=1):
        row = {
            "iteration": iteration,
            "episode_return_mean": ret,
            "env_steps": 100.0 * iteration,
            "env_steps_per_s": 50.0,
            "wall_seconds": 1.0,
            "module_episode_returns_mean": None,
            "eval_return_mean": None,
        }
        carry_last_return(row, rows[-1] if rows else None)
        rows.append(row)
        print_row(row)
    assert [(r["last_episode_return_mean"], r["return_age"]) for r in rows] == [
        (None, None),
        (-900.0, 0),
        (-900.0, 1),
        (-900.0, 2),
        (-700.0, 0),
    ]
    lines = capsys.readouterr().out.splitlines()
    assert "return mean  -900.00 (2 it ago)" in lines[3]
    assert "return mean  -700.00 |" in lines[4] and "return mean        - |" in lines[0]


def _learning_figures(rows: list[dict]) -> list[dict]:
    """What a seed must fix: returns, steps and every learner statistic but timings."""
    return [
        {
            "episode_return_mean": r["episode_return_mean"],
            "env_steps": r["env_steps"],
            **{
                k: v
                for k, v in r["metrics"].items()
                if k.startswith("learners/") and "time" not in k and "throughput" not in k
            },
        }
        for r in rows
    ]


def test_the_start_says_what_the_run_is_and_what_ends_it(tmp_path: Path, monkeypatch, capsys):
    """An env of the user's own: no preset, its env-step budget (a default), no other env's
    target; a user's budget drops the defaults; a check says how it decides."""
    monkeypatch.chdir(tmp_path)
    own = "env.entry_point=gymnasium.envs.classic_control:CartPoleEnv"
    runner.run([own, "dry_run=true", "hydra.run.dir=own"])
    out = capsys.readouterr().out
    assert "env: env.entry_point=gymnasium.envs.classic_control:CartPoleEnv, env=custom " in out
    assert "hyperparameters: PPO, conf/algo/ppo.yaml (no tuned file for ppo on env=custom)" in out
    assert "stops at the first of: 100,000 env steps (default); a budget you set" in out
    runner.run(["env.id=ALE/Pong-v5", "stop.iterations=2", "dry_run=true", "hydra.run.dir=pong"])
    out = capsys.readouterr().out
    assert "env: env.id=ALE/Pong-v5, env=atari\n" in out
    assert "stops at the first of: 2 iterations\n" in out
    runner.run(["experiment=tuned_dqn_cartpole", "dry_run=true", "hydra.run.dir=tuned"])
    out = capsys.readouterr().out
    assert "conf/algo/dqn.yaml + conf/tuned/dqn_cartpole.yaml (rllib/examples/" in out
    assert (
        "check: env_runners/episode_return_mean >= 450 within 200,000 env steps, stopping "
        "once decided; exit 1 if missed" in out
    )


@pytest.mark.slow
def test_same_seed_without_env_runner_actors_gives_identical_metrics(cli):
    """num_env_runners=0: sampling and learning in one process, so a seed fixes every
    figure of the first iterations (the README says what is not deterministic)."""
    common = (
        "debug=tiny",
        "scaling.num_env_runners=0",
        "stop.iterations=2",
        "checkpoint.at_end=false",
    )
    first = cli(*common, "seed=3", "verbose=true", run_dir="a")
    second = cli(*common, "seed=3", run_dir="b")
    other = cli(*common, "seed=4", run_dir="c")
    for result in (first, second, other):
        assert result.returncode == 0, result.stderr
    # What the run runs, before the first iteration: what ends it, and with verbose=true
    # the AlgorithmConfig's changes, once (always in algorithm_config.json).
    assert first.stdout.count("settings that differ from RLlib") == 1
    assert first.stdout.index('"seed": 3') < first.stdout.index("iter    1")
    assert "settings that differ from RLlib" not in second.stdout
    stops = "stops at the first of: 2 iterations\n"
    assert second.stdout.index(stops) < second.stdout.index("iter    1")
    assert json.loads((second.run_dir / "algorithm_config.json").read_text())["seed"] == 3
    figures = _learning_figures(first.jsonl("metrics.jsonl"))
    assert len(figures) == 2 and "learners/default_policy/total_loss" in figures[0]
    assert figures == _learning_figures(second.jsonl("metrics.jsonl"))
    assert figures != _learning_figures(other.jsonl("metrics.jsonl"))
