"""Measurements of this machine kept on disk, keyed by what decides them: compile=auto's
timings and scaling=auto's sampling rates are each measured once, then read back by every
run with the same key (`measured_or_cached`)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runner.errors import ConfigError
from runner.results.files import write_json


def cache_dir(configured: str | None, name: str) -> Path:
    """The configured dir, else $XDG_CACHE_HOME/rllib-runner/<name> (~/.cache/...)."""
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "rllib-runner" / name


def cache_file(folder: Path, prefix: str, key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()
    return folder / f"{prefix}-{digest[:20]}.json"


def read_cached(path: Path, key: dict[str, Any]) -> Any | None:
    """The figures written under `key`, or None: no file, another key, or a file that is
    not whole JSON (a disk that filled, an edit by hand), which is measured again."""
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(cached, dict) or cached.get("key") != key:
        return None
    return cached.get("figures")


def writable(folder: Path, setting: str) -> None:
    """`folder` made and written to, or one line naming `setting`: before any measuring."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".probe-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as ex:
        raise ConfigError(
            f"{setting} '{folder}' is not writable ({ex.strerror}); point {setting} at a "
            "writable dir"
        ) from None


def measured_or_cached(
    path: Path, key: dict[str, Any], refresh: bool, measure: Callable[[], Any], setting: str
) -> tuple[Any, str]:
    """The figures from `path` unless `refresh` or none are there under `key`; else
    `measure()`'s, written there. Also where they came from: "cache" or "measured". The
    dir is made before measuring: `setting` (the one naming it) is in the one line."""
    cached = None if refresh else read_cached(path, key)
    if cached is not None:
        return cached, "cache"
    writable(path.parent, setting)
    figures = measure()
    write_json(path, {"key": key, "figures": figures})
    return figures, "measured"
