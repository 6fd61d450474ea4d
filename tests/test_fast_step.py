"""The fast off-policy step (runner/algorithms/fast_step.py) against RLlib's own: the same
losses and gradients on the same transitions, the same weights after K minibatches in one Learner
call as after K of RLlib's calls, the step chosen by default and RLlib's where it cannot
run (with the reason in the run's first lines). RLlib's Learners, connectors and buffers
run for real, from the runner's configs. A killed EnvRunner under the fast step, and its
checkpoints restored on RLlib's step and back: tests/test_faults.py."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import compose_config, prepared
from episodes import chunks
from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
from ray.rllib.algorithms.sac.torch.default_sac_torch_rl_module import DefaultSACTorchRLModule
from ray.rllib.algorithms.sac.torch.sac_torch_learner import SACTorchLearner
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME
from ray.rllib.utils.replay_buffers import PrioritizedEpisodeReplayBuffer
from ray.rllib.utils.torch_utils import convert_to_torch_tensor

from runner.algorithms.fast_step import (
    MINIBATCH_TIMESTEPS,
    FastDQN,
    FastPPOLearner,
    FastSAC,
    FastStep,
)
from runner.algorithms.flat_replay import FlatReplay
from runner.algorithms.reward_scaling import RewardScaling
from runner.algorithms.sac_module import SB3QCatalog
from runner.errors import ConfigError
from runner.job.app import start_lines

PRESETS = {
    "dqn": ("experiment=tuned_dqn_cartpole", "CartPole-v1"),
    "sac": ("experiment=tuned_sac_pendulum", "Pendulum-v1"),
}


def _learner(overrides: list[str], env_id: str):
    config = prepared(overrides).config
    return config, config.build_learner(env=gym.make(env_id))


def learner_for(algo: str, *overrides: str):
    """The preset's AlgorithmConfig as a run makes it, and its Learner built here."""
    return _learner([PRESETS[algo][0], *overrides], PRESETS[algo][1])


def filled(algo: str, config) -> tuple[FlatReplay, PrioritizedEpisodeReplayBuffer]:
    """The preset's buffer (prioritized or uniform) and RLlib's prioritized one, filled
    with the same episodes (all at the same priority, RLlib's samples are uniform too)."""
    buffer = config.replay_buffer_config
    alpha = buffer["alpha"] if buffer["type"].startswith("Prioritized") else None
    flat = FlatReplay(10_000, alpha=alpha, seed=0)
    ours = PrioritizedEpisodeReplayBuffer(capacity=10_000, alpha=alpha or 1.0)
    for call in chunks(seed=7, steps=200, chunk=5, env_id=PRESETS[algo][1], limit=60):
        flat.add(call)
        ours.add(call)
    return flat, ours


def losses_and_grads(learner, batch: dict) -> tuple[dict, list[torch.Tensor]]:
    torch.manual_seed(0)  # SAC's forward_train samples actions
    fwd = learner.module.forward_train(batch)
    losses = learner.compute_losses(fwd_out=fwd, batch=batch)
    grads = learner.compute_gradients(losses)
    return (
        {m: float(v) for m, v in losses.items()},
        [g.detach().clone() for g in grads.values() if g is not None],
    )


@pytest.mark.parametrize("algo", ["dqn", "sac"])
def test_same_losses_and_gradients_as_rllibs_learner(algo: str):
    """RLlib's buffer samples 64 n-step items and its Learner connector batches them;
    the flat buffer gives the same (step, n) items as columns. RLlib's Learner computes
    the same losses and gradients from both batches."""
    config, learner = learner_for(algo, "algo.fast_step.enabled=false")
    flat, ours = filled(algo, config)
    episodes = ours.sample(num_items=64, n_step=(2, 5), gamma=config.gamma, beta=0.4)
    theirs = learner._learner_connector(
        rl_module=learner.module,
        batch={},
        episodes=episodes,
        shared_data={},
        metrics=learner.metrics,
    )[DEFAULT_MODULE_ID]
    row_of = {flat.arrays["obs"][r].tobytes(): r for r in np.flatnonzero(flat.is_step)}
    rows = np.array(
        [row_of[np.asarray(e.get_observations(0), np.float32).tobytes()] for e in episodes]
    )
    n = np.array([e.get_extra_model_outputs("n_step")[0] for e in episodes])
    mine = flat.transitions(rows, n, config.gamma, beta=0.4).columns
    # RLlib's weights use the steps' priorities of its own buffer: both are new (all
    # equal), so both are 1.
    assert set(mine) == set(theirs)
    for name, column in mine.items():
        np.testing.assert_allclose(
            np.asarray(column, np.float64),
            theirs[name].numpy().astype(np.float64),
            rtol=1e-5,
            atol=1e-6,
        )
    ours_batch = convert_to_torch_tensor({k: np.asarray(v) for k, v in mine.items()})
    ours_batch["actions"] = ours_batch["actions"].to(theirs["actions"].dtype)
    loss_a, grads_a = losses_and_grads(learner, {DEFAULT_MODULE_ID: theirs})
    loss_b, grads_b = losses_and_grads(learner, {DEFAULT_MODULE_ID: ours_batch})
    assert loss_a == pytest.approx(loss_b, rel=1e-5)
    assert len(grads_a) == len(grads_b) > 0
    for a, b in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def _weights(learner) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in learner.module[DEFAULT_MODULE_ID].get_state().items()}


@pytest.mark.parametrize(("algo", "every"), [("dqn", 2), ("sac", 1)])
def test_k_minibatches_in_one_call_equal_k_of_rllibs_calls(algo: str, every: int):
    """Four minibatches in one fast Learner call (each with the env-step count it
    stands for) leave the module, its target networks included, as four calls of
    RLlib's Learner do: DQN's target updated every 2 env steps, SAC's Polyak step after
    every minibatch."""
    freq = f"algo.training.target_network_update_freq={every}"
    config, fast = learner_for(algo, freq)
    _, plain = learner_for(algo, freq, "algo.fast_step.enabled=false")
    assert type(fast).__name__.startswith("Fast") and not type(plain).__name__.startswith("Fast")
    plain.set_state(fast.get_state())
    flat, _ = filled(algo, config)
    size, k = config.total_train_batch_size, 4
    drawn = flat.sample(k * size, config.n_step, config.gamma, 0.4)
    assert drawn is not None
    at = [10, 11, 12, 13]
    torch.manual_seed(1)
    fast.update(
        batch=MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(drawn.columns)}, k * size),
        minibatch_size=size,
        num_epochs=1,
        timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: at[-1], MINIBATCH_TIMESTEPS: at},
    )
    torch.manual_seed(1)
    for i in range(k):
        part = {name: c[i * size : (i + 1) * size] for name, c in drawn.columns.items()}
        plain.update(
            batch=MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(part)}, size),
            timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: at[i]},
        )
    before = _weights(learner_for(algo, freq)[1])
    after_fast, after_plain = _weights(fast), _weights(plain)
    targets = [name for name in after_fast if "target" in name]
    assert targets
    for name in after_fast:
        np.testing.assert_allclose(after_fast[name], after_plain[name], rtol=1e-5, atol=1e-6)
    assert any(not np.allclose(after_fast[n], before[n]) for n in targets)


def test_ppos_fast_learner_leaves_the_weights_as_rllibs_does():
    """PPO Acrobot's preset (minibatches of 64, gradients clipped at a global norm of 0.5)
    on the fast Learner and on RLlib's, from the same weights, over the same batch in
    the same minibatch order (2 epochs of 4): one minibatch's clipped gradients are
    RLlib's (the clip really scaled them: their norm, logged, is above 0.5), and the
    weights end as RLlib's leaves them (Adam is blind to a common scale: the gradients
    are compared first)."""
    preset = ["experiment=tuned_ppo_acrobot"]
    config, fast = _learner(preset, "Acrobot-v1")
    _, plain = _learner([*preset, "algo.fast_step.enabled=false"], "Acrobot-v1")
    assert type(fast).__mro__[1:3] == (RewardScaling, FastPPOLearner)
    assert type(plain).__mro__[1:3] == (RewardScaling, PPOTorchLearner)
    plain.set_state(fast.get_state())
    before = _weights(fast)
    rng = np.random.default_rng(0)
    n = 4 * config.minibatch_size
    logits = rng.normal(size=(n, 3)).astype(np.float32)
    actions = rng.integers(0, 3, n)
    logp = logits[np.arange(n), actions] - np.log(np.exp(logits).sum(axis=1))
    columns = {
        "obs": rng.normal(size=(n, 6)).astype(np.float32),
        "actions": actions,
        "action_dist_inputs": logits,
        "action_logp": logp.astype(np.float32),
        "advantages": rng.normal(size=n).astype(np.float32),
        "value_targets": rng.normal(-50, 20, size=n).astype(np.float32),
    }
    first = convert_to_torch_tensor({k: v[: config.minibatch_size] for k, v in columns.items()})
    clipped = []
    for learner in (fast, plain):
        fwd = learner.module.forward_train({DEFAULT_MODULE_ID: first})
        losses = learner.compute_losses(fwd_out=fwd, batch={DEFAULT_MODULE_ID: first})
        grads = learner.postprocess_gradients(learner.compute_gradients(losses))
        clipped.append([grad.clone() for grad in grads.values()])
    assert len(clipped[0]) == len(clipped[1]) > 0
    for ours, theirs in zip(*clipped, strict=True):  # both in the module's parameter order
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-7)
    norms = []
    for learner in (fast, plain):
        results = learner.update(
            batch=MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(columns)}, n),
            minibatch_size=config.minibatch_size,
            num_epochs=2,
            shuffle_batch_per_epoch=False,
            timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: n},
        )
        logged = results[DEFAULT_MODULE_ID]["gradients_default_optimizer_global_norm"]
        norms.append(float(logged.peek()))
    after_fast, after_plain = _weights(fast), _weights(plain)
    for name in after_fast:
        np.testing.assert_allclose(after_fast[name], after_plain[name], rtol=1e-5, atol=1e-6)
    assert any(not np.allclose(after_fast[k], before[k]) for k in before)
    assert norms[0] == pytest.approx(norms[1], rel=1e-5) and norms[0] > config.grad_clip


def _linears(net: torch.nn.Module) -> list[tuple[int, int]]:
    return [tuple(m.weight.shape) for m in net.modules() if isinstance(m, torch.nn.Linear)]


def test_the_sac_preset_has_sb3s_networks_and_rllibs_forward_and_gradients():
    """The SAC preset's module (runner/algorithms/sac_module.py) has SB3's networks at the preset's
    width (conf/tuned/sac_pendulum.yaml): each Q [obs, action] 4->128->128->1, the policy
    3->128->128->2. Its training forward pass
    and the fast Learner's one backward pass give the same outputs, losses and gradients
    as RLlib's forward pass (run on the same module) and RLlib's SAC Learner's backward
    pass per optimizer."""
    _, learner = learner_for("sac")
    module = learner.module[DEFAULT_MODULE_ID]
    assert _linears(module.qf_encoder) + _linears(module.qf) == [(128, 4), (128, 128), (1, 128)]
    assert _linears(module.pi_encoder) + _linears(module.pi) == [(128, 3), (128, 128), (2, 128)]
    rng = np.random.default_rng(0)
    batch = convert_to_torch_tensor(
        {
            "obs": rng.normal(size=(64, 3)).astype(np.float32),
            "new_obs": rng.normal(size=(64, 3)).astype(np.float32),
            "actions": rng.uniform(-2, 2, size=(64, 1)).astype(np.float32),
            "rewards": rng.normal(size=64).astype(np.float32),
            "terminateds": rng.random(64) < 0.1,
            "n_step": np.ones(64, np.float32),
            "weights": np.ones(64, np.float32),
        }
    )

    def run(forward, backward) -> tuple[dict, dict, list[torch.Tensor]]:
        torch.manual_seed(0)
        out = forward(batch)
        losses = learner.compute_losses(
            fwd_out={DEFAULT_MODULE_ID: out}, batch={DEFAULT_MODULE_ID: batch}
        )
        grads = backward(learner, losses)
        return out, losses, [g.detach().clone() for g in grads.values() if g is not None]

    rllib = run(
        lambda b: DefaultSACTorchRLModule._forward_train_continuous(module, b),
        SACTorchLearner.compute_gradients,
    )
    lean = run(module._forward_train_continuous, type(learner).compute_gradients)
    assert type(module).__name__ == "SB3QSAC" and type(learner).__name__ == "FastSACLearner"
    assert set(rllib[0]) == set(lean[0])
    for key, value in rllib[0].items():
        torch.testing.assert_close(lean[0][key], value, msg=key)
    assert float(rllib[1][DEFAULT_MODULE_ID]) == pytest.approx(float(lean[1][DEFAULT_MODULE_ID]))
    assert len(rllib[2]) == len(lean[2]) == len(learner._params)
    for a, b in zip(rllib[2], lean[2], strict=True):
        torch.testing.assert_close(a, b)


def test_sb3q_sac_leaves_discrete_actions_to_rllib_and_refuses_unflat_spaces():
    """SB3QSAC on CartPole (discrete actions: RLlib's Q network per action, which
    encodes no action) builds RLlib's SAC networks and runs RLlib's forward pass; a Box
    action space that is not flat is one ConfigError line naming the fix."""
    spec = (
        "{_target_:ray.rllib.core.rl_module.rl_module.RLModuleSpec,"
        "module_class:runner.algorithms.sac_module:SB3QSAC}"
    )
    config, learner = _learner(
        ["algo=sac", "env=cartpole", f"+algo.rl_module.rl_module_spec={spec}"], "CartPole-v1"
    )
    module = learner.module[DEFAULT_MODULE_ID]
    assert type(module).__name__ == "SB3QSAC"
    assert _linears(module.qf_encoder) == [(256, 4), (256, 256)]  # RLlib's, obs only
    obs = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
    out = module.forward_train(
        convert_to_torch_tensor({"obs": obs, "new_obs": obs, "actions": np.zeros(8, np.int64)})
    )
    assert out["qf_preds"].shape == (8, 2)
    model_config = {**config.model_config, "twin_q": True}
    flat_obs, square = gym.spaces.Box(-1, 1, (3,)), gym.spaces.Box(-1, 1, (2, 2))
    with pytest.raises(ConfigError, match="takes flat Box observations and actions"):
        SB3QCatalog(flat_obs, square, model_config).build_qf_encoder("torch")


def test_a_non_finite_gradient_takes_rllibs_own_path():
    """The fast Learner's one finiteness check hands a NaN gradient to RLlib's
    apply_gradients, which zeroes it before the (fused) Adam step: the weights stay
    finite. Without that hand-over, fused Adam would write NaN into them."""
    config, learner = learner_for("dqn")
    assert all(o.defaults["fused"] for o in learner._named_optimizers.values())
    flat, _ = filled("dqn", config)
    drawn = flat.sample(32, config.n_step, config.gamma, 0.4)
    batch = {DEFAULT_MODULE_ID: convert_to_torch_tensor(dict(drawn.columns))}
    grads = learner.compute_gradients(
        learner.compute_losses(fwd_out=learner.module.forward_train(batch), batch=batch)
    )
    assert learner._finite_without_extras(grads)
    # A gradient that is not its parameter's own (a user's postprocessing): RLlib's path.
    assert not learner._finite_without_extras({k: g.clone() for k, g in grads.items()})
    first = next(iter(grads))
    grads[first].fill_(float("nan"))
    assert not learner._finite_without_extras(grads)
    learner.apply_gradients(grads)
    assert all(torch.isfinite(p).all() for p in learner._params.values())


def test_the_fast_step_is_the_default_and_says_so():
    """algo=sac env=pendulum and algo=dqn run the fast step, and their first lines say
    so; a config it cannot run takes RLlib's step with the reason; PPO keeps RLlib's step
    on the fast Learner, and says so."""
    lines, learners = {}, {}
    for name, overrides in {
        "sac": ["algo=sac", "env=pendulum"],
        "dqn": ["algo=dqn"],
        "off": ["algo=dqn", "algo.fast_step.enabled=false"],
        "two_learners": ["algo=dqn", "scaling.num_learners=2", "scaling.num_cpus_per_learner=1"],
        "buffer": [
            "algo=dqn",
            "algo.training.replay_buffer_config.type=MultiAgentEpisodeReplayBuffer",
        ],
        "ppo": ["algo=ppo"],
        "ppo_off": ["algo=ppo", "algo.fast_step.enabled=false"],
        "mean_std": [
            "algo=sac",
            "env=pendulum",
            "+algo.env_runners.env_to_module_connector="
            "{_target_:ray.rllib.connectors.env_to_module.MeanStdFilter}",
        ],
        "own_learner_connector": [
            "algo=dqn",
            "+algo.training.learner_connector="
            "{_target_:ray.rllib.connectors.learner.AddInfosFromEpisodesToTrainBatch}",
        ],
    }.items():
        job = prepared(overrides)
        lines[name] = [
            x for x in start_lines(job, {}, compose_config(overrides)) if "training step" in x
        ]
        learners[name] = job.config.learner_class
        if name in ("sac", "dqn", "mean_std"):
            assert issubclass(job.config.algo_class, FastDQN if name == "dqn" else FastSAC)
        elif not name.startswith("ppo"):
            assert not issubclass(job.config.algo_class, FastStep)
    assert "fast off-policy step (16 updates per Learner call" in lines["sac"][0]  # its preset's
    assert "fast off-policy step (32 updates per Learner call" in lines["dqn"][0]  # as SAC
    assert lines["off"] == ["training step: RLlib's own (algo.fast_step.enabled=false)"]
    assert "scaling.num_learners=2" in lines["two_learners"][0]
    assert "replay_buffer_config.type=MultiAgentEpisodeReplayBuffer" in lines["buffer"][0]
    assert "its Learner's updates the runner's fast ones" in lines["ppo"][0]
    assert learners["ppo"] is FastPPOLearner
    assert lines["ppo_off"] == ["training step: RLlib's own (algo.fast_step.enabled=false)"]
    assert lines["mean_std"] == lines["sac"]  # the Learner reads the stored observations
    assert "the Learner connector pipeline is the user's" in lines["own_learner_connector"][0]
