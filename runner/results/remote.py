"""results.uri: a run dir mirrored under a filesystem URI, and a run dir pulled back.

Any URI pyarrow opens (`s3://bucket/prefix`, `gs://...`, `hdfs://...`, `file:///abs`) or,
failing that, fsspec (with the scheme's own package installed) will do. A run writes its
local run dir as always; the mirror copies it to `<results.uri>/<run dir>` (the run
dir's path as the run names it, e.g. outputs/runs/<date>/<time>) after each checkpoint and
when the job ends, however it ends. A checkpoint's files go up before its manifest and a
pruned checkpoint loses its manifest first, so under the URI, as on disk, a checkpoint is
whole or has no manifest, and one without is never chosen (runner/results/checkpoints.py).

`resume=`, `checkpoint=` and `python -m runner.report` take such a URI: the run dir comes
down into a new temporary dir (a checkpoint's files only for the checkpoint chosen), and
everything after reads it as a local run dir.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path, PurePosixPath
from typing import Any

from runner.errors import ConfigError, RunnerError, one_line
from runner.results.checkpoints import MANIFEST
from runner.results.files import CHECKPOINTS

# Object stores make an object visible only once it is whole, and have no dirs; elsewhere a
# file is written under a temporary name in its dir, then moved into place.
OBJECT_STORES = ("s3", "gcs")
BLOCK = 1 << 20
CHECK = (
    "check the bucket or path and the credentials (for S3: AWS_ACCESS_KEY_ID and "
    "AWS_SECRET_ACCESS_KEY or AWS_PROFILE, AWS_REGION, AWS_ENDPOINT_URL)"
)


def is_uri(text: str) -> bool:
    return "://" in text


def join(uri: str, relative: str) -> str:
    """`relative` under `uri`, a query (`?endpoint_override=...`) kept at the end."""
    base, mark, query = uri.partition("?")
    return f"{base.rstrip('/')}/{relative}{mark}{query}"


def open_uri(uri: str, setting: str) -> tuple[Any, str]:
    """(pyarrow filesystem, path inside it) for `uri`; one line when no filesystem opens it.
    An S3 bucket's region comes from AWS_REGION or AWS_DEFAULT_REGION where set (else S3
    is asked, which takes seconds to fail when S3 cannot be reached)."""
    import pyarrow
    from pyarrow import fs as pafs

    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    opened = uri
    if uri.startswith("s3://") and region and "region=" not in uri:
        opened = f"{uri}{'&' if '?' in uri else '?'}region={region}"
    try:
        return pafs.FileSystem.from_uri(opened)
    except pyarrow.ArrowInvalid:  # a scheme pyarrow lacks: fsspec's, if it knows it
        pass
    except (OSError, pyarrow.ArrowException) as ex:
        raise ConfigError(f"{setting}={uri}: {one_line(ex)}; {CHECK}") from None
    try:
        import fsspec

        fs, path = fsspec.core.url_to_fs(uri)
    except (ImportError, ValueError) as ex:
        raise ConfigError(
            f"{setting}={uri}: no filesystem opens this URI ({one_line(ex)}); use s3://, gs://, "
            "hdfs:// or file:///, or install the fsspec package for its scheme"
        ) from None
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), path


def _where(run_dir: Path) -> str:
    """A run dir's path under the URI: as the run names it, relative to the working dir."""
    try:
        return run_dir.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return run_dir.name


class Mirror:
    """One run dir (or a sweep dir's own files) copied to `<uri>/<run dir>`."""

    def __init__(self, uri: str, run_dir: Path, setting: str = "results.uri") -> None:
        self.run_dir = run_dir
        self.uri = join(uri, _where(run_dir))
        self.setting = f"{setting}={uri}"  # as the user gave it, for messages
        self.fs, self.root = open_uri(self.uri, setting)
        self.object_store = self.fs.type_name in OBJECT_STORES  # no dirs to make there
        self.sent: dict[str, tuple[int, int]] = {}  # relative path: (size, mtime_ns) sent

    def probe(self) -> None:
        """A small write and its removal, so a wrong bucket or missing credentials is one
        line before anything runs."""
        name = f"{self.root}/.probe-{uuid.uuid4().hex}"
        try:
            if not self.object_store:
                self.fs.create_dir(self.root)
            with self.fs.open_output_stream(name) as out:
                out.write(b"probe")
            self.fs.delete_file(name)
        except Exception as ex:  # pyarrow raises OSError; fsspec's filesystems their own
            raise ConfigError(
                f"{self.setting}: cannot write to {self.uri} ({one_line(ex)}); {CHECK}"
            ) from None

    def _send(self, path: Path, relative: str) -> None:
        try:
            stat = path.stat()
        except FileNotFoundError:  # a logger's temporary file, gone since the listing
            return
        if self.sent.get(relative) == (stat.st_size, stat.st_mtime_ns):
            return
        target = f"{self.root}/{relative}"
        if self.object_store:
            written = target  # an object is visible once whole
        else:
            self.fs.create_dir(str(PurePosixPath(target).parent))
            written = f"{target}.{uuid.uuid4().hex}.tmp"
        try:
            source = path.open("rb")
        except FileNotFoundError:
            return
        with source, self.fs.open_output_stream(written) as out:
            shutil.copyfileobj(source, out, BLOCK)
        if written != target:
            self.fs.move(written, target)
        self.sent[relative] = (stat.st_size, stat.st_mtime_ns)

    def push(self, top_only: bool = False) -> None:
        """Copy what changed since the last push: each checkpoint's manifest after every
        other file, then the checkpoints pruned here removed there (manifest first).
        `top_only`: the dir's own files, not its subdirs' (a sweep dir beside its jobs)."""
        try:
            self._push(top_only)
        except OSError as ex:
            raise RunnerError(f"{self.setting}: copying to {self.uri}: {one_line(ex)}") from ex

    def _push(self, top_only: bool) -> None:
        files: list[tuple[Path, str]] = []
        manifests: list[tuple[Path, str]] = []
        found = self.run_dir.glob("*") if top_only else self.run_dir.rglob("*")
        for path in sorted(p for p in found if p.is_file()):
            relative = path.relative_to(self.run_dir).as_posix()
            parts = relative.split("/")
            if parts[0] == CHECKPOINTS and len(parts) > 2 and parts[1].startswith("."):
                continue  # a checkpoint being written (runner/results/checkpoints.py)
            in_checkpoint = parts[0] == CHECKPOINTS and len(parts) > 2
            (manifests if in_checkpoint and path.name == MANIFEST else files).append(
                (path, relative)
            )
        for path, relative in files + manifests:
            self._send(path, relative)
        if not top_only:
            self._remove_pruned()

    def _remove_pruned(self) -> None:
        from pyarrow import fs as pafs

        here = {p.name for p in (self.run_dir / CHECKPOINTS).glob("iter_*")}
        selector = pafs.FileSelector(f"{self.root}/{CHECKPOINTS}", allow_not_found=True)
        for info in self.fs.get_file_info(selector):
            if info.type == pafs.FileType.Directory and info.base_name not in here:
                manifest = f"{info.path}/{MANIFEST}"
                if self.fs.get_file_info(manifest).type == pafs.FileType.File:
                    self.fs.delete_file(manifest)
                self.fs.delete_dir(info.path)
                gone = f"{CHECKPOINTS}/{info.base_name}/"
                self.sent = {k: v for k, v in self.sent.items() if not k.startswith(gone)}


def _payload(relative: str) -> bool:
    """A checkpoint's own files inside a run dir (all but its manifest): pulled on demand."""
    parts = relative.split("/")
    return parts[0] == CHECKPOINTS and len(parts) > 2 and parts[-1] != MANIFEST


class Pulled:
    """A run dir (or a checkpoint dir) under a URI, copied into a new temporary dir,
    checkpoints' files left behind until `fetch` asks for one."""

    def __init__(self, uri: str, setting: str) -> None:
        from pyarrow import fs as pafs

        self.uri, self.setting = uri.rstrip("/"), setting
        self.fs, self.root = open_uri(self.uri, setting)
        cache = Path(tempfile.gettempdir()) / "rllib-runner-pulled"
        cache.mkdir(exist_ok=True)
        self.local = Path(tempfile.mkdtemp(dir=cache)) / PurePosixPath(self.root).name
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self.root, recursive=True))
        except FileNotFoundError:
            infos = []
        except OSError as ex:
            raise ConfigError(f"{setting}={uri}: cannot read it: {one_line(ex)}") from None
        self.files = [
            info.path[len(self.root) :].lstrip("/")
            for info in infos
            if info.type == pafs.FileType.File
        ]
        if not self.files:
            raise ConfigError(
                f"{setting}={uri}: nothing there; pass a run dir's URI "
                "(<results.uri>/outputs/runs/<date>/<time>) or a checkpoint's"
            )
        self._get([f for f in self.files if not _payload(f)])

    def _get(self, names: list[str]) -> None:
        try:
            for name in names:
                target = self.local / name
                target.parent.mkdir(parents=True, exist_ok=True)
                source = self.fs.open_input_stream(f"{self.root}/{name}")
                with source, target.open("wb") as out:
                    shutil.copyfileobj(source, out, BLOCK)
        except OSError as ex:
            raise ConfigError(f"{self.setting}={self.uri}: cannot read: {one_line(ex)}") from None

    def fetch(self, checkpoint: Path) -> None:
        """The files of one checkpoint of the pulled run dir."""
        prefix = checkpoint.relative_to(self.local).as_posix() + "/"
        self._get([f for f in self.files if f.startswith(prefix) and _payload(f)])
