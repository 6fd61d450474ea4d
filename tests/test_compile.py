"""torch.compile really happens on EnvRunners and Learners, and matches eager."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.core.columns import Columns
from torch._dynamo.callback import CallbackTrigger, callback_handler
from torch._dynamo.utils import counters

from runner.compile.apply import CompiledCall, compile_function, counts
from runner.compile.onnxrt import register
from runner.compile.settings import CompileSpec

TOLERANCE = 1e-5


def components(summary: dict) -> dict[str, dict]:
    return {c["component"]: c for c in summary["compile"]["components"]}


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["inductor_default"])  # aot_eager: the complete_update test
def test_compile_takes_effect_on_env_runner_and_learner(cli, preset):
    result = cli("debug=tiny", "stop.iterations=3", f"compile={preset}")
    assert result.returncode == 0, result.stderr
    summary = result.json("summary.json")
    parts = components(summary)
    for name in ("env_runner/0", "learner/0"):
        assert parts[name]["took_effect"], parts[name]
        assert parts[name]["frames"] > 0 and parts[name]["compile_seconds"] > 0
    assert parts["env_runner/0"]["methods"]["default._forward_exploration"]["calls"] > 0
    assert parts["env_runner/0"]["recompiles"] == 0  # the warm-up batch matched real ones
    assert parts["learner/0"]["methods"]["default_policy._forward_train"]["calls"] > 0
    # After every iteration's weight sync: compiled == eager on the last real batch.
    rows = result.jsonl("metrics.jsonl")
    assert len(rows) == 3
    assert all(r["compile_max_abs_diff"] <= TOLERANCE for r in rows)
    assert summary["compile"]["applied"] is True
    assert f"compile {preset.split('_')[0]}" in result.stdout


@pytest.mark.slow
def test_remote_env_runner_and_remote_learner_compile(cli):
    """(aot_eager on the local ones: above; inductor on recreated remote EnvRunners, and
    compile=none's zero frames: tests/test_faults.py.) reduce-overhead on these CPU modules:
    inductor compiles them and skips CUDA graphs, and each component says so."""
    overrides = ["scaling.num_env_runners=1", "scaling.num_learners=1", "compile=inductor_ro"]
    result = cli("debug=tiny", "stop.iterations=2", *overrides)
    assert result.returncode == 0, result.stderr
    parts = components(result.json("summary.json"))
    main_pid = parts["env_runner/0"]["pid"]
    for name in ("env_runner/1", "learner/0"):
        part = parts[name]
        assert part["took_effect"] and part["frames"] > 0, part
        assert part["pid"] != main_pid
        assert part["cudagraph_skips"] >= 1 and part["cudagraph_recordings"] == 0, part
        assert (part["device"], part["device_name"]) == ("cpu", None)
        # 1 CPU each: 1 compile thread, where inductor's default is this machine's cores.
        assert part["compile_threads"] == 1
    assert parts["env_runner/1"]["pid"] != parts["learner/0"]["pid"]
    assert parts["env_runner/1"]["max_abs_diff"] <= TOLERANCE
    assert result.json("summary.json")["gpus_used"] == {}
    assert ", CUDA graphs recorded 0 and skipped " in result.stdout


@pytest.mark.slow
def test_onnxrt_on_env_runners_matches_eager_after_weight_syncs(cli):
    """docs/compile.md's onnxrt command (planned by the page's test): a remote EnvRunner's
    session, rebuilt with the weights each sync brings."""
    result = cli(
        "debug=tiny", "stop.iterations=3", "compile=onnxrt_default", "scaling.num_env_runners=1"
    )
    assert result.returncode == 0, result.stderr
    assert "onnxrt session rebuilds after weight syncs" in result.stdout
    parts = components(result.json("summary.json"))
    assert parts["env_runner/1"]["took_effect"]
    assert parts["learner/0"]["methods"] == {}  # onnxrt is inference only
    # Each iteration's weight sync: one rebuild of the session with the new weights.
    assert parts["env_runner/1"]["session_rebuilds"] >= 2
    assert parts["env_runner/1"]["rebuild_seconds"] > 0
    assert all(r["compile_max_abs_diff"] <= TOLERANCE for r in result.jsonl("metrics.jsonl"))


@pytest.mark.slow
def test_complete_update_compiles_the_learner_update(cli):
    result = cli(
        "debug=tiny",
        "stop.iterations=3",
        "compile=aot_eager",
        "compile.env_runners=false",
        "compile.learner_granularity=complete_update",
    )
    assert result.returncode == 0, result.stderr
    learner = components(result.json("summary.json"))["learner/0"]
    assert set(learner["methods"]) == {"complete_update"}
    assert learner["took_effect"] and learner["frames"] > 0


def ppo_cartpole_module() -> tuple[torch.nn.Module, gym.Env]:
    env = gym.make("CartPole-v1")
    module = PPOConfig().environment("CartPole-v1").get_rl_module_spec(env=env).build()
    return module, env


def test_onnxrt_backend_matches_eager_on_batch_sizes_and_weight_changes():
    """Weights baked in as initializers: equal to eager at batch 1, 4 and 16, and again
    after each in-place weight change, with exactly one session rebuild per change for
    the graph that is called."""
    register()
    module, env = ppo_cartpole_module()
    obs, _ = env.reset(seed=0)
    spec = CompileSpec("onnxrt", None, None, True, False, "forward_train")
    compiled = compile_function(spec, module._forward_exploration)

    def gap(batch_size: int) -> float:
        batch = {Columns.OBS: torch.tensor(obs).repeat(batch_size, 1) + torch.randn(batch_size, 4)}
        ours = compiled(batch)[Columns.ACTION_DIST_INPUTS]
        theirs = module._forward_exploration(batch)[Columns.ACTION_DIST_INPUTS]
        return float((ours - theirs).abs().max())

    def rebuilds() -> int:
        return counters["onnxrt"]["rebuilds"]

    probe = {Columns.OBS: torch.tensor(obs)[None]}
    for batch_size in (1, 4, 16):
        assert gap(batch_size) <= TOLERANCE
    torch.manual_seed(0)
    for change in range(2):
        before, start = module._forward_exploration(probe)[Columns.ACTION_DIST_INPUTS], rebuilds()
        with torch.no_grad():
            for p in module.parameters():
                p.add_(0.05 * torch.randn_like(p))  # in place, as a weight sync writes them
        after = compiled(probe)[Columns.ACTION_DIST_INPUTS]
        assert float((after - before).abs().max()) > 1e-3  # the compiled module saw it
        assert rebuilds() == start + 1, change
        compiled(probe)
        assert rebuilds() == start + 1  # no change since: no rebuild
    for batch_size in (1, 4, 16):  # each batch size's graph rebuilds once, then matches
        assert gap(batch_size) <= TOLERANCE


def spec_for(backend: str, mode: str | None = None) -> CompileSpec:
    return CompileSpec(backend, mode, None, True, False, "forward_train")


def test_cuda_graph_recordings_and_skips_are_counted_per_compiled_call():
    """No GPU here: torch's own CUDAGRAPH_RECORDING callback, which cudagraph trees fire
    around each recording, is fired by hand to count one; the cudagraphs backend's skip of
    CPU tensors, and its reason, are real."""
    torch._dynamo.reset()  # also clears dynamo's callbacks: compile_function adds ours back
    module = torch.nn.Linear(4, 2)
    call = CompiledCall(module, compile_function(spec_for("cudagraphs"), module), "linear")
    call(torch.randn(3, 4))
    stats = call.stats()
    assert stats["cudagraph_skips"] == 1 and stats["cudagraph_recordings"] == 0
    assert [r.split(" (")[0] for r in stats["cudagraph_skip_reasons"]] == ["cpu device"]

    def records_a_graph(x: torch.Tensor) -> torch.Tensor:
        with callback_handler.install_callbacks(CallbackTrigger.CUDAGRAPH_RECORDING, "0/0"):
            return x

    before = counts()["cudagraph_recordings"]
    by_hand = CompiledCall(records_a_graph, records_a_graph, "by hand")
    by_hand(torch.ones(1))
    assert by_hand.stats()["cudagraph_recordings"] == 1
    assert counts()["cudagraph_recordings"] == before + 1


def test_dqn_exploration_mutates_an_inputs_storage_and_takes_the_timestep_as_an_int():
    """What DQN's exploration graph holds for CUDA graphs (the warning check_placement gives),
    found on the CPU with inductor's own check on the graph inductor gets: epsilon is written
    with `Tensor.data = ...`, an input storage mutation, for which inductor skips CUDA graphs;
    and after the second distinct timestep `t` is a symbolic int input, on which cudagraph
    trees would key one recording per value. PPO's graph has neither."""
    from ray.rllib.algorithms.dqn import DQNConfig
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.cudagraph_utils import (
        get_input_storage_mutation_info,
        get_input_storage_mutation_reason,
    )

    def graphs(config) -> list[dict]:
        torch._dynamo.reset()
        env = gym.make("CartPole-v1")
        module = config.environment("CartPole-v1").get_rl_module_spec(env=env).build().eval()
        seen = []

        def forward(gm, inputs):
            info = get_input_storage_mutation_info(gm)
            seen.append(
                {
                    "storage_mutation": get_input_storage_mutation_reason(info),
                    "int_inputs": sum(isinstance(x, torch.SymInt) for x in inputs),
                }
            )
            return gm

        # As inductor traces it: AOTAutograd keeping inference input mutations in the graph.
        backend = aot_autograd(fw_compiler=forward, keep_inference_input_mutations=True)
        compiled = torch.compile(module._forward_exploration, backend=backend)
        obs = torch.as_tensor(env.reset(seed=0)[0])[None]
        with torch.no_grad():
            for t in range(0, 40, 4):
                compiled({Columns.OBS: obs}, t=t)
        return seen

    dqn = graphs(DQNConfig())
    assert len(dqn) == 2  # one recompile, at the second timestep, then t is symbolic
    assert all(g["storage_mutation"].startswith("input storage mutation") for g in dqn)
    assert [g["int_inputs"] for g in dqn] == [0, 1]
    assert graphs(PPOConfig()) == [{"storage_mutation": None, "int_inputs": 0}]


def test_a_sampling_forward_pass_has_no_compiled_gap_to_report():
    """DQN's exploration draws its epsilon-greedy actions inside the module: compiled and
    eager replays of one input differ by chance (a gap of a whole action), so the report
    gives none, where PPO's exploration (logits; the connector samples) gives its gap."""
    from ray.rllib.algorithms.dqn import DQNConfig

    env = gym.make("CartPole-v1")
    obs = torch.as_tensor(env.reset(seed=0)[0])[None].repeat(64, 1)
    gaps = {}
    for name, config in {"dqn": DQNConfig(), "ppo": PPOConfig()}.items():
        module = config.environment("CartPole-v1").get_rl_module_spec(env=env).build().eval()
        method = module._forward_exploration
        call = CompiledCall(method, torch.compile(method, backend="eager"), name)
        with torch.no_grad():
            call({Columns.OBS: obs}, t=0)  # DQN's epsilon starts at 1: every action random
            gaps[name] = call.max_abs_diff()
    assert gaps == {"dqn": None, "ppo": 0.0}


@pytest.mark.slow
def test_dqn_exploration_with_static_shapes_recompiles_per_timestep_up_to_the_limit():
    """compile.dynamic=false specializes on the int timestep (the warning check_placement
    gives): a frame per timestep until dynamo's recompile limit, then eager code."""
    from ray.rllib.algorithms.dqn import DQNConfig

    env = gym.make("CartPole-v1")
    obs = torch.as_tensor(env.reset(seed=0)[0])[None]
    frames = {}
    for dynamic in (False, None):
        torch._dynamo.reset()
        module = DQNConfig().environment("CartPole-v1").get_rl_module_spec(env=env).build()
        spec = CompileSpec("aot_eager", None, dynamic, True, False, "forward_train")
        fn = module._forward_exploration
        call = CompiledCall(fn, compile_function(spec, fn), "dqn")
        with torch.no_grad():
            for t in range(20):
                call({Columns.OBS: obs}, t=t)
        frames[dynamic] = call.stats()["frames"]
    assert frames == {False: torch._dynamo.config.recompile_limit, None: 2}
