"""Real training through the CLI: results on disk, resume, remote EnvRunners, the main job;
and the progress line of iterations that end no episode."""

from __future__ import annotations

import yaml
from conftest import TINY

from runner.tasks.train import carry_last_return, print_row


def test_tiny_training_writes_every_result_and_resume_continues(cli):
    first = cli(*TINY, "stop.iterations=2", "checkpoint.every=1", run_dir="first")
    assert first.returncode == 0, first.stderr
    run = first.run_dir
    for name in (".hydra/config.yaml", "algorithm_config.json", "plan.json", "summary.json"):
        assert (run / name).is_file(), name
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    rows = first.jsonl("metrics.jsonl")
    assert [r["iteration"] for r in rows] == [1, 2]
    assert rows[1]["env_steps"] > rows[0]["env_steps"] > 0
    assert "learners/default_policy/policy_loss" in rows[1]["metrics"]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "iter_000001",
        "iter_000002",
    ]
    summary = first.json("summary.json")
    assert summary["iterations"] == 2 and summary["stop_reason"].startswith("iterations")
    assert summary["env_steps"] == rows[1]["env_steps"]
    assert summary["env_steps_per_s"] > 0
    assert summary["compile"]["requested"] is False
    assert set(summary["versions"]) == {"python", "torch", "ray"}
    assert summary["hardware"]["cpus"] >= 1
    assert first.json("algorithm_config.json")["_train_batch_size_per_learner"] == 400
    assert "iter    2" in first.stdout

    # Resume from the run dir: the original overrides come back, counting carries on.
    second = cli(f"resume={run}", "stop.iterations=3", run_dir="second")
    assert second.returncode == 0, second.stderr
    resumed = second.jsonl("metrics.jsonl")
    assert [r["iteration"] for r in resumed] == [3]
    assert resumed[0]["env_steps"] > rows[1]["env_steps"]
    assert second.json("algorithm_config.json")["_train_batch_size_per_learner"] == 400
    assert second.json("summary.json")["resumed_from"].endswith("iter_000002")
    overrides = yaml.safe_load((second.run_dir / "composed_overrides.yaml").read_text())
    assert "stop.iterations=3" in overrides and not any(o.startswith("resume=") for o in overrides)
    # The first run is untouched.
    assert len(first.jsonl("metrics.jsonl")) == 2


def test_run_dir_with_results_is_never_reused(cli):
    assert cli(*TINY, "stop.iterations=1", run_dir="once").returncode == 0
    again = cli(*TINY, "stop.iterations=1", run_dir="once", timeout=60)
    assert again.returncode == 2
    assert "already holds a run's results" in again.stderr


def test_remote_env_runner(cli):
    result = cli(*TINY, "scaling.num_env_runners=1", "stop.iterations=2")
    assert result.returncode == 0, result.stderr
    plan = result.json("plan.json")
    assert [g["role"] for g in plan["groups"]] == ["main", "env_runner"]
    assert result.jsonl("metrics.jsonl")[-1]["env_steps"] >= 800


def test_breakout_trains_on_a_remote_env_runner(cli):
    """The Atari env reaches remote EnvRunners as a class (RLlib refuses a plain function)."""
    result = cli(
        "env=breakout",
        "algo.training.train_batch_size_per_learner=128",
        "algo.training.minibatch_size=64",
        "algo.training.num_epochs=1",
        "scaling.num_env_runners=1",
        "scaling.num_envs_per_env_runner=1",
        "stop.iterations=1",
        "checkpoint.at_end=false",
    )
    assert result.returncode == 0, result.stderr
    row = result.jsonl("metrics.jsonl")[-1]
    assert row["env_steps"] >= 128
    assert row["metrics"]["env_runners/num_env_steps_sampled"] >= 128


def test_experiment_values_override_the_root_config():
    """An experiment's `stop` wins over conf/config.yaml's (the root comes first)."""
    from conftest import compose_config

    assert compose_config([]).stop.seconds == 90
    assert compose_config(["experiment=tuned_sac_pendulum"]).stop.seconds is None


def test_dry_run_of_a_gpu_profile_on_this_machine(cli):
    result = cli("hardware=a100", "compile=inductor_ro", "scaling.num_learners=2", "dry_run=true")
    assert result.returncode == 0, result.stderr
    config = result.json("algorithm_config.json")
    assert (config["num_learners"], config["num_gpus_per_learner"]) == (2, 1)
    plan = result.json("plan.json")
    assert plan["total"]["gpus"] == 2
    assert plan["preflight"]["ok"] is False
    assert not (result.run_dir / "metrics.jsonl").exists()
    assert "resource plan" in result.stdout


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


def test_same_seed_without_env_runner_actors_gives_identical_metrics(cli):
    """num_env_runners=0: sampling and learning in one process, so a seed fixes every
    figure of the first iterations (the README says what is not deterministic)."""
    common = (*TINY, "scaling.num_env_runners=0", "stop.iterations=3", "checkpoint.at_end=false")
    first = cli(*common, "seed=3", run_dir="a")
    second = cli(*common, "seed=3", run_dir="b")
    other = cli(*common, "seed=4", run_dir="c")
    for result in (first, second, other):
        assert result.returncode == 0, result.stderr
    figures = _learning_figures(first.jsonl("metrics.jsonl"))
    assert len(figures) == 3 and "learners/default_policy/total_loss" in figures[0]
    assert figures == _learning_figures(second.jsonl("metrics.jsonl"))
    assert figures != _learning_figures(other.jsonl("metrics.jsonl"))
