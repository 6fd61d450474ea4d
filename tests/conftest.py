"""Shared helpers: Hydra's compose API over conf/, and the CLI run in a forked child (cli_forks)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import cli_forks
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from runner import CONFIG_DIR
from runner.api import register_configs
from runner.app import Prepared, prepare

register_configs()

# The one tiny-run setting: a PPO batch a 2-core CPU gets through in about a second...
TINY_BATCH = (
    "algo.training.train_batch_size_per_learner=400",
    "algo.training.minibatch_size=128",
    "algo.training.num_epochs=1",
)
# ...two envs per EnvRunner, and no stop at a return (a test's own stop.* decides).
TINY = [*TINY_BATCH, "scaling.num_envs_per_env_runner=2", "stop.episode_return_mean=null"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The ipex tests need the ipex extra (CI's second lane): left out unless an -m
    expression names ipex."""
    if "ipex" in (config.getoption("markexpr") or ""):
        return
    ipex = [item for item in items if item.get_closest_marker("ipex")]
    if ipex:
        config.hook.pytest_deselected(items=ipex)
        items[:] = [item for item in items if not item.get_closest_marker("ipex")]


def compose_config(overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    """The config `python -m runner <overrides>` would run, without running it."""
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def prepared(overrides: list[str] | tuple[str, ...] = ()) -> Prepared:
    """Typed settings, task, compile spec, AlgorithmConfig and plan, as a run makes them."""
    return prepare(compose_config(overrides))


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    run_dir: Path

    def json(self, name: str) -> dict:
        return json.loads((self.run_dir / name).read_text())

    def jsonl(self, name: str) -> list[dict]:
        return [json.loads(line) for line in (self.run_dir / name).read_text().splitlines()]


def run_cli(
    cwd: Path,
    *overrides: str,
    run_dir: str = "run",
    timeout: float = 600,
    env: dict[str, str] | None = None,
) -> CliResult:
    """`python -m runner` in `cwd` (so the installed package is used), run dir under cwd;
    `env` adds to the environment. The CLI's entry point runs in a child forked from one
    process that imported it once (tests/cli_forks.py); `seconds` count from the fork."""
    args = [*overrides, f"hydra.run.dir={run_dir}"]
    proc = cli_forks.server().run(cwd, args, {**os.environ, **(env or {})}, timeout)
    return CliResult(proc.returncode, proc.stdout, proc.stderr, proc.seconds, cwd / run_dir)


@pytest.fixture
def cli(tmp_path: Path):
    def _run(*overrides: str, **kwargs) -> CliResult:
        return run_cli(tmp_path, *overrides, **kwargs)

    return _run
