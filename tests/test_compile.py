"""torch.compile really happens on EnvRunners and Learners, and matches eager."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch
from conftest import TINY
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.core.columns import Columns
from torch._dynamo.utils import counters

from runner.compile.apply import compile_function
from runner.compile.onnxrt import register
from runner.compile.settings import CompileSpec

TOLERANCE = 1e-5


def components(summary: dict) -> dict[str, dict]:
    return {c["component"]: c for c in summary["compile"]["components"]}


@pytest.mark.parametrize("preset", ["inductor_default"])  # aot_eager: the complete_update test
def test_compile_takes_effect_on_env_runner_and_learner(cli, preset):
    result = cli(*TINY, "stop.iterations=3", f"compile={preset}")
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


def test_remote_env_runner_and_remote_learner_compile(cli):
    """(aot_eager on the local ones: above; inductor on recreated remote EnvRunners, and
    compile=none's zero frames: tests/test_faults.py.)"""
    overrides = ["scaling.num_env_runners=1", "scaling.num_learners=1", "compile=inductor_default"]
    result = cli(*TINY, "stop.iterations=2", *overrides)
    assert result.returncode == 0, result.stderr
    parts = components(result.json("summary.json"))
    main_pid = parts["env_runner/0"]["pid"]
    for name in ("env_runner/1", "learner/0"):
        assert parts[name]["took_effect"] and parts[name]["frames"] > 0, parts[name]
        assert parts[name]["pid"] != main_pid
    assert parts["env_runner/1"]["pid"] != parts["learner/0"]["pid"]
    assert parts["env_runner/1"]["max_abs_diff"] <= TOLERANCE


def test_onnxrt_on_env_runners_matches_eager_after_weight_syncs(cli):
    result = cli(*TINY, "stop.iterations=3", "compile=onnxrt_default")
    assert result.returncode == 0, result.stderr
    parts = components(result.json("summary.json"))
    assert parts["env_runner/0"]["took_effect"]
    assert parts["learner/0"]["methods"] == {}  # onnxrt is inference only
    # Each iteration's weight sync: one rebuild of the session with the new weights.
    assert parts["env_runner/0"]["session_rebuilds"] >= 2
    assert parts["env_runner/0"]["rebuild_seconds"] > 0
    assert all(r["compile_max_abs_diff"] <= TOLERANCE for r in result.jsonl("metrics.jsonl"))


def test_complete_update_compiles_the_learner_update(cli):
    result = cli(
        *TINY,
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
