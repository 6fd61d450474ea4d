"""Use what you trained, for real. The README's "Use what you trained" commands run here
(tiny CartPole PPO training with record.every, evaluate on two remote EnvRunners, evaluate
with video, export), and a tiny Pendulum SAC run is evaluated and exported. Checked:
eval.json against episodes.csv and RLlib's own mean, videos decoded back with the library
that wrote them, export parity at batch 1 and 16, the README's onnxruntime-only script
against the torch module, and the bad input of each."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import imageio.v2 as imageio
import numpy as np
import onnxruntime as ort
import pytest
import torch
from cli_call import call
from conftest import cli_env, run_cli
from ray.rllib.algorithms.dqn import DQNConfig
from ray.rllib.core.columns import Columns
from readme import commands, python_blocks
from test_readme import run_block

from runner.algorithms import onnx_export as export
from runner.algorithms import trained
from runner.results import checkpoints

TESTS = Path(__file__).resolve().parent
README_SECTION = "Use what you trained"
FAULTY = "faulty_env:FaultyCartPole"  # made without a render mode: it draws no frames
WITH_TESTS = {"PYTHONPATH": str(TESTS)}  # faulty_env and exotic_module are imported from here
# SAC on Pendulum, small enough for a few seconds an iteration: learning starts at once.
TINY_SAC = ("algo=sac", "env=pendulum", "debug=tiny")


def _train(tmp_path_factory, name: str, *overrides: str) -> Path:
    cwd = tmp_path_factory.mktemp(name)
    result = run_cli(cwd, *overrides, "checkpoint.every=0", env=WITH_TESTS)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.run_dir


@pytest.fixture(scope="module")
def readme_outputs(tmp_path_factory) -> Path:
    """The README's "Use what you trained" commands, run as test_readme runs every block
    (tiny training, two remote evaluation EnvRunners): train, evaluate, video, export."""
    cwd = tmp_path_factory.mktemp("readme")
    run_block([c.text for c in commands() if c.section == README_SECTION], cwd)
    return cwd / "outputs"


@pytest.fixture(scope="module")
def cartpole(readme_outputs: Path) -> Path:
    return readme_outputs / "cartpole"


@pytest.fixture(scope="module")
def pendulum(tmp_path_factory) -> Path:
    """Two SAC iterations recording one greedy episode after the second (record.every)."""
    return _train(tmp_path_factory, "pendulum", *TINY_SAC, "stop.iterations=2", "record.every=2")


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def _frames(video: Path) -> tuple[np.ndarray, int]:
    reader = imageio.get_reader(video, format="FFMPEG")
    try:
        return reader.get_data(0), reader.count_frames()
    finally:
        reader.close()


@pytest.mark.slow
def test_evaluate_figures_agree_with_episodes_and_the_video_plays(
    readme_outputs: Path, cartpole: Path
):
    run_dir = readme_outputs / "cartpole_eval"
    found = json.loads((run_dir / "eval.json").read_text())
    rows = _rows(run_dir / "episodes.csv")
    returns = [float(r["episode_return"]) for r in rows]
    assert found["episodes"] == len(rows) == 20
    assert {r["env_runner"] for r in rows} == {"1", "2"}  # 10 each, remote
    assert found["episode_return_mean"] == pytest.approx(np.mean(returns))
    assert found["episode_return_std"] == pytest.approx(np.std(returns))
    assert found["episode_return_min"] == min(returns)
    assert found["episode_return_max"] == max(returns)
    lengths = [int(r["episode_len"]) for r in rows]
    assert found["episode_len_mean"] == pytest.approx(np.mean(lengths))
    assert found["rllib_episode_return_mean"] == pytest.approx(found["episode_return_mean"])
    assert returns == [float(n) for n in lengths]  # CartPole: 1 per step
    assert found["checkpoint"] == str(checkpoints.latest(cartpole).resolve())
    assert found["explore"] is False and found["seed"] == 0 and found["videos"] == []
    # The video command: 3 episodes evaluated, then one recorded, and its strip.
    watched = readme_outputs / "cartpole_video"
    assert json.loads((watched / "eval.json").read_text())["episodes"] == 3
    videos = sorted((watched / "videos").glob("eval-episode-*.mp4"))
    assert [v.name for v in videos] == ["eval-episode-0.mp4"]
    frame, count = _frames(videos[0])
    assert frame.shape == (400, 600, 3) and frame.std() > 0  # CartPole's drawing, not blank
    assert count >= 2
    strip = imageio.imread(watched / "videos" / "eval-strip.png")
    assert strip.shape[0] == 120 and strip.shape[1] > 120
    # record.every=2 in training: the second iteration's episode.
    (trained_video,) = (cartpole / "videos").glob("*.mp4")
    assert trained_video.name == "iter_000002-episode-0.mp4"
    assert _frames(trained_video)[0].shape == (400, 600, 3)


@pytest.mark.slow
def test_training_records_an_episode_every_n_iterations(pendulum: Path):
    videos = sorted((pendulum / "videos").glob("*.mp4"))
    assert [v.name for v in videos] == ["iter_000002-episode-0.mp4"]
    frame, count = _frames(videos[0])
    assert frame.shape == (500, 500, 3)
    assert count >= 200  # one whole Pendulum episode: 200 steps (and the reset's frame)


@pytest.mark.slow  # its module's trained run
def test_evaluate_pendulum_sac(pendulum: Path, tmp_path: Path):
    result = run_cli(tmp_path, "task=evaluate", f"checkpoint={pendulum}", "task.episodes=2")
    assert result.returncode == 0, result.stderr[-3000:]
    found = result.json("eval.json")
    rows = _rows(result.run_dir / "episodes.csv")
    assert found["episodes"] == len(rows) == 2 and found["algo"] == "SAC"
    assert [int(r["episode_len"]) for r in rows] == [200, 200]
    assert found["episode_return_mean"] == pytest.approx(
        np.mean([float(r["episode_return"]) for r in rows])
    )


def _torch_outputs(checkpoint: Path, obs: np.ndarray) -> dict[str, np.ndarray]:
    module = next(iter(trained.load_modules(checkpoint).values()))
    with torch.no_grad():
        out = module.forward_inference({Columns.OBS: torch.from_numpy(obs)})
    return {k: v.numpy() for k, v in out.items()}


@pytest.mark.slow  # its module's trained run
def test_export_cartpole_parity_and_the_readme_script(readme_outputs: Path, cartpole: Path):
    run_dir = readme_outputs / "cartpole_onnx"
    policy = json.loads((run_dir / "policy.json").read_text())
    gaps = policy["parity"]["max_abs_diff"]
    assert set(gaps) == {"1", "16"} and max(gaps.values()) <= 1e-5
    assert policy["input"] == {"name": "obs", "dtype": "float32", "shape": ["batch", 4]}
    assert policy["outputs"] == [{"name": "action_dist_inputs", "shape": ["batch", 2]}]
    assert policy["action"]["greedy"] == "argmax(action_dist_inputs, axis=-1)"
    assert policy["action_space"] == {"type": "Discrete", "dtype": "int64", "n": 2, "start": 0}
    assert policy["observation_space"]["high"][1] == "inf"  # JSON has no infinity
    # The README's script, with onnxruntime alone, against the torch module.
    (script,) = python_blocks(README_SECTION)
    (run_dir / "act.py").write_text(script)
    rng = np.random.default_rng(0)
    observations = rng.uniform(-0.2, 0.2, size=(8, 4)).astype(np.float32)
    greedy = _torch_outputs(checkpoints.latest(cartpole), observations)["action_dist_inputs"]
    for obs, logits in zip(observations, greedy, strict=True):
        proc = subprocess.run(
            [sys.executable, "-I", "act.py", json.dumps(obs.tolist())],
            cwd=run_dir,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        assert int(proc.stdout.strip()) == int(np.argmax(logits))


@pytest.mark.slow  # its module's trained run
def test_export_pendulum_sac_parity(pendulum: Path, tmp_path: Path):
    result = run_cli(tmp_path, "task=export", f"checkpoint={pendulum}", "task.batch_sizes=[1,16]")
    assert result.returncode == 0, result.stderr[-3000:]
    policy = result.json("policy.json")
    assert max(policy["parity"]["max_abs_diff"].values()) <= 1e-5
    assert policy["action"]["distribution"] == "TorchSquashedGaussian"
    assert policy["action"]["greedy"] == "tanh(action_dist_inputs[:, :1])"
    assert policy["action"]["to_env"].startswith("clip(low + (a + 1) * (high - low) / 2")
    assert policy["action_space"]["low"] == [-2.0] and policy["action_space"]["high"] == [2.0]
    session = ort.InferenceSession(str(result.run_dir / "policy.onnx"))
    obs = np.array([[1.0, 0.0, 0.5], [0.0, 1.0, -0.5]], dtype=np.float32)
    (ours,) = session.run(None, {"obs": obs})
    theirs = _torch_outputs(checkpoints.latest(pendulum), obs)["action_dist_inputs"]
    assert np.max(np.abs(ours - theirs)) <= 1e-5


BAD = {
    "another env's observations": (
        ["task=evaluate", "env=pendulum"],
        "the checkpoint's policy was trained on observations Box((4,)), but env.id=Pendulum-v1"
        " gives Box((3,))",
    ),
    "export for another env": (
        ["task=export", "env=pendulum"],
        "trained on observations Box((4,)), but env.id=Pendulum-v1 gives Box((3,))",
    ),
    "video of an env that cannot draw": (
        [
            "task=evaluate",
            "task.video=true",
            "env.id=null",
            "env.entry_point=faulty_env:FaultyCartPole",
        ],
        f"env.entry_point={FAULTY} cannot render 'rgb_array' frames",
    ),
    "a checkpoint dir that is not one": (
        ["task=evaluate", "checkpoint=CHECKPOINT/learner_group"],
        "holds no checkpoint",
    ),
    "a push with no repository named": (["task=push"], "task=push needs task.repo_id="),
    "a push with no token": (
        ["task=push", "task.repo_id=me/cartpole"],
        "task=push uploads with a Hugging Face token, and none is set: set HF_TOKEN",
    ),
    "a Hub repository not in the cache, offline": (
        ["task=evaluate", "checkpoint=hf://me/nowhere"],
        "checkpoint=hf://me/nowhere: the Hub repository could not be read",
    ),
}


@pytest.fixture(scope="module")
def exotic(tmp_path_factory) -> Path:
    """A run whose module uses erfinv, which the ONNX exporter cannot convert."""
    return _train(
        tmp_path_factory,
        "exotic",
        "debug=tiny",
        "stop.iterations=1",
        "scaling.num_env_runners=0",
        "+algo.rl_module.rl_module_spec._target_=ray.rllib.core.rl_module.RLModuleSpec",
        "+algo.rl_module.rl_module_spec.module_class=exotic_module:ErfinvPPOModule",
    )


@pytest.mark.slow  # its module's trained run
def test_bad_input_for_trained_policies(cartpole: Path, exotic: Path, tmp_path: Path):
    """One line each, exit 2, within seconds; nothing written beside the new run dir."""
    cases = {
        **BAD,
        "a module ONNX cannot express": (
            ["task=export", f"checkpoint={exotic}"],
            "ErfinvPPOModule cannot be exported to ONNX",
        ),
    }
    latest = str(checkpoints.latest(cartpole))
    runs = []
    for name, (args, _) in cases.items():
        cwd = tmp_path / name.replace(" ", "_").replace("'", "")
        cwd.mkdir()
        args = [a.replace("CHECKPOINT", latest) for a in args]
        if not any(a.startswith("checkpoint=") for a in args):
            args.append(f"checkpoint={cartpole}")
        runs.append((cwd, [*args, "hydra.run.dir=run"]))
    # No Hugging Face token, and the Hub's cache (empty) read offline: no network here.
    hub = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    env = {k: v for k, v in {**os.environ, **WITH_TESTS, **hub}.items() if k != "HF_TOKEN"}
    results = [call(cwd, args, env, timeout=120) for cwd, args in runs]
    for (name, (_, expected)), (cwd, _), result in zip(cases.items(), runs, results, strict=True):
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2, (name, result.stderr[-2000:])
        assert len(lines) == 1 and expected in lines[0], (name, lines)
        assert "Traceback" not in result.stdout + result.stderr, name
        assert result.seconds < 10, (name, result.seconds)
        assert set(cwd.iterdir()) <= {cwd / "run"}, name
        assert not (cwd / "run" / "policy.onnx").exists(), name
        assert not list((cwd / "run").glob(".policy.onnx.tmp")), name


class _NanMean(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.nanmean(dim=-1, keepdim=True)


def test_dueling_dqn_exports_through_the_nanmean_conversion(tmp_path: Path):
    """RLlib's dueling DQN head averages with nanmean, which torch's exporter lacks: the
    export's own conversion matches torch, NaNs included, and the DQN module exports."""
    x = torch.tensor([[1.0, float("nan"), 3.0], [2.0, 4.0, 9.0]])
    export.add_onnx_conversions()
    path = str(tmp_path / "nanmean.onnx")
    torch.onnx.export(_NanMean(), (x,), path, dynamo=False, input_names=["x"])
    (ours,) = ort.InferenceSession(path).run(None, {"x": x.numpy()})
    assert np.array_equal(ours, _NanMean()(x).numpy()) and np.array_equal(ours, [[2.0], [5.0]])

    env = gym.make("CartPole-v1")
    spec = DQNConfig().environment("CartPole-v1").get_rl_module_spec(env=env)
    spec.observation_space, spec.action_space = env.observation_space, env.action_space
    forward = export.InferenceForward(spec.build().eval(), ["actions"])
    obs = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32)
    export._export(forward, torch.from_numpy(obs[:1]), tmp_path / "dqn.onnx", None)
    session = ort.InferenceSession(str(tmp_path / "dqn.onnx"))
    assert export.parity(forward, session, obs, [1, 16]) == {"1": 0.0, "16": 0.0}


def _fill_hub_cache(home: Path, repo_id: str, folder: Path) -> None:
    """huggingface_hub's cache as a download leaves it (refs/main -> a snapshot holding
    the repository's files), so that HF_HUB_OFFLINE=1 reads it: no network here."""
    commit = "0" * 40
    repo = home / "hub" / f"models--{repo_id.replace('/', '--')}"
    shutil.copytree(folder, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)


@pytest.mark.slow  # its module's trained run
def test_push_makes_a_hub_repository_and_hf_reads_it_back(
    cartpole: Path, tmp_path: Path, monkeypatch
):
    """task=push on the README's trained run: the repository's folder (the card
    huggingface_hub's ModelCard reads back, with the evaluation's mean return as its
    model-index; the checkpoint, the ONNX export, the video), sent through HfApi, whose
    network calls are stubbed at its boundary; then checkpoint=hf://... evaluates it from
    huggingface_hub's cache with no network (a real process, HF_HUB_OFFLINE=1)."""
    from huggingface_hub import HfApi, ModelCard

    sent: list[dict] = []
    monkeypatch.setattr(HfApi, "create_repo", lambda self, repo_id, **kw: sent.append(kw))
    monkeypatch.setattr(
        HfApi,
        "upload_folder",
        lambda self, **kw: (sent.append(kw), type("Commit", (), {"commit_url": "https://hf.co/x"}))[
            1
        ],
    )
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    push = ["task=push", f"checkpoint={cartpole}", "task.repo_id=me/cartpole", "task.episodes=3"]
    done = run_cli(tmp_path, *push, run_dir="pushed")
    assert done.returncode == 0, done.stderr
    folder = tmp_path / "pushed" / "hub"
    card = ModelCard.load(folder / "README.md")
    evaluated = json.loads((folder / "eval.json").read_text())
    (result,) = card.data.eval_results
    assert result.metric_type == "mean_reward" and result.dataset_name == "CartPole-v1"
    assert result.metric_value == (
        f"{evaluated['episode_return_mean']:.2f} +/- {evaluated['episode_return_std']:.2f}"
    )
    assert card.data.library_name == "rllib" and "hf://me/cartpole" in card.text
    assert json.loads((folder / "policy.json").read_text())["parity"]["max_abs_diff"]
    assert list((folder / "videos").glob("*.mp4")) and (folder / "policy.onnx").is_file()
    (checkpoint,) = (folder / "checkpoints").iterdir()
    assert checkpoints.problem(checkpoint) is None  # whole, as its manifest says
    assert sent[-1]["repo_id"] == "me/cartpole" and Path(sent[-1]["folder_path"]) == folder
    assert json.loads((tmp_path / "pushed" / "summary.json").read_text())["push"]["url"]

    home = tmp_path / "hf"
    _fill_hub_cache(home, "me/cartpole", folder)
    offline = cli_env(extra={"HF_HOME": str(home), "HF_HUB_OFFLINE": "1"})
    offline.pop("HF_TOKEN", None)
    evaluate = ["task=evaluate", "checkpoint=hf://me/cartpole", "task.episodes=2"]
    read = subprocess.run(
        [sys.executable, "-m", "runner", *evaluate, "hydra.run.dir=from_hub"],
        cwd=tmp_path, env=offline, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert read.returncode == 0, read.stderr
    assert json.loads((tmp_path / "from_hub" / "eval.json").read_text())["episodes"] == 2
    # resume=hf://...: the repository is a run dir; its training goes on one iteration.
    done_before = json.loads((cartpole / "summary.json").read_text())["iterations"]
    more = f"stop.iterations={done_before + 1}"
    resumed = subprocess.run(
        [sys.executable, "-m", "runner", "resume=hf://me/cartpole", more, "hydra.run.dir=resumed"],
        cwd=tmp_path, env=offline, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads((tmp_path / "resumed" / "summary.json").read_text())
    assert summary["iterations"] == done_before + 1 and summary["resumed_from"]
