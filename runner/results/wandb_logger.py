"""logger=wandb: one Weights & Biases run per run or sweep job, through the `wandb` package.

The run's config is the composed config; each iteration logs every numeric metric under
RLlib's names at the env steps sampled so far (runner/results/tracking.py feeds it as it
feeds MLflow); when the run ends, its videos go up as W&B videos and summary.json's
numbers into the run's summary. A sweep's jobs share a group named after the sweep dir.
The run's files go under the run dir's wandb/ (offline: `wandb sync` uploads them later).
A search's trials are logged by Ray Tune's own `WandbLoggerCallback` (runner/tasks/tune.py).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import netrc
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from omegaconf import OmegaConf

from runner.errors import ConfigError, one_line
from runner.job import Job
from runner.results.files import env_step, flatten_numbers
from runner.settings.schema import RunnerConfig, WandbConfig, WandbMode

log = logging.getLogger("runner")


def _logged_in() -> bool:
    """A W&B key where `wandb` looks first: WANDB_API_KEY (or an identity token file),
    else the ~/.netrc entry `wandb login` writes for the server's host."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    path = Path(os.environ.get("NETRC", "~/.netrc")).expanduser()
    try:
        return netrc.netrc(path).authenticators(host or "") is not None
    except (OSError, netrc.NetrcParseError):
        return False


def check_ready(config: WandbConfig) -> None:
    """One line, before Ray starts, when W&B cannot log: no package, or no login online."""
    if importlib.util.find_spec("wandb") is None:
        raise ConfigError(
            "logger=wandb needs the wandb package: pip install 'rllib-runner[wandb]' "
            "(or pip install wandb)"
        )
    if config.mode == WandbMode.online and not _logged_in():
        raise ConfigError(
            "logger=wandb with logger.wandb.mode=online needs a W&B login: run `wandb login` "
            "or set WANDB_API_KEY, or log with logger.wandb.mode=offline and `wandb sync` later"
        )


def init_kwargs(config: WandbConfig, settings: RunnerConfig, group: str | None) -> dict[str, Any]:
    """wandb.init's keywords for a run or (through Tune's callback) a search's trials."""
    return {
        "project": config.project,
        "entity": config.entity,
        "group": config.group or group,
        "tags": [*config.tags, settings.algo.name, settings.env.name],
        "mode": config.mode.value,
    }


class WandbTracker:
    """One W&B run; the runner's own output stays its own (W&B's console capture off)."""

    def __init__(self, settings: RunnerConfig, job: Job) -> None:
        import wandb

        assert settings.logger.wandb is not None
        group = str(job.sweep_dir) if job.sweep_dir is not None else None
        self.run = wandb.init(
            **init_kwargs(settings.logger.wandb, settings, group),
            name=job.display_name,
            dir=str(job.run_dir),
            config=OmegaConf.to_container(job.cfg, resolve=True),  # type: ignore[arg-type]  # a dict node
            settings=wandb.Settings(console="off", quiet=True),
            reinit="create_new",  # a sweep's jobs in one process: one run each
        )

    def log(self, row: dict[str, Any], metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=env_step(row))

    def finish(self, run_dir: Path, status: str) -> None:
        """The run's videos and summary, then its end (a failed run exits 1 in W&B). A
        failure now is a warning: the run's own error, if any, is what goes up."""
        try:
            self._finish(run_dir, status)
        except Exception as ex:
            log.warning("logger=wandb: the run's end was not logged: %s", one_line(ex))

    def _finish(self, run_dir: Path, status: str) -> None:
        import wandb

        videos = sorted((run_dir / "videos").glob("*.mp4"))
        if videos:
            self.run.log({f"videos/{p.stem}": wandb.Video(str(p), format="mp4") for p in videos})
        summary = run_dir / "summary.json"
        if summary.is_file():
            self.run.summary.update(flatten_numbers(json.loads(summary.read_text())))
        self.run.summary["status"] = status
        self.run.finish(exit_code=0 if status == "FINISHED" else 1)
