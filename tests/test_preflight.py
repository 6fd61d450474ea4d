"""Preflight verdicts for machines this one is not.

There is no GPU here: GPU machines are simulated at torch's CUDA driver calls and Ray's
NVML calls, clusters at `ray.cluster_resources()` (tests/simulated_gpu.py), and the real
`machine.local_resources`/`cluster_resources`, plan and checks read them.
"""

from __future__ import annotations

import pytest
import torch
from conftest import compose_config, prepared
from simulated_gpu import CUDA13_ARCHS, Model, simulate, simulate_cluster

from runner import machine
from runner.errors import ConfigError
from runner.job.app import prepare
from runner.machine import preflight
from runner.settings.schema import typed

A10G = Model("NVIDIA A10G", (8, 6), 24, 80)
RTX_A1000 = Model("NVIDIA RTX A1000", (8, 6), 8, 20)
CLUSTER = "10.0.0.1:6379"


def verdict(overrides: list[str], cluster: machine.Resources | None = None) -> preflight.Report:
    """The preflight of `overrides` on this process's (simulated) machine, or on `cluster`."""
    job = prepare(typed(compose_config(overrides)), cluster)
    return preflight.check(
        job.settings, job.config, job.plan, job.resources, job.warnings, job.spec
    )


def cluster_of(monkeypatch, model: str | Model, gpus: int, cpus: int = 64) -> machine.Resources:
    simulate_cluster(monkeypatch, model, gpus, cpus)
    return machine.cluster_resources(CLUSTER)


def test_gpu_profile_on_the_matching_gpu_passes(monkeypatch):
    simulate(monkeypatch, "a100", 1)
    assert verdict(["hardware=a100"]).ok


def test_gpu_profile_on_another_gpu_fails_naming_both(monkeypatch):
    simulate(monkeypatch, "h200", 1)
    report = verdict(["hardware=a100"])
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


def test_h100_and_h200_profiles_take_their_own_gpu(monkeypatch):
    simulate(monkeypatch, "h200", 1)
    assert verdict(["hardware=h200"]).ok
    assert not verdict(["hardware=h100"]).ok
    simulate(monkeypatch, RTX_A1000, 1)
    assert not verdict(["hardware=a100"]).ok


def test_mixed_gpus_name_the_odd_ones_and_the_fix(monkeypatch):
    simulate(monkeypatch, ["a100", "t4"])
    (problem,) = verdict(["hardware=a100"]).problems
    assert "Tesla T4" in problem and "CUDA_VISIBLE_DEVICES" in problem


def test_too_few_gpus_names_the_numbers(monkeypatch):
    simulate(monkeypatch, "h100", 1)
    report = verdict(["hardware=h100", "scaling=learners2"])
    assert len(report.problems) == 1
    assert "needs 2 GPU(s) (2 learner x 1 GPU)" in report.problems[0]


GPU_RUNNERS = ["hardware=gpu", "scaling.num_gpus_per_learner=0"]


def test_gpu_sums_are_counted_as_ray_counts_them(monkeypatch):
    """In floats 29 x 0.1 + 0.1 > 3; in Ray's fixed-point units it is 3."""
    simulate(monkeypatch, A10G, 3, cpus=64)
    fits = [*GPU_RUNNERS, "scaling.num_env_runners=30", "scaling.num_gpus_per_env_runner=0.1"]
    job = prepared(fits)
    assert job.plan.total_gpus == 3.0
    assert verdict(fits).ok
    over = [*GPU_RUNNERS, "scaling.num_env_runners=31", "scaling.num_gpus_per_env_runner=0.1"]
    report = verdict(over)
    assert any("needs 3.1 GPU(s)" in p for p in report.problems)


def test_fractional_gpus_over_several_learners_are_refused(monkeypatch):
    """Ray packs them onto one GPU, and their NCCL group aborts ("Duplicate GPU detected")."""
    simulate(monkeypatch, "t4", 1)
    shared = ["hardware=t4", "scaling.num_learners=4", "scaling.num_gpus_per_learner=0.25"]
    (problem,) = verdict(shared).problems
    assert "Duplicate GPU detected" in problem and "scaling.num_gpus_per_learner=1" in problem
    assert "scaling.num_learners=0 with a fractional local Learner" in problem
    # What works: one remote Learner on part of a GPU, or a fractional local Learner.
    one = ["hardware=t4", "scaling.num_learners=1", "scaling.num_gpus_per_learner=0.5"]
    assert verdict(one).ok
    local = ["hardware=t4", "scaling.num_gpus_per_learner=0.5"]
    assert verdict(local).ok


def test_a_local_gpu_learner_needs_a_gpu_in_the_driver(monkeypatch):
    """On a cluster the local Learner runs in the driver, which Ray never schedules."""
    cluster = cluster_of(monkeypatch, "a100", 8)
    (problem,) = verdict(["hardware=a100"], cluster).problems
    assert "the local Learner" in problem and "sees no GPU through torch.cuda" in problem
    assert "Ray never schedules the driver" in problem and "scaling.num_learners=1" in problem
    assert verdict(["hardware=a100", "scaling.num_learners=1"], cluster).ok
    # A driver on one of the cluster's GPU nodes serves it.
    simulate(monkeypatch, Model("NVIDIA A100-SXM4-40GB", (8, 0), 40, 108), 1)
    assert verdict(["hardware=a100"], machine.cluster_resources(CLUSTER)).ok


def test_ray_gpus_the_machine_lacks_do_not_serve_the_driver():
    (problem,) = verdict(["hardware=gpu", "ray.num_gpus=1"]).problems
    assert "sees no GPU through torch.cuda" in problem


def test_the_drivers_gpu_counts_against_the_cluster_and_is_of_the_profile(monkeypatch):
    """A driver on a cluster node uses one of its GPUs, which Ray may also hand an actor."""
    overrides = ["hardware=a100", "scaling.num_env_runners=2", "scaling.num_gpus_per_env_runner=1"]
    simulate(monkeypatch, "a100", 1)
    (problem,) = verdict(overrides, cluster_of(monkeypatch, "a100", 2)).problems
    assert "needs 3 GPU(s) (1 main x 1 + 2 env_runner x 1 GPU)" in problem
    assert verdict(overrides, cluster_of(monkeypatch, "a100", 3)).ok
    # The local Learner runs on the driver's GPU: a T4 there is no A100.
    simulate(monkeypatch, "t4", 1)
    (problem,) = verdict(["hardware=a100"], cluster_of(monkeypatch, "a100", 2)).problems
    assert "Tesla T4" in problem


def test_inference_bench_on_a_gpu_needs_the_drivers_gpu(monkeypatch):
    bench = ["task=inference_bench", "compile=inductor_default", "hardware=a100"]
    job = prepared(bench)
    assert [(g.role, g.gpus_each) for g in job.plan.groups] == [("main", 1.0)]
    (problem,) = verdict(bench, cluster_of(monkeypatch, "a100", 4)).problems
    assert "the benchmarked module, on cuda" in problem
    simulate(monkeypatch, "a100", 1)
    assert verdict(bench).ok


@pytest.mark.parametrize(
    ("capability", "archs", "runs"),
    [
        ("8.6", ["sm_80"], True),  # binary-compatible within a major version, upwards
        ("8.0", ["sm_86"], False),
        ("9.0", ["sm_90a"], True),
        ("9.0", ["compute_80"], True),  # PTX compiles for newer devices
        ("7.0", list(CUDA13_ARCHS), False),  # a V100 on a CUDA 12.8+ build
        ("7.0", ["sm_50", "sm_60", "sm_70", "sm_75"], True),
        ("12.0", list(CUDA13_ARCHS), True),
    ],
)
def test_compute_capability_against_torchs_kernels(capability, archs, runs):
    assert machine.has_kernels(capability, archs) is runs


def test_a_gpu_without_kernels_in_this_torch_is_refused(monkeypatch):
    simulate(monkeypatch, "v100", 1, archs=CUDA13_ARCHS)
    (problem,) = verdict(["hardware=v100"]).problems
    assert "compute capability 7.0 (sm_70)" in problem and "sm_75 sm_80" in problem
    assert "whl/cu126" in problem
    simulate(monkeypatch, "v100", 1, archs=("sm_70", "sm_80"))
    assert verdict(["hardware=v100"]).ok


def test_a_gpu_profile_here_says_torch_is_a_cpu_build():
    """Real: this machine's torch is the CPU build (CI's, too)."""
    assert torch.version.cuda is None
    (problem,) = verdict(["hardware=a100"]).problems
    assert f"has no GPU (torch {torch.__version__} is a CPU build)" in problem


def test_strict_false_turns_problems_into_warnings():
    report = verdict(["hardware=v100", "preflight.strict=false"])
    assert report.ok
    assert any("preflight.strict=false" in w and "V100" in w for w in report.warnings)


def test_driver_sharing_a_core_only_warns():
    report = verdict(["scaling=runners2", "ray.num_cpus=2"])
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


@pytest.mark.parametrize("algo", ["ppo", "appo", "impala", "dqn", "sac"])
def test_every_algo_fits_a_2_cpu_machine_as_it_is(algo: str):
    """`python -m runner algo=X` on 2 cores plans within them: APPO's tuned CartPole
    example asks 2 aggregator actors (1 CPU each) beside its remote Learner, which get
    fewer, with a line saying so. The layout APPO gets here, a remote Learner with no
    aggregator actor, trains in tests/test_env_wrappers.py (IMPALA's default count)."""
    job = prepared([f"algo={algo}", "ray.num_cpus=2"])
    report = preflight.check(
        job.settings, job.config, job.plan, job.resources, job.warnings, job.spec
    )
    assert report.ok, report.problems
    assert job.plan.total_cpus <= 2, job.plan
    fitted = [line for line in job.placement.chosen if "aggregator" in line]
    if algo == "appo":
        assert job.config.num_aggregator_actors_per_learner == 0
        (line,) = fitted
        assert "2 aggregator actor(s) per Learner (1 CPU each) would want 4 CPUs" in line
        assert "num_aggregator_actors_per_learner=0" in line
        assert "preflight.strict=false keeps 2" in line
    else:
        assert not fitted


def test_the_plan_shows_the_aggregator_actors_beside_their_learner():
    """RLlib puts a remote Learner's aggregator actors in its bundle: the plan names them."""
    job = prepared(["algo=appo", "ray.num_cpus=8"])
    roles = {g.role: (g.count, g.cpus_each) for g in job.plan.groups}
    assert roles["learner"] == (1, 1.0) and roles["aggregator"] == (2, 1.0)
    assert job.plan.total_cpus == 4 and job.config.num_aggregator_actors_per_learner == 2
    kept = prepared(["algo=appo", "ray.num_cpus=2", "preflight.strict=false"])
    assert kept.config.num_aggregator_actors_per_learner == 2  # tried as it is


def test_a_cpu_shortfall_names_only_settings_that_fix_it():
    """Each named fix is computed from the plan: never the EnvRunner count of a run with
    none; a combination where no one setting is enough."""
    aggregators = "algo.learners.num_aggregator_actors_per_learner=2"
    (alone,) = verdict(["algo=appo", aggregators, "ray.num_cpus=1"]).problems
    assert "the plan's actors need 3 CPU(s) (1 learner x 1 + 2 aggregator x 1 CPU)" in alone
    assert "set algo.learners.num_aggregator_actors_per_learner=0 (0: none)," in alone
    assert "num_env_runners" not in alone and "num_learners" not in alone
    (both,) = verdict(
        ["algo=appo", aggregators, "scaling.num_env_runners=2", "ray.num_cpus=2"]
    ).problems
    assert (
        "set scaling.num_env_runners=0 (0: sampling in the main process) with "
        "algo.learners.num_aggregator_actors_per_learner=1," in both
    )
    (runners,) = verdict(["algo=impala", "scaling.num_env_runners=3", "ray.num_cpus=2"]).problems
    assert "set scaling.num_env_runners=1, share the cores with ray.num_cpus=5" in runners
