"""The built wheel holds every file the code reads at run time and runs outside the clone
(as `pip install .` installs it); the code is ruff clean."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The wheel installed into a dir of its own; commands run with it first on the path.
    Built from a copy of the checkout without its build outputs: setuptools builds in the
    source's build/, where a file deleted from runner/ or conf/ since the last build stays
    and would be shipped."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"
    outputs = ("build", "*.egg-info", ".venv*", ".git", "outputs", ".*_cache", ".gpu_bundle")
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*outputs, "__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(source), "-w", str(tmp)],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp.glob("rllib_runner-*.whl")
    site = tmp / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), wheel],
        check=True,
        capture_output=True,
    )
    return site


def outside(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """`python <args>` in `cwd` (not the clone), importing the installed wheel."""
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def _files(root: Path, pattern: str) -> set[Path]:
    return {p.relative_to(root) for p in root.rglob(pattern) if "__pycache__" not in p.parts}


@pytest.mark.slow
def test_wheel_ships_every_file_the_code_reads(installed: Path):
    shipped = _files(installed / "runner" / "conf", "*.yaml")
    assert shipped == _files(ROOT / "conf", "*.yaml")
    data = {p for p in _files(ROOT / "runner" / "data", "*") if p.suffix in (".csv", ".md")}
    assert data and _files(installed / "runner" / "data", "*") == data
    modules = _files(ROOT / "runner", "*.py")
    assert _files(installed / "runner", "*.py") == modules


@pytest.mark.slow
def test_installed_wheel_runs_outside_the_clone(installed: Path, tmp_path: Path):
    where = outside(installed, tmp_path, "-c", "import runner; print(runner.CONFIG_DIR)")
    assert where.stdout.strip() == str(installed / "runner" / "conf")

    dry = outside(
        installed, tmp_path, "-m", "runner", "algo=appo", "dry_run=true", "hydra.run.dir=run"
    )
    assert dry.returncode == 0, dry.stderr
    assert (tmp_path / "run" / "plan.json").is_file()

    listed = outside(installed, tmp_path, "-m", "runner.published")
    assert listed.returncode == 0, listed.stderr
    assert len(listed.stdout.splitlines()) == 48

    bench = outside(
        installed,
        tmp_path,
        "-m",
        "runner",
        "experiment=inference_cpu_201_onnxrt_default",
        "task.iterations=5",
        "task.burn_in=1",
        "task.batch_sizes=[1]",
        "hydra.run.dir=runs/inference",
    )
    assert bench.returncode == 0, bench.stderr
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- reproductions:begin -->\n<!-- reproductions:end -->\n"
        "<!-- measured:begin -->\n<!-- measured:end -->\n"
    )
    report = outside(installed, tmp_path, "-m", "runner.report", "runs", "--doc", str(page))
    assert report.returncode == 0, report.stderr
    assert "inference_cpu_201_onnxrt_default" in (tmp_path / "outputs/report/report.md").read_text()
    assert "`headline_a100_21n`" in page.read_text()
    assert json.loads((tmp_path / "runs/inference/bench.json").read_text())["rows"]


def test_ruff_clean():
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "runner", "tests", "benchmarks"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout


def test_no_private_calls_into_the_standard_library():
    """The runner uses the standard library's public API only (its exit included): no
    `module._name` on a standard-library module, such as `threading._shutdown`."""
    import ast

    found = []
    for path in sorted((ROOT / "runner").rglob("*.py")):
        tree = ast.parse(path.read_text())
        stdlib = {
            alias.asname or alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.Import)
            for alias in node.names
            if alias.name.split(".")[0] in sys.stdlib_module_names
        }
        found += [
            f"{path.relative_to(ROOT)}:{node.lineno}: {node.value.id}.{node.attr}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in stdlib
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and node.attr != "_exit"  # os._exit: public, documented
        ]
    assert found == []
