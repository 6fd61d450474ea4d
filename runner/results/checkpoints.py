"""Checkpoints that are whole or absent, checked before they are trusted, pruned as a run goes.

RLlib writes a checkpoint as a dir of files; a run killed while writing one would leave
a dir that looks like a checkpoint and is not. Here each is written to a hidden temporary
dir, gets `manifest.json` last (every file with its sha256, the iteration, env steps, the
episode return mean and the versions), and is renamed into place. A dir without a
manifest is incomplete and never chosen; one whose files differ from their manifest is
refused with one line naming the bad file and the newest good checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runner.errors import RunnerError
from runner.results.files import CHECKPOINTS, versions, write_json

CHECKPOINT_FILE = "rllib_checkpoint.json"  # RLlib's own marker
MANIFEST = "manifest.json"  # ours, written last
# What ranks a run's checkpoints for checkpoint.keep_best and `:best`: the return of the
# evaluation during training (eval.every), else the training return mean.
EVALUATION, TRAINING = "evaluation", "training"


class CorruptCheckpoint(RunnerError):
    """A checkpoint's files differ from its manifest."""


def checkpoint_dir(run_dir: Path, iteration: int) -> Path:
    return run_dir / CHECKPOINTS / f"iter_{iteration:06d}"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST)


def save(
    algo: Any,
    run_dir: Path,
    facts: dict[str, Any],
    verify: Callable[[], None] = lambda: None,
    scratch: Path | None = None,
) -> Path:
    """`algo.save_to_path` into a temporary dir, `verify()`, the manifest last, then one rename.

    `facts` (iteration, env_steps, episode_return_mean, ...) go into the manifest. On an
    error (a full disk, or `verify` raising because a part of the state went missing) the
    temporary dir is removed and the error raised: the checkpoints already written stay
    as they were. The temporary dir lies in `scratch` (on the run dir's disk) when
    something copies the run dir while it runs, as Ray Tune does a trial's."""
    final = checkpoint_dir(run_dir, algo.iteration)
    temporary = (scratch or final.parent) / f".{final.name}.tmp"
    shutil.rmtree(temporary, ignore_errors=True)
    for folder in {temporary.parent, final.parent}:
        folder.mkdir(parents=True, exist_ok=True)
    try:
        algo.save_to_path(str(temporary.resolve()))
        verify()
        files = {str(p.relative_to(temporary)): _sha256(p) for p in _files(temporary)}
        write_json(temporary / MANIFEST, {**facts, "versions": versions(), "files": files})
        if final.exists():
            _supersede(final, temporary)
        else:
            temporary.rename(final)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return final


def _supersede(final: Path, temporary: Path) -> None:
    """A Tune trial resumed on the Ray session it was interrupted on (a cluster's) finds
    its trial dir as it was left, and repeats the iterations after its last reported
    checkpoint: the new timeline's checkpoint replaces the abandoned one's. (A training
    run's dir is new, so its checkpoints never meet one.)"""
    stale = temporary.with_name(f".{final.name}.superseded")
    shutil.rmtree(stale, ignore_errors=True)
    final.rename(stale)
    temporary.rename(final)
    shutil.rmtree(stale, ignore_errors=True)


def manifest(checkpoint: Path) -> dict[str, Any] | None:
    path = checkpoint / MANIFEST
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def problem(checkpoint: Path) -> str | None:
    """Why `checkpoint` cannot be trusted (the first bad file), or None if it is whole."""
    found = manifest(checkpoint)
    if found is None:
        return f"{checkpoint / MANIFEST} is missing or unreadable (an incomplete checkpoint)"
    for name, digest in found["files"].items():
        path = checkpoint / name
        if not path.is_file():
            return f"{path} is missing"
        if _sha256(path) != digest:
            return f"{path} differs from its manifest (truncated or overwritten)"
    return None


def complete(run_dir: Path) -> list[Path]:
    """A run dir's checkpoints that have a manifest, oldest first (none half-written)."""
    return sorted(p.parent for p in (run_dir / CHECKPOINTS).glob(f"iter_*/{MANIFEST}"))


def latest(run_dir: Path) -> Path | None:
    """The newest checkpoint with a manifest; a checkpoint written before manifests
    (or by RLlib itself) counts when the run dir has no manifest at all."""
    found = complete(run_dir)
    if found:
        return found[-1]
    legacy = sorted((run_dir / CHECKPOINTS).glob(f"iter_*/{CHECKPOINT_FILE}"))
    return legacy[-1].parent if legacy else None


def ranked_by(eval_every: int) -> str:
    return EVALUATION if eval_every else TRAINING


def score(checkpoint: Path) -> float:
    """What ranks `checkpoint`: its manifest's score (the training return mean in a
    manifest written before scores); -inf without one."""
    found = manifest(checkpoint) or {}
    value = found.get("score", found.get("episode_return_mean"))
    return float("-inf") if value is None else value


def best(run_dir: Path) -> Path | None:
    """The complete checkpoint with the highest score (the newest among equals)."""
    found = complete(run_dir)
    return max(reversed(found), key=score) if found else None


def newest_good(run_dir: Path, before: Path | None = None) -> Path | None:
    """The newest checkpoint of `run_dir` that verifies, older than `before` if given."""
    for checkpoint in reversed(complete(run_dir)):
        if (before is None or checkpoint.name < before.name) and problem(checkpoint) is None:
            return checkpoint
    return None


def verified(checkpoint: Path) -> Path:
    """`checkpoint` if its files match its manifest; else one line with the bad file and
    the newest good checkpoint to resume from instead. One without a manifest (RLlib's
    own, or this runner's before manifests) is taken as it is."""
    if manifest(checkpoint) is None and checkpoint.name.startswith("."):
        raise CorruptCheckpoint(f"'{checkpoint}' is a checkpoint that was never finished")
    if manifest(checkpoint) is None:
        return checkpoint
    bad = problem(checkpoint)
    if bad is None:
        return checkpoint
    good = newest_good(checkpoint.parent.parent, before=checkpoint)
    instead = f"resume={good}" if good else "no older checkpoint of this run verifies"
    raise CorruptCheckpoint(f"checkpoint '{checkpoint}' is corrupt: {bad}; use {instead}")


def prune(
    run_dir: Path, keep: int | None, keep_best: int, scratch: Path | None = None
) -> list[Path]:
    """Remove all but the newest `keep` checkpoints and the `keep_best` ones with the
    highest score (None keeps all); return the removed ones. With `scratch`, each leaves
    the run dir in one rename before its files are deleted there."""
    if keep is None:
        return []
    found = complete(run_dir)
    kept = set(found[-keep:] if keep else [])
    kept.update(sorted(reversed(found), key=score, reverse=True)[:keep_best])
    removed = [p for p in found if p not in kept]
    for p in removed:
        gone = p
        if scratch is not None:
            gone = p.rename(scratch / f".{p.name}.removed")
        shutil.rmtree(gone)
    return removed
