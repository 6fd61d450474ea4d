"""PPO's reward scaling (runner/algorithms/reward_scaling.py) against Stable-Baselines3's own
running statistics, and in a real PPO run: the Learner trains on scaled rewards, the
metrics stay the env's, the statistics go into the checkpoint and a resumed run goes on
from them."""

from __future__ import annotations

import copy
import pickle
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from conftest import compose_config, prepared, run_cli
from episodes import chunks
from stable_baselines3.common.running_mean_std import RunningMeanStd

from runner.algorithms.reward_scaling import (
    STATE_KEY,
    RewardScaling,
    RewardScalingFastPPOLearner,
    RewardScalingPPOLearner,
    ScaleRewards,
)
from runner.job.app import start_lines

GAMMA = 0.9


def test_scaled_rewards_are_vecnormalizes():
    """Episode chunks as EnvRunners send them, train batch after train batch, through
    ScaleRewards; beside it SB3's RunningMeanStd takes each batch's discounted returns,
    computed here over each whole episode (not chunk by chunk), and scales and clips the
    rewards as VecNormalize does. Both give the same rewards."""
    calls = chunks(seed=3, steps=120, chunk=5, env_id="Pendulum-v1", limit=12)
    piece = ScaleRewards(gamma=GAMMA, clip=1.5)
    reference = RunningMeanStd(shape=())
    so_far: dict[str, list[float]] = defaultdict(list)  # each episode's rewards up to now
    clipped = 0
    for call in calls:
        raw = [np.asarray(e.get_rewards(), np.float64) for e in call]
        returns = []
        for episode, rewards in zip(call, raw, strict=True):
            assert len(so_far[episode.id_]) == episode.t_started  # chunks come in order
            so_far[episode.id_] += list(rewards)
            whole = np.array(so_far[episode.id_])
            discounted = [
                sum(GAMMA ** (t - k) * whole[k] for k in range(t + 1)) for t in range(len(whole))
            ]
            returns += discounted[episode.t_started :]
        reference.update(np.array(returns))
        scale = np.sqrt(reference.var + 1e-8)
        mine = copy.deepcopy(call)
        piece(rl_module=None, batch={}, episodes=mine)
        for episode, rewards in zip(mine, raw, strict=True):
            expected = np.clip(rewards / scale, -1.5, 1.5)
            np.testing.assert_allclose(episode.get_rewards(), expected, rtol=1e-5, atol=1e-6)
            clipped += int(np.sum(np.abs(rewards / scale) > 1.5))
    assert reference.var != pytest.approx(1.0) and clipped > 0  # both paths exercised
    assert piece.get_state() == pytest.approx(
        {"mean": reference.mean, "var": reference.var, "count": reference.count}
    )
    assert not piece.running.keys() - {e.id_ for e in calls[-1]}  # only unfinished ones kept


def test_ppo_gets_the_learner_where_enabled():
    """Its Learner (on the fast step's PPO Learner, or RLlib's where the fast step is off),
    the algorithm's gamma and a start line where enabled (other algorithms, and a Learner
    class of the user's: one line, tests/test_bad_input.py)."""
    overrides = ["algo=ppo", "algo.reward_scaling.enabled=true"]
    job = prepared(overrides)
    assert job.config.learner_class is RewardScalingFastPPOLearner
    off = prepared([*overrides, "algo.fast_step.enabled=false"])
    assert off.config.learner_class is RewardScalingPPOLearner
    assert job.config.learner_config_dict["runner_reward_scaling"]["gamma"] == job.config.gamma
    lines = [x for x in start_lines(job, {}, compose_config(overrides)) if "rewards:" in x]
    assert lines == [
        "rewards: scaled for the Learner as SB3's VecNormalize does (gamma 0.99, clip 10; "
        "algo.reward_scaling), the metrics the env's own"
    ]
    plain = prepared(["algo=ppo"])
    assert not issubclass(plain.config.learner_class, RewardScaling)
    assert not [x for x in start_lines(plain, {}, compose_config(["algo=ppo"])) if "rewards" in x]


def _statistics(run: Path) -> dict[str, float]:
    [newest] = sorted((run / "checkpoints").glob("iter_*"))[-1:]
    state = pickle.loads((newest / "learner_group" / "learner" / "state.pkl").read_bytes())
    return state[STATE_KEY]


def test_a_ppo_run_scales_its_rewards_and_resumes_its_statistics(tmp_path: Path):
    """PPO Acrobot's preset (reward scaling on), tiny, sampling in the main process: the
    EnvRunner sums an episode's return over the chunks it returned, which the Learner's
    pipeline must not scale in place; Acrobot's reward is -1 a step (0 on the step that
    ends it), so the episodes return minus their length, or one more each. The checkpoint
    holds the statistics, and a run resumed from it, on RLlib's Learner rather than the
    fast step's and sampled by a remote EnvRunner (its episodes reach the Learner
    read-only, through Ray's object store), goes on counting from them."""
    first = run_cli(
        tmp_path, "algo=ppo", "env=acrobot", "debug=tiny", "stop.iterations=3", "checkpoint.every=1"
    )
    assert first.returncode == 0, first.stderr
    assert "rewards: scaled for the Learner" in first.stdout and "fast ones" in first.stdout
    rows = first.jsonl("metrics.jsonl")
    ended = [r["metrics"] for r in rows if "env_runners/episode_len_mean" in r["metrics"]]
    assert ended  # 500-step episodes at most, each over 3 of the EnvRunner's chunks
    for metrics in ended:
        length = metrics["env_runners/episode_len_mean"]
        returned = metrics["env_runners/episode_return_mean"]
        assert -length <= returned <= -length + 1, (returned, length)
    saved = _statistics(first.run_dir)
    assert saved["count"] == pytest.approx(rows[-1]["env_steps"] + 1e-4) and saved["var"] > 1
    # The Learner's state, Adam's and the statistics, is the same on either Learner.
    resumed = run_cli(
        tmp_path,
        f"resume={first.run_dir}",
        "stop.iterations=4",
        "algo.fast_step.enabled=false",
        "scaling.num_env_runners=1",
        run_dir="second",
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "RLlib's own (algo.fast_step" in resumed.stdout
    after = _statistics(resumed.run_dir)
    assert after["count"] == pytest.approx(resumed.jsonl("metrics.jsonl")[-1]["env_steps"] + 1e-4)
    assert after["count"] > saved["count"]
