"""The built wheel ships conf/ and runs without the clone; the code is ruff clean."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_ships_the_config_tree_and_runs(tmp_path: Path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(ROOT), "-w", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("rllib_runner-*.whl")
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), wheel],
        check=True,
        capture_output=True,
    )
    shipped = {
        p.relative_to(site / "runner" / "conf") for p in (site / "runner/conf").rglob("*.yaml")
    }
    in_clone = {p.relative_to(ROOT / "conf") for p in (ROOT / "conf").rglob("*.yaml")}
    assert shipped == in_clone

    env = {**os.environ, "PYTHONPATH": str(site)}
    code = "import runner; print(runner.__file__); print(runner.CONFIG_DIR)"
    where = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    ).stdout.split()
    assert where == [str(site / "runner" / "__init__.py"), str(site / "runner" / "conf")]
    dry = subprocess.run(
        [sys.executable, "-m", "runner", "algo=appo", "dry_run=true", "hydra.run.dir=run"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert dry.returncode == 0, dry.stderr
    assert (tmp_path / "run" / "plan.json").is_file()


def test_ruff_clean():
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "runner", "tests", "benchmarks"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout
