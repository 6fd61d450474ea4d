"""Trained agents on the Hugging Face Hub, through huggingface_hub (no HTTP of the runner's
own): a run's folder pushed as a model repository with its card, and `hf://user/name`
read back as a run dir (resume=, checkpoint=), as RL Zoo's push_to_hub/load_from_hub do.

The folder is a run dir the runner can read again: `config.yaml` and
`composed_overrides.yaml` (the trained run's), `checkpoints/<name>/` (the RLlib checkpoint
with its manifest), `policy.onnx` and `policy.json` (the ONNX export and its parity),
`eval.json` and `videos/`, and `README.md`, the model card (`huggingface_hub.ModelCard`,
its `model-index` the evaluation's mean return). The token is huggingface_hub's own:
`HF_TOKEN`, else the one `hf auth login` saved.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from runner.errors import ConfigError, RunnerError, one_line

PREFIX = "hf://"
FOLDER = "hub"  # the repository's folder in the push's run dir
# RL Zoo's tags, which the Hub's filters for reinforcement learning read, and the runner's.
TAGS = ["reinforcement-learning", "deep-reinforcement-learning", "ray-rllib", "rllib-runner"]


def is_hub(path: str) -> bool:
    return path.startswith(PREFIX)


def repo_of(uri: str) -> str:
    """`user/name` from `hf://user/name`; one line if it is not that."""
    repo = uri.removeprefix(PREFIX).strip("/")
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise ConfigError(f"'{uri}' names no Hub repository: give hf://<user or org>/<name>")
    return repo


def download(uri: str, setting: str) -> Path:
    """The repository's files in huggingface_hub's cache (fetched, or with HF_HUB_OFFLINE=1
    the copy already there), as a local dir."""
    from huggingface_hub import snapshot_download

    repo = repo_of(uri)
    try:
        return Path(snapshot_download(repo_id=repo))
    except Exception as ex:  # no network, no such repository, not in the cache offline
        raise ConfigError(
            f"{setting}={uri}: the Hub repository could not be read ({type(ex).__name__}: "
            f"{one_line(ex)}); check the name and the network, or set HF_HUB_OFFLINE=1 to "
            "read huggingface_hub's cache"
        ) from None


def check_token() -> None:
    """A token to push with, before anything runs: one line if there is none."""
    from huggingface_hub import get_token

    if not get_token():
        raise ConfigError(
            "task=push uploads with a Hugging Face token, and none is set: set HF_TOKEN or run "
            "`hf auth login`; task.upload=false writes the repository's folder only"
        )


def card(facts: dict[str, Any]) -> Any:
    """The model card: RL Zoo's metadata (library, tags, the evaluation's mean reward as
    `model-index`) and a page saying what was trained, how it did and how to reproduce it."""
    from huggingface_hub import EvalResult, ModelCard, ModelCardData

    env, algo, ev = facts["env"], facts["algo"], facts["evaluate"]
    data = ModelCardData(
        library_name="rllib",
        tags=[
            "reinforcement-learning",
            "ray-rllib",
            "rllib-runner",
            "deep-reinforcement-learning",
            env,
        ],
        model_name=f"{algo}-{env}",
        eval_results=[
            EvalResult(
                task_type="reinforcement-learning",
                task_name="reinforcement-learning",
                dataset_type=env,
                dataset_name=env,
                metric_type="mean_reward",
                metric_value=f"{ev['episode_return_mean']:.2f} +/- {ev['episode_return_std']:.2f}",
                metric_name="mean_reward",
            )
        ],
    )
    parity = facts["export"]["parity"]["max_abs_diff"]
    body = f"""
# {algo} on {env}

A policy trained by rllib-runner (declarative Hydra experiments for Ray RLlib) on RLlib's new
API stack.

- evaluation: {ev["episodes"]} {"sampled" if ev["explore"] else "greedy"} episodes, return
  {ev["episode_return_mean"]:.2f} +/- {ev["episode_return_std"]:.2f} (`eval.json`, `episodes.csv`)
- `checkpoints/`: the RLlib checkpoint (each file's sha256 in its `manifest.json`)
- `policy.onnx`, `policy.json`: the policy for onnxruntime; largest gap to torch by batch
  size: {", ".join(f"{b}: {g:.2g}" for b, g in parity.items())}
- `config.yaml`, `composed_overrides.yaml`: the run's settings

Reproduce the training:

```bash
python -m runner {" ".join(facts["overrides"])}
```

Evaluate this agent, or continue its training:

```bash
python -m runner task=evaluate checkpoint=hf://{facts["repo_id"]}
python -m runner resume=hf://{facts["repo_id"]}
```

Checkpoints are pickles, which run code when loaded: load only repositories you trust.
"""
    return ModelCard(f"---\n{data.to_yaml()}\n---\n{body}")


def folder(run_dir: Path, trained: Path, checkpoint: Path, facts: dict[str, Any]) -> Path:
    """The repository's files in `run_dir`/hub: the trained run's settings, the checkpoint,
    this run's export, evaluation and videos, and the card."""
    out = run_dir / FOLDER
    if out.exists():
        shutil.rmtree(out)
    out.mkdir()
    for name in ("config.yaml", "composed_overrides.yaml"):
        shutil.copy2(trained / name, out / name)
    shutil.copytree(checkpoint, out / "checkpoints" / checkpoint.name)
    for name in ("policy.onnx", "policy.json", "eval.json", "episodes.csv"):
        shutil.copy2(run_dir / name, out / name)
    if (run_dir / "videos").is_dir():
        shutil.copytree(run_dir / "videos", out / "videos")
    card(facts).save(out / "README.md")
    return out


def upload(out: Path, repo_id: str, private: bool) -> str:
    """The folder as the repository's newest commit; its URL. A refusal is one line."""
    from huggingface_hub import HfApi

    api = HfApi()
    try:
        api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
        commit = api.upload_folder(
            repo_id=repo_id,
            folder_path=out,
            commit_message="rllib-runner: task=push",
        )
    except Exception as ex:  # no network, a token without write access, ...
        raise RunnerError(
            f"task=push: the upload to {repo_id} failed ({type(ex).__name__}: {one_line(ex)}); "
            f"the folder is in {out}"
        ) from None
    return str(commit.commit_url)
