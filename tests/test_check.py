"""A run's pass criterion (`check`, RLlib's --as-test): it stops the run when decided and
sets the exit code; real runs for pass and fail, the bookkeeping in-process."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from conftest import prepared

from runner.envs import make_env, random_returns
from runner.errors import ConfigError
from runner.job.check import Check
from runner.settings.schema import CheckBaseline, CheckConfig, CheckOn

METRIC = "env_runners/episode_return_mean"


def test_check_passes_at_the_threshold_and_keeps_the_last_known_value():
    check = Check(CheckConfig(threshold=100.0, env_steps=1000))
    assert check.update({METRIC: 40.0}, 200, 1.0) is None
    assert check.update({}, 400, 2.0) is None  # no episode ended: 40 is still the value
    reason = check.update({METRIC: 120.0}, 600, 3.0)
    assert reason == f"check passed: {METRIC} 120 >= 100 at 600 env steps"
    assert check.to_dict() == {
        "enabled": True,
        "metric": METRIC,
        "threshold": 100.0,
        "baseline": None,
        "env_steps_budget": 1000,
        "source": "",
        "passed": True,
        "best": 120.0,
        "env_steps_to_threshold": 600,
        "seconds_to_threshold": 3.0,
    }


def test_check_fails_when_the_budget_is_spent():
    check = Check(CheckConfig(threshold=100.0, env_steps=1000))
    assert check.update({METRIC: 90.0}, 500, 1.0) is None
    assert check.update({METRIC: 80.0}, 1000, 2.0) == (
        f"check failed: {METRIC} best 90 < 100 within 1,000 env steps"
    )
    assert not check.passed


def test_no_threshold_or_disabled_is_no_check():
    for config in (CheckConfig(), CheckConfig(enabled=False, threshold=1.0)):
        check = Check(config)
        assert check.update({METRIC: 500.0}, 10, 1.0) is None
        assert check.to_dict()["passed"] is None
        check.raise_if_failed()  # nothing to fail


@pytest.mark.slow
def test_a_check_on_evaluation_reads_the_evaluation_during_training():
    check = Check(CheckConfig(threshold=100.0, on=CheckOn.evaluation))
    assert check.update({METRIC: 150.0}, 200, 1.0) is None  # training's return: not read
    reason = check.update({f"evaluation/{METRIC}": 120.0}, 400, 2.0)
    assert reason == f"check passed: evaluation/{METRIC} 120 >= 100 at 400 env steps"
    with pytest.raises(ConfigError, match=r"check.on=evaluation .*: set eval.every"):
        prepared(["check.on=evaluation", "check.threshold=100"])
    job = prepared(["check.on=evaluation", "check.threshold=100", "eval.every=2"])
    assert job.config.evaluation_interval == 2


@pytest.mark.slow  # it trains (the fast subset's only Ray start)
def test_a_run_that_passes_its_check_stops_and_exits_0(cli):
    result = cli("debug=tiny", "check.threshold=1", "check.env_steps=100000", "stop.iterations=5")
    assert result.returncode == 0, result.stderr
    summary = result.json("summary.json")
    assert summary["stop_reason"].startswith("check passed")
    assert summary["iterations"] == 1
    assert summary["check"]["passed"] is True
    assert summary["check"]["env_steps_to_threshold"] == summary["env_steps"]


@pytest.mark.slow
def test_a_run_that_misses_its_check_exits_1_in_one_line(cli):
    result = cli(
        "debug=tiny",
        "stop.iterations=null",  # the check's budget stops it
        "check.threshold=100000",
        "check.env_steps=800",
        "checkpoint.every=0",
    )
    assert result.returncode == 1, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: check failed: {METRIC} best ")
    assert "< 100000 within 800 env steps" in line
    summary = result.json("summary.json")  # every result is kept
    assert summary["check"]["passed"] is False
    assert summary["stop_reason"].startswith("check failed")
    assert summary["env_steps"] >= 800


def test_a_random_policy_sets_the_threshold_where_no_source_states_one():
    """Real envs: CartPole (one agent) and MPE2's Simple Spread (three, summed)."""
    cartpole = make_env(prepared([]).config)
    returns = random_returns(cartpole, 0, 30)
    assert returns == random_returns(cartpole, 0, 30)  # the seed fixes them
    assert all(r >= 8 for r in returns) and max(returns) < 100  # random CartPole: 8 to ~60
    check = Check(CheckConfig(baseline=CheckBaseline.random, env_steps=1000))
    assert check.active and check.needs_baseline
    assert check.update({METRIC: 10.0}, 100, 1.0) is None  # no threshold measured yet
    line = check.set_baseline(returns, 0)
    mean, std = np.mean(returns), np.std(returns)
    assert check.threshold == pytest.approx(mean + std) and not check.needs_baseline
    assert line.startswith(f"check: a random policy returned {mean:.1f} +- {std:.1f} over 30")
    assert check.update({METRIC: mean + std + 1}, 200, 2.0).startswith("check passed")
    assert check.to_dict()["baseline"]["return_mean"] == pytest.approx(mean)
    spread = make_env(prepared(["env=simple_spread"]).config)
    agents = random_returns(spread, 0, 5)
    assert len(agents) == 5 and all(r < 0 for r in agents)  # distances and collisions


def test_a_random_policy_acts_only_for_agents_still_in_the_episode():
    """Two CartPoles in one env end apart: the one that ended is not stepped again (gymnasium
    warns on a step after `terminated`), and the episode's return sums both poles' steps."""
    env = make_env(prepared(["env=multi_agent_cartpole"]).config)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        returns = random_returns(env, 0, 10)
    assert len(returns) == 10 and all(16 <= r < 200 for r in returns)  # 2 poles, 8+ each


def test_a_baseline_needs_episodes():
    with pytest.raises(ConfigError, match=r"check.baseline_episodes must be >= 1"):
        prepared(["check.baseline=random", "check.baseline_episodes=0"])
