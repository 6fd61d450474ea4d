"""task=push: a trained agent shared on the Hugging Face Hub, as RL Zoo's push_to_hub does.

    python -m runner task=push checkpoint=<run dir> task.repo_id=<user>/<name>
    python -m runner task=push checkpoint=<run dir> task.repo_id=<user>/<name> task.upload=false

The checkpoint's policy is evaluated (task=evaluate's episodes and video) and exported
(task=export's ONNX and its parity check) in this run dir; then the repository's folder
is made in `hub/` (runner/results/hub.py: the card, the trained run's settings and
checkpoint, the export, the evaluation, the video) and, unless `task.upload=false`,
uploaded with huggingface_hub. `checkpoint=hf://<user>/<name>` (task=evaluate, export,
push) and `resume=hf://...` read such a repository back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from runner.console import console
from runner.errors import ConfigError
from runner.job.task import Task, TaskRun, own_settings
from runner.settings.schema import RunnerConfig
from runner.tasks import evaluate, export

if TYPE_CHECKING:
    from runner.compile.settings import CompileSpec


@dataclass
class PushSettings(evaluate.EvaluateSettings, export.ExportSettings):
    """Evaluate and export the checkpoint's policy, then share it as a Hub repository."""

    name: ClassVar[str] = "push"

    repo_id: str | None = None  # <user or org>/<name>
    upload: bool = True  # false: the repository's folder only, nothing sent
    private: bool = False
    episodes: int = 10
    video: bool = True


def check(settings: RunnerConfig, spec: CompileSpec | None) -> list[str]:
    from runner.results import hub

    task = own_settings(settings, PushSettings)
    if not task.repo_id:
        raise ConfigError("task=push needs task.repo_id=<user or org>/<name>, the Hub repository")
    hub.repo_of(task.repo_id)
    if task.upload:
        hub.check_token()
    return evaluate.check(settings, spec) + export.check(settings, spec)


def run(run: TaskRun) -> None:
    from runner.algorithms.onnx_export import export as onnx_export
    from runner.results import hub
    from runner.results.files import read_overrides

    task = own_settings(run.settings, PushSettings)
    assert run.checkpoint is not None and task.repo_id is not None  # validate() checked both
    evaluate.run(run)
    onnx_export(run)
    trained = run.checkpoint.parent.parent  # checkpoints/<name>/ in the trained run's dir
    facts = {
        "repo_id": task.repo_id,
        "env": run.settings.env.name,
        "algo": run.settings.algo.name,
        "evaluate": run.record["evaluate"],
        "export": run.record["export"],
        "overrides": read_overrides(trained),
    }
    out = hub.folder(run.files, trained, run.checkpoint, facts)
    pushed = {"repo_id": task.repo_id, "folder": str(out), "url": None}
    if task.upload:
        pushed["url"] = hub.upload(out, task.repo_id, task.private)
        console.print(f"pushed to {pushed['url']}")
    else:
        console.print(f"task.upload=false: the repository's folder is in {out}, nothing sent")
    run.record["push"] = pushed


TASK = Task(
    settings=PushSettings,
    run=run,
    check=check,
    configure=evaluate.configure,
    uses_compile=False,
)
