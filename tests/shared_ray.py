"""One Ray per test process, which the CLI runs join as runs in a Ray job do (RAY_ADDRESS).

A run that starts a Ray of its own spends about 5 s of CPU on Ray's start and stop, most
of a tiny run. The CLI runs of the tests (conftest.run_cli, the README's commands) join
this one instead, through the environment a Ray job gives its driver: RAY_ADDRESS and
the cluster's auth token. It has this machine's CPU count, as a run's own Ray would, and
the same system config (runner.machine.ray_session.LOCAL_SYSTEM_CONFIG). A run's own Ray stays
tested where it matters: the main job, the fault tests, the cluster tests, and every
command with `own_ray`.

`ray stop` (docs/cluster.md's block) stops every Ray on the machine, this one too: the
next run that asks for it starts it again.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from runner.machine.ray_session import LOCAL_SYSTEM_CONFIG

HOST = "127.0.0.1"
ROOT = Path(__file__).resolve().parent.parent
USER_CODE = [str(ROOT / "tests"), str(ROOT / "examples" / "my_rl_pkg")]
# What a run must not inherit from this Ray's environment to start a Ray of its own.
KEYS = ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((HOST, port)) == 0


class SharedRay:
    """`ray start --head --block` in the background, started when first asked for;
    `dashboard` adds Ray's dashboard, where the Ray Jobs server lives (`dashboard_url`)."""

    def __init__(self, dashboard: bool = False) -> None:
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.dashboard = dashboard
        self.dashboard_port = 0
        self.token = os.environ.get("RAY_AUTH_TOKEN") or uuid.uuid4().hex
        atexit.register(self.stop)

    def env(self) -> dict[str, str]:
        """The environment that joins it, starting it first if it is not running (a
        `ray stop` may have stopped its processes: what is left of it is killed)."""
        if self.proc is None or self.proc.poll() is not None or not _listening(self.port):
            self._kill()
            self._start()
        return {
            "RAY_ADDRESS": f"{HOST}:{self.port}",
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": self.token,
        }

    @property
    def dashboard_url(self) -> str:
        return f"http://{HOST}:{self.dashboard_port}"

    def _start(self) -> None:
        self.port, self.dashboard_port = _free_port(), _free_port()
        ray = Path(sys.executable).parent / "ray"
        env = {k: v for k, v in os.environ.items() if k not in KEYS}
        env.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token})
        # A Ray job's `python` is this environment's, activated or not.
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        # Its workers import what the tests' runs name as a user's installed code would be
        # imported: the test envs (tests/) and the example package (examples/my_rl_pkg).
        env["PYTHONPATH"] = os.pathsep.join(p for p in [*USER_CODE, env.get("PYTHONPATH")] if p)
        # The Jobs server hands a job to the head's dashboard agent, whose HTTP port is
        # 52365 unless given: beside another Ray on this machine (the other test worker's)
        # it would not start, and every submission would find "No available agent".
        agent_ports = (
            "--dashboard-agent-listen-port",
            "--dashboard-agent-grpc-port",
            "--runtime-env-agent-port",
            "--metrics-export-port",
        )
        dashboard = (
            ["--include-dashboard=true", f"--dashboard-host={HOST}"]
            + [f"--dashboard-port={self.dashboard_port}"]
            + [f"{flag}={_free_port()}" for flag in agent_ports]
            if self.dashboard
            else ["--include-dashboard=false"]
        )
        log = Path(tempfile.mkstemp(prefix="shared-ray-", suffix=".log")[1])
        command = [
            str(ray),
            "start",
            "--head",
            "--block",
            f"--node-ip-address={HOST}",
            f"--port={self.port}",
            f"--num-cpus={os.cpu_count() or 1}",
            "--num-gpus=0",
            *dashboard,
            "--disable-usage-stats",
            f"--system-config={json.dumps(LOCAL_SYSTEM_CONFIG)}",
        ]
        with log.open("w") as out:
            self.proc = subprocess.Popen(
                command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + 120
        while "Ray runtime started" not in log.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the shared Ray did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        log.unlink()

    def _kill(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def stop(self) -> None:
        """At the test process's exit: `ray start --block` stops its Ray on SIGTERM."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._kill()
        self.proc = None


_shared: SharedRay | None = None


def env() -> dict[str, str]:
    """This test process's shared Ray, as the environment variables that join it."""
    global _shared
    if _shared is None:
        _shared = SharedRay()
    return _shared.env()
