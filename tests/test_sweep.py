"""Sweeps with -m, for real: Hydra's multirun over tiny jobs, the summary, failures,
re-runs that skip finished jobs, and the sweep dry run."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import CliResult, run_cli
from scipy import stats

from runner import report, sweep

# One iteration of a few hundred steps: a job takes seconds.
JOB = ["debug=tiny", "checkpoint.at_end=false"]


def run_sweep(cwd: Path, *overrides: str, sweep_dir: str = "sweep", **kwargs) -> CliResult:
    """`python -m runner -m <overrides>` in cwd (called in this process: conftest.run_cli)."""
    return run_cli(cwd, "-m", *overrides, f"hydra.sweep.dir={sweep_dir}", **kwargs)


def read_summary(sweep_dir: Path) -> list[dict[str, str]]:
    with (sweep_dir / "summary.csv").open() as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def finished_sweep(tmp_path_factory) -> tuple[Path, CliResult]:
    cwd = tmp_path_factory.mktemp("sweep")
    proc = run_sweep(cwd, "compile=none,eager", "scaling.num_envs_per_env_runner=1,2", *JOB)
    return cwd, proc


@pytest.mark.slow
def test_the_sweep_summary_links_its_comparison(finished_sweep):
    """A real sweep's runs through runner/compare.py: the page, curves on both axes, the
    aggregates on returns normalized by CartPole's solved_return and a random policy's
    return (measured), the performance profile and the probability of improvement; its
    CSV; linked from summary.md."""
    cwd, proc = finished_sweep
    assert proc.returncode == 0, proc.stderr
    assert "[compare/compare.md](compare/compare.md)" in (cwd / "sweep" / "summary.md").read_text()
    out = cwd / "sweep" / "compare"
    page = (out / "compare.md").read_text()
    assert "4 runs, 4 configurations, 1 envs" in page and "(1 seeds)" in page
    assert "env.solved_return (conf/env/cartpole.yaml)" in page
    for png in ("curves_0_env_steps.png", "curves_0_seconds.png", "profile.png"):
        assert (out / png).is_file(), png
    rows = list(csv.DictReader((out / "compare.csv").open()))
    configurations = {
        f"compile={c} scaling.num_envs_per_env_runner={n}"
        for c in ("none", "eager")
        for n in (1, 2)
    }
    assert {r["configuration"] for r in rows} == configurations
    assert {r["statistic"] for r in rows if r["section"] == "normalized"} == {
        "iqm", "median", "mean", "optimality_gap"
    }  # fmt: skip
    assert len([r for r in rows if r["section"] == "improvement"]) == 4 * 3


@pytest.mark.slow
def test_sweep_summarises_every_job(finished_sweep):
    cwd, proc = finished_sweep
    assert proc.returncode == 0, proc.stderr
    rows = read_summary(cwd / "sweep")
    assert [r["job"] for r in rows] == ["0", "1", "2", "3"]
    assert {r["status"] for r in rows} == {"finished"}
    for r in rows:
        assert float(r["env_steps_per_s"]) > 0 and float(r["wall_seconds"]) > 0
        assert r["final_episode_return_mean"]
    # Speedup against the compile=none job with the same other overrides, from their figures.
    by_overrides = {r["overrides"]: r for r in rows}
    for r in rows:
        if "compile=eager" in r["overrides"]:
            base = by_overrides[r["overrides"].replace("compile=eager", "compile=none")]
            expected = float(r["env_steps_per_s"]) / float(base["env_steps_per_s"]) - 1
            assert float(r["speedup"]) == pytest.approx(expected)
            assert r["compile"] == "eager/default applied"
        else:
            assert r["speedup"] == "" and r["compile"] == "off"
    sweep_dir = cwd / "sweep"
    for plot in ("throughput_vs_num_envs_per_env_runner.png", "speedup.png"):
        assert (sweep_dir / plot).read_bytes()[:4] == b"\x89PNG"
    assert "4 jobs, 0 failed." in (sweep_dir / "summary.md").read_text()


@pytest.mark.slow
def test_rerun_skips_finished_jobs(finished_sweep):
    cwd, _ = finished_sweep
    metrics = cwd / "sweep" / "0" / "metrics.jsonl"
    before = metrics.stat().st_mtime_ns
    proc = run_sweep(cwd, "compile=none,eager", "scaling.num_envs_per_env_runner=1,2", *JOB)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("finished in an earlier run of this sweep, skipped") == 4
    assert metrics.stat().st_mtime_ns == before
    assert len(read_summary(cwd / "sweep")) == 4


@pytest.mark.slow  # its module's trained run
def test_summary_rebuilds_from_the_sweep_dir(finished_sweep, capsys):
    cwd, _ = finished_sweep
    sweep_dir = cwd / "sweep"
    before = read_summary(sweep_dir)
    (sweep_dir / "summary.csv").unlink()
    (sweep_dir / "speedup.png").unlink()
    assert sweep.main([str(sweep_dir)]) == 0
    assert read_summary(sweep_dir) == before
    assert (sweep_dir / "speedup.png").is_file()
    assert "| compile=eager scaling.num_envs_per_env_runner=2 |" in capsys.readouterr().out


@pytest.mark.slow
def test_refused_job_is_recorded_and_the_rest_run(tmp_path: Path):
    """A job whose settings are refused records why (job.json and its summary.json say
    refused), the others run, and the sweep counts it and exits 1."""
    proc = run_sweep(tmp_path, "scaling.num_envs_per_env_runner=1,0", *JOB)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last == "error: 1 of 2 sweep jobs failed or were refused (1 refused: job 1)"
    assert "sweep: 2 jobs, 1 refused; summary in" in proc.stdout
    rows = read_summary(tmp_path / "sweep")
    assert [r["status"] for r in rows] == ["finished", "refused"]
    assert rows[1]["error"] == "scaling.num_envs_per_env_runner must be >= 1, got 0"
    record = json.loads((tmp_path / "sweep" / "1" / "summary.json").read_text())
    assert record["status"] == "refused" and record["error"] == rows[1]["error"]
    assert "2 jobs, 1 refused." in (tmp_path / "sweep" / "summary.md").read_text()
    # Running it again retries the refused job only, keeping its first attempt.
    again = run_sweep(tmp_path, "scaling.num_envs_per_env_runner=1,0", *JOB)
    assert again.returncode == 1
    assert again.stdout.count("skipped") == 1
    assert "the earlier refused attempt's files are kept in attempt-1/" in again.stdout
    assert (tmp_path / "sweep" / "1" / "attempt-1" / "job.json").is_file()


def test_a_summary_of_runs_counts_the_refused_ones(tmp_path: Path, capsys):
    """`python -m runner.sweep` over a dir of single runs: a run refused before it wrote
    anything but its record is a row, refused, with its line."""
    for n, bad in enumerate(["stop.iterations=-3", "scaling.num_env_runners=-1"]):
        refused = run_cli(tmp_path, bad, run_dir=f"runs/{n}", own_ray=True)  # no Ray: refused
        assert refused.returncode == 2 and "must be >= 0" in refused.stderr
    assert sweep.main([str(tmp_path / "runs")]) == 1
    assert "2 jobs, 2 refused." in capsys.readouterr().out
    rows = read_summary(tmp_path / "runs")
    assert [(r["status"], r["overrides"]) for r in rows] == [
        ("refused", "stop.iterations=-3"),
        ("refused", "scaling.num_env_runners=-1"),
    ]
    assert rows[1]["error"] == "scaling.num_env_runners must be >= 0, got -1"


@pytest.mark.slow
def test_sweep_dry_run_plans_every_job_and_runs_none(tmp_path: Path):
    proc = run_sweep(
        tmp_path, "hardware=cpu,a100", "scaling.num_env_runners=1,-1", "dry_run=true", own_ray=True
    )
    assert proc.returncode == 1  # two invalid jobs
    out = proc.stdout
    assert "dry run: 4 jobs, 2 invalid" in out
    assert "hardware=cpu scaling.num_env_runners=1 dry_run=True: 2 CPUs, 0 GPUs" in out
    assert "scaling.num_env_runners must be >= 0, got -1" in out
    assert "preflight would fail: hardware=a100 expects an NVIDIA A100 GPU" in out
    assert not list((tmp_path / "sweep").rglob("metrics.jsonl"))
    assert [r["status"] for r in read_summary(tmp_path / "sweep")] == [
        "dry_run",
        "refused",
        "dry_run",
        "refused",
    ]


@pytest.mark.slow
def test_crash_inside_rllib_is_one_failed_job(tmp_path: Path):
    """Zero epochs pass RLlib's checks, and its Learner then fails in the first update."""
    job = [o for o in JOB if not o.startswith("algo.training.num_epochs")]
    proc = run_sweep(tmp_path, "algo.training.num_epochs=1,0", *job)
    assert proc.returncode == 1
    rows = read_summary(tmp_path / "sweep")
    assert [r["status"] for r in rows] == ["finished", "failed"]
    error_file = tmp_path / "sweep" / "1" / "error.txt"
    assert rows[1]["error"] == (
        "cannot access local variable 'loss_per_module' where it is not associated with a "
        f"value (traceback in {error_file})"
    )
    assert "ray/rllib/core/learner" in error_file.read_text()


def test_speedup_baseline_is_the_compile_none_job_with_equal_overrides():
    def row(*overrides: str, steps: float) -> dict:
        return {"_overrides": list(overrides), "env_steps_per_s": steps}

    rows = [
        row("compile=none", "scaling.num_env_runners=1", steps=100.0),
        row("compile=eager", "scaling.num_env_runners=1", steps=150.0),
        row("compile=eager", "scaling.num_env_runners=2", steps=150.0),  # no baseline
        row("compile.backend=eager", "compile.env_runners=true", steps=80.0),
        row(steps=50.0),  # the defaults: compile=none
    ]
    sweep._add_speedups(rows)
    assert rows[1]["speedup"] == pytest.approx(0.5)
    assert "speedup" not in rows[2] and "speedup" not in rows[0]
    # compile.* settings without a compile= override still compile: not a baseline...
    assert "speedup" not in rows[4]
    # ...and they are measured against the job without them.
    assert rows[3]["speedup"] == pytest.approx(80 / 50 - 1)


@pytest.mark.slow
def test_seeds_are_grouped_with_intervals_and_a_learning_curve(tmp_path: Path):
    """Three seeds of one configuration: one row with the pass rate, IQMs with scipy's
    bootstrap intervals, the median steps to threshold, and the learning-curve plot."""
    job = [o for o in JOB if o != "stop.iterations=1"]
    proc = run_sweep(
        tmp_path,
        "seed=0,1,2",
        *job,
        "check.threshold=27",
        "check.env_steps=1200",
        "stop.iterations=null",
    )
    sweep_dir = tmp_path / "sweep"
    summaries = [json.loads((sweep_dir / str(n) / "summary.json").read_text()) for n in range(3)]
    passed = [s["check"]["passed"] for s in summaries]
    # A seed that misses the check fails its job, as RLlib's --as-test does.
    assert proc.returncode == (0 if all(passed) else 1), proc.stderr
    with (sweep_dir / "seeds.csv").open() as f:
        (row,) = list(csv.DictReader(f))
    assert "check.threshold=27" in row["configuration"] and "seed=" not in row["configuration"]
    assert (int(row["seeds"]), int(row["passed"])) == (3, sum(passed))
    finals = np.array([s["final_episode_return_mean"] for s in summaries])
    assert float(row["final_return_iqm"]) == pytest.approx(stats.trim_mean(finals, 0.25))
    assert float(row["final_return_low"]) <= float(row["final_return_iqm"])
    assert float(row["final_return_iqm"]) <= float(row["final_return_high"])
    assert float(row["final_return_low"]) >= finals.min() - 1e-9
    assert float(row["final_return_high"]) <= finals.max() + 1e-9
    steps = [s["check"]["env_steps_to_threshold"] for s in summaries if s["check"]["passed"]]
    expected = np.median(steps) if steps else None
    assert (float(row["steps_to_threshold_median"]) if steps else None) == expected
    assert (sweep_dir / row["curve"]).read_bytes()[:4] == b"\x89PNG"
    assert "## Over seeds" in (sweep_dir / "summary.md").read_text()
    # The report's verification table: the same seeds, one row, its criterion.
    out = tmp_path / "report"
    assert report.main([str(sweep_dir), "--out", str(out)]) == 0
    table = (out / "verification.md").read_text().splitlines()
    (line,) = [t for t in table if t.startswith("| python -m runner ")]
    assert f"| 27 within 1,200 | {sum(passed)}/3 |" in line
    assert (out / "learning_curve_0.png").is_file()


def test_interval_and_curve_band():
    from runner.results import seeds

    assert seeds.interval([5.0], seeds.iqm) == (5.0, 5.0, 5.0)
    assert seeds.interval([None], seeds.iqm) == (None, None, None)
    point, low, high = seeds.interval([1.0, 2.0, 3.0, 4.0, 100.0], seeds.iqm)
    assert point == pytest.approx(3.0) and low < point < high < 100.0
    # A run that stopped early holds its last value; before its first point it has none.
    early = (np.array([10.0, 20.0]), np.array([1.0, 3.0]))
    late = (np.array([10.0, 40.0]), np.array([1.0, 5.0]))
    grid, mid, _, _ = seeds.band([early, late])
    assert grid[0] == 10.0 and grid[-1] == 40.0
    assert mid[-1] == pytest.approx(4.0)  # mean of 3 (held) and 5
    # Below 4 seeds an IQM trims nothing: the legend says mean, as the tables do.
    assert [seeds.center(n) for n in (1, 3, 4)] == [
        "mean over 1 seed",
        "mean over 3 seeds",
        "IQM over 4 seeds",
    ]


def test_a_measured_threshold_names_the_random_policy_in_the_criterion():
    from runner import report

    assert report.criterion({"threshold": 27.0, "baseline_return": None}) == "27"
    measured = {"threshold": -54.38, "baseline_return": -79.67, "baseline_stds": 1.0}
    assert report.criterion(measured) == "-54.4 (a random policy's -79.7 + 1 std)"
    assert report.criterion({"threshold": None, "baseline_return": None}) == "not measured"


def test_a_criterion_on_a_win_rate_puts_the_win_rate_in_the_returns_place(tmp_path: Path):
    """tuned_ppo_tictactoe's check is on the greedy evaluation's win rate: the table shows
    each seed's last win rate (metrics.jsonl) and best (the check's), marked so."""
    from runner.results import seeds

    metric = "evaluation/env_runners/win_rate"
    rows = []
    for seed, (last, best) in enumerate([(0.96, 0.96), (0.9, 0.95), (0.97, 0.97)]):
        job = tmp_path / str(seed)
        job.mkdir()
        lines = [{"iteration": 1, "metrics": {metric: 0.5}}, {"iteration": 2, "metrics": {}}]
        lines.insert(1, {"iteration": 2, "metrics": {metric: last}})
        (job / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
        check = {"enabled": True, "metric": metric, "threshold": 0.95, "passed": best >= 0.95}
        check |= {"best": best, "env_steps_to_threshold": 1000 if best >= 0.95 else None}
        check |= {"env_steps_budget": 5000, "source": "s"}
        rows.append(
            {
                "_overrides": ["experiment=x", f"seed={seed}"],
                "_dir": job,
                "check": check,
                "final_eval_return_mean": 0.0,  # a zero-sum game's sum: not what it judges
                "wall_seconds": 1.0,
            }
        )
    (row,) = seeds.group(rows, tmp_path, lambda r: "x")
    assert row["return_of"] == "evaluation win_rate"
    assert seeds.evaluated(row) == " (evaluation win_rate)"
    assert row["final_return_iqm"] == pytest.approx(stats.trim_mean([0.96, 0.9, 0.97], 0.25))
    assert row["best_return_iqm"] == pytest.approx(stats.trim_mean([0.96, 0.95, 0.97], 0.25))
    assert seeds.interval_text(row, "final_return").startswith("0.94 [")
    assert row["passed"] == 3


def test_a_job_row_carries_the_evaluation_returns(tmp_path: Path):
    """A criterion on the evaluation's return needs the evaluation's returns in the rows
    the seed table is made of (a job's summary.json has both kinds)."""
    job = tmp_path / "0"
    job.mkdir()
    figures = {
        f"{w}_{k}_return_mean": float(n)
        for n, (w, k) in enumerate(
            [("final", "episode"), ("best", "episode"), ("final", "eval"), ("best", "eval")]
        )
    }
    (job / "summary.json").write_text(json.dumps({"check": {}, **figures}))
    (job / "composed_overrides.yaml").write_text("- seed=0\n")
    row = sweep.job_row(job)
    assert {k: row[k] for k in figures} == figures
