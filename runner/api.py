"""The runner from Python, and what both entry points share.

`compose(overrides)` gives the typed settings `python -m runner <overrides>` would run;
`run(overrides)` runs that job and returns its summary. Both use Hydra's compose API;
the CLI (runner/__main__.py) is a thin shell over the same `app.run`. Here too: the
config schemas registered with Hydra, and run dirs that no two runs share.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf, open_dict

from runner import CONFIG_DIR
from runner.settings.schema import STOP_DEFAULT, RunnerConfig, default_gives_way

RESOLVER = "unique_dir"


def unique_dir(base: str) -> str:
    """A new dir at `base`, or `base-2`, `base-3`, ... when another run took it: made
    with one atomic mkdir, so runs (and sweeps) started in the same second never share
    one. Each call makes a new dir: as a resolver it is cached within one composition
    (OmegaConf's resolver cache, which Hydra copies into each job of a sweep)."""
    Path(base).parent.mkdir(parents=True, exist_ok=True)
    for n in itertools.count(1):
        candidate = base if n == 1 else f"{base}-{n}"
        try:
            os.mkdir(candidate)
        except FileExistsError:
            continue
        return candidate
    raise AssertionError("unreachable")  # itertools.count never ends


def register_configs() -> None:
    """The root schema (conf/config.yaml lists it first), every task's settings schema as
    `schema/task/<name>` (each conf/task/ file lists its own), the run dir resolver and
    the default stop budgets' (runner/settings/schema.py)."""
    from runner.tasks import TASKS

    store = ConfigStore.instance()
    store.store(name="runner_schema", node=RunnerConfig)
    for task in TASKS.values():
        store.store(group="schema/task", name=task.name, node=task.settings)
    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, unique_dir, use_cache=True)
    if not OmegaConf.has_resolver(STOP_DEFAULT):
        OmegaConf.register_new_resolver(STOP_DEFAULT, default_gives_way)


@contextlib.contextmanager
def _hydra() -> Iterator[None]:
    """Hydra's compose API over conf/ (a config dir of the user's is searched too, through
    the hydra.searchpath override), unless an entry point already set Hydra up."""
    register_configs()
    if GlobalHydra.instance().is_initialized():
        yield
        return
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        yield


def composed(overrides: list[str]) -> tuple[DictConfig, dict[str, Any]]:
    """The composed config and its group choices; a composition error (a typo'd option
    or key, a wrong type) as the runner's ConfigError, in the CLI's one line."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from runner.errors import ConfigError, one_line

    try:
        return compose_with_choices(overrides)
    except (HydraException, OmegaConfBaseException) as ex:
        raise ConfigError(one_line(ex)) from ex


def compose_with_choices(overrides: list[str]) -> tuple[DictConfig, dict[str, Any]]:
    """The config `overrides` compose (through the Hydra instance the entry point set up:
    its config dirs), and the group choices it was composed from: the one call of Hydra's
    compose API, for both entry points (a Job's `compose`)."""
    cfg = hydra_compose(config_name="config", overrides=overrides, return_hydra_config=True)
    choices = OmegaConf.to_container(cfg.hydra.runtime.choices)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg, choices  # type: ignore[return-value]  # a DictConfig and a dict node's container


def _as_cli(overrides: list[str], config_dir: str | None) -> list[str]:
    """The overrides as the CLI would take them (runner/settings/overrides.py: `checkpoint=` and an
    env's preset), with the config dir `config_dir` searched too."""
    from runner.settings.overrides import normalized

    overrides = normalized(overrides)
    if config_dir is None:
        return overrides
    return [*overrides, f"hydra.searchpath=[file://{Path(config_dir).resolve()}]"]


def compose(overrides: Sequence[str] = (), config_dir: str | None = None) -> RunnerConfig:
    """The typed settings `python -m runner <overrides>` would run on this machine, the
    Learner layout picked for it (runner/machine/placement.py); starts nothing. Bad input raises
    runner.errors.ConfigError (or Hydra's own error) with one line."""
    from runner import machine
    from runner.machine import placement
    from runner.settings.schema import typed

    with _hydra():
        cfg, _ = composed(_as_cli(list(overrides), config_dir))
        settings = typed(cfg)
    placement.resolve(settings, machine.local_resources(settings.ray))
    return settings


def _run_dir(given: list[str]) -> Path:
    """The run dir, made once the config composed (bad input leaves none): the last
    `hydra.run.dir=...` of `given` (its dir must hold no results), else a new dir under
    outputs/runs/ as the CLI makes one."""
    if given:
        path = Path(given[-1].split("=", 1)[1])
        path.mkdir(parents=True, exist_ok=True)
        return path
    return Path(unique_dir(time.strftime("outputs/runs/%Y-%m-%d/%H-%M-%S")))


def run(overrides: Sequence[str] = (), config_dir: str | None = None) -> dict[str, Any]:
    """Run the job `python -m runner <overrides>` would run, in this process; returns
    its summary.json as the job wrote it (a dry run: the plan's CPUs and GPUs, and what
    its preflight would refuse) as a dict with `run_dir` added. Bad input raises
    runner.errors.ConfigError; a run that ends without success raises the runner's error
    for it (its files are kept, as the CLI keeps them).
    A Ray the runner started is stopped afterwards, and this process's environment is as
    it was (so a later run, or a process it starts, gets a Ray of its own); a Ray you
    started (ray.init) is used and left running."""
    from runner.job import Job, app
    from runner.machine.ray_session import stop_ray
    from runner.results.record import ended_early

    start = time.perf_counter()
    given = [o for o in overrides if o.startswith("hydra.run.dir=")]
    rest = [o for o in overrides if not o.startswith("hydra.run.dir=")]
    overrides = _as_cli(rest, config_dir)  # kept with the run: resume takes it again
    environ = dict(os.environ)  # ray.init sets its auth token here, stale once Ray stops
    with _hydra():
        cfg, choices = composed(overrides)
        run_dir = _run_dir(given)
        job = Job(cfg, run_dir, overrides, choices, compose=composed)
        try:
            ran = app.run(job, start)
        except BaseException as ex:  # one that ended before its task leaves its record too
            known = {"overrides": overrides, "choices": choices}
            ended_early(run_dir, choices["task"], ex, time.perf_counter() - start, known)
            raise
        finally:
            stop_ray()
            os.environ.clear()
            os.environ.update(environ)
    summary = ran.pop("summary", None)  # a dry run has none
    return {**(summary if summary is not None else ran), "run_dir": str(run_dir)}
