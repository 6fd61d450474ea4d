"""python -m runner.compare on run dirs made here with known curves and returns (the
figures checked against values computed independently), on a real sweep's run dirs, and
its one line for bad input."""

from __future__ import annotations

import csv
import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import scipy.stats
from conftest import compose_config
from omegaconf import OmegaConf

from runner import compare
from runner.results import stats
from runner.settings.schema import typed

SEEDS = range(5)
# env -> (random return, reference return): each run's check carries them.
ENVS = {"cartpole": (20.0, 500.0), "acrobot": (-500.0, -100.0)}
# configuration -> env -> the final return of seed s, a known function of s.
FINAL = {
    "algo.training.lr=0.001": {
        "cartpole": lambda s: 300.0 + 10 * s,
        "acrobot": lambda s: -300.0 + 5 * s,
    },
    "algo.training.lr=0.01": {
        "cartpole": lambda s: 100.0 + 10 * s,
        "acrobot": lambda s: -450.0 + 5 * s,
    },
}


def make_run(root: Path, config: str, env: str, seed: int, baseline: bool = True) -> Path:
    """A training run's files as the runner writes them: the record, the overrides, a
    learning curve rising to its final return over 10 iterations."""
    run = root / f"{config}-{env}-{seed}"
    run.mkdir(parents=True)
    random, reference = ENVS[env]
    final = FINAL[config][env](seed)
    check = {"enabled": True, "threshold": reference, "source": "a test's reference"}
    if baseline:
        check["baseline"] = {"return_mean": random, "stds": 2}
    record = {"task": "train", "final_episode_return_mean": final, "choices": {"env": env}}
    (run / "summary.json").write_text(json.dumps({**record, "check": check}))
    overrides = [f"env={env}", f"seed={seed}", config]
    (run / "composed_overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    rows = [
        {"iteration": i, "env_steps": 1000 * i, "wall_seconds": 2.0 * i + seed * 0.1,
         "last_episode_return_mean": random + (final - random) * i / 10}
        for i in range(1, 11)
    ]  # fmt: skip
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def figures(out: Path) -> list[dict[str, str]]:
    return list(csv.DictReader((out / "compare.csv").open()))


def test_the_page_holds_the_figures_computed_independently(tmp_path: Path):
    runs = tmp_path / "multirun"
    for config in FINAL:
        for env in ENVS:
            for seed in SEEDS:
                make_run(runs, config, env, seed)
    assert compare.main([str(runs), "--out", str(tmp_path / "cmp")]) == 0
    out, rows = tmp_path / "cmp", figures(tmp_path / "cmp")
    good, bad = FINAL
    for config in FINAL:
        # Normalized finals: seeds x envs, by hand.
        matrix = np.array(
            [
                [(FINAL[config][e](s) - ENVS[e][0]) / (ENVS[e][1] - ENVS[e][0]) for e in ENVS]
                for s in SEEDS
            ]
        )
        normalized = [r for r in rows if r["configuration"] == config and r["env"] == "all"]
        iqm = next(r for r in normalized if r["statistic"] == "iqm")
        assert float(iqm["value"]) == pytest.approx(scipy.stats.trim_mean(matrix.ravel(), 0.25))
        assert float(iqm["low"]) <= float(iqm["value"]) <= float(iqm["high"])
        gap = next(r for r in normalized if r["statistic"] == "optimality_gap")
        assert float(gap["value"]) == pytest.approx(1 - np.minimum(matrix, 1).mean())
        # Each env on its own: one column of the matrix.
        own = next(r for r in rows if r["section"] == "normalized" and r["env"] == "acrobot"
                   and r["configuration"] == config and r["statistic"] == "mean")  # fmt: skip
        assert float(own["value"]) == pytest.approx(matrix[:, list(ENVS).index("acrobot")].mean())
        final = next(r for r in rows if r["configuration"] == config and r["env"] == "cartpole")
        cartpole = [FINAL[config]["cartpole"](s) for s in SEEDS]
        assert float(final["value"]) == pytest.approx(stats.iqm(np.array([cartpole]).T))
    # Every seed of the first beats every seed of the second on both envs.
    improvement = {
        (r["configuration"], r["versus"]): r for r in rows if r["section"] == "improvement"
    }
    assert float(improvement[good, bad]["value"]) == 1.0 == float(improvement[good, bad]["low"])
    assert float(improvement[bad, good]["value"]) == 0.0
    page = (out / "compare.md").read_text()
    assert (
        "| configuration | cartpole | acrobot |" in page
        or "| configuration | acrobot | cartpole |" in page
    )
    assert "seeds)" not in page  # 5 seeds each: nothing marked
    for png in (
        "curves_0_env_steps.png",
        "curves_0_seconds.png",
        "curves_1_env_steps.png",
        "profile.png",
    ):
        assert (out / png).stat().st_size > 5000, png
        assert f"]({png})" in page
    html = (out / "compare.html").read_text()
    assert html.count("data:image/png;base64,") == 5 and "src='http" not in html


def test_fewer_seeds_are_marked_and_a_missing_random_return_is_measured(
    tmp_path: Path, monkeypatch
):
    """Three seeds are marked as such; an env whose check states a threshold but measured
    no baseline gets its random policy's return measured here (CartPole, for real)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    env = typed(compose_config(["env=cartpole"])).env
    for config in FINAL:
        for seed in range(3):
            run = make_run(tmp_path / "runs", config, "cartpole", seed, baseline=False)
            (run / "config.yaml").write_text(OmegaConf.to_yaml({"env": asdict(env)}))
    page = compare.build([tmp_path / "runs"], tmp_path / "cmp", [], "python -m runner.compare runs")
    text = page.read_text()
    assert "(3 seeds)" in text and "100 random episodes" in text
    [cached] = (tmp_path / "cache" / "rllib-runner" / "random-returns").glob("random-*.json")
    random = json.loads(cached.read_text())["figures"]
    assert 10 < random < 40  # CartPole's random policy: about 22 steps an episode


def test_x_draws_one_axis(tmp_path: Path):
    for seed in range(2):
        make_run(tmp_path / "runs", "algo.training.lr=0.001", "cartpole", seed)
    assert compare.main([str(tmp_path / "runs"), "--x", "seconds"]) == 0
    drawn = sorted(p.name for p in (tmp_path / "runs" / "compare").glob("curves_*.png"))
    assert drawn == ["curves_0_seconds.png"]
    with pytest.raises(SystemExit) as refused:  # argparse's refusal
        compare.main([str(tmp_path / "runs"), "--x", "hours"])
    assert refused.value.code == 2


def test_by_names_configurations_from_the_run_config(tmp_path: Path):
    runs = []
    for lr, seed in ((0.001, 0), (0.01, 1)):
        run = make_run(tmp_path, f"algo.training.lr={lr}", "cartpole", seed)
        (run / "config.yaml").write_text(f"algo:\n  name: PPO\n  training:\n    lr: {lr}\n")
        runs.append(run)
    found = compare.find([tmp_path])
    compare.label(found, ["algo.name", "algo.training.lr"])
    assert sorted(r.configuration for r in found) == [
        "algo.name=PPO algo.training.lr=0.001",
        "algo.name=PPO algo.training.lr=0.01",
    ]
    compare.label(found, [])  # the overrides that differ, seed and env aside
    assert sorted(r.configuration for r in found) == sorted(FINAL)


def test_no_training_run_is_one_line(tmp_path: Path, capsys):
    assert compare.main([str(tmp_path)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no training run" in err[0] and "Traceback" not in err[0]


def test_the_env_factory_builds_from_settings_alone():
    from runner.envs import from_settings

    env = from_settings(typed(compose_config(["env=cartpole"])).env)
    assert env.observation_space.shape == (4,)
    env.close()
