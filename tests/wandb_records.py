"""An offline W&B run read back: the records of its run-<id>.wandb file.

The file is W&B's transaction log: a 7-byte header (`:W&B`, a magic number, a version),
then LevelDB's log format (32 KiB blocks of records, each a 7-byte header of checksum,
length and type, long records split FIRST/MIDDLE/LAST) holding `Record` protobufs, whose
definitions ship with the wandb package. wandb 0.31 has no public reader of its own.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BLOCK = 32768
FULL, LAST = 1, 4


def records(path: Path) -> Iterator[Any]:
    # Imported here: wandb's protobufs take ~0.7 s, and every xdist worker imports this
    # module while it collects tests/test_tune.py, whose fast tests read no run.
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    pos, pieces = 7, b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # a block's trailer: too short for a record header
            pos += left
            continue
        _checksum, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:  # zero padding to the block's end
            pos += left
            continue
        pieces += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (FULL, LAST):
            yield wandb_internal_pb2.Record.FromString(pieces)
            pieces = b""


def _items(items: Any) -> dict[str, Any]:
    return {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items}


def offline_run(run_dir: Path) -> dict[str, Any]:
    """The one offline W&B run under `run_dir`/wandb: its config, history rows (each with
    `_step`) and summary."""
    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    run: dict[str, Any] = {"config": {}, "history": [], "summary": {}, "exit_code": None}
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run["config"] = _items(record.run.config.update)
            run["group"], run["project"] = record.run.run_group, record.run.project
        elif kind == "history":
            run["history"].append(_items(record.history.item))
        elif kind == "summary":
            run["summary"].update(_items(record.summary.update))
        elif kind == "exit":
            run["exit_code"] = record.exit.exit_code
    return run
