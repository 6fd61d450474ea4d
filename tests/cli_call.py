"""`python -m runner ...` for the tests: the CLI's entry point called in this process, or,
where the process is the point, a real one.

`call` runs the CLI's own `main()` (what `python -m runner` runs, less the interpreter's
start and exit) in the test process: its cwd, argv and environment as the shell would
give them, its stdout and stderr (Python's and the file descriptors', so Ray's and
torch's own output too) into files, its exit status from SystemExit. Afterwards the
process is put back as it was: environment, cwd, argv, sys.path, signal handlers, logging
(Hydra configures it per job), Hydra's global state, the Ray the job joined or started,
torch's thread count and compiled-code caches, and the modules the job imported from
outside the installed packages (a user's package, tests/faulty_env.py: the next job may
bring another copy). A run still going at its timeout gets every thread's stack dumped
into its stdout and a SIGINT (as Ctrl-C would), so the test fails where it hangs.

`start` and `start_many` run `python -m runner` as a new process (a signal, a killed
actor, runs launched at once, the interpreter's own exit): about a dozen tests.
"""

from __future__ import annotations

import contextlib
import faulthandler
import importlib
import io
import logging
import os
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_INSTALLED = (Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(), ROOT / "runner")


@dataclass
class Called:
    returncode: int
    stdout: str
    stderr: str
    seconds: float


LoggingState = list[tuple[logging.Logger, list[logging.Handler], int, bool, bool]]


def _logging_state() -> LoggingState:
    loggers = [logging.getLogger()] + [
        lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger)
    ]
    return [(lg, lg.handlers[:], lg.level, lg.propagate, lg.disabled) for lg in loggers]


def _restore_logging(state: LoggingState) -> None:
    kept = {id(h) for _, handlers, *_ in state for h in handlers}
    known = {id(lg) for lg, *_ in state}
    for lg, handlers, level, propagate, disabled in state:
        for h in lg.handlers:
            if id(h) not in kept:
                h.close()
        lg.handlers[:] = handlers
        lg.setLevel(level)
        lg.propagate, lg.disabled = propagate, disabled
    for lg in logging.Logger.manager.loggerDict.values():  # loggers the job made
        if isinstance(lg, logging.Logger) and id(lg) not in known:
            for h in lg.handlers:
                h.close()
            lg.handlers.clear()


def _imported_from_outside(before: set[str]) -> list[str]:
    """Modules the job imported whose file is neither installed nor the runner's own."""
    found = []
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if name in before or not file:
            continue
        path = Path(file).resolve()
        if not any(path.is_relative_to(p) for p in _INSTALLED):
            found.append(name)
    return found


def _handlers() -> list[logging.StreamHandler]:
    """Every stream handler this process made, in a logger or not."""
    found = (ref() for ref in logging._handlerList)  # type: ignore[attr-defined]  # the only list of them all
    return [h for h in found if isinstance(h, logging.StreamHandler)]


class _Forward(io.TextIOBase):
    """A handler's stream while a job runs: writes into the job's output; close() is a
    no-op (the handler's own stream is given back afterwards)."""

    def __init__(self, target: io.TextIOBase) -> None:
        super().__init__()
        self._target = target

    def write(self, text: str) -> int:
        with contextlib.suppress(ValueError):  # the job's output, closed after the job
            self._target.write(text)
        return len(text)

    def flush(self) -> None:
        with contextlib.suppress(ValueError):
            self._target.flush()

    def close(self) -> None:
        pass


@contextlib.contextmanager
def _output_to(stdout: Path, stderr: Path) -> Iterator[None]:
    """File descriptors 1 and 2, and sys.stdout/sys.stderr, into the files (one file
    when they are the same, in the order the lines came)."""
    saved_streams = sys.stdout, sys.stderr
    for stream in saved_streams:
        stream.flush()
    saved_fds = os.dup(1), os.dup(2)
    opened: list[io.TextIOWrapper] = []
    moved: list[tuple[logging.StreamHandler, object]] = []
    try:
        for fd, path in ((1, stdout), (2, stderr)):
            if fd == 2 and stderr == stdout:
                os.dup2(1, 2)
                break
            f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            os.dup2(f, fd)
            os.close(f)
        out = io.TextIOWrapper(os.fdopen(os.dup(1), "wb"), line_buffering=True, errors="replace")
        err = (
            out
            if stderr == stdout
            else io.TextIOWrapper(os.fdopen(os.dup(2), "wb"), line_buffering=True, errors="replace")
        )
        opened = [out] if err is out else [out, err]
        sys.stdout, sys.stderr = out, err
        # Handlers made before (Ray's, absl's) write where the job's own do, through a
        # stream no one can close: Hydra's logging set-up closes every handler, and absl's
        # closes its stream unless it is sys.stdout/sys.stderr at that moment, which this
        # process's (or a stream an earlier phase of the test left, pytest's capsys) is not.
        for handler in _handlers():
            fixed = isinstance(getattr(type(handler), "stream", None), property)  # sys.stderr's
            if not fixed and not isinstance(handler, logging.FileHandler):
                moved.append((handler, handler.stream))
                handler.stream = _Forward(out if handler.stream is saved_streams[0] else err)
        yield
    finally:
        for handler, stream in moved:
            handler.stream = stream
        for stream in opened:
            with contextlib.suppress(ValueError, OSError):
                stream.flush()
        sys.stdout, sys.stderr = saved_streams
        os.dup2(saved_fds[0], 1)
        os.dup2(saved_fds[1], 2)
        for fd in saved_fds:
            os.close(fd)
        for stream in opened:
            with contextlib.suppress(ValueError, OSError):
                stream.close()


def _as_a_new_interpreter_sees_it() -> None:
    """PYTHONPATH first on sys.path, and packages installed since this process started
    (their .pth files), as `python -m runner` would find them."""
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[1:1] = [p for p in extra if p not in sys.path]
    for sitedir in site.getsitepackages():
        site.addsitedir(sitedir)
    importlib.invalidate_caches()


def _interrupt(stdout: Path, timeout: float) -> None:
    """A run past its timeout: every thread's stack into its stdout, then Ctrl-C."""
    with stdout.open("a") as out:
        out.write(f"\ntests/cli_call.py: still running after {timeout} s; the stacks:\n")
        out.flush()
        faulthandler.dump_traceback(out, all_threads=True)
    os.kill(os.getpid(), signal.SIGINT)


def _fresh_dynamo() -> None:
    """Dynamo as a new process has it: no compiled code, and zero in the counters a run's
    compile report reads (`process_frames`), which `torch._dynamo.reset()` leaves as they are.
    A test that compiled in this worker before would otherwise show in a compile=none run."""
    import torch._dynamo

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()


def call(
    cwd: Path, args: list[str], env: dict[str, str], timeout: float, merged: bool = False
) -> Called:
    """`python -m runner <args>` in `cwd` with exactly the environment `env`, in this
    process (see the module's docstring)."""
    import torch
    from hydra.core.global_hydra import GlobalHydra

    import runner.__main__ as entry
    from runner.machine import shutdown
    from runner.machine.ray_session import stop_ray

    out = Path(tempfile.mkdtemp(prefix="cli-"))
    stdout, stderr = out / "stdout", out / ("stdout" if merged else "stderr")
    saved_env, saved_cwd, saved_argv = dict(os.environ), os.getcwd(), sys.argv[:]
    saved_path, saved_modules = sys.path[:], set(sys.modules)
    saved_signals = {s: signal.getsignal(s) for s in shutdown.HANDLED}
    saved_logging, saved_threads = _logging_state(), torch.get_num_threads()
    code = 1
    overdue = threading.Timer(timeout, _interrupt, (stdout, timeout))
    overdue.start()
    start = time.perf_counter()
    try:
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        _as_a_new_interpreter_sees_it()
        _fresh_dynamo()
        sys.argv = ["runner", *args]
        entry.START = time.perf_counter()
        with _output_to(stdout, stderr):
            try:
                entry.main()
                code = 0
            except SystemExit as ex:
                code = ex.code if isinstance(ex.code, int) else (0 if ex.code is None else 1)
            finally:
                stop_ray()  # what the process's exit does: the job's Ray, or its connection
    finally:
        seconds = time.perf_counter() - start
        overdue.cancel()
        GlobalHydra.instance().clear()
        _restore_logging(saved_logging)
        for s, handler in saved_signals.items():
            signal.signal(s, handler)
        shutdown._first_signal = None
        torch.set_num_threads(saved_threads)
        _fresh_dynamo()
        for name in _imported_from_outside(saved_modules):
            del sys.modules[name]
        sys.path[:] = saved_path
        sys.argv = saved_argv
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    called = Called(
        code,
        stdout.read_text(errors="replace"),
        "" if merged else stderr.read_text(errors="replace"),
        seconds,
    )
    shutil.rmtree(out)
    return called


class Running:
    """`python -m runner` as a process of its own, while it runs: its pid, its output
    (stdout, with stderr unless kept apart) line by line as it comes, its end."""

    def __init__(
        self, cwd: Path, args: list[str], env: dict[str, str], merged: bool = True
    ) -> None:
        self.out = Path(tempfile.mkdtemp(prefix="cli-process-"))
        self.stdout = self.out / "stdout"
        self.stderr = self.stdout if merged else self.out / "stderr"
        with self.stdout.open("wb") as out, self.stderr.open("ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "runner", *args],
                cwd=cwd,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT if merged else err,
                # The leader of a process group, as a shell makes a command it starts: a
                # test may signal the whole group, as `timeout` and Ctrl-C do.
                preexec_fn=os.setpgrp,
            )
        self.pid = self.proc.pid
        self.started = time.perf_counter()
        self.lines = self._tail()

    def _tail(self, timeout: float = 600) -> Iterator[str]:
        deadline = time.monotonic() + timeout
        partial = ""
        with open(self.stdout, encoding="utf-8", errors="replace") as f:
            while True:
                ended = self.proc.poll() is not None
                chunk = f.read()  # after the end was seen: all there is
                *whole, partial = (partial + chunk).split("\n")
                yield from (line + "\n" for line in whole)
                if ended and not chunk:
                    if partial:
                        yield partial
                    return
                if time.monotonic() > deadline:
                    self.kill()
                    raise AssertionError(f"{self.proc.args}: still running after {timeout} s")
                if not chunk:
                    time.sleep(0.05)

    def wait(self, timeout: float) -> Called:
        """Its exit code and whole output, once it ends (killed after `timeout`)."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.proc.args}: still running after {timeout} s") from None
        seconds = time.perf_counter() - self.started
        stdout = self.stdout.read_text(errors="replace")
        stderr = "" if self.stderr == self.stdout else self.stderr.read_text(errors="replace")
        shutil.rmtree(self.out, ignore_errors=True)
        return Called(self.proc.returncode, stdout, stderr, seconds)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait()


def start(cwd: Path, args: list[str], env: dict[str, str], merged: bool = True) -> Running:
    """`python -m runner <args>` in `cwd`, a new process, handed back while it runs."""
    return Running(cwd, args, env, merged)


def start_many(
    cases: list[tuple[Path, list[str]]], env: dict[str, str], timeout: float = 300
) -> list[Called]:
    """Each `python -m runner <args>` in its `cwd`, all launched at once; their ends."""
    running = [Running(cwd, args, env, merged=False) for cwd, args in cases]
    return [r.wait(timeout) for r in running]
