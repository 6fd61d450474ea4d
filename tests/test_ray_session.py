"""Which Ray a job runs on: the one a sweep's earlier job left, a new one for other
settings, and a Ray the user started, used as it is and never stopped by the runner."""

from __future__ import annotations

import os

import pytest
import ray

from runner import ray_session
from runner.errors import ConfigError
from runner.schema import RayConfig


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


@pytest.mark.slow
def test_jobs_with_the_same_settings_share_a_ray_and_other_settings_get_a_new_one(environ):
    ray_session.start_ray(RayConfig(num_cpus=1))
    first = _node()
    ray_session.start_ray(RayConfig(num_cpus=1))  # the next job of a sweep
    assert _node() == first
    ray_session.start_ray(RayConfig(num_cpus=2))
    assert _node() != first and ray.cluster_resources()["CPU"] == 2
    ray_session.stop_ray()
    assert not ray.is_initialized()


@pytest.mark.slow
def test_a_ray_the_user_started_is_used_and_left_running(environ):
    ray.init(num_cpus=1, include_dashboard=False)
    users = _node()
    ray_session.start_ray(RayConfig())
    assert _node() == users
    with pytest.raises(ConfigError, match=r"ray\.num_cpus, compile\.cache_dir cannot apply"):
        ray_session.start_ray(RayConfig(num_cpus=2), compile_cache_dir="cache")
    ray_session.stop_ray()
    assert ray.is_initialized() and _node() == users
