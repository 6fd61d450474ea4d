"""Shared helpers: Hydra's compose API over conf/, and the CLI called in this process
(tests/cli_call.py)."""

from __future__ import annotations

import contextlib
import copy
import fcntl
import functools
import json
import os
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

# Ray reads its auth mode once, when it is first imported: this process joins the shared
# Ray (tests/shared_ray.py) with its token, and every Ray a run starts here takes the same
# token, so the runs called in this process may join one and start another.
os.environ.setdefault("RAY_AUTH_MODE", "token")
os.environ.setdefault("RAY_AUTH_TOKEN", uuid.uuid4().hex)
# Tests run several at a time (`-n auto`, pytest_xdist_auto_num_workers below): each
# worker's torch (and the runs it starts) gets its share of the cores for intra-op threads,
# at least one, as Ray gives each 1-CPU actor one, not torch's default of every core, where
# the workers' OpenMP threads spin against each other (the suite's in-process training
# tests take about a fifth less wall time with one thread each, measured here). Set before
# torch imports.
if workers := os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    share = max(1, (os.cpu_count() or 1) // int(workers))
    os.environ.setdefault("OMP_NUM_THREADS", str(share))

import cli_call  # noqa: E402
import pytest  # noqa: E402

# setuptools before anything imports the standard library's distutils: inductor's C++
# builder imports setuptools, whose distutils shim refuses to load after the other.
import setuptools  # noqa: E402, F401
import shared_ray  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from runner import CONFIG_DIR  # noqa: E402
from runner.api import register_configs  # noqa: E402
from runner.settings.schema import typed  # noqa: E402

register_configs()

if TYPE_CHECKING:
    from runner.job.app import Prepared


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: one worker per core, and one more when the slow tests run. They wait on
    processes they start (Ray's, the actors', the CLI's): with one worker per core, the
    cores sat idle 12-14 % of a full run here (/proc sampled each 0.5 s), with a third
    4-5 %. Full runs with two workers took 776, 705 and 811 s, with three 623 and 777 s
    (the last pair back to back; three workers also spend more CPU on the same tests). The
    fast subset computes in-process: a third worker made it slower (63.0 and 65.5 s ->
    72.5 and 83.6 s, alternated)."""
    cores = os.cpu_count() or 1
    return cores if "not slow" in (config.getoption("markexpr") or "") else cores + 1


def pytest_itemcollected(item: pytest.Item) -> None:
    """Tests that share a module-scoped fixture (a training run, a search, a cluster) run
    on one xdist worker (`--dist loadgroup`), so the fixture is made once."""
    defs = item._fixtureinfo.name2fixturedefs.values()  # type: ignore[attr-defined]
    if any(d.scope == "module" for chain in defs for d in chain):
        item.add_marker(pytest.mark.xdist_group(item.module.__name__))


# Modules whose tests build configs, plans and help pages, run the type check, or run pytest
# on a suite of their own only: they never start or join a Ray, so they run beside an
# `alone` test (whose `ray stop` stops only Ray's processes).
RAY_FREE = {"test_config", "test_preflight", "test_help", "test_types", "test_suite_settings"}


def _ray_free(item: pytest.Item) -> bool:
    return item.module.__name__ in RAY_FREE


def _dispatch_order(item: pytest.Item) -> tuple[bool, bool, bool]:
    """xdist hands out the tests outside a group one at a time, in collection order: the
    quick ones go after the slow ones, so a run ends on short tests with both workers busy;
    then a test marked `alone`, then the Ray-free tests, which the other worker runs while
    the alone test does (it would idle otherwise)."""
    grouped = item.get_closest_marker("xdist_group") is not None
    quick = not grouped and item.get_closest_marker("slow") is None
    alone = item.get_closest_marker("alone") is not None
    return alone or _ray_free(item), _ray_free(item), quick


# Tests of another environment, CI's second and third lanes: `ipex` needs the ipex extra
# (torch 2.8), `box` makes a Python 3.12 venv like the GPU machine (about 5 GB, kept
# between runs), `cluster` what docs/cluster.md describes (Ray clusters of several nodes,
# Ray Jobs, a local SLURM started as root, object storage), one test at a time.
SECOND_LANE = ("ipex", "box", "cluster")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The second lane's tests are left out unless an -m expression names their marker.
    The rest in the order `_dispatch_order` gives (a stable sort: a module's grouped tests
    keep theirs)."""
    items.sort(key=_dispatch_order)
    named = config.getoption("markexpr") or ""
    left_out = [m for m in SECOND_LANE if m not in named]
    other = [item for item in items if any(item.get_closest_marker(m) for m in left_out)]
    if other:
        config.hook.pytest_deselected(items=other)
        items[:] = [item for item in items if item not in other]


@contextlib.contextmanager
def _share_the_machine(alone: bool) -> Iterator[None]:
    """Under pytest-xdist (`-n auto`, the README's test command) tests run at once. A
    test marked `alone` runs while no other does (its setup and teardown too): it stops
    every Ray on the machine (`ray stop`), or bounds how fast a fault is handled. The
    others share a lock (the Ray-free ones need none); the gate stops new tests from
    starting while one waits to run alone."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:
        yield
        return
    base = Path(tempfile.gettempdir()) / f"rllib-runner-tests-{run}"
    with open(f"{base}.gate", "a") as gate, open(f"{base}.lock", "a") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    if _ray_free(item):
        yield
        return
    with _share_the_machine(item.get_closest_marker("alone") is not None):
        yield


def compose_config(overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    """The config `python -m runner <overrides>` would run, without running it: a copy of
    its one composition in this worker (a third of the fast subset's compositions repeat
    an earlier one's overrides, e.g. hardware=a100 for each GPU count; Hydra's compose
    takes ~95 ms, a copy ~3 ms), so a test may change its copy."""
    return copy.deepcopy(_composed(tuple(overrides)))


@functools.cache
def _composed(overrides: tuple[str, ...]) -> DictConfig:
    """conf/ does not change while the tests run; an override that fails to compose
    raises each time (functools.cache keeps only results). The overrides as the entry
    points take them (runner/settings/overrides.py's normalized: an env named alone picks
    its option)."""
    from runner.settings.overrides import normalized

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose(config_name="config", overrides=normalized(list(overrides)))


@pytest.fixture
def tests_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """tests/ on sys.path, so a config can name a test env (image_env:TinyImages,
    masked_env:MaskedChoice) by import path; taken off again after the test."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent))


@pytest.fixture
def joins_shared_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    """`runner.run()` in this test joins the test process's shared Ray (RAY_ADDRESS), as
    the CLI runs do: a Ray of its own costs about 4 s to start and stop, and where the
    test is not about that Ray (test_ray_session's are) it buys nothing."""
    for key, value in shared_ray.env().items():
        monkeypatch.setenv(key, value)


def prepared(overrides: list[str] | tuple[str, ...] = ()) -> Prepared:
    """Typed settings, task, compile spec, AlgorithmConfig and plan, as a run makes them.
    (runner.job.app, with torch and RLlib, imported here: pytest-xdist's controller process
    loads this file too, and runs no test.)"""
    from runner.job.app import prepare

    return prepare(typed(compose_config(overrides)))


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


def cli_env(own_ray: bool = False, extra: dict[str, str] | None = None) -> dict[str, str]:
    """A CLI run's environment: this one, joining the test process's shared Ray
    (tests/shared_ray.py) unless `own_ray`, then `extra`."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return {**env, **({} if own_ray else shared_ray.env()), **(extra or {})}


def run_cli(
    cwd: Path,
    *overrides: str,
    run_dir: str = "run",
    timeout: float = 600,
    env: dict[str, str] | None = None,
    own_ray: bool = False,
) -> CliResult:
    """`python -m runner` in `cwd`, run dir under cwd; `env` adds to the environment. It
    joins the shared Ray unless `own_ray`. The CLI's entry point runs in this process
    (tests/cli_call.py)."""
    args = [*overrides, f"hydra.run.dir={run_dir}"]
    proc = cli_call.call(cwd, args, cli_env(own_ray, env), timeout)
    return CliResult(proc.returncode, proc.stdout, proc.stderr, proc.seconds, cwd / run_dir)


@pytest.fixture
def cli(tmp_path: Path):
    def _run(*overrides: str, **kwargs) -> CliResult:
        return run_cli(tmp_path, *overrides, **kwargs)

    return _run
