"""compile=auto and task=autotune for real: the module timed eager and compiled with each
candidate, a candidate that cannot compile recorded and skipped, the measurement cached
and reused by the next run, and `refresh=true` measuring again."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from conftest import compose_config, prepared, run_cli

from runner.compile import auto
from runner.settings.schema import typed

TESTS = Path(__file__).resolve().parent
CANDIDATES = ["inductor/default", "onnxrt/default", "cudagraphs/default"]


def figures(entry: dict) -> list[tuple]:
    """What a measurement found per candidate (the choice is remade per run)."""
    keys = ("preset", "status", "compile_seconds", "call_seconds")
    return [tuple(c.get(k) for k in keys) for c in entry["candidates"]]


@pytest.mark.slow
def test_autotune_then_compile_auto_reuses_its_measurement_then_refreshes(tmp_path: Path):
    env = {"PYTHONPATH": str(TESTS)}
    common = [
        "debug=tiny",
        "+algo.rl_module.rl_module_spec._target_=ray.rllib.core.rl_module.RLModuleSpec",
        "+algo.rl_module.rl_module_spec.module_class=exotic_module:ErfinvPPOModule",
        f"compile.auto.candidates=[{','.join(CANDIDATES)}]",
        "compile.auto.warmup_calls=2",
        "compile.auto.timed_calls=20",
        f"compile.auto.cache_dir={tmp_path / 'decisions'}",
    ]

    tuned = run_cli(tmp_path, *common, "task=autotune", run_dir="autotune", env=env)
    assert tuned.returncode == 0, tuned.stderr
    section = tuned.json("autotune.json")
    for kind in ("env_runners", "learners"):
        statuses = {c["preset"]: c["status"] for c in section[kind]["candidates"]}
        assert list(statuses) == CANDIDATES
        assert statuses["inductor/default"] == "measured"
        assert statuses["cudagraphs/default"] == "skipped"  # no CUDA here
        assert section[kind]["choice"] in ("eager", "inductor/default")
        assert section[kind]["source"] == "measured"
    runners = {c["preset"]: c for c in section["env_runners"]["candidates"]}
    assert runners["onnxrt/default"]["status"] == "failed"  # erfinv: no ONNX conversion
    assert "onnxrt" in runners["onnxrt/default"]["reason"]
    learners = {c["preset"]: c for c in section["learners"]["candidates"]}
    assert "inference only" in learners["onnxrt/default"]["reason"]
    assert runners["inductor/default"]["max_rel_diff"] <= 1e-5
    rows = list(csv.DictReader((tuned.run_dir / "autotune.csv").open()))
    assert len(rows) == 2 * (1 + len(CANDIDATES))  # eager and each candidate, per kind
    assert (tuned.run_dir / "autotune.png").stat().st_size > 0
    assert "choice: " in tuned.stdout
    # A line per candidate compiled, of the 3 usable here: no cudagraphs on the CPU, no
    # onnxrt for a Learner.
    assert "compile=auto [1 of at most 3, " in tuned.stdout
    assert "env runners: inductor/default compiled in " in tuned.stdout

    # The same settings, training: the decision comes from the cache, nothing is timed.
    cached = run_cli(
        tmp_path, *common, "compile=auto", "stop.iterations=1", run_dir="cached", env=env
    )
    assert cached.returncode == 0, cached.stderr
    auto = cached.json("summary.json")["compile_auto"]
    for kind in ("env_runners", "learners"):
        assert auto[kind]["source"] == "cache"
        assert figures(auto[kind]) == figures(section[kind])  # the autotune's own timings
    assert "cached decision" in cached.stdout
    assert "compile=auto chose" in cached.stdout

    refreshed = run_cli(
        tmp_path,
        *common,
        "compile=auto",
        "compile.auto.refresh=true",
        "stop.iterations=1",
        run_dir="refreshed",
        env=env,
    )
    assert refreshed.returncode == 0, refreshed.stderr
    auto = refreshed.json("summary.json")["compile_auto"]
    assert {auto[k]["source"] for k in ("env_runners", "learners")} == {"measured"}
    assert figures(auto["env_runners"]) != figures(section["env_runners"])  # timed anew
    chosen = auto["env_runners"]["choice"]
    summary = refreshed.json("summary.json")
    components = {c["component"]: c for c in summary["compile"]["components"]}
    # What was chosen is what ran: the EnvRunner's methods are compiled only if one won.
    assert bool(components["env_runner/0"]["methods"]) == (chosen != "eager")


def test_a_spent_budget_compiles_nothing_and_keeps_eager(tmp_path: Path):
    """compile.auto.budget_seconds below the timed rounds it must leave: no candidate
    compiles, each usable one is recorded as left out, eager stays (the job is prepared
    with that choice: nothing compiles)."""
    job = prepared(
        [
            "compile=auto",
            "compile.auto.budget_seconds=0.5",
            "compile.auto.timed_seconds=1",
            "compile.auto.refresh=true",
            f"compile.auto.cache_dir={tmp_path}",
        ]
    )
    section = job.autos["compile_auto"]
    assert job.spec is None and job.config.callbacks_on_algorithm_init is None
    for kind in auto.wanted_kinds(job.settings):
        assert section[kind]["choice"] == "eager"
        reasons = {c["preset"]: c.get("reason") for c in section[kind]["candidates"]}
        assert reasons["inductor/default"] == auto.BUDGET_SPENT, reasons
        assert not any(c["status"] == "measured" for c in section[kind]["candidates"])


def test_compile_auto_can_split_its_choice_between_component_kinds():
    settings = typed(compose_config(["compile=auto"]))
    section = {
        "env_runners": {"choice": "onnxrt/default"},
        "learners": {"choice": "inductor/max-autotune"},
    }
    spec = auto.chosen_spec(settings, section)
    assert spec.env_runners and spec.learners
    assert (spec.backend, spec.for_learners().backend) == ("onnxrt", "inductor")
    assert spec.for_learners().mode == "max-autotune"
    assert spec.preset == "onnxrt/default on EnvRunners, inductor/max-autotune on Learners"
    section["env_runners"]["choice"] = "eager"
    only_learners = auto.chosen_spec(settings, section)
    assert not only_learners.env_runners and only_learners.preset == "inductor/max-autotune"
    section["learners"]["choice"] = "eager"
    assert auto.chosen_spec(settings, section) is None
