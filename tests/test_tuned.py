"""RLlib's tuned examples as checked-in experiments: each composes, builds and plans with
the example's settings and pass criterion; the Atari one is refused here and trains at
scale=local. The full runs are benchmarks (benchmarks/tuned_experiments.sh), not tests."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from conftest import compose_config, prepared
from omegaconf import OmegaConf

import runner
from runner import CONFIG_DIR
from runner.errors import RunnerError
from runner.job.app import start_lines
from runner.machine import preflight

# name: (threshold, env-step budget), as issue 11 and RLlib's examples state them.
TUNED = {
    "tuned_ppo_cartpole": (450, 300_000),
    "tuned_ppo_pendulum": (-300, 400_000),
    "tuned_dqn_cartpole": (450, 200_000),
    "tuned_sac_pendulum": (-250, 20_000),
    "tuned_appo_cartpole": (450, 2_000_000),
    "tuned_impala_cartpole": (450, 2_000_000),
    "tuned_ppo_multi_agent_cartpole": (900, 400_000),
    "tuned_appo_pong": (18, 10_000_000),
    "tuned_ppo_acrobot": (-91.7, 1_000_000),
    "tuned_dqn_acrobot": (-88.4, 100_000),
    "tuned_dqn_mountaincar": (-110.8, 120_000),
    "tuned_dqn_lunarlander": (75.1, 100_000),
    "tuned_ppo_mountaincar": (-129.9, 1_000_000),
    "tuned_ppo_lunarlander": (210.3, 1_000_000),
    # No source states one: the threshold is a random policy's return, measured by the run.
    "tuned_ppo_simple_spread": (None, 300_000),
    # A win rate against random legal moves, RLlib's self-play example's threshold.
    "tuned_ppo_tictactoe": (0.95, 500_000),
}
# Criteria on another metric than the return, and on the greedy evaluation.
METRIC = {"tuned_ppo_tictactoe": "env_runners/win_rate"}
EVALUATED = {"tuned_ppo_tictactoe"}


def test_every_tuned_experiment_is_listed():
    shipped = {p.stem for p in (Path(CONFIG_DIR) / "experiment").glob("tuned_*.yaml")}
    assert shipped == set(TUNED)


@pytest.mark.parametrize("name", sorted(TUNED))
def test_tuned_experiment_states_its_pass_criterion(name: str):
    job = prepared([f"experiment={name}"])
    check = job.settings.check
    assert (check.threshold, check.env_steps) == TUNED[name]
    assert check.enabled
    assert check.metric == METRIC.get(name, "env_runners/episode_return_mean")
    evaluated = check.source.startswith("rl-") or name in EVALUATED
    assert check.on.value == ("evaluation" if evaluated else "training")
    # The source names RLlib's example file (else RL Zoo's files, for an env RLlib has no
    # tuned example of), which the experiment's comment names too; with no source, the
    # threshold is measured against a random policy.
    own = "the project's own settings; the threshold from rllib/examples/"
    assert check.source.startswith(("rllib/examples/algorithms/", "rl-baselines3-zoo ", own)) or (
        check.baseline.value == "random" and "random policy" in check.source
    )
    assert check.source in (Path(CONFIG_DIR) / "experiment" / f"{name}.yaml").read_text()
    # The check ends the run, not the runner's default stops.
    assert job.settings.stop.seconds is None and job.settings.stop.episode_return_mean is None


def test_settings_reach_rllib_as_the_examples_set_them():
    dqn = prepared(["experiment=tuned_dqn_cartpole"]).config
    assert dqn.n_step == (2, 5) and dqn.epsilon == [[0, 1.0], [25000, 0.02]]
    assert dqn.model_config["fcnet_hiddens"] == [256] and dqn.num_envs_per_env_runner == 4
    # What the preset changes (its tuned.changes): SB3's plain DQN head, one update per env step.
    assert (dqn.double_q, dqn.dueling, dqn.training_intensity) == (False, False, 32)
    sac = prepared(["experiment=tuned_sac_pendulum"]).config  # RL Zoo's, SB3's defaults
    assert (sac.actor_lr, sac.critic_lr, sac.alpha_lr, sac.lr) == (1e-3, 1e-3, 1e-3, None)
    assert sac.num_steps_sampled_before_learning_starts == 100 and sac.n_step == 1
    assert sac.get_rollout_fragment_length() == 1 and sac.total_train_batch_size == 256
    assert (
        sac.model_config["fusionnet_hiddens"] == [] and sac.metrics_num_episodes_for_smoothing == 5
    )
    assert sac.replay_buffer_config["type"] == "EpisodeReplayBuffer"
    ppo = prepared(["experiment=tuned_ppo_cartpole"]).config
    assert (ppo.num_env_runners, ppo.num_envs_per_env_runner, ppo.num_learners) == (4, 16, 1)
    assert (ppo.num_epochs, ppo.vf_loss_coeff, ppo.train_batch_size_per_learner) == (6, 0.01, 4000)
    assert (ppo.lambda_, ppo.clip_param, ppo.vf_clip_param) == (1.0, 0.3, 10.0)  # RLlib's
    appo = prepared(["experiment=tuned_appo_cartpole"]).config
    assert appo.num_aggregator_actors_per_learner == 2 and appo.vf_loss_coeff == 0.05
    pong = prepared(["experiment=tuned_appo_pong"])
    assert pong.config.env_config["repeat_action_probability"] == 0.0
    assert pong.plan.total_gpus == 1 and pong.config.train_batch_size_per_learner == 1280


# conf/tuned/<algo>_<env>.yaml: the experiment whose hyperparameters it holds.
TUNED_FILES = {
    "dqn_cartpole": "tuned_dqn_cartpole",
    "sac_pendulum": "tuned_sac_pendulum",
    "ppo_pendulum": "tuned_ppo_pendulum",
    "appo_cartpole": "tuned_appo_cartpole",
    "impala_cartpole": "tuned_impala_cartpole",
    "ppo_multi_agent_cartpole": "tuned_ppo_multi_agent_cartpole",
    "ppo_acrobot": "tuned_ppo_acrobot",
    "dqn_acrobot": "tuned_dqn_acrobot",
    "dqn_mountaincar": "tuned_dqn_mountaincar",
    "dqn_lunarlander": "tuned_dqn_lunarlander",
    "ppo_mountaincar": "tuned_ppo_mountaincar",
    "ppo_lunarlander": "tuned_ppo_lunarlander",
    "ppo_simple_spread": "tuned_ppo_simple_spread",
    "ppo_tictactoe": "tuned_ppo_tictactoe",
}


# Presets whose hyperparameters come from elsewhere than their criterion: where from.
CRITERION_ELSEWHERE = {"sac_pendulum": "rl-baselines3-zoo"}


def test_every_tuned_file_is_listed():
    shipped = {p.stem for p in (Path(CONFIG_DIR) / "tuned").glob("*.yaml")}
    assert shipped == set(TUNED_FILES)


def _within(written: Any, composed: Any) -> bool:
    """Every value the tuned file writes is in the composed config (a mapping it writes may
    hold more there: conf/algo/dqn.yaml's replay buffer keys that its buffer ignores)."""
    if isinstance(written, dict):
        return all(_within(v, composed.get(k)) for k, v in written.items())
    return written == composed


@pytest.mark.parametrize("pair", sorted(TUNED_FILES))
def test_an_algo_and_env_pair_gets_its_tuned_file_and_the_experiment_adds_scale_and_check(
    pair: str,
):
    path = Path(CONFIG_DIR) / "tuned" / f"{pair}.yaml"
    algo, env = pair.split("_", 1)
    plain = prepared([f"algo={algo}", f"env={env}"])
    assert plain.settings.tuned.file == f"conf/tuned/{pair}.yaml"
    written = OmegaConf.to_container(OmegaConf.load(path).algo)
    composed = OmegaConf.to_container(compose_config([f"algo={algo}", f"env={env}"]).algo)
    assert _within(written, composed)
    assert plain.warnings == [] or all(pair not in w for w in plain.warnings)
    # The start line names the source, and what the preset changed from it where it did
    # (its comment says where: "differs", "but for").
    tuned = plain.settings.tuned
    (line,) = [x for x in start_lines(plain, {}, compose_config([])) if "hyperparameters" in x]
    assert f"({tuned.source}" in line
    says_it_differs = re.search(r"differs from|but for", path.read_text())
    assert bool(tuned.changes) == bool(says_it_differs), tuned.changes
    if tuned.changes:
        assert line.endswith(f"; changed: {tuned.changes})"), line
    name = TUNED_FILES[pair]
    experiment = prepared([f"experiment={name}"])
    assert experiment.settings.tuned == plain.settings.tuned
    if pair in CRITERION_ELSEWHERE:  # the experiment's comment names both
        text = (Path(CONFIG_DIR) / "experiment" / f"{name}.yaml").read_text()
        assert CRITERION_ELSEWHERE[pair] in experiment.settings.tuned.source
        assert f"conf/tuned/{pair}.yaml" in text and experiment.settings.check.source in text
    else:
        assert experiment.settings.tuned.source == experiment.settings.check.source
    # The experiment file holds no hyperparameter of the tuned file's.
    own = OmegaConf.load(Path(CONFIG_DIR) / "experiment" / f"{name}.yaml")
    assert not set(own.get("algo", {}).get("training", {})) & set(written.get("training", {}))


def test_a_pair_without_a_tuned_file_and_a_tuned_file_on_another_env():
    assert prepared(["algo=ppo", "env=cartpole"]).settings.tuned is None  # conf/algo/ppo.yaml
    moved = prepared(["algo=dqn", "env=cartpole", "env.id=Acrobot-v1"])
    assert any(
        "is tuned for CartPole-v1, and this run's env is Acrobot-v1" in w for w in moved.warnings
    )


@pytest.mark.parametrize("name", ["tuned_sac_pendulum", "tuned_dqn_cartpole", "tuned_appo_pong"])
def test_env_and_module_build_as_the_preflight_builds_them(name: str):
    """SAC's initializer is a callable in the example and a name here; DQN's and Pong's
    models differ from the defaults: RLlib must still build each module."""
    job = prepared([f"experiment={name}"])
    preflight.check_env(job.settings, job.config)  # raises ConfigError if it cannot


def test_atari_experiment_is_refused_here_in_one_line(tmp_path: Path):
    run_dir = tmp_path / "run"
    with pytest.raises(RunnerError) as refused:
        runner.run(["experiment=tuned_appo_pong", f"hydra.run.dir={run_dir}"])
    line = str(refused.value)
    assert "\n" not in line and "hardware=gpu expects an NVIDIA GPU" in line
    assert "scale=local" in line
    assert not (run_dir / "metrics.jsonl").exists()


@pytest.mark.slow
def test_atari_experiment_trains_at_scale_local(cli):
    """On a remote EnvRunner (scale=local has one): the Atari env reaches it as a class
    (RLlib refuses a plain function). APPO samples asynchronously: an iteration may end
    before the first samples arrive, so the run stops on env steps. The Learner aggregates
    its batches itself (the preset's two aggregator actors are two more processes, not the
    point here)."""
    result = cli(
        "experiment=tuned_appo_pong",
        "scale=local",
        "algo.learners.num_aggregator_actors_per_learner=0",
        "check.enabled=false",
        "stop.iterations=null",
        "stop.env_steps=1",
        "algo.training.train_batch_size_per_learner=200",
        "algo.training.minibatch_size=100",
        "checkpoint.at_end=false",
        "++algo.reporting.min_time_s_per_iteration=1",  # RLlib's APPO: at least 10 s
    )
    assert result.returncode == 0, result.stderr
    summary = result.json("summary.json")
    assert summary["iterations"] >= 1 and summary["env_steps"] > 0
    config = result.json("algorithm_config.json")
    assert config["env_config"]["repeat_action_probability"] == 0.0
