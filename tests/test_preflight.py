"""Preflight verdicts for machines this one is not (GPU counts and names as plain data)."""

from __future__ import annotations

from conftest import prepared

from runner import preflight


def verdict(overrides: list[str], gpus: int = 0, names: tuple[str, ...] = (), cpus: int = 16):
    job = prepared(overrides)
    res = preflight.Resources("a test machine", cpus, gpus, list(names))
    return preflight.check(job.settings, job.config, job.plan, res, job.warnings, job.spec)


def test_gpu_profile_on_the_matching_gpu_passes():
    assert verdict(["hardware=a100"], gpus=1, names=("NVIDIA A100-SXM4-80GB",)).ok


def test_gpu_profile_on_another_gpu_fails_naming_both():
    report = verdict(["hardware=a100"], gpus=1, names=("NVIDIA H200",))
    assert not report.ok
    assert "expects an A100 GPU" in report.problems[0] and "NVIDIA H200" in report.problems[0]


def test_too_few_gpus_names_the_numbers():
    report = verdict(["hardware=h100", "scaling=learners2"], gpus=1, names=("NVIDIA H100",))
    assert len(report.problems) == 1
    assert "needs 2 GPU(s) (2 learner x 1 GPU)" in report.problems[0]


def test_fractional_gpus_pack():
    overrides = ["hardware=t4", "scaling.num_learners=4", "scaling.num_gpus_per_learner=0.25"]
    assert verdict(overrides, gpus=1, names=("Tesla T4",)).ok


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


def test_cuda_graphs_on_cpu_modules_warn():
    report = verdict(["compile=inductor_ro"])
    assert report.ok
    assert any("no CUDA graphs are used" in w for w in report.warnings)
    assert not any("CUDA graphs" in w for w in verdict(["compile=inductor_default"]).warnings)


def test_a_mode_the_backend_ignores_warns():
    report = verdict(["compile=onnxrt_ma"])
    assert any(
        "compile.mode=max-autotune is ignored by backend onnxrt" in w for w in report.warnings
    )


def test_a_negative_return_is_a_valid_stop_criterion():
    """Pendulum's returns are negative, and so is its solved return (the default stop)."""
    report = verdict(["algo=sac", "env=pendulum"])
    assert report.ok
