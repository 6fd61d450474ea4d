"""Reproductions: the generated experiment files, their plans on this machine, and
docs/reproductions.md's commands for real (an inference and an exploration reproduction,
the report over them, the page refreshed), then what they wrote, read back."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
from conftest import compose_config, prepared
from readme import commands
from test_readme import as_user_dir, run_block

import runner
from runner import CONFIG_DIR, docs, published, report
from runner.algorithms.algorithm_config import build_algorithm_config
from runner.compile.settings import ipex_problem
from runner.errors import RunnerError, one_line
from runner.machine import Resources
from runner.machine.preflight import check
from runner.tasks.exploration_bench import eager_twin

EXPERIMENTS = list(published.experiments())
# This machine for preflight, with no GPU, as CI has.
CPU_MACHINE = Resources(where="this machine", cpus=2, gpus=0, gpu_names=[], cpu_model="test")


def test_experiment_files_are_the_generated_ones():
    """conf/experiment/ holds exactly what runner/data/ generates: no figure typed twice."""
    on_disk = {
        p.stem
        for p in (Path(CONFIG_DIR) / "experiment").glob("*.yaml")
        if "runner.published --write" in p.read_text()
    }
    assert on_disk == set(EXPERIMENTS)
    for name, (title, cfg) in published.experiments().items():
        text = (Path(CONFIG_DIR) / "experiment" / f"{name}.yaml").read_text()
        assert text == published.render(name, title, cfg), "run python -m runner.published --write"


def test_every_published_table_and_headline_has_an_experiment():
    with (published.DATA / "torch_compile_inference_published.csv").open() as f:
        tables = {(r["hardware"], r["torch"], r["backend"], r["mode"]) for r in csv.DictReader(f)}
    assert len(tables) == len([n for n in EXPERIMENTS if n.startswith("inference_")])
    headlines = {n for n in EXPERIMENTS if n.startswith("headline_")}
    assert headlines == {
        "headline_cpu_201",
        "headline_t4_201",
        "headline_t4_21n",
        "headline_v100_201",
        "headline_v100_21n",
        "headline_a100_21n",
    }
    explorations = {n for n in EXPERIMENTS if n.startswith("exploration_")}
    assert explorations == {
        f"exploration_{b}_{m}"
        for b, m in [("onnxrt", "default"), ("onnxrt", "ro"), ("ipex", "default")]
        + [("ipex", "ro"), ("ipex", "ma")]
    }


def test_published_figures_reach_the_composed_config():
    cfg = compose_config(["experiment=inference_cpu_201_ipex_default"])
    rows = {r["batch_size"]: r["speedup"] for r in cfg.reproduction.published}
    assert rows == {1: pytest.approx(0.3612, abs=1e-4), 4: pytest.approx(0.2312, abs=1e-4)} | {
        16: pytest.approx(0.1500, abs=1e-4)
    }
    assert cfg.hardware.name == "cpu" and cfg.compile.backend == "ipex"
    assert (cfg.task.iterations, cfg.task.burn_in) == (5000, 500)
    assert prepared(["experiment=inference_cpu_201_ipex_default"]).task.name == "inference_bench"
    assert cfg.env.id == "ALE/Breakout-v5"


def test_headline_notes_say_which_appendix_row_has_the_figure():
    """The summary's V100 2.0.1 figure (92.43 %) is the appendix's max-autotune row."""
    cfg = compose_config(["experiment=headline_v100_201"])
    assert cfg.compile.mode == "reduce-overhead"
    assert cfg.reproduction.published[0].speedup == pytest.approx(0.9243)
    assert "inductor + max-autotune" in cfg.reproduction.note


@pytest.mark.slow
@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_plans_and_preflights_on_a_cpu_machine(name: str):
    """GPU reproductions refuse through the preflight; scale=local makes every one fit.
    Without the ipex extra, an ipex reproduction still plans: the missing package is a
    preflight problem."""
    job = prepared([f"experiment={name}"])
    cfg, plan = job.settings, job.plan
    if cfg.task.name == "exploration_bench":
        build_algorithm_config(eager_twin(cfg), None)
        # Published: "a Ray cluster of at least 129 CPUs (2x64 + 1) and 2 GPUs".
        assert (plan.total_cpus, plan.total_gpus) == (129, 2)
    result = check(cfg, job.config, plan, CPU_MACHINE, job.warnings, job.spec)
    missing = cfg.compile.backend == "ipex" and ipex_problem() is not None
    if missing:
        assert any("intel-extension-for-pytorch" in p for p in result.problems)
    fits = cfg.hardware.accelerator == "cpu" and cfg.task.name != "exploration_bench"
    assert result.ok == (fits and not missing)
    if not fits:
        assert any(p.endswith("scaled down on one CPU machine") for p in result.problems)

    local = prepared([f"experiment={name}", "scale=local"])
    local_result = check(
        local.settings, local.config, local.plan, CPU_MACHINE, local.warnings, local.spec
    )
    assert local_result.ok != missing
    assert local.settings.hardware.name == "cpu" and local.plan.total_gpus == 0


def test_gpu_reproduction_refuses_in_one_line(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RunnerError) as refused:
        runner.run(["experiment=headline_a100_21n"])
    line = one_line(refused.value)
    assert line.startswith("hardware=a100 expects an NVIDIA A100") and "scale=local" in line


def test_exploration_dry_run_plans_both_copies(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    result = runner.run(["experiment=exploration_onnxrt_default", "dry_run=true"])
    plan = json.loads((Path(result["run_dir"]) / "plan.json").read_text())
    assert plan["total"] == {"cpus": 129.0, "gpus": 2.0}
    assert not plan["preflight"]["ok"]
    assert "preflight would fail: hardware=gpu expects an NVIDIA GPU" in capsys.readouterr().out


def test_exploration_bench_needs_compiled_env_runners(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RunnerError) as refused:
        runner.run(["task=exploration_bench"])
    assert one_line(refused.value) == (
        "task=exploration_bench compares compiled with eager EnvRunners: pick a compile "
        "preset and keep compile.env_runners=true, e.g. compile=inductor_default"
    )


@pytest.fixture(scope="module")
def reproductions(tmp_path_factory) -> Path:
    """docs/reproductions.md's commands, run in a user's dir as the doc test runs a page
    (tests/test_readme.py): two reproductions at local scale, the report, the page refreshed."""
    cwd = as_user_dir(tmp_path_factory.mktemp("reproductions"))
    run_block(list(dict.fromkeys(c.text for c in commands() if c.section == "Reproductions")), cwd)
    return cwd


def run_of(cwd: Path, name: str) -> Path:
    """The run dir of reproduction `name` under cwd's outputs/."""
    (bench,) = [
        p
        for p in (cwd / "outputs").rglob("bench.json")
        if json.loads(p.read_text())["reproduction"]["name"] == name
    ]
    return bench.parent


@pytest.fixture(scope="module")
def exploration_run(reproductions: Path) -> Path:
    """The page's exploration reproduction at local scale (Breakout, a small batch)."""
    return run_of(reproductions, "exploration_onnxrt_default")


@pytest.fixture(scope="module")
def inference_run(reproductions: Path) -> Path:
    return run_of(reproductions, "inference_cpu_201_onnxrt_default")


@pytest.mark.slow
def test_the_page_shows_what_its_commands_measured(reproductions: Path):
    page = (reproductions / "docs" / "reproductions.md").read_text()
    measured = page.split("<!-- measured:begin -->")[1]
    assert "inference_cpu_201_onnxrt_default" in measured
    assert "exploration_onnxrt_default" in measured


@pytest.mark.slow
def test_exploration_bench_writes_both_throughputs(exploration_run: Path):
    bench = json.loads((exploration_run / "bench.json").read_text())
    assert bench["task"] == "exploration_bench" and bench["backend"] == "onnxrt"
    assert [(r["copy"], r["timed"]) for r in bench["rows"]] == [
        ("compiled", False),
        ("eager", False),
        ("eager", True),
        ("compiled", True),
    ]
    for copy in ("compiled", "eager"):
        timed = next(r for r in bench["rows"] if r["copy"] == copy and r["timed"])
        assert bench[f"{copy}_env_steps_per_s"] == pytest.approx(
            timed["env_steps"] / timed["seconds"]
        )
        assert timed["env_steps"] >= 200
    assert bench["speedup"] == pytest.approx(
        bench["compiled_env_steps_per_s"] / bench["eager_env_steps_per_s"] - 1
    )
    # The compiled copy really compiled its EnvRunner and matched eager after the sync.
    ran = [c for c in bench["compile"]["components"] if c["calls"] > 0]
    assert [c["component"] for c in ran] == ["env_runner/1"] and ran[0]["took_effect"]
    assert bench["compile"]["frames"] >= 1
    assert all(r["compile_max_abs_diff"] < 1e-4 for r in bench["rows"] if r["copy"] == "compiled")
    assert bench["num_env_runners"] == 1 and bench["scale"] == "local"
    assert (exploration_run / "bench.png").read_bytes()[:4] == b"\x89PNG"
    with (exploration_run / "bench.csv").open() as f:
        assert len(list(csv.DictReader(f))) == 4


@pytest.mark.slow
def test_report_puts_published_and_measured_side_by_side(
    exploration_run: Path, inference_run: Path, tmp_path: Path
):
    runs = tmp_path / "runs"
    for run in (exploration_run, inference_run):
        shutil.copytree(run, runs / run.name)
    readme = tmp_path / "README.md"
    readme.write_text(
        "# x\n<!-- reproductions:begin -->\nold\n<!-- reproductions:end -->\n"
        "text kept\n<!-- measured:begin -->\nold\n<!-- measured:end -->\n"
    )
    out = tmp_path / "report"
    code = report.main([str(runs), "--out", str(out), "--readme", str(readme)])
    assert code == 0
    md = (out / "report.md").read_text()
    # The published figures of the matching rows: CPU onnxrt default b1 +34.67 %, and the
    # PPO exploration onnxrt default -72.34 %.
    b1 = next(line for line in md.splitlines() if "inference_cpu_201_onnxrt_default" in line)
    assert "| 1 | +34.67 % |" in b1
    assert "| -72.34 % |" in next(line for line in md.splitlines() if "exploration_" in line)
    assert "CPU, torch 2.0.1+cu118" in md and "CPUs), torch " in md
    with (out / "report.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3 + 1
    inference = [r for r in rows if r["kind"] == "inference"]
    measured = json_rows(inference_run)
    for row in inference:
        assert float(row["measured_speedup"]) == pytest.approx(measured[int(row["batch_size"])])
    exploration = next(r for r in rows if r["kind"] == "exploration")
    assert "num_env_runners 1 vs 64" in exploration["differences"]
    assert "GPU Learner" in exploration["differences"]
    assert "iterations 20 vs 5000" in inference[0]["differences"]
    assert (out / "report.png").read_bytes()[:4] == b"\x89PNG"
    text = readme.read_text()
    assert "old" not in text and "text kept" in text
    assert "`headline_a100_21n`" in text and "+156.66 %" in text
    assert "| +34.67 % |" in text


def json_rows(run: Path) -> dict[int, float]:
    bench = json.loads((run / "bench.json").read_text())
    return {r["batch_size"]: r["speedup"] for r in bench["rows"]}


def test_report_bad_input_is_one_line(tmp_path: Path, capsys):
    assert report.main([str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    missing = tmp_path / "nowhere"
    assert err == [f"error: report: '{missing}' does not exist; pass run or sweep dirs"]
    assert report.main([str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert "no reproduction results" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_docs_refreshes_the_list_of_reproductions(tmp_path: Path, capsys):
    page = tmp_path / "page.md"
    page.write_text("# kept\n<!-- reproductions:begin -->\nold\n<!-- reproductions:end -->\n")
    assert docs.main([str(page)]) == 0
    text = page.read_text()
    assert text.startswith("# kept\n") and "old" not in text
    assert len([line for line in text.splitlines() if line.startswith("| `")]) == len(EXPERIMENTS)
    assert docs.main([str(tmp_path / "none.md")]) == 2
    assert docs.main([str(page), "--measured", str(page)]) == 2  # the page has no measured block
    err = capsys.readouterr().err.strip().splitlines()
    missing = tmp_path / "none.md"
    assert (
        err[0]
        == f"error: docs: '{missing}' does not exist; pass a Markdown page with marked blocks"
    )
    assert "has no '<!-- measured:begin -->'" in err[1]


def test_a_verification_of_one_experiment_keeps_the_other_rows(tmp_path: Path):
    """ONLY=<one experiment> in benchmarks/tuned_experiments.sh refreshes its own row of the
    page's table; the rows of the experiments it did not run stay, named as kept."""
    header = "| experiment | criterion | seeds passed |\n|---|---|---|\n"
    page = tmp_path / "tuned.md"
    page.write_text(
        "intro\n<!-- verification:begin -->\nGenerated by `old`.\n\n"
        + header
        + "| a | 1 | 3/3 |\n| b | 2 | 0/3 |\n<!-- verification:end -->\nafter\n"
    )
    docs.refresh(page, verification="Generated by `new`.\n\n" + header + "| b | 2 | 3/3 |\n")
    text = page.read_text()
    assert text.startswith("intro\n") and text.endswith("after\n")
    block = text.split("<!-- verification:begin -->\n")[1].split("<!-- verification:end -->")[0]
    assert block.splitlines() == [
        "Generated by `new`.",
        "",
        "Rows kept from the earlier table (not measured by this run): a.",
        "",
        *header.splitlines(),
        "| a | 1 | 3/3 |",
        "| b | 2 | 3/3 |",
    ]


def test_a_kept_row_of_fewer_than_4_seeds_is_marked_a_mean(tmp_path: Path):
    """An interquartile mean of 3 seeds trims nothing: a row kept from a table made before
    the report said so is marked "(mean)" like the report's own rows; 5 seeds are not."""
    header = "| experiment | seeds passed | final return | source |\n|---|---|---|---|\n"
    page = tmp_path / "tuned.md"
    page.write_text(
        "<!-- verification:begin -->\nGenerated by `old`.\n\n"
        + header
        + "| a | 3/3 | 500 [500, 500] |  |\n| b | 5/5 | 461 [453, 471] | s |\n"
        + "| c | 0/3 | - | s |\n<!-- verification:end -->\n"
    )
    docs.refresh(page, verification="Generated by `new`.\n\n" + header + "| d | 1/1 | 9 | s |\n")
    rows = [line for line in page.read_text().splitlines() if line.startswith("| ")][1:]
    assert rows == [
        "| a | 3/3 | 500 [500, 500] (mean) |  |",
        "| b | 5/5 | 461 [453, 471] | s |",
        "| c | 0/3 | - | s |",
        "| d | 1/1 | 9 | s |",
    ]


def gpu_bench(backend: str, **rows: int) -> dict:
    """A bench.json as a GPU run writes it, as plain data (no GPU here): the machine's first
    GPU is not the one the bench ran on."""
    return {
        "reproduction": {"name": "x", "kind": "inference", "hardware": "A100"}
        | {"torch": "2.1.0 nightly", "backend": backend, "mode": "default", "published": []},
        "hardware": {"cpus": 16, "gpus": 2, "gpu_names": ["NVIDIA A100-SXM4-80GB", "NVIDIA H200"]},
        "versions": {"torch": "2.13.0+cu130"},
        "device": "cuda",
        "device_name": "NVIDIA H200",
        "parameters_as_graph_inputs": True,
        "rows": [{"batch_size": 1, "cudagraph_skips": 0, "cudagraph_recordings": 1, **rows}],
    }


def test_report_names_the_gpu_measured_on_and_what_cuda_graphs_did():
    data = gpu_bench("cudagraphs")
    assert report.measured_on(data) == "NVIDIA H200, torch 2.13.0+cu130"
    notes = report.differences(data)
    assert "published on A100, measured on NVIDIA H200" in notes
    assert any("copies every weight into its graph's buffers on each replay" in n for n in notes)
    skipped = report.differences(gpu_bench("inductor", cudagraph_skips=2, cudagraph_recordings=0))
    assert "no CUDA graph ran: torch skipped them 2 time(s)" in skipped
    assert not any("copies every weight" in n for n in skipped)
    same = gpu_bench("inductor") | {"device_name": "NVIDIA A100 80GB PCIe"}
    assert not any(n.startswith("published on") for n in report.differences(same))
