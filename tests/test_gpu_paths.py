"""Every GPU decision, run here against a simulated GPU machine (tests/simulated_gpu.py).

torch's CUDA driver calls and Ray's NVML calls answer for the simulated GPUs; the runner's
real code reads them: `machine.driver_cuda` -> the Learner layout -> plan -> preflight ->
compile device rules -> AlgorithmConfig, through `runner.run(... dry_run=true)` (the CLI's
job in this process) or `app.prepare` with the preflight, as `app.run` calls them. A
cluster is `ray.cluster_resources()` answering for its GPUs. The tests stop at the plan:
nothing runs a CUDA kernel (this torch is a CPU build).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import compose_config
from simulated_gpu import CUDA13_ARCHS, CUDA126_ARCHS, MODELS, simulate, simulate_cluster

import runner
from runner import machine
from runner.errors import ConfigError, PreflightError
from runner.job.app import Prepared, prepare
from runner.machine import placement, preflight
from runner.settings import autos
from runner.settings.schema import typed

PROFILES = list(MODELS)
COUNTS = [1, 2, 8]
# The used-by line: python -m runner hardware=a100 compile=inductor_ro scaling.num_learners=2
USED_BY = ["compile=inductor_ro", "scaling.num_learners=2"]
KERNELS = "compute capability 7.0 (sm_70)"  # a V100 on a CUDA 13 build


def dry_run(tmp_path: Path, *overrides: str) -> dict:
    """plan.json and algorithm_config.json of `python -m runner <overrides> dry_run=true`."""
    result = runner.run([*overrides, "dry_run=true", f"hydra.run.dir={tmp_path / 'run'}"])
    run_dir = Path(result["run_dir"])
    plan = json.loads((run_dir / "plan.json").read_text())
    plan["config"] = json.loads((run_dir / "algorithm_config.json").read_text())
    return plan


def roles(groups: list) -> dict[str, tuple[int, float, float]]:
    """role -> (count, CPUs each, GPUs each), from a plan's groups (dicts or Groups)."""
    rows = [g if isinstance(g, dict) else vars(g) for g in groups]
    return {g["role"]: (g["count"], g["cpus_each"], g["gpus_each"]) for g in rows}


def planned(
    overrides: list[str], res: machine.Resources | None = None
) -> tuple[Prepared, preflight.Report]:
    """The job and its preflight, as app.run makes them for this (simulated) machine, or
    for `res` (a cluster's, read through machine.cluster_resources)."""
    job = prepare(typed(compose_config(overrides)), res)
    report = preflight.check(
        job.settings, job.config, job.plan, job.resources, job.warnings, job.spec
    )
    return job, report


def on_cluster(monkeypatch, model: str, gpus: int) -> machine.Resources:
    simulate_cluster(monkeypatch, model, gpus)
    return machine.cluster_resources("10.0.0.1:6379")


@pytest.mark.parametrize("profile", PROFILES)
def test_driver_cuda_reads_the_simulated_driver(monkeypatch, profile: str):
    """The crash this caught: torch.cuda.get_devicecapability_tuple, which torch lacks."""
    (gpu, _) = simulate(monkeypatch, profile, 2)
    major, minor = gpu.capability
    assert machine.driver_cuda() == {
        "driver_gpus": [gpu.name] * 2,
        "driver_capabilities": [f"{major}.{minor}"] * 2,
        "torch_cuda_archs": list(CUDA13_ARCHS),
    }


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("profile", PROFILES)
def test_the_used_by_line_on_each_gpu_machine(monkeypatch, tmp_path, profile: str, count: int):
    """Two DDP Learners of one GPU and 2 CPUs each (inductor's compile workers), compiling
    without CUDA graphs; the main process on the CPU. One GPU is too few; a V100 has no
    kernels in a CUDA 13 build of torch."""
    simulate(monkeypatch, profile, count)
    plan = dry_run(tmp_path, f"hardware={profile}", *USED_BY)
    assert roles(plan["groups"]) == {"main": (1, 1, 0), "learner": (2, 2, 1)}
    config = plan["config"]
    assert (config["num_learners"], config["num_gpus_per_learner"]) == (2, 1)
    assert config["num_cpus_per_learner"] == 2
    problems, warnings = plan["preflight"]["problems"], plan["preflight"]["warnings"]
    expected = []
    if count < 2:
        expected.append("the plan needs 2 GPU(s) (2 learner x 1 GPU)")
    if profile == "v100":
        expected.append(KERNELS)
    assert len(problems) == len(expected)
    for problem, text in zip(problems, expected, strict=True):
        assert text in problem
    (ddp,) = [w for w in warnings if "DDP" in w]
    assert "Learners compile with inductor/default instead" in ddp
    assert any("local EnvRunner (scaling.num_env_runners=0) runs on the CPU" in w for w in warnings)


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("profile", PROFILES)
def test_the_main_job_on_each_gpu_machine(monkeypatch, profile: str, count: int):
    """A local Learner on the driver's GPU; a V100 passes with a CUDA 12.6 build."""
    simulate(monkeypatch, profile, count)
    job, report = planned([f"hardware={profile}"])
    assert roles(job.plan.groups) == {"main": (1, 1, 1)}
    assert job.resources.gpus == count and job.resources.local
    if profile == "v100":
        (problem,) = report.problems
        assert KERNELS in problem and "whl/cu126" in problem
        monkeypatch.undo()
        simulate(monkeypatch, profile, count, archs=CUDA126_ARCHS)
        assert planned([f"hardware={profile}"])[1].ok
    else:
        assert report.ok, report.problems


COMPILES = [
    "none",
    "inductor_default",
    "inductor_ro",
    "inductor_ma",
    "cudagraphs_default",
    "onnxrt_default",
]
COMPILES_LEARNERS = {"inductor_default", "inductor_ro", "inductor_ma", "cudagraphs_default"}
CUDA_GRAPHS = {"inductor_ro", "inductor_ma", "cudagraphs_default"}
# On hardware=a100 with 2 GPUs and 16 CPUs, by scaling group: role -> (count, CPUs, GPUs);
# "C" is the CPUs of a remote GPU Learner (2 where it compiles, else RLlib's 0).
SCALINGS = {
    "default": {"main": (1, 1, 1)},
    "runners2": {"main": (1, 1, 1), "env_runner": (2, 1, 0)},
    "vectorized": {"main": (1, 1, 1)},
    "async": {"main": (1, 1, 1), "env_runner": (1, 1, 0), "async_env": (4, 0, 0)},
    "learners2": {"main": (1, 1, 0), "learner": (2, "C", 1)},
    "published_exploration": {"main": (1, 1, 0), "env_runner": (64, 1, 0), "learner": (1, "C", 1)},
}


@pytest.mark.parametrize("scaling", list(SCALINGS))
@pytest.mark.parametrize("compile_group", COMPILES)
def test_compile_and_scaling_groups_on_two_a100s(monkeypatch, compile_group: str, scaling: str):
    simulate(monkeypatch, "a100", 2)
    job, report = planned(["hardware=a100", f"compile={compile_group}", f"scaling={scaling}"])
    # Under DDP cudagraphs' Learners compile with eager instead (below): no compile CPUs.
    eager_ddp = compile_group == "cudagraphs_default" and scaling == "learners2"
    learner_cpus = 2 if compile_group in COMPILES_LEARNERS and not eager_ddp else 0
    expected = {
        role: tuple(learner_cpus if v == "C" else v for v in row)
        for role, row in SCALINGS[scaling].items()
    }
    assert roles(job.plan.groups) == expected
    if scaling == "published_exploration":
        (problem,) = report.problems
        assert f"the plan's actors need {64 + learner_cpus} CPU(s)" in problem and "16" in problem
    else:
        assert report.ok, report.problems
    ddp = [w for w in report.warnings if "DDP" in w]
    assert bool(ddp) == (scaling == "learners2" and compile_group in CUDA_GRAPHS)
    if ddp and compile_group == "cudagraphs_default":
        assert "Learners compile with eager instead" in ddp[0]
        assert job.spec is not None and not job.spec.learners
    unused = [w for w in report.warnings if "no CUDA graphs are used" in w]
    assert bool(unused) == (compile_group in CUDA_GRAPHS)


def test_compile_auto_refuses_gpu_learners_the_driver_cannot_time(monkeypatch):
    """A cluster's GPU Learners, driven from a machine with no GPU: compile=auto would time
    them on a CUDA device this process does not have, so the job stops before measuring."""
    res = on_cluster(monkeypatch, "a100", 8)
    overrides = ["hardware=a100", "compile=auto", "scaling.num_learners=1"]
    with pytest.raises(PreflightError) as refused:
        planned(overrides, res)
    problem = str(refused.value)
    assert "the learners run on a GPU" in problem and "sees no GPU through torch.cuda" in problem
    assert "compile=inductor_default" in problem
    # A driver on one of the cluster's GPU nodes times them (no CUDA kernel runs here: the
    # check alone).
    simulate(monkeypatch, "a100", 1)
    settings, cluster = typed(compose_config(overrides)), machine.cluster_resources("10.0.0.1:6379")
    placement.resolve(settings, cluster)
    autos.refuse_unseen_gpus(settings, cluster)


def test_onnxrt_on_gpu_evaluation_env_runners_is_refused(monkeypatch):
    simulate(monkeypatch, "a100", 2)
    gpu_runners = [
        "hardware=a100",
        "scaling.num_env_runners=1",
        "scaling.num_gpus_per_env_runner=0.5",
    ]
    evaluation = ["eval.every=5", "eval.num_env_runners=1"]
    with pytest.raises(ConfigError, match="the EnvRunners and evaluation EnvRunners run on a GPU"):
        planned(["compile=onnxrt_default", *gpu_runners, *evaluation])
    # On the CPU, onnxrt evaluates too.
    cpu = ["compile=onnxrt_default", "scaling.num_env_runners=1", *evaluation]
    job, report = planned(cpu)
    assert report.ok and job.spec is not None and job.spec.backend == "onnxrt"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["hardware=a100", "scaling.num_gpus_per_env_runner=0.5"],
            "scaling.num_gpus_per_env_runner=0.5 with scaling.num_env_runners=0: RLlib gives "
            "the local EnvRunner no GPU",
        ),
        (
            ["hardware=a100", "scaling.num_gpus_per_learner=2"],
            "scaling.num_gpus_per_learner=2: a Learner uses one GPU",
        ),
    ],
)
def test_gpu_settings_that_would_go_unused_are_refused(monkeypatch, overrides, message):
    simulate(monkeypatch, "a100", 2)
    with pytest.raises(ConfigError, match=message):
        planned(overrides)


def test_gpu_learners_get_cpus_for_inductor_only_where_they_compile(monkeypatch):
    simulate(monkeypatch, "h200", 2)
    job, _ = planned(["hardware=h200", "scaling=learners2", "compile=inductor_default"])
    (learner,) = [g for g in job.plan.groups if g.role == "learner"]
    assert learner.cpus_each == 2 and "inductor's compile workers" in learner.note
    own = ["hardware=h200", "scaling=learners2", "compile=inductor_default"]
    job, _ = planned([*own, "scaling.num_cpus_per_learner=6"])
    assert roles(job.plan.groups)["learner"] == (2, 6, 1)
    job, _ = planned(["hardware=h200", "scaling=learners2"])
    assert roles(job.plan.groups)["learner"] == (2, 0, 1)  # RLlib's "auto" for a GPU Learner


def test_async_envs_are_counted_as_processes():
    """128 env processes on 5 CPUs: each would step on a fraction of a core."""
    many = ["scaling=async", "scaling.num_env_runners=2", "scaling.num_envs_per_env_runner=64"]
    job, report = planned([*many, "ray.num_cpus=5"])
    assert roles(job.plan.groups)["async_env"] == (128, 0, 0)
    (problem,) = report.problems
    assert "async runs 128 env processes" in problem and "gym_env_vectorize_mode=sync" in problem
    job, report = planned(["scaling=async", "ray.num_cpus=4"])
    assert report.ok and any("4 async env processes" in w for w in report.warnings)


@pytest.mark.parametrize("algo", ["appo", "impala"])
def test_appo_and_impala_take_the_scaling_guides_layout(monkeypatch, tmp_path, capsys, algo):
    """No GPU: one remote CPU Learner; one GPU: a local Learner on it; N: N Learners."""
    plan = dry_run(tmp_path, f"algo={algo}")
    shown = capsys.readouterr().out
    assert "scaling.num_learners=1 scaling.num_gpus_per_learner=0" in shown
    count, _, gpus = roles(plan["groups"])["learner"]  # its CPUs: RLlib's (aggregators)
    assert (count, gpus) == (1, 0)
    assert not any("scaling guide" in w for w in plan["preflight"]["warnings"])
    simulate(monkeypatch, "a100", 1)
    job, report = planned([f"algo={algo}", "hardware=gpu"])
    assert (job.config.num_learners, job.config.num_gpus_per_learner) == (0, 1)
    assert roles(job.plan.groups)["main"] == (1, 1, 1) and "learner" not in roles(job.plan.groups)
    assert report.ok
    assert "scaling.num_learners=0 scaling.num_gpus_per_learner=1" in job.placement.chosen[0]
    monkeypatch.undo()
    simulate(monkeypatch, "a100", 8)
    job, report = planned([f"algo={algo}", "hardware=a100"])
    count, _, gpus = roles(job.plan.groups)["learner"]
    assert (count, gpus) == (8, 1) and report.ok


def test_an_explicit_layout_against_the_guide_runs_with_one_warning(monkeypatch):
    job, report = planned(["algo=appo", "scaling.num_learners=0"])
    assert report.ok and not [line for line in job.placement.chosen if "scaling guide" in line]
    (warning,) = [w for w in report.warnings if "scaling guide" in w]
    assert "recommends scaling.num_learners=1 scaling.num_gpus_per_learner=0" in warning
    simulate(monkeypatch, "t4", 1)
    job, report = planned(["algo=impala", "hardware=t4", "scaling.num_learners=1"])
    (warning,) = [w for w in report.warnings if "scaling guide" in w]
    assert "scaling.num_learners=0 scaling.num_gpus_per_learner=1 (got 1 and 1)" in warning
    # The guide's own layout, given explicitly, warns of nothing.
    job, report = planned(["algo=impala", "hardware=t4", "scaling.num_learners=0"])
    assert not [w for w in report.warnings if "scaling guide" in w]
