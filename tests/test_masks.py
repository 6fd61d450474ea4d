"""Action masks from YAML: an observation with an `action_mask` reaches RLlib's
action-masking RLModule as it expects it, the module never picks a masked action
(exploring or greedy), a run of an env that fails on a masked action trains, and a
PettingZoo classic game (tictactoe) trains against random legal moves with its win rate
logged. Env: tests/masked_env.py (it raises on a masked action)."""

from __future__ import annotations

import csv
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import prepared, run_cli
from ray.rllib.core.columns import Columns

from runner.algorithms.algorithm_config import build_module
from runner.envs import make_env
from runner.envs.masking import MAIN, RANDOM, MaskedPPO, RandomLegalMoves, Seats
from runner.errors import ConfigError

TESTS = Path(__file__).resolve().parent
MASKED = ["env.id=null", "env.entry_point=masked_env:MaskedChoice"]
TICTACTOE = ["env=tictactoe"]


pytestmark = pytest.mark.usefixtures("tests_importable")


def test_a_masked_observation_reaches_the_masking_module_as_floats():
    config = prepared(MASKED).config
    env = make_env(config)
    obs, _ = env.reset(seed=0)
    assert set(obs) == {"observations", "action_mask"}
    assert obs["observations"].dtype == np.float32 and obs["action_mask"].dtype == np.float32
    assert set(np.unique(obs["observations"])) <= {0.0, 1.0}  # codes 0..3 scaled by bounds
    assert config.rl_module_spec.module_class is MaskedPPO


def _masks(n: int, rng: np.random.Generator) -> torch.Tensor:
    masks = (rng.random((n, 6)) < 0.4).astype(np.float32)
    masks[np.arange(n), rng.integers(0, 6, n)] = 1.0  # at least one legal action
    return torch.as_tensor(masks)


def test_the_masking_module_never_picks_a_masked_action():
    config = prepared(MASKED).config
    module = build_module(config, make_env(config))
    masks = _masks(2000, np.random.default_rng(0))

    def batch() -> dict:
        return {Columns.OBS: {"observations": masks * 1.0, "action_mask": masks.clone()}}

    with torch.no_grad():
        explored = module.forward_exploration(batch())[Columns.ACTION_DIST_INPUTS]
        greedy = module.forward_inference(batch())[Columns.ACTION_DIST_INPUTS]
    dist = module.get_exploration_action_dist_cls().from_logits(explored)
    for _ in range(5):
        sampled = dist.sample()
        assert masks[torch.arange(len(masks)), sampled].all()
    assert masks[torch.arange(len(masks)), greedy.argmax(-1)].all()
    # Masked actions have no probability at all, not a small one.
    assert torch.softmax(explored, -1)[masks == 0].max() < 1e-30


def test_masks_and_opponents_that_do_not_fit_are_one_line():
    cases = {
        ("env=cartpole", "env.action_mask=true"): "env.action_mask=true, but env.id=CartPole-v1",
        (*MASKED, "algo=dqn"): "applies for PPO only, not DQN: use algo=ppo",
        ("env=cartpole", "env.opponent=random"): "env.opponent=random is for multi-agent envs",
        (*TICTACTOE, "env.policies=shared"): "env.opponent=random and env.policies=shared",
    }
    for overrides, expected in cases.items():
        with pytest.raises(ConfigError) as caught:
            prepared(list(overrides))
        assert expected in str(caught.value) and "\n" not in str(caught.value), overrides


def test_tictactoe_plays_main_against_random_legal_moves_in_every_seat():
    config = prepared(TICTACTOE).config
    assert set(config.policies) == {MAIN, RANDOM} and config.policies_to_train == [MAIN]
    specs = config.rl_module_spec.rl_module_specs
    assert specs[MAIN].module_class is MaskedPPO
    assert specs[RANDOM].module_class is RandomLegalMoves
    seats = config.policy_mapping_fn
    assert isinstance(seats, Seats)

    class Episode:
        def __init__(self, n: int) -> None:
            self.id_ = f"{zlib.crc32(str(n).encode()):08x}"

    games = [Episode(n) for n in range(400)]
    for game in games:  # one seat main, the other random
        assert sorted(seats(a, game) for a in seats.agents) == [MAIN, RANDOM]
    first = sum(seats(seats.agents[0], g) == MAIN for g in games) / len(games)
    assert 0.4 < first < 0.6  # main plays both seats
    module = build_module(config, make_env(config))[RANDOM]
    masks = _masks(2000, np.random.default_rng(1))
    moves = module.forward_exploration({Columns.OBS: {"action_mask": masks}})[Columns.ACTIONS]
    assert masks[torch.arange(len(masks)), moves].all()
    assert len(set(moves.tolist())) == 6


@pytest.mark.slow
def test_a_masked_env_trains_without_ever_stepping_a_masked_action(tmp_path: Path):
    """The env raises on a masked action: one taken would fail the run."""
    ran = run_cli(
        tmp_path, *MASKED, "debug=tiny", "stop.iterations=2", env={"PYTHONPATH": str(TESTS)}
    )
    assert ran.returncode == 0, ran.stderr
    summary = ran.json("summary.json")
    assert summary["status"] == "finished" and summary["env_steps"] >= 800
    assert "env_runner_error" not in summary


@pytest.mark.slow
def test_tictactoe_trains_from_yaml_and_logs_mains_win_rate(tmp_path: Path):
    ran = run_cli(
        tmp_path, *TICTACTOE, "debug=tiny", "stop.iterations=2", "scaling.num_env_runners=1"
    )
    assert ran.returncode == 0, ran.stderr
    rows = ran.jsonl("metrics.jsonl")
    win, loss = (rows[-1]["metrics"][f"env_runners/{k}"] for k in ("win_rate", "loss_rate"))
    assert 0.0 <= win <= 1.0 and 0.0 <= loss <= 1.0 and win + loss <= 1.0
    assert "illegal" not in ran.stdout.lower()  # PettingZoo's warning on an illegal move
    # Evaluated, a game's return is main's (+1 won, -1 lost, 0 a draw), not the sum (0).
    evaluated = run_cli(
        tmp_path, "task=evaluate", f"checkpoint={ran.run_dir}", "task.episodes=10", run_dir="eval"
    )
    assert evaluated.returncode == 0, evaluated.stderr
    with (evaluated.run_dir / "episodes.csv").open() as f:
        returns = [float(r["episode_return"]) for r in csv.DictReader(f)]
    assert len(returns) == 10 and set(returns) <= {-1.0, 0.0, 1.0} and any(returns)


def test_an_opponent_in_a_game_without_masks_plays_any_action():
    config = prepared(["env=multi_agent_cartpole", "env.opponent=random"]).config
    module = build_module(config, make_env(config))
    assert type(module[MAIN]).__name__ == "DefaultPPOTorchRLModule"  # nothing to mask
    moves = module[RANDOM].forward_exploration({Columns.OBS: torch.zeros(200, 4)})
    assert set(np.asarray(moves[Columns.ACTIONS]).tolist()) == {0, 1}
