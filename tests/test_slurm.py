"""SLURM, for real: docs/cluster.md's "SLURM" commands on the one-node SLURM that
scripts/slurm_local.sh starts on this machine (Debian's slurm-wlm and munge; needs root),
CI's cluster lane (`python -m pytest -m cluster`). Sweeps go through hydra-submitit-launcher
as job arrays; jobs are requeued with `scancel --signal=USR2` (the warning before a time
limit) and `scontrol requeue` (SLURM's own requeue: SIGTERM to every process of the job).
Nothing is simulated: SLURM runs each job's `python -m submitit.core._submit`, which runs
the runner's Hydra job. What a job reads of SLURM's environment is tested without SLURM
too (the main lane): the environment set as SLURM sets it, the lowest layer."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import cli_call
import pytest
from conftest import cli_env
from readme import commands
from test_readme import WAYS, run_block

from runner import machine
from runner.machine import slurm as slurm_job
from runner.results import checkpoints
from runner.settings.schema import RayConfig

ROOT = Path(__file__).resolve().parent.parent
SECTION = "SLURM"
SCRIPT = ROOT / "scripts" / "slurm_local.sh"


def _sh(*args: str, check: bool = True) -> str:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert not check or proc.returncode == 0, f"{args}: {proc.stdout}{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def slurm() -> None:
    """The local SLURM up (started by the section's own first command if it is not)."""
    _sh("bash", str(SCRIPT), "start")
    assert _sh("sinfo", "-h", "-o", "%t").split() == ["idle"]


def _section() -> list[str]:
    return [c.text for c in commands() if c.page == "docs/cluster.md" and c.section == SECTION]


@pytest.mark.cluster
def test_the_section_runs_on_a_local_slurm(slurm, tmp_path):
    """The page's block as a user runs it: start, a 2-job sweep through SLURM, a job of
    two tasks on one Ray, stop, then start again. Each job's Ray has the CPU SLURM
    granted it (1 of this machine's 2); the sweep's summary and comparison are gathered."""
    printed = run_block(_section(), tmp_path)
    sweeps = sorted((tmp_path / "outputs" / "multirun").glob("*/*"))
    assert len(sweeps) == 2, sweeps
    two_jobs, two_tasks = sweeps
    assert "sweep: 2 jobs, 0 failed" in next(iter(p for c, p in printed.items() if "seed=0,1" in c))
    for n in (0, 1):
        summary = json.loads((two_jobs / str(n) / "summary.json").read_text())
        assert summary["status"] == "finished"
        slurm_job = summary["hardware"]["slurm"]
        assert (slurm_job["cpus"], slurm_job["tasks"], summary["hardware"]["cpus"]) == (1, 1, 1.0)
        assert summary["hardware"]["where"].startswith("SLURM job ")
        assert json.loads((two_jobs / str(n) / "job.json").read_text())["status"] == "finished"
    assert "| seed=0" in (two_jobs / "summary.md").read_text()
    assert (two_jobs / "compare" / "compare.md").is_file()
    # The batch script submitit wrote holds the launcher's settings.
    script = next((two_jobs / ".submitit").glob("*/*_submission.sh")).read_text()
    for line in ("--array=0-1%2", "--cpus-per-task=1", "--partition=local", "--signal=USR2@120"):
        assert f"#SBATCH {line}\n" in script, script
    # The job of two tasks: one Ray of two nodes, the run on it.
    summary = json.loads((two_tasks / "0" / "summary.json").read_text())
    assert summary["status"] == "finished"
    assert (summary["hardware"]["nodes"], summary["hardware"]["cpus"]) == (2, 2.0)
    assert summary["hardware"]["where"].startswith("the Ray cluster at ")
    assert not (two_tasks / "0" / "ray_head.json").exists()  # the workers' signal to stop
    _sh("bash", str(SCRIPT), "start")  # the block ended with `stop`: the next test needs it


@pytest.mark.cluster
def test_the_launcher_takes_account_and_qos_from_the_command_line(slurm, tmp_path):
    """The preset composes (Hydra #2697 does not arise) with sbatch's settings given on the
    command line, and the batch script of a real submission carries them."""
    env = cli_env(own_ray=True)
    proc = cli_call.call(
        tmp_path,
        [
            "hydra/launcher=slurm",
            "hydra.launcher.account=rl",
            "hydra.launcher.qos=normal",
            "--cfg",
            "hydra",
            "-p",
            "hydra.launcher",
        ],  # fmt: skip
        env,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "account: rl\n" in proc.stdout and "qos: normal\n" in proc.stdout
    sweep = tmp_path / "sweep"
    proc = cli_call.call(
        tmp_path,
        [
            "-m",
            "hydra/launcher=slurm",
            "hydra.launcher.account=rl",
            "hydra.launcher.qos=normal",
            "hydra.launcher.cpus_per_task=1",
            "debug=tiny",
            f"hydra.sweep.dir={sweep}",
        ],  # fmt: skip
        env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    script = next((sweep / ".submitit").glob("*/*_submission.sh")).read_text()
    assert "#SBATCH --account=rl\n" in script and "#SBATCH --qos=normal\n" in script


def _array_id(sweep: Path) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ids = [p.name for p in (sweep / ".submitit").glob("*") if re.fullmatch(r"\d+", p.name)]
        if ids:
            return ids[0]
        time.sleep(0.5)
    raise AssertionError(f"no job array submitted under {sweep}")


def _wait_for_checkpoint(job_dir: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while checkpoints.latest(job_dir) is None:
        assert time.monotonic() < deadline, f"no checkpoint in {job_dir} in {timeout} s"
        time.sleep(0.5)


def _release_when_requeued(job: str, timeout: float = 120) -> None:
    """A requeued job waits a while before it may start (its BeginTime): start it now."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reason = _sh("squeue", "-h", "-j", job, "-o", "%T %r", check=False).strip()
        if reason == "PENDING BeginTime":
            _sh("scontrol", "update", f"JobId={job}", "StartTime=now")
            return
        time.sleep(0.5)
    raise AssertionError(f"job {job} was not requeued in {timeout} s")


@pytest.mark.cluster
def test_requeued_jobs_continue_from_their_checkpoints(slurm, tmp_path):
    """Job 0 gets USR2, SLURM's warning before a time limit: it finishes its iteration,
    checkpoints, and submitit requeues it. Job 1 is requeued by SLURM (`scontrol requeue`:
    SIGTERM to every process, its Ray's too), after at least one periodic checkpoint. Each
    requeued job runs again in its dir, continues from its newest checkpoint, and the
    sweep ends with both finished at the full budget."""
    sweep = tmp_path / "sweep"
    env = {**cli_env(own_ray=True), "PYTHONUNBUFFERED": "1"}
    args = ["-m", "hydra/launcher=slurm", "hydra.launcher.cpus_per_task=1", "debug=tiny",
            "stop.iterations=150", "checkpoint.every=5", "seed=0,1",
            f"hydra.sweep.dir={sweep}"]  # fmt: skip
    driver = cli_call.start(tmp_path, args, env)
    array = _array_id(sweep)
    for n in (0, 1):
        _wait_for_checkpoint(sweep / str(n))
    _sh("scancel", "--signal=USR2", f"{array}_0")
    _sh("scontrol", "requeue", f"{array}_1")
    for n in (0, 1):
        _release_when_requeued(f"{array}_{n}")
    ended = driver.wait(timeout=400)
    assert ended.returncode == 0, ended.stdout[-4000:]
    assert "sweep: 2 jobs, 0 failed" in ended.stdout
    first_status = {0: "interrupted", 1: None}  # SIGTERM to all: the first attempt was killed
    for n in (0, 1):
        job = sweep / str(n)
        summary = json.loads((job / "summary.json").read_text())
        assert summary["status"] == "finished" and summary["iterations"] == 150
        assert summary["hardware"]["slurm"]["restarts"] == 1
        resumed = Path(summary["resumed_from"])
        assert resumed.parent.parent == job / "attempt-1", resumed
        assert 0 < summary["iterations_this_run"] < 150
        first = job / "attempt-1" / "job.json"
        assert (json.loads(first.read_text())["status"] if first.is_file() else None) == (
            first_status[n]
        )
        rows = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines()]
        assert [r["iteration"] for r in rows] == list(range(1, 151))  # carried over, no gap
    log = "".join(p.read_text() for p in (sweep / ".submitit").glob(f"{array}_0/*_log.out"))
    assert "asking SLURM to requeue the job" in log and "Requeued job" in log


def test_the_script_refuses_a_slurm_config_it_did_not_write(tmp_path):
    """One line, exit 2, and the machine's own config untouched (run against a copy of
    the script pointed at a config of the test's)."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=theirs\n")
    script = tmp_path / "slurm_local.sh"
    script.write_text(SCRIPT.read_text().replace("CONF=/etc/slurm/slurm.conf", f"CONF={conf}"))
    proc = subprocess.run(["bash", str(script), "start"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"slurm_local.sh: {conf} exists and was not written by this script: "
        "this machine has a SLURM of its own"
    ]
    assert conf.read_text() == "ClusterName=theirs\n"


@pytest.mark.cluster
def test_every_command_of_the_section_has_its_way():
    assert _section() and all(text in WAYS for text in _section())
    assert sys.platform == "linux"  # the script and the lane are Linux's (Debian's packages)
    assert os.geteuid() == 0, (
        "the cluster lane runs as root (the SLURM script installs and starts daemons)"
    )


ARRAY_TASK = {
    "SLURM_JOB_ID": "41",
    "SLURM_ARRAY_JOB_ID": "40",
    "SLURM_ARRAY_TASK_ID": "1",
    "SLURM_PROCID": "0",
    "SLURM_NTASKS": "1",
    "SLURM_CPUS_PER_TASK": "3",
    "SLURM_CPUS_ON_NODE": "3",
    "SLURM_GPUS_ON_NODE": "a100:2",
    "SLURM_JOB_NUM_NODES": "1",
    "SLURM_RESTART_COUNT": "2",
}


def test_a_jobs_allocation_is_read_from_its_environment():
    assert slurm_job.allocation({}) is None
    assert slurm_job.allocation({"SLURM_JOB_ID": "7"}) is None  # salloc's shell: no task
    granted = slurm_job.allocation(ARRAY_TASK)
    assert granted == slurm_job.Allocation(
        job_id="40_1", cpus=3, gpus=2, tasks=1, rank=0, nodes=1, restarts=2
    )
    two = {"SLURM_JOB_ID": "9", "SLURM_PROCID": "1", "SLURM_NTASKS": "2",
           "SLURM_CPUS_ON_NODE": "8", "SLURM_JOB_NUM_NODES": "2"}  # fmt: skip
    assert slurm_job.allocation(two) == slurm_job.Allocation(
        job_id="9", cpus=8, gpus=0, tasks=2, rank=1, nodes=2, restarts=0
    )


def test_a_local_ray_is_sized_to_the_allocation_not_the_node(monkeypatch):
    """This machine's 2 CPUs aside: a job granted 3 CPUs and 2 GPUs plans (and starts
    its Ray: ray_session.start_ray asks local_size) with those; ray.num_* still win."""
    for key, value in ARRAY_TASK.items():
        monkeypatch.setenv(key, value)
    seen = machine.local_resources(RayConfig())
    assert (seen.cpus, seen.gpus) == (3.0, 2.0)
    assert seen.where == "SLURM job 40_1's task 0: 3 CPU, 2 GPU"
    assert seen.slurm is not None and seen.slurm["restarts"] == 2
    assert slurm_job.local_size(1, None) == (1, 2)
    monkeypatch.delenv("SLURM_PROCID")
    assert slurm_job.local_size(None, None) == (None, None)
    assert machine.local_resources(RayConfig()).where == "this machine"


def test_the_launcher_off_slurm_is_one_line(tmp_path):
    """Where SLURM's commands are not on PATH (no SLURM here), submitting is refused in one
    line within seconds, nothing submitted."""
    env = {**cli_env(own_ray=True), "PATH": str(Path(sys.executable).parent)}
    started = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "runner",
            "-m",
            "hydra/launcher=slurm",
            "debug=tiny",
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
        ],  # fmt: skip
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and time.monotonic() - started < 20
    assert proc.stderr.strip().splitlines() == [
        'error: Could not detect "srun", are you indeed on a slurm cluster?'
    ]
    assert not (tmp_path / "sweep" / ".submitit").exists()
