"""The static type check over runner/ (pyproject's [tool.mypy]), in the suite CI runs.

What no simulation reaches, the check does: a call to a function torch does not have
(torch.cuda.get_devicecapability_tuple crashed every run on a GPU machine while every CPU
test passed) fails here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# mypy's incremental cache, outside the checkout: mypy checks each cached file against its
# source, so a warm one only saves time.
CACHE = Path.home() / ".cache" / "rllib-runner" / "mypy"

PROBE = (
    "import torch\n\n\n"
    "def capability() -> str:\n"
    '    return "{}.{}".format(*torch.cuda.get_devicecapability_tuple(0))\n'
)


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """One mypy over runner/ and a probe module with the crash's call: torch is analysed
    once for both (the check's time is mostly torch's and Ray's stubs). What it printed,
    and the probe's path."""
    probe = tmp_path_factory.mktemp("probe") / "gpu_probe.py"
    probe.write_text(PROBE)
    command = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml")]
    command += ["--cache-dir", str(CACHE), str(ROOT / "runner"), str(probe)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    return result.stdout + result.stderr, probe


def test_runner_type_checks_clean(checked: tuple[str, Path]):
    out, probe = checked
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert errors, out  # the probe's, below
    # (mypy names a cached module's error by the path it had when cached: a probe of an
    # earlier run's temp dir.)
    assert all(Path(line.split(":")[0]).name == probe.name for line in errors), out


def test_a_call_to_a_function_torch_lacks_fails_the_check(checked: tuple[str, Path]):
    out, probe = checked
    assert f'{probe.name}:5: error: Module has no attribute "get_devicecapability_tuple"' in out
    assert "get_device_capability" in out  # mypy's own did-you-mean
    assert "Found 1 error in 1 file" in out
