"""scaling=auto for real: candidate layouts sampled by RLlib's EnvRunners on Ray (the
test process's shared Ray, as a run in a Ray job joins its cluster), those that do not
fit the CPU plan left out, the choice shown by a dry run and written into the run dir's
config, cached, and read by the next run, which trains with it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import compose_config, prepared, run_cli

from runner.machine import local_resources, scaling_auto
from runner.machine.measure_cache import measured_or_cached
from runner.machine.scaling_auto import Layout
from runner.settings.schema import RunnerConfig, typed

# 64 EnvRunners fit no machine the tests run on: the series that asks for them stops there.
COMMON = [
    "debug=tiny",
    "scaling=auto",
    "scaling.auto.seconds=0.3",
    "scaling.auto.env_runners=[0,1,64]",
    "scaling.auto.envs_per_env_runner=[2,4]",
    "scaling.auto.vectorize_modes=[sync]",
    # Time for every layout however busy the machine is (in CI the default 30 s left one
    # out); the budget test below sets its own.
    "scaling.auto.budget_seconds=600",
]


def layout(row: dict) -> Layout:
    return scaling_auto._layout(row)


def settings(overrides: list[str]) -> RunnerConfig:
    """The typed settings, scaling=auto not yet resolved (a run's prepare measures it)."""
    return typed(compose_config(overrides))


@pytest.mark.slow
def test_a_dry_run_measures_and_shows_the_choice_and_a_run_trains_with_it(tmp_path: Path):
    cache = f"scaling.auto.cache_dir={tmp_path / 'layouts'}"
    dry = run_cli(tmp_path, *COMMON, cache, "dry_run=true", run_dir="dry")
    assert dry.returncode == 0, dry.stderr
    assert "scaling=auto chose" in dry.stdout and "measured now" in dry.stdout
    assert "dry run: nothing trained" in dry.stdout
    [cache_file] = (tmp_path / "layouts").glob("layouts-*.json")
    rows = json.loads(cache_file.read_text())["figures"]
    measured = [r for r in rows if r["status"] == "measured"]
    # The configured layout (debug=tiny: 2 envs in the main process) first, then each series.
    assert layout(measured[0]) == Layout(0, 2, "sync")
    assert all(r["env_steps_per_s"] > 0 and r["rounds"] >= 2 for r in measured)
    assert {r["num_env_runners"] for r in measured} == {0, 1}
    assert [(r["num_env_runners"], r["status"]) for r in rows if r not in measured] == [
        (64, "does not fit the CPU plan")
    ]
    # The choice is the fastest measured, or the configured layout if none beat it; the
    # two were measured again at the end, so each has two measurements.
    base = Layout(0, 2, "sync")
    rates = scaling_auto.best_rates(rows)
    best = max(rates, key=lambda x: rates[x])
    chosen = dry.stdout.split("scaling=auto chose ")[1].split(": ")[0]
    assert chosen in (str(best), str(base))
    if best != base:
        assert [layout(r) for r in measured[-2:]] == [best, base]
    config = (tmp_path / "dry" / "config.yaml").read_text()
    chosen_layout = next(layout(r) for r in measured if str(layout(r)) == chosen)
    assert f"num_env_runners: {chosen_layout.num_env_runners}\n" in config
    assert f"num_envs_per_env_runner: {chosen_layout.num_envs_per_env_runner}\n" in config

    run = run_cli(tmp_path, *COMMON, cache, "stop.iterations=1", run_dir="run")
    assert run.returncode == 0, run.stderr
    assert "cached figures" in run.stdout
    section = run.json("summary.json")["scaling_auto"]
    assert section["source"] == "cache" and section["rows"] == rows
    assert str(layout(section["chosen"])) == chosen
    algorithm_config = run.json("algorithm_config.json")
    assert algorithm_config["num_env_runners"] == chosen_layout.num_env_runners
    assert algorithm_config["num_envs_per_env_runner"] == chosen_layout.num_envs_per_env_runner


def test_the_layouts_that_fit_follow_the_cpus_the_plan_counts():
    """A simulated larger machine (ray.num_cpus) lets more EnvRunners compete."""
    base = settings(["scaling=auto"])
    for cpus, fitting in ((2, {0, 1, 2}), (8, {0, 1, 2, 4, 8})):
        resources = local_resources(settings([f"ray.num_cpus={cpus}"]).ray)
        fit = set()
        for runners in base.scaling.auto.env_runners:
            plan = prepared([f"ray.num_cpus={cpus}", f"scaling.num_env_runners={runners}"]).plan
            if scaling_auto.fits(plan, resources):
                fit.add(runners)
        assert fit == fitting, cpus


def test_the_configured_layout_stays_unless_a_candidate_beats_it_by_the_margin():
    def row(runners: int, envs: int, rate: float) -> dict:
        return {
            "num_env_runners": runners,
            "num_envs_per_env_runner": envs,
            "gym_env_vectorize_mode": "sync",
            "status": "measured",
            "env_steps_per_s": rate,
        }

    base = Layout(0, 8, "sync")
    close = scaling_auto.decide([row(0, 8, 1000), row(1, 16, 1040)], base, margin=0.05)
    assert close["chosen"] == {**vars(base)} and close["speedup"] == 1.0
    assert "scaling.auto.margin=0.05" in close["why"]
    faster = scaling_auto.decide([row(0, 8, 1000), row(1, 16, 1500)], base, margin=0.05)
    assert Layout(**faster["chosen"]) == Layout(1, 16, "sync")
    assert faster["speedup"] == pytest.approx(1.5)


def test_async_series_start_at_two_envs():
    series = scaling_auto.candidates(settings(["scaling=auto", "scaling.auto.env_runners=[1]"]))
    assert [[x.num_envs_per_env_runner for x in s] for s in series] == [
        [1, 2, 4, 8, 16, 32, 64],
        [2, 4, 8, 16, 32, 64],
    ]
    assert {x.gym_env_vectorize_mode for x in series[1]} == {"async"}


def test_env_runners_with_gpus_leave_local_sampling_out():
    """EnvRunners with a GPU each cannot be the driver's local one: no 0-runner layout."""
    gpus = settings(
        [
            "scaling=auto",
            "scaling.num_env_runners=1",
            "scaling.num_gpus_per_env_runner=0.5",
            "scaling.auto.env_runners=[0,2]",
        ]
    )
    assert {x.num_env_runners for s in scaling_auto.candidates(gpus) for x in s} == {2}


def test_a_cache_file_cut_short_or_for_other_settings_is_measured_again(tmp_path: Path):
    """compile=auto's and scaling=auto's measurements kept through one helper: measured
    once, then read back under the same key; another key, refresh, or a file that is not
    whole JSON (a full disk, an edit by hand) measures again."""
    key, path, calls = {"env": "CartPole-v1"}, tmp_path / "cache" / "layouts.json", []

    def measure() -> list[float]:
        calls.append(1)
        return [float(len(calls))]

    def figures(key: dict, refresh: bool = False) -> tuple[list[float], str]:
        return measured_or_cached(path, key, refresh, measure, "scaling.auto.cache_dir")

    assert figures(key) == ([1.0], "measured")
    assert figures(key) == ([1.0], "cache")
    assert figures({"env": "Pendulum-v1"}) == ([2.0], "measured")  # and replaced the file
    assert figures({"env": "Pendulum-v1"}, refresh=True) == ([3.0], "measured")
    path.write_text(path.read_text()[:20])
    assert figures({"env": "Pendulum-v1"}) == ([4.0], "measured")
    assert json.loads(path.read_text()) == {"key": {"env": "Pendulum-v1"}, "figures": [4.0]}


@pytest.mark.slow
def test_a_spent_budget_leaves_the_other_layouts_out_and_says_so(tmp_path: Path):
    """scaling.auto.budget_seconds: no candidate starts that would end past it; the
    configured layout is measured and kept; each measurement is a line saying how many
    of how many, and the rows name what the budget left out."""
    cache = f"scaling.auto.cache_dir={tmp_path / 'layouts'}"
    dry = run_cli(tmp_path, *COMMON, cache, "scaling.auto.budget_seconds=0.1", "dry_run=true")
    assert dry.returncode == 0, dry.stderr
    assert "scaling=auto [1 of at most 6, " in dry.stdout  # 4 layouts + 2 re-measurements
    [cache_file] = (tmp_path / "layouts").glob("layouts-*.json")
    rows = json.loads(cache_file.read_text())["figures"]
    by_status = {(layout(r), r["status"]) for r in rows}
    assert by_status == {
        (Layout(64, 2, "sync"), scaling_auto.NO_FIT),
        (Layout(0, 2, "sync"), "measured"),
        (Layout(0, 4, "sync"), scaling_auto.BUDGET_SPENT),
        (Layout(1, 2, "sync"), scaling_auto.BUDGET_SPENT),
        (Layout(1, 4, "sync"), scaling_auto.BUDGET_SPENT),
    }
    assert "scaling=auto chose local x 2 envs (sync): no layout beat" in dry.stdout
