"""Which Ray a job runs on: the one a sweep's earlier job left, a new one for other
settings, a Ray the user started, used as it is and never stopped by the runner, and the
one the CLI starts while it imports the job."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray
import shared_ray
from conftest import compose_config
from simulated_gpu import accelerator_type, simulate

from runner.errors import ConfigError, PreflightError
from runner.job import Job, app, hooks
from runner.job.app import prepare
from runner.machine import ray_session
from runner.settings.schema import RayConfig, typed


@pytest.fixture
def environ():
    """ray.init writes its auth token into os.environ: leave the worker's as it was."""
    saved = dict(os.environ)
    yield
    ray_session.stop_ray()
    if ray.is_initialized():
        ray.shutdown()
    os.environ.clear()
    os.environ.update(saved)


def _node() -> str:
    return ray.get_runtime_context().get_node_id()


def test_a_cluster_address_nothing_answers_at_is_one_line_naming_where_it_came_from(
    environ, monkeypatch
):
    """ray.init would wait without end (ignoring SIGTERM) for a cluster that is not there."""
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    with pytest.raises(ConfigError, match=r"^RAY_ADDRESS=127\.0\.0\.1:1: no Ray cluster answers"):
        ray_session.start_ray(RayConfig())
    with pytest.raises(ConfigError, match=r"^ray\.address=nonsense is not host:port"):
        ray_session.start_ray(RayConfig(address="nonsense"))
    assert not ray.is_initialized()


@pytest.mark.slow
def test_jobs_with_the_same_settings_share_a_ray_and_other_settings_get_a_new_one(environ):
    ray_session.start_ray(RayConfig(num_cpus=1))
    first = _node()
    ray_session.start_ray(RayConfig(num_cpus=1))  # the next job of a sweep
    assert _node() == first
    ray_session.start_ray(RayConfig(num_cpus=2))
    assert _node() != first and ray.cluster_resources()["CPU"] == 2
    # stop_ray kills this Ray's autoscaler monitor first (Ray's shutdown would wait 1 s on
    # it), and no other: the shared Ray's (`ray start`, a child of this process too) stays.
    shared_ray.env()
    ours = ray.get_runtime_context().gcs_address
    before = _monitors()
    assert ours in before.values() and len(set(before.values())) == 2, before
    ray_session.stop_ray()
    assert not ray.is_initialized()
    after = _monitors()
    assert ours not in after.values() and after == {
        pid: gcs for pid, gcs in before.items() if gcs != ours
    }


def _monitors() -> dict[int, str]:
    """Ray autoscaler monitors below this process: pid -> the GCS address it serves."""
    found = {}
    for pid in ray_session.descendants(os.getpid()):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_text().split("\0")
        except OSError:
            continue
        if any(a.endswith("autoscaler/_private/monitor.py") for a in argv):
            (gcs,) = [a.split("=", 1)[1] for a in argv if a.startswith("--gcs-address=")]
            found[pid] = gcs
    return found


@pytest.mark.slow
def test_a_ray_the_user_started_is_used_and_left_running(environ):
    # address="local": a Ray of the user's own, not one `ray start` runs on this machine.
    ray.init(address="local", num_cpus=1, include_dashboard=False)
    users = _node()
    ray_session.start_ray(RayConfig())
    assert _node() == users
    with pytest.raises(ConfigError, match=r"ray\.num_cpus, compile\.cache_dir cannot apply"):
        ray_session.start_ray(RayConfig(num_cpus=2), compile_cache_dir="cache")
    ray_session.stop_ray()
    assert ray.is_initialized() and _node() == users


# ray.init counted in a real `python -m runner` process; each call records whether the
# job's module (runner.job.app) had finished importing by then.
COUNTED_RUN = """
import sys
import ray

calls = []
init = ray.init


def counted(*args, **kwargs):
    calls.append(hasattr(sys.modules.get("runner.job.app"), "run"))
    return init(*args, **kwargs)


ray.init = counted
sys.argv = ["runner", *sys.argv[1:]]
import runner.__main__ as entry

try:
    entry.main()
finally:
    print("ray.init calls:", calls)
"""


@pytest.mark.slow
def test_the_cli_starts_ray_while_the_job_imports_and_the_job_runs_on_it(tmp_path: Path):
    """One ray.init in all, made before torch and RLlib finished importing: the job found
    that Ray running with its own settings and did not start another."""
    args = ["debug=tiny", "ray.num_cpus=2", "hydra.run.dir=run"]
    proc = subprocess.run(
        [sys.executable, "-c", COUNTED_RUN, *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ray.init calls: [False]" in proc.stdout, proc.stdout[-3000:]
    assert (tmp_path / "run" / "summary.json").is_file()


@pytest.mark.slow
def test_a_local_gpu_learner_reserves_its_gpu_through_ray(environ, monkeypatch, tmp_path):
    """On a simulated machine of two H200s (tests/simulated_gpu.py) a local Ray counts them
    through NVML and names their accelerator type as a cluster's node would. The job's
    hooks (runner/job/hooks.py) start that Ray and reserve the local Learner's GPU through
    it, pointing RLlib's local_gpu_idx at the one Ray gave, so another job on the same Ray
    gets the other GPU, a third is refused in one line within seconds, and a job's end
    frees them. The test starts the hooks and stops at the TaskRun: nothing runs on a GPU."""
    simulate(monkeypatch, "h200", 2, cpus=2)
    cfg = compose_config(["hardware=h200"])
    job = prepare(typed(cfg))
    assert job.plan.main_gpus == 1
    around = hooks.for_job(job.task, Job(cfg, tmp_path, []), job.plan.main_gpus, None)
    assert isinstance(around[-1], hooks.DriverGpus)
    run = app.make_task_run(job, Job(cfg, tmp_path, []), time.perf_counter(), None, [], {})
    for hook in around:  # the job's, up to the task: Ray, then the local Learner's GPU
        hook.start(run)
    total = ray.cluster_resources()
    assert total["GPU"] == 2 and total[f"accelerator_type:{accelerator_type('h200')}"] == 1
    first = run.config.local_gpu_idx
    assert first in (0, 1) and ray.available_resources().get("GPU", 0) == 1
    second = ray_session.reserve_driver_gpus(1)  # a sweep's next job beside it
    assert {first, second} == {0, 1}
    start = time.monotonic()
    with pytest.raises(PreflightError, match="needs 1 GPU of this node, and Ray gave none"):
        ray_session.reserve_driver_gpus(1, timeout=2)
    assert time.monotonic() - start < 10
    ray_session.release_driver_gpus()
    deadline = time.monotonic() + 30
    while ray.available_resources().get("GPU", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("GPU", 0) == 2
