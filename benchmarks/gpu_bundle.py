"""The GPU check as one folder for a bare GPU machine: the wheels it lacks, and run.sh.

    python benchmarks/gpu_bundle.py                 # here (network): writes .gpu_bundle/
    python benchmarks/gpu_bundle.py --out DIR

The GPU machine this is for has Python 3.12 with a CUDA build of torch and the packages in
BOX, but no Ray, no package registry and no network, and takes at most 64 MiB of files with
a run. So the bundle holds, as wheels for CPython 3.12 on manylinux x86_64:

- ray 2.60.0, repacked without its Java jars (`ray/jars/`, 31 MiB that only Java workers
  load), its RECORD rewritten for the files that are left;
- the rest of pyproject.toml's [project].dependencies with their dependencies, read from
  each downloaded wheel's METADATA (Requires-Dist whose markers hold on Linux, CPython 3.12;
  `extra == ...` ones only for an extra asked for, such as ray's `rllib`), less the
  packages the machine has (BOX, not looked into further) and less LEFT_OUT: dependencies
  the check never imports (each imported inside the function that needs it, or by a
  plugin that must be named);
- the project itself (`pip wheel --no-deps`), and a copy of benchmarks/gpu_smoke.py.

run.sh installs them with `pip install --no-index --no-deps --target` and runs the check;
bundle.json says what is in it and what it expects of the machine. The folder must stay
within 60 MiB: the script prints each file's size and exits non-zero when it is over.
Only the standard library and pip are used, so any Python with pip builds it.
"""

from __future__ import annotations

import argparse
import base64
import csv
import email.parser
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.specifiers import SpecifierSet
from pip._vendor.packaging.version import Version

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    from pip._vendor import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
LIMIT_MIB = 60
PYTHON = "3.12"
PYTHON_FULL = "3.12.3"
ABI = "cp312"
# glibc 2.28 and older (pip does not widen a manylinux_2_x platform to older ones itself);
# pure `py3-none-any` wheels are always accepted.
PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(28, 16, -1)] + [
    "manylinux2014_x86_64"
]
# Where the markers are evaluated: the GPU machine's Python.
MARKER_ENV = {
    "implementation_name": "cpython",
    "implementation_version": PYTHON_FULL,
    "os_name": "posix",
    "platform_machine": "x86_64",
    "platform_python_implementation": "CPython",
    "platform_release": "",
    "platform_system": "Linux",
    "platform_version": "",
    "python_full_version": PYTHON_FULL,
    "python_version": PYTHON,
    "sys_platform": "linux",
}
# What the GPU machine has (its torch venv), with the versions known. Not bundled, and their
# own dependencies are taken to be there.
BOX_PACKAGES = """
    absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
    certifi charset-normalizer click cloudpickle colorama contourpy cycler filelock flatbuffers
    fonttools frozenlist fsspec grpcio h11 h5py httpcore httpx idna imageio jinja2 joblib
    kiwisolver markdown markdown-it-py markupsafe matplotlib mdurl msgpack multidict networkx
    numpy onnx onnxruntime onnxscript opencv-python-headless packaging pandas pillow pip
    prometheus-client propcache protobuf psutil pyarrow pygments pyparsing pytest
    python-dateutil pyyaml regex requests rich scipy setuptools six sympy tensorboard torch tqdm
    triton typing-extensions urllib3 wheel yarl zipp
"""
BOX = {
    **dict.fromkeys(BOX_PACKAGES.split(), ""),  # noqa: SIM905 - the list as the machine gives it
    "numpy": "2.5.2",
    "onnx": "1.23.1",
    "onnxruntime": "1.30.0",
    "torch": "2.11.0",
}
# pyproject dependencies the GPU check does not import: `python -m runner dry_run=true`, a
# PPO run and benchmarks/gpu_smoke.py's steps never reach them. A kept package that needs
# one of them still gets it.
LEFT_OUT = {
    "hydra-joblib-launcher": "a Hydra plugin, loaded only for hydra/launcher=joblib",
    "moviepy": "video only (record.every, task.video): gymnasium's RecordVideo imports it",
    "imageio-ffmpeg": "video only: moviepy's ffmpeg (a 30 MiB binary)",
    "pygame": "video only: CartPole's and Pendulum's rgb_array frames",
    "optuna": "task=tune only (imported in runner/tasks/tune.py's functions)",
    "mlflow-skinny": "logger=mlflow only (imported in runner/results/tracking.py's functions)",
    "sqlalchemy": "logger=mlflow's SQLite store only",
    "alembic": "logger=mlflow's SQLite store only",
    "huggingface-hub": "task=push and hf:// only (imported in runner/results/hub.py's functions)",
    "hydra-submitit-launcher": "a Hydra plugin, loaded only for hydra/launcher=slurm",
    "submitit": "hydra/launcher=slurm only (the launcher's library)",
    "scikit-learn": "search.scheduler=pb2 and a search's importances only (PB2, fANOVA)",
}
RAY = "ray"
RAY_DROPPED = "ray/jars/"
RUN_SH = "run.sh"
MANIFEST = "bundle.json"  # what the bundle holds, what it leaves to the machine and to whom


class BundleError(Exception):
    """One line for the user: what went wrong and what to do."""


def canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass
class Wheel:
    path: Path
    name: str
    version: Version
    requires: list[Requirement]


@dataclass
class Needs:
    """What the requirements walked so far ask of one package."""

    spec: SpecifierSet = field(default_factory=SpecifierSet)
    extras: set[str] = field(default_factory=set)
    by: set[str] = field(default_factory=set)


def read_wheel(path: Path) -> Wheel:
    with zipfile.ZipFile(path) as whl:
        (metadata,) = [n for n in whl.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
        message = email.parser.Parser().parsestr(whl.read(metadata).decode())
    return Wheel(
        path,
        canon(message["Name"]),
        Version(message["Version"]),
        [Requirement(r) for r in message.get_all("Requires-Dist") or []],
    )


def applies(req: Requirement, extras: set[str]) -> bool:
    """Whether `req` holds on the GPU machine's Python, for the package's extras asked for."""
    if req.marker is None:
        return True
    return any(req.marker.evaluate({**MARKER_ENV, "extra": e}) for e in {"", *extras})


def project_requirements(root: Path) -> list[Requirement]:
    deps = tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
    return [Requirement(d) for d in deps]


def walk(roots: list[Requirement], chosen: dict[str, Wheel]) -> dict[str, Needs]:
    """Every package reached from `roots` through the chosen wheels' Requires-Dist: a
    package the machine has, or not yet chosen, is a leaf."""
    needs: dict[str, Needs] = {}
    todo = [(r, "pyproject.toml") for r in roots if applies(r, set())]
    expanded: dict[str, set[str]] = {}
    while todo:
        req, by = todo.pop()
        name = canon(req.name)
        need = needs.setdefault(name, Needs())
        need.spec &= req.specifier
        need.extras |= req.extras
        need.by.add(by)
        wheel = chosen.get(name)
        if name in BOX or wheel is None or wheel.version not in need.spec:
            continue
        if expanded.get(name) == need.extras:
            continue
        expanded[name] = set(need.extras)
        todo += [(r, name) for r in wheel.requires if applies(r, need.extras)]
    return needs


def pip(args: list[str], what: str) -> None:
    """`python -m pip ARGS`; pip's own error line if it fails."""
    proc = subprocess.run(
        [sys.executable, "-m", "pip", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    if proc.returncode != 0:
        lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
        reason = next((line for line in lines if line.startswith("ERROR:")), None)
        reason = reason or (lines[-1] if lines else f"pip exited {proc.returncode}")
        raise BundleError(f"pip could not {what}: {reason.removeprefix('ERROR: ')}")


def download(reqs: list[str], into: Path) -> list[Path]:
    """The wheels for the GPU machine's Python, one per requirement, into a new folder. A
    requirement with no wheel (antlr4-python3-runtime 4.9.3, which hydra-core pins, is an
    sdist only) is built here, and must then be pure Python."""
    folder = Path(tempfile.mkdtemp(dir=into))
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    args = [
        "download", "--no-deps", "--only-binary=:all:", "--python-version", PYTHON,
        "--implementation", "cp", "--abi", ABI, *platforms, "--progress-bar", "off",
        "--timeout", "60", "--retries", "2", "-d", str(folder),
    ]  # fmt: skip
    remaining = list(reqs)
    while remaining:
        try:
            pip([*args, *remaining], f"download {' '.join(remaining)}")
            break
        except BundleError as ex:
            named = re.search(r"satisfies the requirement (\S+)", str(ex))
            failed = named and next(
                (r for r in remaining if canon(Requirement(r).name)
                 == canon(Requirement(named.group(1)).name)),
                None,
            )  # fmt: skip
            if not failed:
                raise
            reason = str(ex).split(": ", 1)[1]
            try:
                build_pure(failed, folder)
            except BundleError:
                if "(from versions: none)" in reason:
                    reason += "; does this machine reach the package index?"
                raise BundleError(f"pip could not download {failed}: {reason}") from None
            remaining.remove(failed)
    return sorted(folder.glob("*.whl"))


def build_pure(req: str, folder: Path) -> None:
    """`req`'s wheel built from its sdist, into `folder`: pure Python, or an error."""
    built = folder / "built"
    pip(["wheel", "--no-deps", "--no-binary=:all:", "-q", "-w", str(built), req], f"build {req}")
    (wheel,) = built.glob("*.whl")
    if not wheel.name.endswith("-none-any.whl"):
        raise BundleError(f"{req} has no wheel for CPython {PYTHON}; built here: {wheel.name}")
    wheel.rename(folder / wheel.name)


def resolve(roots: list[Requirement], into: Path) -> tuple[dict[str, Wheel], dict[str, Needs]]:
    """The wheels the roots need that the machine lacks, and what was asked of each
    package (those of the machine included)."""
    chosen: dict[str, Wheel] = {}
    for _ in range(20):
        needs = walk(roots, chosen)
        missing = {
            name: need
            for name, need in needs.items()
            if name not in BOX and (name not in chosen or chosen[name].version not in need.spec)
        }
        if not missing:
            return {n: chosen[n] for n in needs if n in chosen}, needs
        for path in download([f"{name}{need.spec}" for name, need in missing.items()], into):
            wheel = read_wheel(path)
            chosen[wheel.name] = wheel
    raise BundleError("the requirements did not settle in 20 rounds of downloads")


def record_line(name: str, data: bytes) -> list[str]:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [name, f"sha256={digest}", str(len(data))]


def same_as(info: zipfile.ZipInfo) -> zipfile.ZipInfo:
    """A new member like `info`: its name, time and mode (the exec bits of ray's raylet and
    gcs_server), deflated."""
    new = zipfile.ZipInfo(info.filename, info.date_time)
    new.external_attr, new.create_system = info.external_attr, info.create_system
    new.compress_type = zipfile.ZIP_DEFLATED
    return new


def repack_without(src: Path, dest: Path, dropped: str) -> list[str]:
    """`src` without the members under `dropped`, its RECORD rewritten for what is left
    (each entry's hash and size as the original RECORD had it, checked). The names dropped."""
    with zipfile.ZipFile(src) as whl:
        (record_name,) = [n for n in whl.namelist() if re.fullmatch(r"[^/]+\.dist-info/RECORD", n)]
        original = {
            row[0]: row for row in csv.reader(io.StringIO(whl.read(record_name).decode())) if row
        }
        removed, rows = [], []
        with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as out:
            for info in whl.infolist():
                if info.filename.startswith(dropped):
                    removed.append(info.filename)
                    continue
                if info.filename == record_name:
                    continue
                data = whl.read(info)
                row = record_line(info.filename, data)
                if original.get(info.filename, row)[1:] != row[1:]:
                    raise BundleError(f"{src.name}: {info.filename} does not match its RECORD")
                rows.append(row)
                out.writestr(same_as(info), data)
            rows.append([record_name, "", ""])
            text = io.StringIO()
            csv.writer(text, lineterminator="\n").writerows(rows)
            out.writestr(same_as(whl.getinfo(record_name)), text.getvalue())
    if not removed:
        raise BundleError(f"{src.name} has no {dropped}: is it still the wheel this expects?")
    return removed


def project_wheel(root: Path, into: Path) -> Path:
    """The project as a wheel, built from a clean copy of what it packages (a stale
    build/ in the checkout cannot add files to it)."""
    source = into / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(root / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("runner", "conf"):
        shutil.copytree(root / name, source / name, ignore=ignore)
    wheels = into / "project"
    pip(["wheel", "--no-deps", "-q", "-w", str(wheels), str(source)], "build the project wheel")
    (wheel,) = wheels.glob("*.whl")
    return wheel


def commit(root: Path) -> str:
    proc = subprocess.run(
        ["git", "-C", str(root), "describe", "--always", "--dirty"], capture_output=True, text=True
    )
    return proc.stdout.strip() or "unknown"


def write_run_sh(out: Path) -> None:
    (out / RUN_SH).write_text(RUN_SH_TEXT)
    (out / RUN_SH).chmod(0o755)


def sizes(out: Path) -> list[tuple[str, int]]:
    files = [p for p in out.rglob("*") if p.is_file()]
    return sorted(((p.relative_to(out).as_posix(), p.stat().st_size) for p in files),
                  key=lambda item: (-item[1], item[0]))  # fmt: skip


def mib(size: int) -> str:
    return f"{size / 2**20:.2f} MiB"


def build(out: Path, root: Path = ROOT) -> dict:
    """Writes the bundle into `out` (a bundle there before is replaced once the new one is
    whole); its manifest."""
    if out.exists() and (out.is_file() or (any(out.iterdir()) and not (out / MANIFEST).is_file())):
        raise BundleError(f"'{out}' exists and is not a bundle; pass a new --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpu_bundle_") as tmp:
        stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
        try:
            manifest = write_bundle(stage, root, Path(tmp))
            if out.exists():
                shutil.rmtree(out)
            stage.rename(out)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    return manifest


def write_bundle(out: Path, root: Path, tmp: Path) -> dict:
    roots = project_requirements(root)
    kept = [r for r in roots if canon(r.name) not in LEFT_OUT]
    chosen, needs = resolve(kept, tmp)
    ray = chosen[RAY]
    dropped = repack_without(ray.path, out / ray.path.name, RAY_DROPPED)
    for name, wheel in chosen.items():
        if name != RAY:
            shutil.copy2(wheel.path, out / wheel.path.name)
    own = project_wheel(root, tmp)
    shutil.copy2(own, out / own.name)
    (out / "benchmarks").mkdir()
    shutil.copy2(root / "benchmarks" / "gpu_smoke.py", out / "benchmarks" / "gpu_smoke.py")
    write_run_sh(out)
    box_needed = {n: str(needs[n].spec) for n in sorted(needs) if n in BOX}
    clashes = [
        f"the machine's {name} {BOX[name]} is outside {spec} "
        f"(asked by {', '.join(sorted(needs[name].by))})"
        for name, spec in box_needed.items()
        if BOX[name] and Version(BOX[name]) not in SpecifierSet(spec)
    ]
    manifest = {
        "python": PYTHON,
        "commit": commit(root),
        "wheels": {
            n: {"version": str(w.version), "file": w.path.name} for n, w in sorted(chosen.items())
        },
        "project": own.name,
        "from_the_machine": box_needed,
        "left_out": {n: LEFT_OUT[n] for n in sorted(LEFT_OUT) if n not in chosen},
        "dropped_from_ray": dropped,
        "warnings": clashes,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


RUN_SH_TEXT = r"""#!/usr/bin/env bash
# The GPU check, from this bundle (written by benchmarks/gpu_bundle.py; docs/gpu.md), on a
# machine with Python 3.12 and a CUDA build of torch, without Ray or a network:
#   bash run.sh          # check, then smoke
#   bash run.sh check    # python -m runner hardware=gpu dry_run=true, then 2 iterations
#                        # of hardware=gpu compile=inductor_ro scaling.num_learners=1 or 2
#   bash run.sh smoke    # benchmarks/gpu_smoke.py (under ten minutes)
#   bash run.sh dry      # any machine: plans all three (dry_run=true, gpu_smoke.py --dry-run)
# Each installs the wheels here first (pip --no-index --no-deps --target "$SITE"). Set
# PYTHON (python3), SITE (/tmp/site) and OUT (outputs): the runs go to $OUT/gpu_<what>.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
python=${PYTHON:-python3}
site=${SITE:-/tmp/site}
what=${1:-all}
case $what in all | check | smoke | dry) ;; *)
    echo "error: run.sh: '$what' is not one of all, check, smoke, dry" >&2
    exit 2
    ;;
esac
if ! gpus=$("$python" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null); then
    echo "error: run.sh: $python cannot import torch; set PYTHON to a Python with torch" >&2
    exit 2
fi
if [ "$what" != dry ] && [ "$gpus" = 0 ]; then
    echo "error: run.sh: torch sees no CUDA GPU here; run it on a GPU machine," \
        "or 'run.sh dry' to plan" >&2
    exit 2
fi
mkdir -p "${OUT:-outputs}"
runs=$(cd "${OUT:-outputs}" && pwd)/gpu_$what
if [ -d "$runs" ] && [ -n "$(ls -A "$runs")" ]; then
    echo "error: run.sh: '$runs' is not empty; set OUT to a new folder" >&2
    exit 2
fi
mkdir -p "$runs"
stamp=$(cat "$here"/*.whl | sha256sum | cut -c1-64)
if [ "$(cat "$site/.gpu_bundle" 2>/dev/null)" != "$stamp" ]; then
    echo "== install: $(ls "$here"/*.whl | wc -l) wheels into $site"
    "$python" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile \
        --upgrade --target "$site" "$here"/*.whl || exit 1
    echo "$stamp" >"$site/.gpu_bundle"
else
    echo "== installed: these wheels are in $site already"
fi
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$site/bin:$PATH"
cd "$runs"  # no runner/ folder here: the runner is the installed wheel
"$python" - <<'EOF' || exit 1
import sys, ray, runner, torch
print(f"python {sys.version.split()[0]}, torch {torch.__version__}", end="")
print(f" ({torch.cuda.device_count()} GPUs), ray {ray.__version__}, runner {runner.__file__}")
EOF
failed=()
step() {  # step NAME COMMAND...: the command's output also in NAME.log
    echo "== $1: ${*:2}"
    "${@:2}" 2>&1 | tee "$runs/$1.log"
    local code=${PIPESTATUS[0]}
    [ "$code" = 0 ] || failed+=("$1 (exit $code)")
}
learners=$((gpus < 1 ? 1 : gpus < 2 ? gpus : 2))  # one Learner per GPU, two at most
train2=(hardware=gpu compile=inductor_ro scaling.num_learners="$learners" stop.iterations=2)
if [ "$what" = dry ]; then
    step dry_run "$python" -m runner hardware=gpu dry_run=true hydra.run.dir="$runs/dry_run"
    step train2_plan "$python" -m runner "${train2[@]}" dry_run=true \
        hydra.run.dir="$runs/train2_plan"
    step smoke_plan "$python" "$here/benchmarks/gpu_smoke.py" --dry-run --out "$runs/smoke_plan"
fi
if [ "$what" = all ] || [ "$what" = check ]; then
    step dry_run "$python" -m runner hardware=gpu dry_run=true hydra.run.dir="$runs/dry_run"
    step train2 "$python" -m runner "${train2[@]}" hydra.run.dir="$runs/train2"
fi
if [ "$what" = all ] || [ "$what" = smoke ]; then
    step smoke "$python" "$here/benchmarks/gpu_smoke.py" --out "$runs/smoke"
fi
if [ ${#failed[@]} -gt 0 ]; then
    echo "run.sh: failed: ${failed[*]}; logs in $runs" >&2
    exit 1
fi
echo "run.sh: $what passed; runs in $runs"
"""


def report(out: Path, manifest: dict) -> int:
    """Each file's size and the folder's; 1, with one line, where it is over the limit."""
    listed = sizes(out)
    total = sum(size for _, size in listed)
    for name, size in listed:
        print(f"{mib(size):>12}  {name}")
    print(f"{mib(total):>12}  {out} ({len(listed)} files; limit {LIMIT_MIB} MiB)")
    for warning in manifest["warnings"]:
        print(f"warning: {warning}")
    if total > LIMIT_MIB * 2**20:
        print(
            f"error: gpu_bundle: {out} is {mib(total)}, over the {LIMIT_MIB} MiB a GPU machine's "
            "run carries; leave more out (LEFT_OUT) or drop more of ray",
            file=sys.stderr,
        )
        return 1
    print(f"written: {out}/{RUN_SH}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / ".gpu_bundle", help="the folder")
    args = parser.parse_args(argv)
    try:
        manifest = build(args.out)
    except BundleError as ex:
        print(f"error: gpu_bundle: {ex}", file=sys.stderr)
        return 2
    return report(args.out, manifest)


if __name__ == "__main__":
    sys.exit(main())
