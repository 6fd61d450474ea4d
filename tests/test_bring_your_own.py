"""The user's own code from YAML: envs three ways, classes by import path or `_target_`,
connectors, callbacks beside the runner's compile callbacks, multi-agent setups, and a
user config dir. Real training for two iterations each, with examples/my_rl_pkg on
PYTHONPATH as a user's package would be (the README test installs it with pip)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
from conftest import CliResult, compose_config, prepared, run_cli
from ray.rllib.connectors.env_to_module import MeanStdFilter

from runner.errors import ConfigError
from runner.machine import preflight
from runner.settings.user_code import ConnectorFactory, PolicyTable, locate

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "my_rl_pkg"
SMALL = ["debug=tiny", "stop.iterations=2", "checkpoint.at_end=false"]


def run_with_package(cwd: Path, *args: str) -> CliResult:
    """`python -m runner` with the example package importable, as if pip-installed: on
    the driver's PYTHONPATH, and the shared Ray's workers have it (tests/shared_ray.py)."""
    return run_cli(cwd, *args, env={"PYTHONPATH": str(EXAMPLE)})


def last_metrics(result: CliResult) -> dict[str, float]:
    return result.jsonl("metrics.jsonl")[-1]["metrics"]


@pytest.mark.slow
def test_module_env_id_and_a_connector_on_a_remote_env_runner(tmp_path: Path):
    """gymnasium's `module:EnvId`: the module is imported in the remote EnvRunner, which
    also builds the MeanStdFilter connector from its `_target_`."""
    result = run_with_package(
        tmp_path,
        "env.id=my_rl_pkg:MyRL/Corridor-v0",
        "scaling.num_env_runners=1",
        "+algo.env_runners.env_to_module_connector._target_="
        "ray.rllib.connectors.env_to_module.MeanStdFilter",
        *SMALL,
        "checkpoint.at_end=true",
    )
    assert result.returncode == 0, result.stderr
    summary = result.json("summary.json")
    assert len(summary["env_runner_nodes"]) == 1
    metrics = last_metrics(result)
    assert metrics["env_runners/num_episodes_lifetime"] > 0
    # Corridor's returns: at most 0.91 (nine steps to the exit), at least -1 (100 steps).
    assert -1.0 <= summary["final_episode_return_mean"] <= 0.91
    # The filter's running statistics, saved from the EnvRunner: it saw every observation.
    saved = Path(summary["checkpoint"]) / "env_runner" / "env_to_module_connector"
    state = pickle.loads((saved / "MeanStdFilter" / "state.pkl").read_bytes())
    (stats,) = state[None]["running_stats"]
    assert stats["num_pushes"] >= metrics["env_runners/num_env_steps_sampled_lifetime"] > 0


@pytest.mark.slow
def test_a_run_callback_of_the_users_stops_the_run_and_writes_its_file(tmp_path: Path):
    """`callbacks:` appends the package's Plateau to the run's callbacks: it sees each
    iteration, its reason ends the run (as a stop criterion would, the final checkpoint
    kept), and its on_end writes its file into the run dir."""
    result = run_with_package(
        tmp_path,
        "debug=tiny",
        "stop.iterations=5",
        "callbacks=[{_target_:my_rl_pkg.callbacks.Plateau,patience:1,min_delta:1000}]",
    )
    assert result.returncode == 0, result.stderr
    summary = result.json("summary.json")
    assert summary["iterations"] == 2 and summary["status"] == "finished"
    assert summary["stop_reason"].startswith("plateau: no gain over ")
    assert summary["checkpoint"].endswith("iter_000002")
    assert result.json("plateau.json")["at_iteration"] == 1
    assert "done (plateau: no gain over" in result.stdout


@pytest.mark.slow
def test_example_package_from_a_user_config_dir_with_compile(tmp_path: Path):
    """The example's experiment file, from its own config dir: its env class by path, its
    RLModule compiled on the EnvRunner and the Learner, and its callback class and
    on_algorithm_init function beside the runner's compile callbacks."""
    result = run_with_package(
        tmp_path,
        "--config-dir",
        str(EXAMPLE / "conf"),
        "experiment=corridor_ppo",
        "compile=eager",
        "+algo.callbacks.on_algorithm_init=my_rl_pkg.callbacks:print_module_size",
        *SMALL,
    )
    assert result.returncode == 0, result.stderr
    assert "my_rl_pkg: MLPModule with" in result.stdout  # the user's function ran too
    config = result.json("algorithm_config.json")
    # Every EnvRunner gets the one env factory, with the env's settings beside its config.
    assert config["env"] == "runner.envs.RunnerEnv"
    assert config["env_config"]["_runner_env"]["entry_point"] == "my_rl_pkg.envs:Corridor"
    assert config["env_config"]["length"] == 10
    assert "module_class=<class 'my_rl_pkg.modules.MLPModule'>" in config["_rl_module_spec"]
    components = result.json("summary.json")["compile"]["components"]
    frames = {c["component"].split("/")[0]: c["frames"] for c in components if c["calls"]}
    assert frames["env_runner"] > 0 and frames["learner"] > 0
    assert last_metrics(result)["env_runners/episode_steps"] > 0  # the user's callback


@pytest.mark.slow
def test_two_agent_cartpole_trains_both_policies(tmp_path: Path):
    result = run_with_package(
        tmp_path,
        "experiment=tuned_ppo_multi_agent_cartpole",
        "check.enabled=false",
        "scaling.num_env_runners=0",
        "compile=eager",
        *SMALL,
        "algo.training.minibatch_size=128",
        "stop.env_steps=null",
    )
    assert result.returncode == 0, result.stderr
    metrics = last_metrics(result)
    for policy in ("p0", "p1"):
        assert f"learners/{policy}/total_loss" in metrics
        assert f"env_runners/module_episode_returns_mean/{policy}" in metrics
    summary = result.json("summary.json")
    assert set(summary["final_module_episode_returns_mean"]) == {"p0", "p1"}
    # Compile wraps each module of the MultiRLModule, on the EnvRunner and the Learner.
    for component in summary["compile"]["components"]:
        methods = component["methods"]
        for policy in ("p0", "p1"):
            assert any(name.startswith(f"{policy}.") and m["calls"] for name, m in methods.items())
        assert component["took_effect"]


def test_target_mappings_become_objects():
    job = prepared(["experiment=tuned_ppo_multi_agent_cartpole"])
    spec = job.config.rl_module_spec
    assert set(spec.rl_module_specs) == {"p0", "p1"}
    assert job.config.policy_mapping_fn(1, None) == "p1"
    assert job.config.is_multi_agent


def test_pendulum_ppo_builds_rllibs_mean_std_filter_in_each_env_runner():
    factory = prepared(["experiment=tuned_ppo_pendulum"]).config._env_to_module_connector
    assert isinstance(factory(None, None, None), MeanStdFilter)


def test_a_learner_connector_list_builds_each_piece():
    job = prepared(
        [
            "+algo.training.learner_connector=["
            "{_target_: ray.rllib.connectors.learner.AddInfosFromEpisodesToTrainBatch},"
            "{_target_: ray.rllib.connectors.learner.AddNextObservationsFromEpisodesToTrainBatch}]"
        ]
    )
    pieces = job.config._learner_connector(None, None)
    assert [type(p).__name__ for p in pieces] == [
        "AddInfosFromEpisodesToTrainBatch",
        "AddNextObservationsFromEpisodesToTrainBatch",
    ]


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            ["env.id=null", "env.entry_point=collections:OrderedDict"],
            "env.entry_point=collections:OrderedDict made a OrderedDict, not a gymnasium.Env",
        ),
        (
            [
                "+algo.rl_module.rl_module_spec._target_=ray.rllib.core.rl_module:RLModuleSpec",
                "+algo.rl_module.rl_module_spec.module_class=gymnasium:Env",
            ],
            "algo.rl_module.rl_module_spec.module_class: Env is not a subclass of RLModule",
        ),
        (
            ["+algo.rl_module.rl_module_spec._target_=nope.specs:Spec"],
            "algo.rl_module.rl_module_spec._target_: cannot import nope.specs:Spec: no module "
            "named 'nope'",
        ),
        (
            [
                "experiment=tuned_ppo_multi_agent_cartpole",
                "algo.multi_agent.policies_to_train=[p0,p3]",
            ],
            "algo.multi_agent.policies_to_train names policy 'p3'",
        ),
        (
            ["experiment=tuned_ppo_multi_agent_cartpole", "env=cartpole"],
            "algo.multi_agent declares policies but env.id=CartPole-v1 is a single-agent env",
        ),
    ],
)
def test_what_is_not_an_env_a_module_or_a_policy_is_one_line(overrides, expected):
    """In-process, as the CLI's preflight does it (the CLI's own exit is in test_bad_input)."""
    with pytest.raises(ConfigError) as raised:
        job = prepared(overrides)
        preflight.check_env(job.settings, job.config)
    assert expected in str(raised.value) and "\n" not in str(raised.value)


def test_connector_factory_pickles_and_builds_a_fresh_piece_each_call():
    factory = ConnectorFactory(
        {"_target_": "ray.rllib.connectors.env_to_module:MeanStdFilter"}, "where"
    )
    copy = pickle.loads(pickle.dumps(factory))
    first, second = copy(None, None, None), copy(None, None, None)
    assert isinstance(first, MeanStdFilter) and first is not second


def test_policy_table_matches_agent_ids_as_text():
    table = PolicyTable({0: "p0", "1": "p1"})
    assert (table("0"), table(1)) == ("p0", "p1")
    with pytest.raises(KeyError, match="no entry for agent 2"):
        table(2)


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("gymnasium.envs.classic_control:CartPoleEnv", "CartPoleEnv"),
        ("gymnasium.envs.classic_control.CartPoleEnv", "CartPoleEnv"),
        ("gymnasium.envs.classic_control.cartpole:CartPoleEnv.step", "step"),
    ],
)
def test_locate_takes_both_spellings(path: str, expected: str):
    assert locate(path, "key").__name__ == expected


def test_a_user_config_dir_composes_with_the_shipped_groups():
    """What --config-dir adds: the user's env option and experiment, typed like ours."""
    from hydra import compose, initialize_config_dir

    from runner import CONFIG_DIR

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(
            config_name="config",
            overrides=[
                f"hydra.searchpath=[file://{EXAMPLE / 'conf'}]",
                "experiment=corridor_ppo",
                "compile=inductor_default",
            ],
        )
    assert cfg.env.entry_point == "my_rl_pkg.envs:Corridor"
    assert cfg.compile.backend == "inductor"
    assert compose_config()["env"]["id"] == "CartPole-v1"
