"""`env.wrappers` and `env.framestack` from YAML: applied by the one env factory to the
driver's envs and to every EnvRunner's (a real run's module is built from what its remote
EnvRunner saw). Multi-agent envs without declared policies, a PettingZoo game among them."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import prepared
from ray.rllib.core import Columns
from ray.rllib.core.rl_module import RLModule
from ray.rllib.env.wrappers.pettingzoo_env import ParallelPettingZooEnv, PettingZooEnv

import runner
from runner.algorithms.algorithm_config import build_algorithm_config
from runner.envs import make_env
from runner.errors import ConfigError

WRAPPERS = (
    "env.wrappers=[gymnasium.wrappers:FlattenObservation,"
    "{_target_:gymnasium.wrappers.TimeLimit,max_episode_steps:7}]"
)


def test_framestack_stacks_the_last_frames_on_the_last_axis():
    config = prepared(["env.framestack=4"]).config
    env = make_env(config)
    assert env.observation_space.shape == (16,)
    first, _ = env.reset(seed=0)
    assert np.array_equal(first, np.tile(first[:4], 4))  # padded with the first frame
    second, *_ = env.step(0)
    assert np.array_equal(second[:12], first[4:]) and not np.array_equal(second[12:], first[12:])
    # RLlib's default encoder takes the stacked vector.
    module = config.get_rl_module_spec(env=env).build()
    out = module.forward_inference({Columns.OBS: torch.as_tensor(second[None])})
    assert out[Columns.ACTION_DIST_INPUTS].shape == (1, 2)


def test_wrappers_apply_in_order_with_their_keywords():
    env = make_env(prepared([WRAPPERS]).config)
    assert [type(w).__name__ for w in (env, env.env)] == ["TimeLimit", "FlattenObservation"]
    env.reset(seed=0)  # pushed left from this start, the pole falls at step 11 unwrapped
    ends = [env.step(0)[2:4] for _ in range(7)]
    assert ends[-1] == (False, True) and not any(any(end) for end in ends[:-1])


@pytest.mark.slow
@pytest.mark.usefixtures("joins_shared_ray")
def test_a_remote_env_runner_builds_the_wrapped_stacked_env(tmp_path: Path, monkeypatch):
    """The Learner's module is built from the spaces the remote EnvRunner's env has."""
    monkeypatch.chdir(tmp_path)
    summary = runner.run(
        [
            "debug=tiny",
            WRAPPERS,
            "env.framestack=3",
            "scaling.num_env_runners=1",
            "stop.iterations=1",
            "hydra.run.dir=run",
        ]
    )
    assert summary["status"] == "finished"
    (module_dir,) = (tmp_path / "run").rglob("rl_module/default_policy")
    module = RLModule.from_checkpoint(module_dir)
    assert module.observation_space.shape == (12,)


def test_a_multi_agent_env_gets_a_policy_per_agent_or_one_shared():
    config = prepared(["env=multi_agent_cartpole"]).config
    assert set(config.policies) == {"0", "1"}
    assert [config.policy_mapping_fn(agent, None) for agent in (0, 1)] == ["0", "1"]
    shared = prepared(["env=multi_agent_cartpole", "env.policies=shared"]).config
    assert set(shared.policies) == {"shared"}
    assert {shared.policy_mapping_fn(agent, None) for agent in (0, 1)} == {"shared"}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["algo=ppo", "env.policies=per_agent", "debug=tiny", "stop.iterations=2"], {"0", "1"}),
        # debug=tiny's APPO iteration (at least 1 s) ends episodes: one will do.
        (["debug=tiny", "algo=appo", "env.policies=shared"], {"shared"}),
    ],
    ids=["ppo-per_agent", "appo-shared"],
)
@pytest.mark.usefixtures("joins_shared_ray")
def test_multi_agent_cartpole_trains_with_no_policies_declared(
    tmp_path: Path, monkeypatch, overrides: list[str], expected: set[str]
):
    monkeypatch.chdir(tmp_path)
    run = ["env=multi_agent_cartpole", *overrides, "stop.episode_return_mean=null"]
    summary = runner.run([*run, "hydra.run.dir=run"])
    assert summary["status"] == "finished"
    assert set(summary["final_module_episode_returns_mean"]) == expected


def test_a_pettingzoo_game_gets_a_policy_per_agent_or_one_shared():
    """MPE2's Simple Spread from YAML alone (conf/env/simple_spread.yaml): RLlib's
    ParallelPettingZooEnv around it, its agent ids read from the game. With no policies
    declared (DQN has no tuned file for it) each agent gets its own; PPO's tuned file
    (conf/tuned/ppo_simple_spread.yaml) shares one."""
    config = prepared(["env=simple_spread", "algo=dqn"]).config
    agents = ["agent_0", "agent_1", "agent_2"]
    assert set(config.policies) == set(agents)
    assert [config.policy_mapping_fn(agent, None) for agent in agents] == agents
    shared = prepared(["env=simple_spread", "env.env_config.N=2"]).config
    assert set(shared.policies) == {"shared"}
    env = make_env(shared)
    assert isinstance(env, ParallelPettingZooEnv) and sorted(env.possible_agents) == agents[:2]
    aec = make_env(
        prepared(["env=simple_spread", "env.pettingzoo=mpe2.simple_spread_v3:env"]).config
    )
    assert isinstance(aec, PettingZooEnv)


@pytest.mark.slow
@pytest.mark.usefixtures("joins_shared_ray")
def test_a_pettingzoo_game_trains_per_agent_and_shared_and_evaluates(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    game = ["env=simple_spread", "stop.iterations=1"]
    # Checked against a random policy (10 episodes), its threshold 10 std below its mean.
    baseline = ["check.baseline=random", "check.baseline_episodes=10", "check.baseline_stds=-10"]
    per_agent = runner.run(
        [*game, "debug=tiny", *baseline, "env.policies=per_agent", "hydra.run.dir=per_agent"]
    )
    assert per_agent["status"] == "finished"
    check = per_agent["check"]
    assert check["passed"] and check["baseline"]["episodes"] == 10
    measured = check["baseline"]["return_mean"] - 10 * check["baseline"]["return_std"]
    assert check["threshold"] == pytest.approx(measured) and measured < 0
    assert set(per_agent["final_module_episode_returns_mean"]) == {"agent_0", "agent_1", "agent_2"}
    # DQN takes each agent's Discrete(5) action space.
    shared = runner.run([*game, "algo=dqn", "env.policies=shared", "hydra.run.dir=shared"])
    assert set(shared["final_module_episode_returns_mean"]) == {"shared"}
    evaluated = runner.run(["task=evaluate", "checkpoint=per_agent", "task.episodes=2"])
    found = evaluated["evaluate"]  # the run record's section of task=evaluate
    assert found["episodes"] == 2 and found["episode_return_mean"] < 0  # MPE: costs


@pytest.mark.slow  # it trains
@pytest.mark.usefixtures("joins_shared_ray")
def test_minigrid_trains_with_its_wrappers_from_yaml_alone(tmp_path: Path, monkeypatch):
    """examples/minigrid: MiniGrid's dict observation, made its 7x7x3 view by the env file's
    one wrapper, reaches the RLModule the run trains as floats in [0, 1], through a conv
    encoder (and fails to build without the wrapper)."""
    example = Path(__file__).resolve().parent.parent / "examples" / "minigrid" / "conf"
    config = runner.compose(["env=minigrid_empty"], config_dir=str(example))
    env = make_env(build_algorithm_config(config, None))
    assert (env.observation_space.shape, env.observation_space.dtype) == ((7, 7, 3), np.float32)
    monkeypatch.chdir(tmp_path)
    summary = runner.run(
        [
            "debug=tiny",
            "experiment=minigrid_empty_ppo",
            "check.enabled=false",
            "hydra.run.dir=run",
        ],
        config_dir=str(example),
    )
    assert summary["status"] == "finished" and summary["env_steps"] > 0
    assert not summary["restarts"], "an EnvRunner died on the wrapped env"
    (module_dir,) = (tmp_path / "run").rglob("rl_module/default_policy")
    module = RLModule.from_checkpoint(module_dir)
    assert module.observation_space.shape == (7, 7, 3)
    assert any(isinstance(m, torch.nn.Conv2d) for m in module.modules())
    with pytest.raises(ConfigError, match="No default encoder config"):
        runner.run(
            ["debug=tiny", "experiment=minigrid_empty_ppo", "env.wrappers=[]", "dry_run=true"],
            config_dir=str(example),
        )


def test_lunarlander_without_box2d_names_the_extra(monkeypatch):
    """Box2D hidden from the import system (installed or not, as on a machine without it)."""
    monkeypatch.setitem(sys.modules, "Box2D", None)
    for name in [m for m in sys.modules if m.startswith("gymnasium.envs.box2d")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(ConfigError, match=r"needs Box2D.*pip install -e '\.\[box2d\]'"):
        make_env(prepared(["env=lunarlander"]).config)
