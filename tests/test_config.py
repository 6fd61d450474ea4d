"""Every config file composes into an AlgorithmConfig and a plan, without Ray."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import compose_config, prepared
from omegaconf import DictConfig
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

from runner import CONFIG_DIR, published
from runner.algorithms import algorithm_config
from runner.compile.settings import resolve
from runner.errors import ConfigError
from runner.machine import local_resources, placement
from runner.machine.plan import make_plan
from runner.settings import autos
from runner.settings.schema import RunnerConfig, typed


def build_algorithm_config(cfg: DictConfig) -> AlgorithmConfig:
    """The AlgorithmConfig a run builds from this composed config (whatever its task)."""
    return built(cfg)[1]


def built(cfg: DictConfig) -> tuple[RunnerConfig, AlgorithmConfig]:
    """Typed settings with the Learner layout picked for this machine, and their
    AlgorithmConfig (a task's own checks, e.g. a missing checkpoint=, are not run)."""
    settings = typed(cfg)
    placement.resolve(settings, local_resources(settings.ray))
    # compile=auto's choice is measured (runner/settings/autos.py): it builds eager until then.
    spec = None if autos.compile_auto(settings) else resolve(settings.compile)[0]
    return settings, algorithm_config.build_algorithm_config(settings, spec)


GROUPS = ("hardware", "compile", "scaling", "algo", "env", "task", "experiment")
# The reproductions' experiment files (generated from the published tables) are built,
# planned and preflighted each in tests/test_reproductions.py, on this machine and scaled
# down: not a second time here.
REPRODUCTIONS = set(published.experiments())
OPTIONS = [
    (group, path.stem)
    for group in GROUPS
    for path in sorted((Path(CONFIG_DIR) / group).glob("*.yaml"))
    if not (group == "experiment" and path.stem in REPRODUCTIONS)
]


def test_every_group_has_options():
    assert {group for group, _ in OPTIONS} == set(GROUPS)
    assert {"cpu", "t4", "v100", "a100", "h100"} <= {o for g, o in OPTIONS if g == "hardware"}


@pytest.mark.parametrize(("group", "option"), OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_option_composes_and_builds(group: str, option: str):
    # env=custom is an env of the user's own: it names one.
    own = [OWN_ENV] if (group, option) == ("env", "custom") else []
    settings, config = built(compose_config([f"{group}={option}", *own]))
    plan = make_plan(config)
    assert type(config).__name__ == f"{settings.algo.name}Config"
    assert config.num_env_runners == settings.scaling.num_env_runners
    assert config.num_learners == settings.scaling.num_learners is not None
    assert plan.count("env_runner") == settings.scaling.num_env_runners


ALGOS = sorted(p.stem for p in (Path(CONFIG_DIR) / "algo").glob("*.yaml"))
# An env of the user's own, by its class: gymnasium's CartPole under another name.
OWN_ENV = "env.entry_point=gymnasium.envs.classic_control:CartPoleEnv"


def test_an_env_named_alone_takes_no_other_envs_settings():
    """env.entry_point alone (no env.id=null needed) takes env=custom: none of CartPole's
    tuned hyperparameters or its 450 target, the budget in env steps; an env.id a preset
    names takes that preset, any other ALE id env=atari's Atari settings."""
    own = typed(compose_config(["algo=dqn", OWN_ENV]))
    assert own.env.entry_point and own.env.id is None and own.tuned is None
    assert own.env.solved_return is None and own.stop.episode_return_mean is None
    assert (own.stop.iterations, own.stop.env_steps, own.stop.seconds) == (None, 100_000, None)
    untuned = typed(compose_config(["algo=dqn", "env=pendulum"]))  # no dqn_pendulum file
    tuned = typed(compose_config(["algo=dqn"]))  # conf/tuned/dqn_cartpole.yaml
    assert own.algo == untuned.algo != tuned.algo
    assert typed(compose_config([OWN_ENV, "stop.iterations=3"])).stop.env_steps is None
    acrobot = typed(compose_config(["env.id=Acrobot-v1"]))
    assert acrobot.env.solved_return == -100 and acrobot.tuned is not None
    pong = typed(compose_config(["env.id=ALE/Pong-v5", "stop.iterations=2"]))
    assert (pong.env.atari, pong.env.framestack, pong.env.environment) == (
        True,
        4,
        {"clip_rewards": True},
    )
    assert (pong.stop.iterations, pong.stop.seconds, pong.stop.episode_return_mean) == (
        2,
        None,
        None,
    )


@pytest.mark.parametrize(
    ("overrides", "budgets"),
    [
        ([], (200, None, 90)),
        (["stop.iterations=3"], (3, None, None)),
        (["stop.env_steps=5000"], (None, 5000, None)),
        (["stop.seconds=null"], (200, None, None)),  # null: that one is off
        (["stop.seconds=30"], (None, None, 30)),
        (["check.threshold=450", "check.env_steps=300000"], (None, None, None)),
        (["check.threshold=450"], (200, None, 90)),  # a check without a budget
        (["debug=tiny"], (1, None, None)),
    ],
)
def test_default_budgets_give_way_to_any_budget_set(overrides: list[str], budgets: tuple):
    """stop.iterations=200 and stop.seconds=90 hold only where no budget is set: a
    default wall-clock limit never cuts a budget chosen on the command line, in a group
    file or as a check's env-step budget."""
    stop = typed(compose_config(overrides)).stop
    assert (stop.iterations, stop.env_steps, stop.seconds) == budgets


@pytest.mark.parametrize("algo", ALGOS)
def test_debug_tiny_shrinks_any_algo_and_the_command_line_still_wins(algo: str):
    """debug=tiny has a part for every algo (conf/debug/algo/), applied after the algo's
    own; an override on the command line is applied after it."""
    assert (Path(CONFIG_DIR) / "debug" / "algo" / f"tiny_{algo}.yaml").is_file()
    settings, config = built(compose_config(["debug=tiny", f"algo={algo}"]))
    assert settings.stop.iterations == 1 and settings.stop.episode_return_mean is None
    assert config.num_envs_per_env_runner == 2
    if algo in ("dqn", "sac"):
        assert config.num_steps_sampled_before_learning_starts == 0
        assert config.min_sample_timesteps_per_iteration == 200
    else:
        assert config.train_batch_size_per_learner <= 400
    again = typed(compose_config(["debug=tiny", f"algo={algo}", "stop.iterations=3"]))
    assert again.stop.iterations == 3


def test_builder_sections_reach_rllib():
    cfg = compose_config(["algo.training.lr=1e-4", "+algo.training.grad_clip=40", "seed=7"])
    config = build_algorithm_config(cfg)
    assert config.lr == 1e-4
    assert config.grad_clip == 40
    assert config.seed == 7
    assert config.num_epochs == cfg.algo.training.num_epochs


def test_scaling_feeds_env_runners_and_learners():
    cfg = compose_config(
        [
            "hardware=a100",
            "scaling=runners2",
            "scaling.num_learners=2",
            "scaling.num_cpus_per_learner=2",
        ]
    )
    config = build_algorithm_config(cfg)
    assert (config.num_env_runners, config.num_envs_per_env_runner) == (2, 4)
    assert (config.num_learners, config.num_gpus_per_learner, config.num_cpus_per_learner) == (
        2,
        1,
        2,
    )
    plan = make_plan(config)
    roles = {g.role: g for g in plan.groups}
    assert roles["env_runner"].count == 2 and roles["env_runner"].cpus_each == 1
    assert roles["learner"].count == 2 and roles["learner"].gpus_each == 1
    assert (plan.total_gpus, plan.actor_cpus) == (2, 2 + 2 * 2)


def test_local_learner_gpu_is_on_the_main_process():
    config = build_algorithm_config(compose_config(["hardware=a100"]))
    main = make_plan(config).groups[0]
    assert main.role == "main" and main.gpus_each == 1
    assert "local Learner" in main.note and "local EnvRunner" in main.note


def test_unknown_builder_key_names_the_closest():
    cfg = compose_config(["+algo.training.lrr=1"])
    with pytest.raises(ConfigError, match=r"algo\.training\.lrr.*did you mean lr"):
        build_algorithm_config(cfg)


def test_scaling_key_set_twice_is_refused():
    cfg = compose_config(["+algo.env_runners.num_env_runners=3"])
    with pytest.raises(ConfigError, match="duplicates scaling.num_env_runners"):
        build_algorithm_config(cfg)


@pytest.mark.parametrize(
    "override", ["scaling.num_env_runners=-1", "scaling.num_envs_per_env_runner=0"]
)
def test_counts_out_of_range(override: str):
    with pytest.raises(ConfigError, match="must be >="):
        prepared([override])


def test_breakout_is_wrapped_for_the_new_api_stack():
    config = build_algorithm_config(compose_config(["env=breakout"]))
    env = config.env({**config.env_config})
    try:
        assert env.observation_space.shape == (64, 64, 4)
        assert config.clip_rewards is True
    finally:
        env.close()


def test_gpu_defaults_follow_the_hardware_profile():
    for profile, gpus in (("cpu", 0), ("t4", 1), ("v100", 1), ("a100", 1), ("h100", 1)):
        settings = prepared([f"hardware={profile}"]).settings
        assert settings.scaling.num_gpus_per_learner == gpus
