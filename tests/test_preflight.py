"""Preflight verdicts for machines this one is not.

There is no GPU here: GPU machines and clusters are written as plain data (their GPU names,
the GPUs the driver sees through torch.cuda, compute capabilities, torch's CUDA
architectures), and the real plan and checks run against them.
"""

from __future__ import annotations

import pytest
import torch
from conftest import prepared

from runner import machine, preflight
from runner.errors import ConfigError

BLACKWELL_ARCHS = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]


def verdict(
    overrides: list[str],
    gpus: int = 0,
    names: tuple[str, ...] = (),
    cpus: int = 16,
    local: bool = True,
    driver: tuple[str, ...] | None = None,
    capability: str = "8.0",
    archs: tuple[str, ...] = ("sm_80", "sm_90"),
) -> preflight.Report:
    """The preflight of `overrides` on a machine (`local`) or cluster with these GPUs; the
    driver sees `driver` (a local machine's own GPUs unless given)."""
    job = prepared(overrides)
    seen = list(names if driver is None and local else driver or ())
    res = machine.Resources(
        "a test machine" if local else "the test cluster",
        cpus,
        gpus,
        list(names),
        local=local,
        driver_gpus=seen,
        driver_capabilities=[capability] * len(seen),
        torch_cuda_archs=list(archs) if seen else [],
    )
    return preflight.check(job.settings, job.config, job.plan, res, job.warnings, job.spec)


def test_gpu_profile_on_the_matching_gpu_passes():
    assert verdict(["hardware=a100"], gpus=1, names=("NVIDIA A100-SXM4-80GB",)).ok


def test_gpu_profile_on_another_gpu_fails_naming_both():
    report = verdict(["hardware=a100"], gpus=1, names=("NVIDIA H200",))
    assert not report.ok
    assert "expects an NVIDIA A100 GPU" in report.problems[0]
    assert "NVIDIA H200" in report.problems[0] and "pick the matching" in report.problems[0]


@pytest.mark.parametrize(
    ("name", "family", "matches"),
    [
        ("NVIDIA A100-SXM4-80GB", "A100", True),
        ("NVIDIA A100 80GB PCIe", "A100", True),
        ("A100-80G", "A100", True),  # a Ray accelerator_type
        ("NVIDIA RTX A1000", "A100", False),
        ("Tesla V100S-PCIE-32GB", "V100", True),
        ("Tesla T4", "T4", True),
        ("NVIDIA T400", "T4", False),
        ("NVIDIA H100 80GB HBM3", "H100", True),
        ("NVIDIA H200", "H100", False),
        ("NVIDIA H200", "H200", True),
        ("NVIDIA GH200 480GB", "H200", False),
    ],
)
def test_gpu_models_match_as_whole_model_numbers(name: str, family: str, matches: bool):
    assert machine.is_gpu_of(name, family) is matches


def test_h100_and_h200_profiles_take_their_own_gpu():
    assert verdict(["hardware=h200"], gpus=1, names=("NVIDIA H200",)).ok
    assert not verdict(["hardware=h100"], gpus=1, names=("NVIDIA H200",)).ok
    assert not verdict(["hardware=a100"], gpus=1, names=("NVIDIA RTX A1000",)).ok


def test_mixed_gpus_name_the_odd_ones_and_the_fix():
    report = verdict(["hardware=a100"], gpus=2, names=("NVIDIA A100-SXM4-80GB", "Tesla T4"))
    (problem,) = report.problems
    assert "Tesla T4" in problem and "CUDA_VISIBLE_DEVICES" in problem


def test_too_few_gpus_names_the_numbers():
    report = verdict(["hardware=h100", "scaling=learners2"], gpus=1, names=("NVIDIA H100",))
    assert len(report.problems) == 1
    assert "needs 2 GPU(s) (2 learner x 1 GPU)" in report.problems[0]


GPU_RUNNERS = ["hardware=gpu", "scaling.num_gpus_per_learner=0", "ray.num_cpus=64"]


def test_gpu_sums_are_counted_as_ray_counts_them():
    """In floats 29 x 0.1 + 0.1 > 3; in Ray's fixed-point units it is 3."""
    fits = [*GPU_RUNNERS, "scaling.num_env_runners=30", "scaling.num_gpus_per_env_runner=0.1"]
    job = prepared(fits)
    assert job.plan.total_gpus == 3.0
    assert verdict(fits, gpus=3, cpus=64, names=("NVIDIA A10G",) * 3).ok
    over = [*GPU_RUNNERS, "scaling.num_env_runners=31", "scaling.num_gpus_per_env_runner=0.1"]
    report = verdict(over, gpus=3, cpus=64, names=("NVIDIA A10G",) * 3)
    assert any("needs 3.1 GPU(s)" in p for p in report.problems)


def test_fractional_gpus_over_several_learners_are_refused():
    """Ray packs them onto one GPU, and their NCCL group aborts ("Duplicate GPU detected")."""
    shared = ["hardware=t4", "scaling.num_learners=4", "scaling.num_gpus_per_learner=0.25"]
    (problem,) = verdict(shared, gpus=1, names=("Tesla T4",)).problems
    assert "Duplicate GPU detected" in problem and "scaling.num_gpus_per_learner=1" in problem
    assert "scaling.num_learners=0 with a fractional local Learner" in problem
    # What works: one remote Learner on part of a GPU, or a fractional local Learner.
    one = ["hardware=t4", "scaling.num_learners=1", "scaling.num_gpus_per_learner=0.5"]
    assert verdict(one, gpus=1, names=("Tesla T4",)).ok
    local = ["hardware=t4", "scaling.num_gpus_per_learner=0.5"]
    assert verdict(local, gpus=1, names=("Tesla T4",)).ok


def test_a_local_gpu_learner_needs_a_gpu_in_the_driver():
    """On a cluster the local Learner runs in the driver, which Ray never schedules."""
    cluster = {"gpus": 8, "names": ("A100",), "local": False}
    (problem,) = verdict(["hardware=a100"], **cluster).problems
    assert "the local Learner" in problem and "sees no GPU through torch.cuda" in problem
    assert "Ray never schedules the driver" in problem and "scaling.num_learners=1" in problem
    assert verdict(["hardware=a100", "scaling.num_learners=1"], **cluster).ok
    # A driver on one of the cluster's GPU nodes serves it.
    assert verdict(["hardware=a100"], **cluster, driver=("NVIDIA A100-SXM4-40GB",)).ok


def test_ray_gpus_the_machine_lacks_do_not_serve_the_driver():
    report = verdict(["hardware=gpu", "ray.num_gpus=1"], gpus=1, driver=())
    (problem,) = report.problems
    assert "sees no GPU through torch.cuda" in problem


def test_the_drivers_gpu_counts_against_the_cluster_and_is_of_the_profile():
    """A driver on a cluster node uses one of its GPUs, which Ray may also hand an actor."""
    overrides = ["hardware=a100", "scaling.num_env_runners=2", "scaling.num_gpus_per_env_runner=1"]
    cluster = {"gpus": 2, "names": ("A100",), "local": False, "driver": ("NVIDIA A100",)}
    (problem,) = verdict(overrides, **cluster).problems
    assert "needs 3 GPU(s) (1 main x 1 + 2 env_runner x 1 GPU)" in problem
    assert verdict(overrides, **(cluster | {"gpus": 3})).ok
    # The local Learner runs on the driver's GPU: a T4 there is no A100.
    (problem,) = verdict(["hardware=a100"], **(cluster | {"driver": ("Tesla T4",)})).problems
    assert "Tesla T4" in problem


def test_inference_bench_on_a_gpu_needs_the_drivers_gpu():
    bench = ["task=inference_bench", "compile=inductor_default", "hardware=a100"]
    job = prepared(bench)
    assert [(g.role, g.gpus_each) for g in job.plan.groups] == [("main", 1.0)]
    (problem,) = verdict(bench, gpus=4, names=("A100",), local=False).problems
    assert "the benchmarked module, on cuda" in problem
    assert verdict(bench, gpus=1, names=("NVIDIA A100-SXM4-80GB",)).ok


@pytest.mark.parametrize(
    ("capability", "archs", "runs"),
    [
        ("8.6", ["sm_80"], True),  # binary-compatible within a major version, upwards
        ("8.0", ["sm_86"], False),
        ("9.0", ["sm_90a"], True),
        ("9.0", ["compute_80"], True),  # PTX compiles for newer devices
        ("7.0", BLACKWELL_ARCHS, False),  # a V100 on a CUDA 12.8+ build
        ("7.0", ["sm_50", "sm_60", "sm_70", "sm_75"], True),
        ("12.0", BLACKWELL_ARCHS, True),
    ],
)
def test_compute_capability_against_torchs_kernels(capability, archs, runs):
    assert machine.has_kernels(capability, archs) is runs


def test_a_gpu_without_kernels_in_this_torch_is_refused():
    gpu = {"gpus": 1, "names": ("Tesla V100-SXM2-16GB",), "capability": "7.0"}
    (problem,) = verdict(["hardware=v100"], **gpu, archs=tuple(BLACKWELL_ARCHS)).problems
    assert "compute capability 7.0 (sm_70)" in problem and "sm_75 sm_80" in problem
    assert "whl/cu126" in problem
    assert verdict(["hardware=v100"], **gpu, archs=("sm_70", "sm_80")).ok


def test_a_gpu_profile_here_says_torch_is_a_cpu_build():
    """Real: this machine's torch is the CPU build (CI's, too)."""
    assert torch.version.cuda is None
    job = prepared(["hardware=a100"])
    res = machine.local_resources(job.settings.ray)
    (problem,) = preflight.check(
        job.settings, job.config, job.plan, res, job.warnings, job.spec
    ).problems
    assert f"has no GPU (torch {torch.__version__} is a CPU build)" in problem


def test_strict_false_turns_problems_into_warnings():
    report = verdict(["hardware=v100", "preflight.strict=false"])
    assert report.ok
    assert any("preflight.strict=false" in w and "V100" in w for w in report.warnings)


def test_impala_appo_learner_placement_rule():
    no_gpu = verdict(["algo=impala"])
    assert any("num_learners=1 scaling.num_gpus_per_learner=0" in w for w in no_gpu.warnings)
    assert not any(
        "scaling guide" in w for w in verdict(["algo=appo", "scaling.num_learners=1"]).warnings
    )
    one_gpu = verdict(["algo=appo", "hardware=a100", "scaling.num_learners=1"], gpus=1)
    assert any("num_learners=0 scaling.num_gpus_per_learner=1" in w for w in one_gpu.warnings)


def test_driver_sharing_a_core_only_warns():
    report = verdict(["scaling=runners2"], cpus=2)
    assert report.ok
    assert any("share a core" in w for w in report.warnings)


def cuda_graph_warnings(overrides: list[str]) -> list[str]:
    return [w for w in prepared(overrides).warnings if "CUDA graphs" in w]


def test_cuda_graphs_on_cpu_modules_warn():
    report = verdict(["compile=inductor_ro"])
    assert report.ok
    assert any("no CUDA graphs are used" in w for w in report.warnings)
    assert not cuda_graph_warnings(["compile=inductor_default"])
    # max-autotune turns CUDA graphs on too.
    assert cuda_graph_warnings(["compile=inductor_ma"])


def test_the_local_env_runner_runs_on_the_cpu_whatever_its_gpus():
    """RLlib gives the local EnvRunner (num_env_runners=0) no GPU."""
    on_gpu = ["hardware=gpu", "compile=inductor_ro", "scaling.num_gpus_per_env_runner=0.5"]
    (warning,) = cuda_graph_warnings(on_gpu)
    assert "the local EnvRunner (scaling.num_env_runners=0) runs on the CPU" in warning
    assert not cuda_graph_warnings([*on_gpu, "scaling.num_env_runners=1"])


def test_dqn_exploration_under_cuda_graphs_warns_on_gpu_env_runners():
    dqn = ["algo=dqn", "hardware=gpu", "compile=inductor_ro", "scaling.num_env_runners=1"]
    (warning,) = cuda_graph_warnings([*dqn, "scaling.num_gpus_per_env_runner=0.5"])
    assert "DQN's forward_exploration" in warning and "input storage mutation" in warning
    assert "CPU tensor's storage" in warning


def test_dqn_exploration_with_static_shapes_warns():
    """Its int timestep recompiles once per value (tests/test_compile.py shows it)."""
    (warning,) = prepared(["algo=dqn", "compile=aot_eager", "compile.dynamic=false"]).warnings
    assert "each new timestep recompiles until dynamo's recompile limit (8)" in warning
    assert not prepared(["algo=dqn", "compile=aot_eager"]).warnings


def test_onnxrt_on_gpu_modules_is_refused():
    gpu_runners = ["hardware=gpu", "scaling.num_env_runners=1", "scaling.num_gpus_per_env_runner=1"]
    with pytest.raises(ConfigError, match="onnxruntime's CPU provider, but the EnvRunners run"):
        prepared(["compile=onnxrt_default", *gpu_runners])
    with pytest.raises(ConfigError, match="the benchmarked module runs on a GPU"):
        prepared(["task=inference_bench", "compile=onnxrt_default", "hardware=a100"])
    # The local EnvRunner is on the CPU: onnxrt is fine there beside a GPU Learner.
    assert prepared(["compile=onnxrt_default", "hardware=gpu"]).spec.backend == "onnxrt"


def test_a_mode_the_backend_ignores_warns():
    report = verdict(["compile=onnxrt_ma"])
    assert any(
        "compile.mode=max-autotune is ignored by backend onnxrt" in w for w in report.warnings
    )


def test_a_negative_return_is_a_valid_stop_criterion():
    """Pendulum's returns are negative, and so is its solved return (the default stop)."""
    report = verdict(["algo=sac", "env=pendulum"])
    assert report.ok
