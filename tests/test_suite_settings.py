"""The suite's own pytest settings (pyproject.toml's addopts), run for real on a tiny
suite of their own: what the README's test command does when a worker dies."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# A module-scoped group (as tests/conftest.py groups a module's fixture users) whose second
# test takes its worker down, beside tests outside the group.
CRASHING = """
import os, time
import pytest

@pytest.mark.xdist_group("shared")
def test_first_of_the_group(): pass

@pytest.mark.xdist_group("shared")
def test_a_segfault_in_the_worker(): os._exit(139)

@pytest.mark.xdist_group("shared")
def test_last_of_the_group(): pass

@pytest.mark.parametrize("n", range(4))
def test_outside(n): time.sleep(0.5)
"""


@pytest.mark.slow
def test_a_worker_that_dies_fails_the_run_within_seconds(tmp_path: Path):
    """With the addopts as they are, a crashed xdist worker fails the run in seconds; a
    replaced worker would leave `--dist loadgroup` waiting for ever (xdist#1378), and CI
    would end at its time limit with nothing said."""
    (tmp_path / "test_crash.py").write_text(CRASHING)
    settings = ["-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path)]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *settings, "."],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "crashed while running 'test_crash.py::test_a_segfault_in_the_worker" in out, out
