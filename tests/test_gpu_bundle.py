"""benchmarks/gpu_bundle.py, rehearsed here: docs/gpu.md's commands (section "On a bare GPU
machine") build the bundle as a user does, then run its dry part in a Python 3.12 venv made
like the GPU machine, with no index and no network for the bundle.

The machine has Python 3.12, torch 2.11.0+cu130 and the packages in gpu_bundle.BOX, and
no Ray. Its stand-in here (`box`): a python3.12 venv with that torch (PyPI has no CPU build
of torch for Python 3.12 and this machine's disk has one for 3.11 only, so the CUDA build,
with the CUDA libraries it loads, from this machine's disk where they lie there; it runs on
the CPU), and the machine's packages that the bundle leaves to it, from the index. It holds
nothing of the bundle's (checked), so it is kept between runs in
~/.cache/rllib-runner/gpu-box (about 5 GB; made again when what it should hold changes).
The bundle itself goes into a new --target folder each run, as run.sh installs it there.
"""

from __future__ import annotations

import ast
import base64
import csv
import hashlib
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import zipfile
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from readme import commands
from test_readme import WAYS

ROOT = Path(__file__).resolve().parent.parent
SECTION = "On a bare GPU machine"
_spec = importlib.util.spec_from_file_location("gpu_bundle", ROOT / "benchmarks" / "gpu_bundle.py")
gpu_bundle = importlib.util.module_from_spec(_spec)
sys.modules["gpu_bundle"] = gpu_bundle
_spec.loader.exec_module(gpu_bundle)

# docs/gpu.md's commands of the section, each with its exit code and what it must print
# here, from the one table of every page's commands.
SHOWN = {c.text: WAYS[c.text] for c in commands() if c.section == SECTION}
SMOKE_STEPS = ["main", "compiled", "dqn", "bench", "learners2"]

# The GPU machine's stand-in.


def _python312() -> str | None:
    """A Python 3.12 that runs (pyenv's shim on PATH may name a version it does not serve)."""
    pyenv = sorted((Path.home() / ".pyenv" / "versions").glob("3.12*/bin/python3.12"))
    for candidate in (shutil.which("python3.12"), *map(str, pyenv)):
        check = "import sys, venv; assert sys.version_info[:2] == (3, 12)"
        if (
            candidate
            and subprocess.run([candidate, "-c", check], capture_output=True).returncode == 0
        ):
            return candidate
    return None


PYTHON312 = _python312()
TORCH = f"torch=={gpu_bundle.BOX['torch']}"
# The CUDA 13 libraries torch's CUDA build links to (it does not import without them).
CUDA_LIBS = [
    "nvidia-cublas", "nvidia-cuda-cupti", "nvidia-cuda-nvrtc", "nvidia-cudnn-cu13",
    "nvidia-cufft", "nvidia-cufile", "nvidia-curand", "nvidia-cusolver", "nvidia-cusparse",
    "nvidia-cusparselt-cu13", "nvidia-nccl-cu13", "nvidia-nvjitlink", "nvidia-nvshmem-cu13",
    "nvidia-nvtx",
]  # fmt: skip
LOCAL_WHEELS = Path("/opt/pypi-more/files")  # where this machine keeps them (2 GB)
TORCH_NEEDS = ["filelock", "fsspec", "jinja2", "networkx", "setuptools<82", "sympy"]
BOX_CACHE = Path.home() / ".cache" / "rllib-runner" / "gpu-box"


def module_level_imports(path: Path) -> set[str]:
    """The top-level names of the modules `path` imports when it is imported (not inside a
    function, nor under `if TYPE_CHECKING`)."""

    def walk(body: list[ast.stmt]):
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                yield from walk(node.orelse)
                continue
            if isinstance(node, ast.Import):
                yield from (alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                yield node.module.split(".")[0]
            for name in ("body", "orelse", "finalbody", "handlers"):
                yield from walk(getattr(node, name, []))

    return set(walk(ast.parse(path.read_text()).body))


def imported_distributions() -> dict[str, set[str]]:
    """The distributions runner/ and benchmarks/gpu_smoke.py import at module level, each
    with the files that do."""
    dists = {
        module: {gpu_bundle.canon(d) for d in names}
        for module, names in packages_distributions().items()
    }
    found: dict[str, set[str]] = {}
    for path in [*sorted((ROOT / "runner").rglob("*.py")), ROOT / "benchmarks" / "gpu_smoke.py"]:
        for module in module_level_imports(path) - set(sys.stdlib_module_names) - {"runner"}:
            for dist in dists.get(module, {f"? {module}"}):
                found.setdefault(dist, set()).add(path.relative_to(ROOT).as_posix())
    return found


def test_left_out_packages_are_imported_only_inside_functions():
    """What the bundle leaves out is never imported when a runner module is; every other
    module-level import is of a package the bundle or the GPU machine has."""
    found = imported_distributions()
    assert {d: found[d] for d in found if d in gpu_bundle.LEFT_OUT} == {}
    unknown = {d: files for d, files in found.items() if d.startswith("?")}
    assert unknown == {}, "a module-level import no installed distribution provides"
    assert {"torch", "ray", "hydra-core", "gymnasium"} <= found.keys()


def test_pip_without_the_index_is_one_line(tmp_path: Path):
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": ""}
    proc = subprocess.run(
        [sys.executable, ROOT / "benchmarks" / "gpu_bundle.py", "--out", tmp_path / "bundle"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: gpu_bundle: pip could not download "), line
    assert "reach the package index" in line
    assert not (tmp_path / "bundle").exists() and list(tmp_path.iterdir()) == []


def user_dir(path: Path) -> Path:
    """What `python benchmarks/gpu_bundle.py` reads, as in a checkout, and a HOME."""
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, path / name)
    for name in ("runner", "conf", "benchmarks"):
        shutil.copytree(ROOT / name, path / name, ignore=shutil.ignore_patterns("__pycache__"))
    (path / "home").mkdir()
    return path


def run(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        ["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    code, expect = SHOWN[command].code, SHOWN[command].expect
    out = proc.stdout + proc.stderr
    assert proc.returncode == code, f"{command}\n{out[-4000:]}"
    assert expect in out, f"{command}\n{out[-4000:]}"
    assert "Traceback" not in out, f"{command}\n{out[-4000:]}"
    if code == 2:
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    return proc


def box_venv(needed: list[str]) -> Path:
    """The GPU machine's stand-in: a python3.12 venv with its torch and `needed`, made once
    for what it holds."""
    key = json.dumps([PYTHON312, TORCH, CUDA_LIBS, TORCH_NEEDS, sorted(needed)])
    venv = BOX_CACHE / f"py312-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    if (venv / "ready").is_file():
        return venv
    shutil.rmtree(BOX_CACHE, ignore_errors=True)  # an older one, or one left unfinished
    BOX_CACHE.mkdir(parents=True)
    subprocess.run([PYTHON312, "-m", "venv", venv], check=True, timeout=300)
    pip = [venv / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    local = ["--no-index", "--find-links", LOCAL_WHEELS] if LOCAL_WHEELS.is_dir() else []
    for args in (["--no-deps", TORCH], ["--no-deps", *local, *CUDA_LIBS], TORCH_NEEDS + needed):
        proc = subprocess.run([*pip, *args], capture_output=True, text=True, timeout=1200)
        assert proc.returncode == 0, f"making the GPU machine's stand-in: {args}\n{proc.stderr}"
    (venv / "ready").write_text(key)
    return venv


def check_ray_wheel(path: Path) -> None:
    """No ray/jars/, and a RECORD that lists every other member with its hash and size."""
    with zipfile.ZipFile(path) as whl:
        names = whl.namelist()
        assert not [n for n in names if n.startswith("ray/jars/")]
        (record,) = [n for n in names if n.count("/") == 1 and n.endswith(".dist-info/RECORD")]
        rows = {r[0]: r[1:] for r in csv.reader(io.StringIO(whl.read(record).decode())) if r}
        assert rows.keys() == set(names) and rows[record] == ["", ""]
        for name in names:
            if name != record:
                data = whl.read(name)
                digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
                assert rows[name] == [f"sha256={digest.decode()}", str(len(data))], name
        for binary in ("ray/core/src/ray/raylet/raylet", "ray/core/src/ray/gcs/gcs_server"):
            assert whl.getinfo(binary).external_attr >> 16 & 0o111, f"{binary} lost its exec bit"


@pytest.mark.slow
@pytest.mark.box
def test_bundle_builds_fits_and_plans_on_a_bare_python312(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    if PYTHON312 is None:
        pytest.skip("no python3.12 here to stand in for the GPU machine's Python")
    shown = list(SHOWN)
    assert len(shown) == 4, f"docs/gpu.md's '{SECTION}' commands changed: update this test"
    cwd = user_dir(tmp_path)
    here = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}

    built = run(shown[0], cwd, here)
    bundle = cwd / ".gpu_bundle"
    manifest = json.loads((bundle / gpu_bundle.MANIFEST).read_text())
    files = {p.relative_to(bundle).as_posix(): p.stat().st_size for p in bundle.rglob("*")}
    assert sum(files.values()) <= gpu_bundle.LIMIT_MIB * 2**20
    assert all(name in built.stdout for name in files)  # each file's size is printed
    wheels = {f for f in files if f.endswith(".whl")}
    assert wheels == {w["file"] for w in manifest["wheels"].values()} | {manifest["project"]}
    check_ray_wheel(bundle / manifest["wheels"]["ray"]["file"])
    bundled = set(manifest["wheels"])
    assert bundled & (gpu_bundle.BOX.keys() | gpu_bundle.LEFT_OUT.keys()) == set()
    assert {"ray", "hydra-core", "omegaconf", "gymnasium", "tensorboardx", "ale-py"} <= bundled
    assert manifest["dropped_from_ray"] == ["ray/jars/ray_dist.jar"]
    assert manifest["warnings"] == []

    # Over the limit: one line, and a non-zero exit.
    monkeypatch.setattr(gpu_bundle, "LIMIT_MIB", 1)
    assert gpu_bundle.report(bundle, manifest) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "over the 1 MiB" in err, err
    monkeypatch.undo()

    # The machine: its packages the bundle leaves to it, and those the runner imports.
    from_box = (manifest["from_the_machine"].keys() | imported_distributions().keys()) & (
        gpu_bundle.BOX.keys() - {"torch"}
    )
    box = box_venv(
        sorted(f"{n}=={gpu_bundle.BOX[n]}" if gpu_bundle.BOX[n] else n for n in from_box)
    )
    installed = subprocess.run(
        [box / "bin" / "python", "-m", "pip", "list", "--format=json"],
        capture_output=True,
        text=True,
        check=True,
    )
    present = {gpu_bundle.canon(d["name"]) for d in json.loads(installed.stdout)}
    assert present & (bundled | gpu_bundle.LEFT_OUT.keys() | {"rllib-runner"}) == set()

    # The bundle's part, without an index or a network: pip is told of none, and a proxy
    # that answers nothing stands for the network.
    site = tmp_path / "site"
    dead = "http://127.0.0.1:9"
    bare = {
        "PATH": f"{box / 'bin'}{os.pathsep}/usr/bin{os.pathsep}/bin",
        "HOME": str(cwd / "home"),
        "SITE": str(site),
        "LANG": "C.UTF-8",
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_NO_INDEX": "1",
        **dict.fromkeys(("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"), dead),
    }
    dry = run(shown[1], cwd, bare)
    assert "== install: " in dry.stdout and f"runner {site}/runner/__init__.py" in dry.stdout
    runs = cwd / "outputs" / "gpu_dry"
    plan = json.loads((runs / "dry_run" / "plan.json").read_text())
    assert plan["total"]["gpus"] == 1 and "has no GPU" in plan["preflight"]["problems"][0]
    train2 = json.loads((runs / "train2_plan" / "plan.json").read_text())
    assert {g["role"]: g["count"] for g in train2["groups"]}["learner"] == 1
    smoke = json.loads((runs / "smoke_plan" / "smoke.json").read_text())
    assert [s["step"] for s in smoke["steps"]] == SMOKE_STEPS
    assert all(s["exit"] == 0 for s in smoke["steps"]), smoke["steps"]
    assert smoke["machine"].startswith(f"torch {gpu_bundle.BOX['torch']}+cu130")
    for command in shown[2:]:  # here, refused in one line before anything is installed
        run(command, cwd, bare)
