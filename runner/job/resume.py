"""resume=<run dir or checkpoint dir> (and checkpoint=<...> of task=evaluate|export): the
config to continue with, and where from.

The new run is composed from the original run's overrides with this command's on top,
so it continues (or evaluates, or exports) the same experiment with whatever this
command changes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from runner.errors import ConfigError
from runner.job import Composer
from runner.results import checkpoints, hub, remote
from runner.results.checkpoints import CHECKPOINT_FILE, MANIFEST
from runner.results.files import OVERRIDES, read_overrides
from runner.settings import overrides as ov

# A task=tune run dir's Ray Tune experiment (tuner.pkl marks it whole enough to restore).
SEARCH_DIR = "tune"


def is_search(path: Path) -> bool:
    return (path / SEARCH_DIR / "tuner.pkl").is_file()


# A run dir's checkpoint to take: `<run dir>:latest` (the default) or `<run dir>:best`.
LATEST, BEST = "latest", "best"


def find_checkpoint(path_text: str, setting: str = "resume") -> tuple[Path, Path | None]:
    """(checkpoint dir, the run dir it belongs to) for a run dir or a checkpoint dir: the
    run dir's newest complete checkpoint (`:best`: its best ranked, by evaluation return
    or training return as its manifests say), checked against its manifest (checkpoints
    are pickles: load only checkpoints you trust). A URI (runner/results/remote.py) is
    pulled first. `setting` names the path in messages."""
    head, _, which = path_text.rpartition(":")
    if not head or which not in (LATEST, BEST):
        head, which = path_text, LATEST
    pulled = remote.Pulled(head, setting) if remote.is_uri(head) and not hub.is_hub(head) else None
    if hub.is_hub(head):  # a Hub repository pushed by task=push: a run dir
        path = hub.download(head, setting)
    else:
        path = pulled.local if pulled else Path(head).expanduser()
    if not path.exists():
        raise ConfigError(
            f"{setting} path '{path}' does not exist; pass a run dir (one with checkpoints/) "
            "or a checkpoint dir"
        )
    if is_search(path):  # task=tune's run dir: the search is restored by Ray Tune
        return path / SEARCH_DIR, path
    if (path / CHECKPOINT_FILE).is_file() or (path / MANIFEST).is_file():
        run_dir = path.parent.parent
        return checkpoints.verified(path), run_dir if (run_dir / OVERRIDES).is_file() else None
    checkpoint = checkpoints.best(path) if which == BEST else checkpoints.latest(path)
    if checkpoint is None:
        raise ConfigError(
            f"{setting} path '{path}' holds no checkpoint (no checkpoints/*/{CHECKPOINT_FILE}); "
            "pass a run dir of this runner or an RLlib checkpoint dir"
        )
    if pulled:  # only the chosen checkpoint's files come down
        pulled.fetch(checkpoint)
    return checkpoints.verified(checkpoint), path


def compose_for_resume(
    cfg: DictConfig,
    current: list[str],
    path_text: str,
    setting: str,
    compose: Composer,
) -> tuple[DictConfig, Path, list[str], dict[str, Any]]:
    """The new run's config (the checkpoint's run's overrides, then `current`, composed
    by the entry point's `compose`), the checkpoint, the overrides it was composed from
    and its group choices (none when the checkpoint is no run dir of this runner's: the
    config stays as composed)."""
    checkpoint, old_run_dir = find_checkpoint(path_text, setting)
    if old_run_dir is None:
        return cfg, checkpoint, current, {}
    merged = ov.merge(read_overrides(old_run_dir), current)
    new_cfg, choices = compose(merged)
    return new_cfg, checkpoint, merged, choices
