"""benchmarks/gpu_smoke.py, the prepared first GPU run, in its CPU-safe parts: the README's
two commands, run here as written. There is no GPU here: the dry run plans every step (each
the job `python -m runner ... dry_run=true` runs, through runner.api in the script's
process), and the real run refuses in one line."""

from __future__ import annotations

import json
import shutil

import pytest
from readme import commands
from test_readme import ROOT, run_block

README_SECTION = "On a GPU"
STEPS = ["main", "compiled", "dqn", "bench", "learners2"]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> dict:
    cwd = tmp_path_factory.mktemp("gpu_smoke")
    shutil.copytree(ROOT / "benchmarks", cwd / "benchmarks")
    run_block([c.text for c in commands() if c.section == README_SECTION], cwd)
    out = cwd / "outputs" / "gpu_smoke"
    assert (out / "smoke.md").read_text().count("\n| ") == 1 + len(STEPS)  # header and rows
    return json.loads((out / "smoke.json").read_text())


@pytest.mark.slow
def test_dry_run_plans_every_step(smoke: dict):
    steps = {s["step"]: s for s in smoke["steps"]}
    assert list(steps) == STEPS
    for name, step in steps.items():
        assert step["exit"] == 0, (name, step["error"])
        assert "summary" not in step and "bench" not in step  # nothing ran
    gpus = {name: step["plan"]["total"]["gpus"] for name, step in steps.items()}
    assert gpus == {"main": 1, "compiled": 1, "dqn": 1, "bench": 1, "learners2": 2}
    # Half a GPU each for the local Learner and the GPU EnvRunner.
    compiled = {g["role"]: g["gpus_each"] for g in steps["compiled"]["plan"]["groups"]}
    assert compiled == {"main": 0.5, "env_runner": 0.5}
    # Here, the preflight refuses each for want of a GPU; DQN's CUDA-graph warning is given.
    assert all("has no GPU" in s["plan"]["preflight"]["problems"][0] for s in steps.values())
    assert any("input storage mutation" in w for w in steps["dqn"]["plan"]["preflight"]["warnings"])
    assert "dry run" in smoke["machine"] and smoke.get("driver_gpus") is None
