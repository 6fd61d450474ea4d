"""The published CPU headline backend, for real: runs in CI's IPEX lane (torch 2.8 + IPEX 2.8).

Selected with `-m ipex`; the main lane (torch 2.13, where IPEX cannot import) deselects it.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.ipex


def test_ipex_compiles_env_runner_and_learner_and_matches_eager(cli):
    result = cli("debug=tiny", "stop.iterations=3", "compile=ipex_default")
    assert result.returncode == 0, result.stderr
    compile_summary = result.json("summary.json")["compile"]
    parts = {c["component"]: c for c in compile_summary["components"]}
    assert parts["env_runner/0"]["took_effect"] and parts["env_runner/0"]["frames"] > 0
    assert parts["learner/0"]["took_effect"] and parts["learner/0"]["frames"] > 0
    rows = result.jsonl("metrics.jsonl")
    assert all(r["compile_max_abs_diff"] <= 1e-5 for r in rows)
    assert result.json("summary.json")["versions"]["torch"].startswith("2.8.")
