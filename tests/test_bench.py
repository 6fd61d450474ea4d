"""The inference benchmark task, for real: tiny, on CartPole's and Breakout's PPO modules."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

import runner
from runner.errors import ConfigError


@pytest.mark.slow
@pytest.mark.parametrize(
    ("env", "preset", "backend", "batch_sizes"),
    [
        ("cartpole", "aot_eager", "aot_eager", [1, 4, 16]),
        ("breakout", "inductor_default", "inductor", [4]),
    ],
)
def test_inference_bench_writes_its_figures(cli, env, preset, backend, batch_sizes):
    result = cli(
        "task=inference_bench",
        f"env={env}",
        f"compile={preset}",
        f"task.batch_sizes=[{','.join(map(str, batch_sizes))}]",
        "task.iterations=20",
        "task.burn_in=5",
    )
    assert result.returncode == 0, result.stderr
    bench = result.json("bench.json")
    assert bench["task"] == "inference_bench" and bench["backend"] == backend
    assert bench["env"] == {"cartpole": "CartPole-v1", "breakout": "ALE/Breakout-v5"}[env]
    assert [r["batch_size"] for r in bench["rows"]] == batch_sizes
    for row in bench["rows"]:
        assert row["eager_calls_per_s"] > 0 and row["compiled_calls_per_s"] > 0
        expected = row["compiled_calls_per_s"] / row["eager_calls_per_s"] - 1
        assert row["speedup"] == pytest.approx(expected)
        # As published, a compile of its own per batch size, static: one graph, compiled
        # at the first call (batch 16 reuses no symbolic graph of batch 4), no recompile.
        assert (row["frames"], row["unique_graphs"], row["recompiles"]) == (1, 1, 0), row
        assert row["first_call_seconds"] > 0
        assert (row["cudagraph_skips"], row["cudagraph_recordings"]) == (0, 0)
    assert (bench["device"], bench["device_name"]) == ("cpu", None)
    assert bench["parameters_as_graph_inputs"] is True
    with (result.run_dir / "bench.csv").open() as f:
        assert len(list(csv.DictReader(f))) == len(batch_sizes)
    assert (result.run_dir / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (result.run_dir / "metrics.jsonl").exists()
    assert "speedup" in result.stdout


def test_inference_bench_needs_a_compile_preset(tmp_path: Path):
    with pytest.raises(ConfigError) as refused:
        runner.run(["task=inference_bench", "env=cartpole", f"hydra.run.dir={tmp_path / 'run'}"])
    assert str(refused.value) == (
        "task=inference_bench compares an eager with a compiled module: pick a compile "
        "preset, e.g. compile=inductor_default"
    )
