"""Many `python -m runner` runs for the price of one import.

Every run of the CLI first imports torch, Ray, RLlib and Hydra (seconds on this machine);
for dozens of bad-input cases that import is most of the time. `run_many` starts one
server process that imports the runner's entry point once, then forks a child per case
(two at a time): the child changes to the case's dir, points its stdout and stderr at
files, sets sys.argv and calls the real `runner.__main__.main`, and its exit status is
the CLI's. A case's seconds count from its fork, so they leave out the shared import:
tests that run the CLI whole (test_faults, test_package) time the rest.

`server()` is one such process for the whole test session, taking one run at a time: the
README's `python -m runner ...` commands run through it (tests/test_readme.py), each
with the environment the user's shell would give it, its clock starting at its fork.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

SERVER = r"""
import importlib, json, os, site, sys, time

import runner.__main__ as entry
# What a job imports (torch, Ray, RLlib, each task's modules), once for every child: the
# entry point itself loads them only when a job runs.
import runner.app, runner.compile.auto, runner.loop, runner.onnx_export, runner.tasks.tune
import runner.sweep
import ray._raylet as ray_raylet
# A training run draws its learning curve (matplotlib: its import and its font cache); a
# run's own Ray checks the dashboard's dependencies (aiohttp and more) even without a
# dashboard.
import ray.dashboard.optional_deps
from runner.results import plots

plots.pyplot()


def start(job):
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.chdir(job["cwd"])
            if job.get("env") is not None:  # the environment the user's shell would have
                os.environ.clear()
                os.environ.update(job["env"])
                # Ray's C++ config (its auth mode among it) was read from this server's
                # environment when Ray was imported: read it again from the job's.
                ray_raylet.Config.initialize("")
            # What a new interpreter would see: PYTHONPATH first, and the packages
            # installed since this process started (their .pth files).
            extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
            sys.path[1:1] = [p for p in extra if p not in sys.path]
            for sitedir in site.getsitepackages():
                site.addsitedir(sitedir)
            importlib.invalidate_caches()
            for fd, name in ((1, "stdout"), (2, "stderr")):
                f = os.open(job[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                os.dup2(f, fd)
            sys.argv = ["runner", *job["args"]]
            entry.START = time.perf_counter()  # the run's clock starts now, not at the import
            entry.cli()  # the CLI's own exit: threads joined, atexit's run, os._exit(its code)
        finally:
            os._exit(code)  # reached only when the child failed before the CLI ran
    return pid


# Jobs come one JSON line each; up to FORKS run at once; each result is a line when its
# job ends (a client that sends one job at a time reads its result before the next).
running, exhausted, forks = {}, False, int(os.environ.get("FORKS", "2"))
while running or not exhausted:
    while not exhausted and len(running) < forks:
        line = sys.stdin.readline()
        if not line:
            exhausted = True
            break
        job = json.loads(line)
        running[start(job)] = (job["i"], time.perf_counter())
    if running:
        pid, status = os.wait()
        i, started = running.pop(pid)
        code = os.waitstatus_to_exitcode(status)
        print(json.dumps({"i": i, "code": code, "seconds": time.perf_counter() - started}))
        sys.stdout.flush()
"""


@dataclass
class Forked:
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def _job(i: int, cwd: Path, args: list[str], env: dict[str, str] | None = None) -> dict:
    """A job for the server: its output goes to files in a temp dir of its own."""
    out = Path(tempfile.mkdtemp(prefix="fork-"))
    return {
        "i": i,
        "cwd": str(cwd),
        "args": args,
        "stdout": str(out / "stdout"),
        "stderr": str(out / "stderr"),
        "env": env,
    }


def _forked(result: dict, job: dict) -> Forked:
    out = Path(job["stdout"]).parent
    forked = Forked(
        result["code"],
        (out / "stdout").read_text(),
        (out / "stderr").read_text(),
        result["seconds"],
    )
    shutil.rmtree(out)
    return forked


def run_many(
    cases: list[tuple[Path, list[str]]], forks: int = 2, env: dict[str, str] | None = None
) -> list[Forked]:
    """Run `python -m runner <args>` in each `cwd`, `forks` at a time, one shared import;
    `env` adds to the environment."""
    jobs = [_job(i, cwd, args) for i, (cwd, args) in enumerate(cases)]
    proc = subprocess.run(
        [sys.executable, "-c", SERVER],
        input="".join(json.dumps(job, default=str) + "\n" for job in jobs),
        capture_output=True,
        text=True,
        timeout=60 + 20 * len(jobs),
        env={**os.environ, **(env or {}), "FORKS": str(forks)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = {r["i"]: r for r in map(json.loads, proc.stdout.strip().splitlines()[-len(jobs) :])}
    return [_forked(results[job["i"]], job) for job in jobs]


class ForkServer:
    """One server for many CLI runs one after another (a README block's commands): each
    `run` forks a child of the process that imported the runner once."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "FORKS": "1"},
        )
        self.count = 0

    def run(self, cwd: Path, args: list[str], env: dict[str, str], timeout: float) -> Forked:
        """`python -m runner <args>` in `cwd` with exactly the environment `env`."""
        self.count += 1
        job = _job(self.count, cwd, args, env)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(job, default=str) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            self.proc.kill()
            raise AssertionError(f"python -m runner {' '.join(args)}: no end in {timeout} s")
        return _forked(json.loads(self.proc.stdout.readline()), job)


_server: ForkServer | None = None


def server() -> ForkServer:
    """The test session's fork server, started at first use."""
    global _server
    if _server is None or _server.proc.poll() is not None:
        _server = ForkServer()
    return _server
