"""The inference benchmark task, for real: tiny, on CartPole's and Breakout's PPO modules."""

from __future__ import annotations

import csv

import pytest


@pytest.mark.parametrize(
    ("env", "preset", "backend"),
    [("cartpole", "aot_eager", "aot_eager"), ("breakout", "inductor_default", "inductor")],
)
def test_inference_bench_writes_its_figures(cli, env, preset, backend):
    result = cli(
        "task=inference_bench",
        f"env={env}",
        f"compile={preset}",
        "task.batch_sizes=[1,4]",
        "task.iterations=20",
        "task.burn_in=5",
    )
    assert result.returncode == 0, result.stderr
    bench = result.json("bench.json")
    assert bench["task"] == "inference_bench" and bench["backend"] == backend
    assert bench["env"] == {"cartpole": "CartPole-v1", "breakout": "ALE/Breakout-v5"}[env]
    assert [r["batch_size"] for r in bench["rows"]] == [1, 4]
    for row in bench["rows"]:
        assert row["eager_calls_per_s"] > 0 and row["compiled_calls_per_s"] > 0
        expected = row["compiled_calls_per_s"] / row["eager_calls_per_s"] - 1
        assert row["speedup"] == pytest.approx(expected)
    assert bench["rows"][0]["first_call_seconds"] > 0
    with (result.run_dir / "bench.csv").open() as f:
        assert len(list(csv.DictReader(f))) == 2
    assert (result.run_dir / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (result.run_dir / "metrics.jsonl").exists()
    assert "speedup" in result.stdout


def test_inference_bench_needs_a_compile_preset(cli):
    result = cli("task=inference_bench", "env=cartpole", timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: task=inference_bench compares an eager with a compiled module: pick a compile "
        "preset, e.g. compile=inductor_default"
    ]
