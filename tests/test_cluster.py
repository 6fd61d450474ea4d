"""A real multi-node Ray cluster on this machine (a head and a worker node, each a raylet
with its own CPU count, from ray.cluster_utils): training and a parallel sweep against it."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
from conftest import run_cli
from ray.cluster_utils import Cluster

pytestmark = pytest.mark.cluster  # CI's cluster lane, one test at a time

# One env per EnvRunner here: three EnvRunners on a 1-CPU head and a 2-CPU worker.
ONE_ITERATION = [
    "debug=tiny",
    "scaling.num_envs_per_env_runner=1",
    "checkpoint.at_end=false",
]


@pytest.fixture(scope="module")
def cluster():
    """Head with 1 CPU, worker with 2: three 1-CPU EnvRunners cannot fit on one node."""
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    c.add_node(num_cpus=2)
    c.wait_for_nodes()
    yield c
    c.shutdown()


def runner(cwd: Path, *args: str, run_dir: str = "run", env: dict[str, str] | None = None):
    """The CLI, called in the test process (conftest.run_cli), as a driver of this
    cluster's own: with its auth settings, not the shared Ray's."""
    auth = {k: os.environ[k] for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN") if k in os.environ}
    return run_cli(cwd, *args, run_dir=run_dir, own_ray=True, env={**auth, **(env or {})})


@pytest.mark.slow
def test_training_spreads_env_runners_over_the_nodes(cluster, tmp_path: Path):
    # 3 EnvRunners need 3 CPUs: more than this machine's local check would allow (2), so the
    # run only starts because the preflight checked the cluster's 3.
    proc = runner(
        tmp_path,
        f"ray.address={cluster.address}",
        "scaling.num_env_runners=3",
        *ONE_ITERATION,
    )
    assert proc.returncode == 0, proc.stderr
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    assert plan["preflight"]["ok"]
    nodes = json.loads((tmp_path / "run" / "summary.json").read_text())["env_runner_nodes"]
    assert len(nodes) == 3
    assert len(set(nodes)) == 2  # both nodes host EnvRunners
    assert set(nodes) == {n.node_id for n in cluster.list_all_nodes()}


@pytest.mark.slow
def test_the_users_package_reaches_every_node_through_py_modules(cluster, tmp_path: Path):
    """The example package is neither installed nor on the path of this process, whose
    environment the cluster's nodes share: ray.runtime_env.py_modules ships it to them, and
    the driver imports it from the same dir."""
    assert importlib.util.find_spec("my_rl_pkg") is None
    package = Path(__file__).resolve().parent.parent / "examples" / "my_rl_pkg"
    proc = runner(
        tmp_path,
        "--config-dir",  # Hydra's flags before the overrides
        str(package / "conf"),
        f"ray.address={cluster.address}",
        "experiment=corridor_ppo",
        f"+ray.runtime_env.py_modules=[{package / 'my_rl_pkg'}]",
        "scaling.num_env_runners=3",
        *ONE_ITERATION,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert len(set(summary["env_runner_nodes"])) == 2
    assert summary["final_episode_return_mean"] is not None


@pytest.mark.slow
def test_preflight_checks_the_cluster_not_this_machine(cluster, tmp_path: Path):
    proc = runner(tmp_path, f"ray.address={cluster.address}", "scaling.num_env_runners=5")
    assert proc.returncode == 2
    line = proc.stderr.strip().splitlines()[-1]
    assert f"but the Ray cluster at {cluster.address} has 3" in line


@pytest.mark.slow
def test_without_ray_address_the_run_gets_its_own_ray(cluster, tmp_path: Path):
    """A cluster running on this machine is not joined unless ray.address says so."""
    proc = runner(tmp_path, "scaling.num_env_runners=1", *ONE_ITERATION)
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert result["hardware"]["where"] == "this machine"
    cluster_nodes = {n.node_id for n in cluster.list_all_nodes()}
    assert len(result["env_runner_nodes"]) == 1
    assert not set(result["env_runner_nodes"]) & cluster_nodes


@pytest.mark.slow
def test_a_run_in_a_ray_job_joins_ray_address_unless_ray_address_is_local(cluster, tmp_path):
    """Ray sets RAY_ADDRESS for a Ray job's driver: the run joins that cluster, and says so
    on its first line; ray.address=local starts a Ray of its own all the same. The
    preflight names which one it checked (5 EnvRunners fit in neither)."""
    job = {"RAY_ADDRESS": cluster.address}
    joined = runner(tmp_path, "scaling.num_env_runners=5", run_dir="joined", env=job)
    assert joined.returncode == 2, joined.stderr
    assert joined.stdout.splitlines()[0].startswith(
        f"ray: joining the cluster at RAY_ADDRESS={cluster.address} "
    )
    assert f"but the Ray cluster at {cluster.address} has 3" in joined.stderr
    own = runner(tmp_path, "ray.address=local", "scaling.num_env_runners=5", run_dir="own", env=job)
    assert own.returncode == 2, own.stderr
    assert "joining" not in own.stdout
    assert "but this machine has" in own.stderr.strip().splitlines()[-1], own.stderr
