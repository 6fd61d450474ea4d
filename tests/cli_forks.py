"""Many `python -m runner` runs for the price of one import.

Every run of the CLI first imports torch, Ray, RLlib and Hydra (seconds on this machine);
for dozens of bad-input cases that import is most of the time. `run_many` starts one
server process that imports the runner's entry point once, then forks a child per case
(two at a time): the child changes to the case's dir, points its stdout and stderr at
files, sets sys.argv and calls the real `runner.__main__.main`, and its exit status is
the CLI's. A case's seconds count from its fork, so they leave out the shared import:
tests that run the CLI whole (test_readme, test_faults) time the rest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

SERVER = r"""
import json, os, sys, time

import runner.__main__ as entry

jobs = [json.loads(line) for line in sys.stdin]
results, running = {}, {}


def start(i, job):
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.chdir(job["cwd"])
            for fd, name in ((1, "stdout"), (2, "stderr")):
                f = os.open(job[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                os.dup2(f, fd)
            sys.argv = ["runner", *job["args"]]
            try:
                entry.main()
                code = 0
            except SystemExit as ex:
                code = ex.code if isinstance(ex.code, int) else (0 if ex.code is None else 1)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    running[pid] = (i, time.perf_counter())


pending = list(enumerate(jobs))
while pending or running:
    while pending and len(running) < int(os.environ.get("FORKS", "2")):
        start(*pending.pop(0))
    pid, status = os.wait()
    i, started = running.pop(pid)
    seconds = time.perf_counter() - started
    results[i] = {"code": os.waitstatus_to_exitcode(status), "seconds": seconds}
print(json.dumps([results[i] for i in range(len(jobs))]))
"""


@dataclass
class Forked:
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def run_many(
    cases: list[tuple[Path, list[str]]], forks: int = 2, env: dict[str, str] | None = None
) -> list[Forked]:
    """Run `python -m runner <args>` in each `cwd`, `forks` at a time, one shared import;
    `env` adds to the environment."""
    jobs = []
    for cwd, args in cases:
        out, err = cwd.parent / f"{cwd.name}.stdout", cwd.parent / f"{cwd.name}.stderr"
        jobs.append({"cwd": str(cwd), "args": args, "stdout": str(out), "stderr": str(err)})
    proc = subprocess.run(
        [sys.executable, "-c", SERVER],
        input="".join(json.dumps(job) + "\n" for job in jobs),
        capture_output=True,
        text=True,
        timeout=60 + 20 * len(jobs),
        env={**os.environ, **(env or {}), "FORKS": str(forks)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    return [
        Forked(
            r["code"],
            Path(job["stdout"]).read_text(),
            Path(job["stderr"]).read_text(),
            r["seconds"],
        )
        for r, job in zip(results, jobs, strict=True)
    ]
