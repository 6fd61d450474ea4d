"""Many `python -m runner` runs for the price of one import.

Every run of the CLI first imports torch, Ray, RLlib and Hydra (seconds on this machine);
for dozens of bad-input cases that import is most of the time. A server process imports
the runner's entry point once, then forks a child per case: the child changes to the
case's dir, points its stdout and stderr at files, sets sys.argv and calls the real
`runner.__main__.main`, and its exit status is the CLI's. `run_many` starts a server of
its own for runs that must start at once. A case's seconds count from its fork, so they
leave out the shared import: a test that runs the CLI whole (test_package's installed
wheel) times the rest.

`server()` is one such process for the whole test session, taking one run at a time: the
README's `python -m runner ...` commands run through it (tests/test_readme.py), each
with the environment the user's shell would give it, its clock starting at its fork, and
the bad-input cases (`run_each`).
`server().start(...)` hands back the run while it runs (its pid, its output as it comes),
for the fault tests' signals and killed actors: the child is the CLI's process, the one
a signal reaches and the Ray it starts belongs to.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SERVER = r"""
import atexit, importlib, json, os, site, sys, threading, time

import runner.__main__ as entry
# What a job imports (torch, Ray, RLlib, each task's modules), once for every child: the
# entry point itself loads them only when a job runs.
import runner.app, runner.compile.auto, runner.loop, runner.onnx_export, runner.tasks.tune
import runner.sweep
import ray._raylet as ray_raylet
import ray._private.worker as ray_worker
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
                if fd == 2 and job["stderr"] == job["stdout"]:
                    os.dup2(1, 2)  # one file, in the order the lines came
                    break
                f = os.open(job[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                os.dup2(f, fd)
            sys.argv = ["runner", *job["args"]]
            entry.START = time.perf_counter()  # the run's clock starts now, not at the import
            # Ray's shutdown was registered at this server's import, before the CLI's own
            # exit handler (which ends the process): in a new interpreter it comes after
            # it, and so runs before. Here it is run in that place by hand.
            atexit.unregister(ray_worker.shutdown)
            try:
                entry.cli()
            except SystemExit:  # what the interpreter does next at its exit: the threads
                # joined, the exit handlers run; the CLI's last one ends the process
                threading._shutdown()  # type: ignore[attr-defined]  # the interpreter's own step
                ray_worker.shutdown(_exiting_interpreter=True)
                atexit._run_exitfuncs()
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
        pid = start(job)
        running[pid] = (job["i"], time.perf_counter())
        if job.get("announce"):  # the client signals it, or its actors, while it runs
            print(json.dumps({"i": job["i"], "pid": pid}))
            sys.stdout.flush()
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


def _job(
    i: int, cwd: Path, args: list[str], env: dict[str, str] | None = None, merged: bool = False
) -> dict:
    """A job for the server: its output goes to files in a temp dir of its own (`merged`:
    stdout and stderr to one file, as a terminal shows them)."""
    out = Path(tempfile.mkdtemp(prefix="fork-"))
    stdout, stderr = out / "stdout", out / ("stdout" if merged else "stderr")
    stdout.touch()  # there to read from the fork on
    return {
        "i": i,
        "cwd": str(cwd),
        "args": args,
        "stdout": str(stdout),
        "stderr": str(stderr),
        "env": env,
    }


def _forked(result: dict, job: dict) -> Forked:
    stdout, stderr = Path(job["stdout"]), Path(job["stderr"])
    forked = Forked(
        result["code"],
        stdout.read_text(),
        "" if stderr == stdout else stderr.read_text(),
        result["seconds"],
    )
    shutil.rmtree(stdout.parent)
    return forked


def run_many(
    cases: list[tuple[Path, list[str]]], forks: int, env: dict[str, str] | None = None
) -> list[Forked]:
    """Run `python -m runner <args>` in each `cwd`, `forks` at a time, from a server of
    their own; `env` adds to the environment."""
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


def run_each(
    cases: list[tuple[Path, list[str]]], env: dict[str, str] | None = None
) -> list[Forked]:
    """Run `python -m runner <args>` in each `cwd`, one after another, on the test
    session's server (no import of their own); `env` adds to this environment."""
    full = {**os.environ, **(env or {})}
    return [server().run(cwd, args, full, timeout=120) for cwd, args in cases]


class ForkServer:
    """One server for many CLI runs one after another (a README block's commands): each
    `run` forks a child of the process that imported the runner once."""

    def __init__(self) -> None:
        # Unbuffered bytes: a line read is exactly one line, so select() sees the next.
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
            env={**os.environ, "FORKS": "1"},
        )
        self.count = 0
        self.running: Running | None = None

    def run(self, cwd: Path, args: list[str], env: dict[str, str], timeout: float) -> Forked:
        """`python -m runner <args>` in `cwd` with exactly the environment `env`."""
        job = self._send(cwd, args, env)
        return _forked(self.line(job, timeout), job)

    def start(
        self, cwd: Path, args: list[str], env: dict[str, str], merged: bool = True
    ) -> Running:
        """The same, handed back as soon as it is forked; stdout and stderr in one file
        unless not `merged`."""
        job = self._send(cwd, args, env, merged=merged, announce=True)
        pid = self.line(job, 60)["pid"]
        self.running = Running(self, job, pid)
        return self.running

    def _send(self, cwd: Path, args: list[str], env: dict[str, str], **how: bool) -> dict:
        if self.running is not None:  # a started run its test left running (it failed)
            self.running.kill()
        self.count += 1
        job = _job(self.count, cwd, args, env, merged=how.get("merged", False))
        job["announce"] = how.get("announce", False)
        assert self.proc.stdin is not None
        data = memoryview((json.dumps(job, default=str) + "\n").encode())
        while data:
            data = data[self.proc.stdin.write(data) :]
        return job

    def line(self, job: dict, timeout: float) -> dict:
        """The server's next line about `job`: its pid if announced, then its exit
        ({"code", "seconds"}); lines about a run killed before are passed over."""
        found = self._next(job, timeout)
        if found is None:
            self.proc.kill()
            what = " ".join(job["args"])
            raise AssertionError(f"python -m runner {what}: no answer in {timeout} s")
        return found

    def ended(self, job: dict) -> dict | None:
        """The job's exit line if it has ended, else None (at once)."""
        return self._next(job, 0)

    def _next(self, job: dict, timeout: float) -> dict | None:
        """The next line about `job` within `timeout` s, or None."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while select.select([self.proc.stdout], [], [], max(deadline - time.monotonic(), 0))[0]:
            line = json.loads(self.proc.stdout.readline())
            if line["i"] == job["i"]:
                return line
        return None


class Running:
    """A forked run while it runs: its pid, its output (its stdout, with stderr if merged)
    line by line as it comes, its end."""

    def __init__(self, server: ForkServer, job: dict, pid: int) -> None:
        self.server, self.job, self.pid = server, job, pid
        self.end: dict | None = None
        self.lines = self._tail()

    def _tail(self, timeout: float = 600) -> Iterator[str]:
        deadline = time.monotonic() + timeout
        partial = ""
        with open(self.job["stdout"], encoding="utf-8", errors="replace") as f:
            while True:
                if self.end is None:
                    self.end = self.server.ended(self.job)
                chunk = f.read()  # after the end was seen: all there is
                *whole, partial = (partial + chunk).split("\n")
                yield from (line + "\n" for line in whole)
                if self.end is not None and not chunk:
                    if partial:
                        yield partial
                    return
                if time.monotonic() > deadline:
                    self.kill()
                    raise AssertionError(f"{self.job['args']}: still running after {timeout} s")
                if not chunk:
                    time.sleep(0.05)

    def wait(self, timeout: float) -> Forked:
        """Its exit code and whole output, once it ends."""
        if self.end is None:
            self.end = self.server.line(self.job, timeout)
        self.server.running = None
        return _forked(self.end, self.job)

    def kill(self) -> None:
        """SIGKILL, then its exit line read (a test that failed left it running)."""
        if self.end is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            self.end = self.server.line(self.job, 60)
        self.server.running = None


_server: ForkServer | None = None


def server() -> ForkServer:
    """The test session's fork server, started at first use."""
    global _server
    if _server is None or _server.proc.poll() is not None:
        _server = ForkServer()
    return _server
