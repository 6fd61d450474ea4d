"""results.uri against a real S3 API: moto's server (`python -m moto.server`) on a loopback
port, with a bucket this module makes. A run mirrors its run dir there; another, in an
empty dir, resumes from there, a third evaluates from there, and the report reads there.
A run killed with SIGKILL leaves only checkpoints there that are whole or have no manifest
(never chosen). A mistyped bucket is one line within seconds. The mirror's own rules (a
manifest last, a pruned checkpoint removed there) are checked on file:// as well."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from conftest import cli_env, run_cli
from readme import commands
from test_readme import WAYS

import runner
from runner.errors import ConfigError
from runner.results import checkpoints
from runner.results.remote import Mirror, Pulled

SECTION = "Results in object storage"  # docs/cluster.md
pytestmark = pytest.mark.cluster  # CI's cluster lane (docs/cluster.md's tests), one at a time
BUCKET, PREFIX = "my-bucket", "rllib"
URI = f"s3://{BUCKET}/{PREFIX}"
TINY_LOCAL = ("debug=tiny", "scaling.num_env_runners=0")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3() -> Iterator[dict[str, str]]:
    """A local S3 server and a bucket in it; the environment that reaches them."""
    server, env = _server()
    yield env
    server.kill()
    server.wait()


def _server() -> tuple[subprocess.Popen, dict[str, str]]:
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
    }
    deadline = time.monotonic() + 30
    while True:
        try:
            _client(env).create_bucket(Bucket=BUCKET)
            break
        except Exception:
            if time.monotonic() > deadline:
                server.kill()
                raise
            time.sleep(0.3)
    return server, env


def _client(env: dict[str, str]):
    return boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region_name=env["AWS_DEFAULT_REGION"],
    )


def _names(env: dict[str, str], prefix: str) -> list[str]:
    """The keys under `prefix` of the bucket, listed with boto3 (not the runner). A run that
    is still copying and pruning is only listed: a key listed may be gone when it is read."""
    client, found = _client(env), []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        for item in page.get("Contents", []):
            if not item["Key"].endswith("/"):  # a dir marker: pyarrow keeps one where it deleted
                found.append(item["Key"])
    return found


def _keys(env: dict[str, str], prefix: str) -> dict[str, bytes]:
    """Every object under `prefix` of a finished run, read back with boto3 (not the runner)."""
    client = _client(env)
    return {
        key[len(prefix) :].lstrip("/"): client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        for key in _names(env, prefix)
    }


def _whole_or_unchosen(env: dict[str, str], run_uri: str) -> list[str]:
    """The run's checkpoints under the URI that have a manifest, each checked file by file
    against it after a pull (a checkpoint without one is never chosen)."""
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        pulled = Pulled(run_uri, "test")
        found = checkpoints.complete(pulled.local)
        for checkpoint in found:
            pulled.fetch(checkpoint)
            assert checkpoints.problem(checkpoint) is None, checkpoint
    return [p.name for p in found]


def _page_commands() -> list[str]:
    return [c.text for c in commands() if c.section == SECTION and c.block]


def _run_page_command(text: str, cwd: Path, env: dict[str, str]):
    """A page command with its Way's overrides after the page's own, as a user runs it."""
    words, way = shlex.split(text), WAYS[text]
    if words[:3] == ["python", "-m", "runner.report"]:
        return subprocess.run(
            [sys.executable, *words[1:], *way.extra],
            cwd=cwd,
            env=cli_env(extra=env),
            capture_output=True,
            text=True,
            timeout=120,
        )
    given = [w.partition("=")[2] for w in words if w.startswith("hydra.run.dir=")]
    return run_cli(cwd, *words[3:], *way.extra, run_dir=(given or ["run"])[0], env=env)


@pytest.fixture(scope="module")
def page(s3, tmp_path_factory) -> dict[str, Any]:
    """docs/cluster.md's commands: the first in one dir, the rest in another, empty one, so
    they read the first run from the bucket alone."""
    first, second = tmp_path_factory.mktemp("first"), tmp_path_factory.mktemp("second")
    done = {}
    for i, text in enumerate(_page_commands()):
        result = _run_page_command(text, second if i else first, s3)
        assert WAYS[text].expect in result.stdout, (result.stdout + result.stderr)[-3000:]
        done[text.split()[3].partition("=")[0]] = result
    return {"runs": done, "first": first / "outputs/runs/first", "second": second}


def test_the_page_shows_a_run_resumed_evaluated_and_reported_from_a_bucket():
    assert [t.split()[3].partition("=")[0] for t in _page_commands()] == [
        "results.uri",
        "resume",
        "task",
        URI + "/outputs/runs",
    ]


@pytest.mark.slow
def test_a_run_dir_is_mirrored_to_s3(s3, page) -> None:
    result, run_dir = page["runs"]["results.uri"], page["first"]
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"results mirrored to {URI}/outputs/runs/first" in result.stdout
    there = _keys(s3, f"{PREFIX}/outputs/runs/first")
    here = {
        p.relative_to(run_dir).as_posix(): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()
    }
    assert here.keys() == there.keys(), here.keys() ^ there.keys()
    for name in ("summary.json", "metrics.jsonl", "progress.csv", ".hydra/config.yaml"):
        assert there[name] == here[name], name
    assert json.loads(there["summary.json"])["iterations"] == 2
    # checkpoint.keep=3 kept both; each whole there, as its manifest says.
    assert _whole_or_unchosen(s3, f"{URI}/outputs/runs/first") == ["iter_000001", "iter_000002"]


@pytest.mark.slow
def test_resumed_evaluated_and_reported_from_s3(s3, page) -> None:
    """Nothing of the first run is on the second dir's disk: each command reads the bucket,
    and the resumed run and the evaluation took results.uri from the first run."""
    second = page["second"]
    resumed = page["runs"]["resume"]
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = resumed.json("summary.json")
    assert (summary["iterations"], summary["iterations_this_run"]) == (3, 1)
    assert summary["resumed_from"].endswith("iter_000002")
    assert json.loads(_keys(s3, f"{PREFIX}/outputs/runs/resumed")["summary.json"]) == summary

    evaluated = page["runs"]["task"]
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert evaluated.json("eval.json")["episodes"] == 2
    assert "eval.json" in _keys(s3, f"{PREFIX}/{evaluated.run_dir.relative_to(second)}")

    report = page["runs"][URI + "/outputs/runs"]
    assert report.returncode == 0, report.stderr
    table = (second / "outputs/report/verification.md").read_text()
    assert "check.threshold=5" in table, table


@pytest.mark.slow
def test_a_killed_run_leaves_only_whole_checkpoints_there(s3, tmp_path) -> None:
    """SIGKILL once two checkpoints are there, while the run trains and copies on."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "runner",
            *TINY_LOCAL,
            "stop.iterations=200",
            "checkpoint.every=1",
            "checkpoint.keep=2",
            f"results.uri={URI}",
            "hydra.run.dir=outputs/runs/killed",
        ],
        cwd=tmp_path,
        env=cli_env(extra=s3),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    prefix = f"{PREFIX}/outputs/runs/killed/checkpoints/"
    deadline = time.monotonic() + 300
    try:
        while sum(k.endswith("manifest.json") for k in _names(s3, prefix)) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, "no checkpoints came"
            time.sleep(0.2)
        time.sleep(1.5)  # into the next iteration's copy, or near it
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    found = _whole_or_unchosen(s3, f"{URI}/outputs/runs/killed")
    assert found, "no whole checkpoint there"
    # What the run pruned here went there too: never more than checkpoint.keep (+1 whose
    # removal the kill may have cut short, its manifest gone first).
    assert len(found) <= 3, found


def test_a_mistyped_bucket_is_one_line_before_anything_runs(s3, tmp_path, monkeypatch) -> None:
    for key, value in s3.items():
        monkeypatch.setenv(key, value)
    run_dir = tmp_path / "run"
    started = time.perf_counter()
    with pytest.raises(ConfigError) as refused:
        runner.run(
            [
                *TINY_LOCAL,
                "results.uri=s3://rnus/team",
                "stop.iterations=1",
                f"hydra.run.dir={run_dir}",
            ]
        )
    line = str(refused.value)
    assert "\n" not in line and "results.uri=s3://rnus/team" in line
    assert "cannot write to s3://rnus/team/" in line and "bucket" in line, line
    # Nothing ran: the record says it was refused, and why; no result beside it.
    record = json.loads((run_dir / "summary.json").read_text())
    assert record["status"] == "refused" and record["error"] == line
    assert not (run_dir / "metrics.jsonl").exists() and not (run_dir / "checkpoints").exists()
    assert time.perf_counter() - started < 10


def test_the_mirror_sends_manifests_last_and_removes_pruned_checkpoints(
    tmp_path: Path, monkeypatch
) -> None:
    """On file:// (written under a temporary name, then moved): the order of the writes,
    what a second push skips, and a pruned checkpoint removed there."""
    monkeypatch.chdir(tmp_path)
    run_dir = Path("outputs/runs/a")
    for name in ("iter_000001", "iter_000002"):
        (run_dir / "checkpoints" / name).mkdir(parents=True)
        (run_dir / "checkpoints" / name / "state.pkl").write_bytes(b"x" * 10)
        (run_dir / "checkpoints" / name / "manifest.json").write_text("{}")
    (run_dir / "checkpoints" / ".iter_000003.tmp").mkdir()
    (run_dir / "checkpoints" / ".iter_000003.tmp" / "state.pkl").write_bytes(b"half")
    (run_dir / "summary.json").write_text("{}")
    store = tmp_path / "store"
    mirror = Mirror(store.as_uri(), run_dir)
    sent: list[str] = []

    class Recording:  # the filesystem, each file it is asked to write noted in order
        def __init__(self, fs) -> None:
            self.fs = fs

        def __getattr__(self, name: str):
            return getattr(self.fs, name)

        def open_output_stream(self, path: str):
            sent.append(path.split("outputs/runs/a/")[1])
            return self.fs.open_output_stream(path)

    mirror.fs = Recording(mirror.fs)
    mirror.push()
    manifests = [i for i, name in enumerate(sent) if "manifest.json" in name]
    assert manifests == [len(sent) - 2, len(sent) - 1], sent
    copied = store / "outputs/runs/a"
    assert (copied / "checkpoints/iter_000002/state.pkl").read_bytes() == b"x" * 10
    assert not (copied / "checkpoints/.iter_000003.tmp").exists()
    assert not list(copied.rglob("*.tmp"))  # moved into place, none left half-named

    sent.clear()
    mirror.push()
    assert sent == [], "unchanged files were sent again"
    mirror._send(run_dir / "gone.tmp", "gone.tmp")  # a logger's file gone since the listing
    assert sent == [] and not (copied / "gone.tmp").exists()

    for p in (run_dir / "checkpoints" / "iter_000001").iterdir():
        p.unlink()
    (run_dir / "checkpoints" / "iter_000001").rmdir()
    mirror.push()
    assert not (copied / "checkpoints/iter_000001").exists()
    assert (copied / "checkpoints/iter_000002/manifest.json").is_file()


@pytest.mark.slow
def test_a_sweep_mirrors_each_job_and_its_summary(s3, tmp_path) -> None:
    result = run_cli(
        tmp_path,
        "-m",
        *TINY_LOCAL,
        "seed=1,2",
        "stop.iterations=1",
        f"results.uri={URI}",
        "hydra.sweep.dir=outputs/multirun/sweep",
        env=s3,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"sweep summary mirrored to {URI}/outputs/multirun/sweep" in result.stdout
    there = _keys(s3, f"{PREFIX}/outputs/multirun/sweep")
    local = tmp_path / "outputs/multirun/sweep"
    assert there["summary.md"] == (local / "summary.md").read_bytes()
    for job in ("0", "1"):
        assert json.loads(there[f"{job}/summary.json"])["iterations"] == 1


@pytest.mark.slow
def test_a_store_lost_while_training_is_a_warning_and_the_last_copy_fails_the_job(
    tmp_path,
) -> None:
    """The S3 server killed once the first checkpoint is there: training goes on, each later
    copy warns, the last one fails the job, and the local run dir is whole."""
    server, env = _server()

    def kill_after_the_first_checkpoint() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if any(k.endswith("manifest.json") for k in _names(env, f"{PREFIX}/outputs")):
                    break
            except Exception:
                pass
            time.sleep(0.2)
        server.kill()

    killer = threading.Thread(target=kill_after_the_first_checkpoint)
    killer.start()
    try:
        result = run_cli(
            tmp_path,
            *TINY_LOCAL,
            # Each copy to the lost store takes pyarrow's S3 retries, about 6 s here: two
            # after the loss, the second checkpoint's and the job's last.
            "stop.iterations=2",
            "checkpoint.every=1",
            "checkpoint.keep=1",
            f"results.uri={URI}",
            run_dir="outputs/runs/lost",
            env=env,
        )
    finally:
        killer.join()
        server.wait()
    out = result.stdout + result.stderr
    assert result.returncode != 0, out[-3000:]
    assert "warning: results.uri=s3://my-bucket/rllib: copying to" in out, out[-3000:]
    assert "results.uri=s3://my-bucket/rllib: copying to" in result.stderr.splitlines()[-1]
    summary = result.json("summary.json")
    assert summary["status"] == "finished" and summary["iterations"] == 2
    assert [p.name for p in checkpoints.complete(result.run_dir)] == ["iter_000002"]  # keep=1
