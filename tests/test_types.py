"""The static type check over runner/ (pyproject's [tool.mypy]), in the suite CI runs.

What no simulation reaches, the check does: a call to a function torch does not have
(torch.cuda.get_devicecapability_tuple crashed every run on a GPU machine while every CPU
test passed) fails here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


# mypy's incremental caches, one per check (the two may run at once), outside the
# checkout: mypy checks each cached file against its source, so a warm one only saves time.
CACHE = Path.home() / ".cache" / "rllib-runner"


def mypy(*args: str, cache: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """`python -m mypy` with the project's config and the named cache."""
    command = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml")]
    command += ["--cache-dir", str(CACHE / cache)]
    return subprocess.run([*command, *args], cwd=cwd, capture_output=True, text=True, timeout=600)


def test_runner_type_checks_clean():
    result = mypy(cache="mypy-runner")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success: no issues found" in result.stdout


def test_a_call_to_a_function_torch_lacks_fails_the_check(tmp_path: Path):
    module = tmp_path / "gpu_probe.py"
    module.write_text(
        "import torch\n\n\n"
        "def capability() -> str:\n"
        '    return "{}.{}".format(*torch.cuda.get_devicecapability_tuple(0))\n'
    )
    result = mypy(str(module), cache="mypy-probe", cwd=tmp_path)
    assert result.returncode == 1
    assert 'Module has no attribute "get_devicecapability_tuple"' in result.stdout
    assert "get_device_capability" in result.stdout  # mypy's own did-you-mean
