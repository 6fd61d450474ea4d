"""Ray Jobs, for real: docs/cluster.md's "Ray Jobs" commands against a head this module
starts (`ray start --head --block` with the dashboard, which serves the Jobs API, on
ports of its own, token auth on) and stops, never touching another Ray. Each `ray job
submit` ships this checkout with `--working-dir .`; the job's driver joins the cluster
through the RAY_ADDRESS Ray sets, and what it wrote is read back."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import shared_ray
from readme import commands
from test_readme import WAYS

pytestmark = pytest.mark.cluster  # CI's cluster lane, one test at a time

ROOT = Path(__file__).resolve().parent.parent
SECTION = "Ray Jobs"


@pytest.fixture(scope="module")
def head():
    cluster = shared_ray.SharedRay(dashboard=True)
    joined = cluster.env()
    yield cluster, joined
    cluster.stop()


def submit(line: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """`ray job submit`, again while the head's job agent is still starting (Ray answers
    "No available agent" until it is up, for a while after the dashboard is)."""
    deadline = time.monotonic() + 120
    while True:
        proc = subprocess.run(line, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        if "No available agent to submit job" not in proc.stderr or time.monotonic() > deadline:
            return proc
        time.sleep(2)


@pytest.fixture(scope="module")
def submitted(head, tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """Each of the section's `ray job submit` commands with its Way's overrides after the
    page's own, its runner's run dir moved under a temp dir, by its dir's name."""
    cluster, joined = head
    out = tmp_path_factory.mktemp("ray_jobs")
    env = {k: v for k, v in os.environ.items() if k not in shared_ray.KEYS}
    env.update(joined)
    env["RAY_API_SERVER_ADDRESS"] = cluster.dashboard_url
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    done = {}
    for command in commands():
        if command.section != SECTION or not command.text.startswith("ray job submit"):
            continue
        words = shlex.split(command.text)
        where = next(w for w in words if w.startswith(("hydra.run.dir=", "hydra.sweep.dir=")))
        key, _, page_dir = where.partition("=")
        name = Path(page_dir).name
        way = WAYS[command.text]
        proc = submit([*words, *way.extra, f"{key}={out / name}"], env)
        assert way.expect in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-3000:]
        done[name] = proc, out / name
    return done


@pytest.mark.slow
def test_the_pages_commands_cover_a_run_and_a_sweep():
    texts = [c.text for c in commands() if c.section == SECTION]
    assert texts[0] == "ray start --head --include-dashboard=true"  # this module's head
    assert [t.split(" -- ")[0] for t in texts[1:]] == ["ray job submit --working-dir ."] * 2


@pytest.mark.slow
def test_a_submitted_run_joins_the_cluster_and_runs_its_env_runners_there(submitted, head):
    cluster, _ = head
    proc, run = submitted["job"]
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "succeeded" in out, out[-3000:]
    # Ray gives the job the head's address by the machine's IP, at this head's port.
    joined = re.search(r"ray: joining the cluster at RAY_ADDRESS=(\S+) ", out)
    assert joined and joined.group(1).endswith(f":{cluster.port}"), out[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["iterations"] == 2
    assert summary["hardware"]["where"] == f"the Ray cluster at {joined.group(1)}"
    assert len(summary["env_runner_nodes"]) == 1  # the remote EnvRunner, on the cluster


@pytest.mark.slow
def test_a_submitted_sweep_runs_its_jobs_on_the_cluster(submitted):
    proc, sweep = submitted["job_sweep"]
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "sweep: 2 jobs, 0 failed" in out, out[-3000:]
    for job in ("0", "1"):
        summary = json.loads((sweep / job / "summary.json").read_text())
        assert summary["status"] == "finished" and not summary["hardware"]["local"]
