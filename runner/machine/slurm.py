"""Inside a SLURM job (hydra/launcher=slurm, conf/hydra/launcher/slurm.yaml): what SLURM
granted the job, a Ray over the job's tasks, and the requeue after its warning signal.

SLURM grants CPUs and GPUs that the node may have more of (without cgroups a job sees
the whole node), so a job's local Ray is sized from the job's environment, never the
node's. A job of several tasks (`nodes>1`, or `tasks_per_node>1`) runs one Ray across
them, Ray's SLURM recipe scripted: task 0 starts the head and runs the job, the others
each start a worker node and serve it until the job ends. The head's address and its auth
token (one per job attempt, so no other job joins it) go to the other tasks through a
file in the job's run dir, which a SLURM job's tasks share.

submitit (the launcher's library) asks a job to stop with USR2 `signal_delay_s` before its
time limit; the runner handles it as it does SIGTERM (the iteration in flight, a
checkpoint, the record), then hands it to submitit, which requeues the job. The requeued
job runs the same sweep job again in its dir, which continues from the checkpoint
(runner/results/jobs.py: earlier_attempt).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from runner.errors import PreflightError

# The signal submitit's jobs get before their time limit (its SUBMITIT_PREEMPT_SIGNAL).
PREEMPT = signal.Signals["SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2").upper()]
HEAD_FILE = "ray_head.json"
HEAD_WAIT_S = 180.0  # how long the other tasks wait for task 0's head


@dataclass(frozen=True)
class Allocation:
    """What SLURM granted this task of a job."""

    job_id: str
    cpus: int  # this task's CPUs
    gpus: int  # this task's GPUs
    tasks: int  # the job's tasks, each a Ray node
    rank: int  # this task's (0 runs the job)
    nodes: int
    restarts: int  # how many times the job was requeued

    def describe(self) -> str:
        gpus = f", {self.gpus} GPU" if self.gpus else ""
        return f"SLURM job {self.job_id}'s task {self.rank}: {self.cpus} CPU{gpus}"


def _count(text: str | None) -> int | None:
    """A SLURM count ("2", "a100:2", "2(x3)"): its first number after any type."""
    if not text:
        return None
    digits = text.rsplit(":", 1)[-1].split("(", 1)[0].split(",", 1)[0]
    return int(digits) if digits.isdigit() else None


def allocation(env: Mapping[str, str] = os.environ) -> Allocation | None:
    """This process's SLURM allocation, from the job's environment; None outside a job
    step (a login node's shell, which may have SLURM_JOB_ID from salloc, runs no task)."""
    if "SLURM_JOB_ID" not in env or "SLURM_PROCID" not in env:
        return None
    cpus = _count(env.get("SLURM_CPUS_PER_TASK")) or _count(env.get("SLURM_CPUS_ON_NODE")) or 1
    gpus = _count(env.get("SLURM_GPUS_PER_TASK")) or _count(env.get("SLURM_GPUS_ON_NODE")) or 0
    return Allocation(
        job_id=env.get("SLURM_ARRAY_JOB_ID", env["SLURM_JOB_ID"])
        + (f"_{env['SLURM_ARRAY_TASK_ID']}" if "SLURM_ARRAY_TASK_ID" in env else ""),
        cpus=cpus,
        gpus=gpus,
        tasks=_count(env.get("SLURM_NTASKS")) or 1,
        rank=int(env["SLURM_PROCID"]),
        nodes=_count(env.get("SLURM_JOB_NUM_NODES")) or 1,
        restarts=_count(env.get("SLURM_RESTART_COUNT")) or 0,
    )


def local_size(num_cpus: int | None, num_gpus: int | None) -> tuple[int | None, int | None]:
    """A local Ray's CPUs and GPUs: ray.num_cpus / ray.num_gpus where set, else what SLURM
    granted this task, else None (Ray counts the machine's)."""
    granted = allocation()
    if granted is None:
        return num_cpus, num_gpus
    return (
        granted.cpus if num_cpus is None else num_cpus,
        granted.gpus if num_gpus is None else num_gpus,
    )


# The handler submitit set for PREEMPT in this job (it requeues), taken before the runner
# sets its own.
_requeue: Callable[[int, Any], Any] | None = None


def take_requeue() -> None:
    """Keep submitit's PREEMPT handler, if this is a submitit job, for `requeue`."""
    global _requeue
    handler = signal.getsignal(PREEMPT)
    if callable(handler) and "submitit" in getattr(handler, "__module__", ""):
        _requeue = handler


def requeue(signum: int) -> None:
    """After the run kept what it had (checkpoint, records): a PREEMPT signal is handed to
    submitit, which requeues the job and exits. Other signals (SIGTERM from SLURM's own
    requeue or a preemption, scancel) leave the requeue, if any, to SLURM."""
    if _requeue is not None and signum == PREEMPT:
        print(f"{PREEMPT.name}: the run is saved; asking SLURM to requeue the job", flush=True)
        # SLURM's SIGTERM as it requeues the job is expected now, not a second signal to
        # abort on (runner/machine/shutdown.py): the job ends here either way.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _requeue(signum, None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _node_ip() -> str:
    from ray.util import get_node_ip_address  # the address Ray itself would advertise

    return str(get_node_ip_address())


def _ray(*args: str) -> subprocess.Popen[bytes]:
    """`ray start ... --block`: the node's processes live while it runs, and end with it."""
    ray = Path(sys.executable).with_name("ray")
    command = [str(ray), "start", *args, "--block", "--disable-usage-stats"]
    return subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        # SLURM's warning goes to every process of the job: it stops the run, not its Ray.
        preexec_fn=lambda: signal.signal(PREEMPT, signal.SIG_IGN),
    )


def _stop(node: subprocess.Popen[bytes]) -> None:
    if node.poll() is None:
        node.terminate()  # `ray start --block` stops the node's processes on SIGTERM
        try:
            node.wait(timeout=30)
        except subprocess.TimeoutExpired:
            node.kill()


def _resources(granted: Allocation) -> list[str]:
    return [f"--num-cpus={granted.cpus}", f"--num-gpus={granted.gpus}"]


@contextlib.contextmanager
def _head(granted: Allocation, head_file: Path) -> Iterator[None]:
    """Task 0: the head, announced in `head_file`, with RAY_ADDRESS and the token set for
    the job (the runner joins a cluster at RAY_ADDRESS as a Ray job's driver does); it
    waits for every task's node before the job starts."""
    token = uuid.uuid4().hex
    # Before Ray's first import: it reads its auth mode once.
    os.environ.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token})
    ip, port = _node_ip(), _free_port()
    node = _ray("--head", f"--node-ip-address={ip}", f"--port={port}",
                "--include-dashboard=false", *_resources(granted))  # fmt: skip
    address = f"{ip}:{port}"
    _wait_for_port(ip, port, node)  # the others take a head that does not answer as gone
    head_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = head_file.with_suffix(".tmp")
    tmp.write_text(json.dumps({"address": address, "token": token, "attempt": granted.restarts}))
    tmp.chmod(0o600)
    tmp.replace(head_file)
    os.environ["RAY_ADDRESS"] = address
    try:
        _wait_for_nodes(address, granted.tasks, node)
        print(f"ray: the job's cluster at {address}, {granted.tasks} nodes", flush=True)
        yield
    finally:
        head_file.unlink(missing_ok=True)  # the other tasks' signal to stop their nodes
        _stop(node)


def _wait_for_port(ip: str, port: int, node: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + HEAD_WAIT_S
    while time.monotonic() < deadline and node.poll() is None:
        with contextlib.suppress(OSError), socket.create_connection((ip, port), timeout=5):
            return
        time.sleep(0.5)
    raise PreflightError(f"the job's Ray head did not start at {ip}:{port} (`ray start --head`)")


def _wait_for_nodes(address: str, tasks: int, node: subprocess.Popen[bytes]) -> None:
    import ray

    deadline = time.monotonic() + HEAD_WAIT_S
    while time.monotonic() < deadline and node.poll() is None:
        with contextlib.suppress(ConnectionError, RuntimeError):
            ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
            alive = sum(1 for n in ray.nodes() if n["Alive"])
            ray.shutdown()
            if alive >= tasks:
                return
        time.sleep(2)
    raise PreflightError(
        f"the job's Ray cluster at {address} did not reach {tasks} nodes in {HEAD_WAIT_S:g} s "
        "(each task starts one: see the tasks' logs in the sweep's .submitit/)"
    )


def _worker(granted: Allocation, head_file: Path) -> None:
    """Task 1 and up: a worker node of task 0's head, until the head file is gone (the job
    ended) or the head stops answering."""
    deadline = time.monotonic() + HEAD_WAIT_S
    while True:
        with contextlib.suppress(OSError, ValueError):
            head = json.loads(head_file.read_text())
            if head["attempt"] == granted.restarts:
                break
        if time.monotonic() > deadline:
            raise PreflightError(f"no Ray head announced in {head_file} in {HEAD_WAIT_S:g} s")
        time.sleep(1)
    os.environ.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": head["token"]})
    node = _ray(f"--address={head['address']}", *_resources(granted))
    host, _, port = head["address"].rpartition(":")
    try:
        while head_file.is_file() and node.poll() is None:
            with socket.create_connection((host, int(port)), timeout=5):
                pass
            time.sleep(2)
    except OSError:
        pass  # the head is gone
    finally:
        _stop(node)


def _threads(granted: Allocation) -> None:
    """torch's and OpenMP's threads in this process (its local EnvRunner and Learner) as
    many as the CPUs granted: a job sees the whole node, and threads for every core of
    it, shared with the node's other jobs, run several times slower. (Ray sets its
    workers' own to their CPUs.)"""
    os.environ.setdefault("OMP_NUM_THREADS", str(granted.cpus))
    if "torch" in sys.modules:  # imported already (its count was read at import)
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def run_job(run_dir: Path, job: Callable[[], None]) -> None:
    """`job` in this process, on a Ray sized to the allocation, its threads too; in a job
    of several tasks, task 0 runs it on the job's cluster and the others serve it a node
    each."""
    granted = allocation()
    if granted is not None:
        _threads(granted)
        print(
            f"slurm: {granted.describe()}; its Ray and torch threads "
            f"(OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}) sized to it",
            flush=True,
        )
    if granted is None or granted.tasks == 1:
        job()
        return
    head_file = run_dir / HEAD_FILE
    if granted.rank != 0:
        _worker(granted, head_file)
        return
    with _head(granted, head_file):
        job()


def describe() -> dict[str, Any] | None:
    """The allocation for the run's record (summary.json's hardware.slurm)."""
    granted = allocation()
    return None if granted is None else asdict(granted)
