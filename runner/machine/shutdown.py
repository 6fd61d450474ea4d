"""What stops a run from outside its loop: signals, the grace after one, and the stall
watchdog.

SIGTERM, SIGINT, SIGHUP and USR2 (a preemption, Ctrl-C, a closed terminal, SLURM's warning
before a time limit) ask the run to stop:
the iteration in flight may finish for `shutdown.grace_seconds`, then it is abandoned; a
second signal aborts at once. The watchdog stops a run in which no iteration finishes
within its bound. Both break into the main thread the one way Ray lets them: Ray's
blocking calls check for signals and give up only on KeyboardInterrupt, so the watch
raises one and keeps why (`Watch.cause`).
"""

from __future__ import annotations

import ctypes
import os
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from runner.machine.ray_session import SIGNALS, kill_local_ray
from runner.machine.slurm import PREEMPT
from runner.settings.schema import WatchdogConfig

# SLURM's warning before a job's time limit (submitit's USR2) stops a run as SIGTERM does.
HANDLED = (*SIGNALS, PREEMPT)


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


class Interrupted(KeyboardInterrupt):
    """A signal stopped the process: exit code 128 + its number (130 for Ctrl-C). A
    KeyboardInterrupt, the one exception Ray's blocking calls give up on (they turn it
    into a plain KeyboardInterrupt: `interrupted` restores it)."""

    def __init__(self, signum: int, message: str = "") -> None:
        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__(message or f"interrupted by {signal_name(signum)}")


_first_signal: int | None = None  # the first signal this process took, once it is known


def interrupted(ex: KeyboardInterrupt) -> Interrupted:
    """The Interrupted a KeyboardInterrupt stands for: a Ray call that a signal broke
    into raises a plain one, of the first signal this process took (else Ctrl-C's)."""
    if isinstance(ex, Interrupted):
        return ex
    return Interrupted(_first_signal or signal.SIGINT)


def abort_now(signum: int, before_exit: Callable[[int], None] | None = None) -> None:
    """A second signal: say so, run `before_exit`, kill what this process started, exit."""
    print(f"{signal_name(signum)} again: aborting now", file=sys.stderr, flush=True)
    if before_exit is not None:
        before_exit(signum)
    kill_local_ray()
    os._exit(128 + signum)


def _interrupt(signum: int, frame: Any) -> None:
    """Outside training: the first signal unwinds the process; any later one (while it
    unwinds: Ray's shutdown, the exit) aborts at once."""
    global _first_signal
    if _first_signal is not None:
        abort_now(signum)
    _first_signal = signum
    raise Interrupted(signum)


def in_main_thread() -> bool:
    """Signal handlers can only be set there (a launcher may run jobs in other threads)."""
    return threading.current_thread() is threading.main_thread()


def install_default() -> None:
    """Outside training, a signal stops the process at once with its exit code (Ray's
    own SIGTERM handler, set by ray.init, would dump a C++ stack and exit 15)."""
    if in_main_thread():
        for s in HANDLED:
            signal.signal(s, _interrupt)


def stall_bound(config: WatchdogConfig, durations: list[float]) -> float | None:
    """Seconds the next iteration may take before the run counts as stalled."""
    if not config.enabled:
        return None
    if config.seconds is not None:
        return config.seconds
    if not durations:
        return config.first_iteration_seconds
    return max(config.min_seconds, config.median_multiple * statistics.median(durations))


class Watch:
    """One training run's watch over signals, the grace and stalls (a context manager).

    The loop runs each iteration (the first with the Algorithm's build) inside
    `iteration()`, and asks `signum` after it; `on_abort(signum)` runs on a second
    signal, before the process exits at once. A signal taken during training still counts
    after it: the next one, while the run winds down, aborts."""

    def __init__(
        self,
        grace_seconds: float,
        watchdog: WatchdogConfig,
        on_abort: Callable[[int], None],
    ) -> None:
        self.grace_seconds = grace_seconds
        self.watchdog = watchdog
        self.on_abort = on_abort
        self.signum: int | None = None
        self.cause: str | None = None  # "abandoned" or "stalled", when the watch broke in
        self.stall_seconds: float | None = None
        self.durations: list[float] = []
        self._signal_at = 0.0
        self._deadline: float | None = None
        self._in_flight = False
        self._done = threading.Event()
        # Held while the monitor decides to break in and signals, and while an iteration
        # leaves flight: a break-in lands in the iteration it was decided for, or not at all.
        self._lock = threading.Lock()
        self._main = threading.get_ident()
        self._monitor_thread = threading.Thread(
            target=self._monitor, name="runner-watch", daemon=True
        )
        self._alarm_before: Any = signal.SIG_DFL

    def __enter__(self) -> Watch:
        if in_main_thread():  # elsewhere (a Tune trial's thread) signals are not ours
            for s in HANDLED:
                signal.signal(s, self._on_signal)
            # None: a handler not set from Python, which Python cannot put back.
            before = signal.signal(signal.SIGALRM, self._on_alarm)
            self._alarm_before = signal.SIG_DFL if before is None else before
        self._monitor_thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        """The monitor ends before SIGALRM's handler is put back: one that decided to
        break in as the run ended would otherwise send its SIGALRM to the handler before
        ours (by default, one that kills the process: a notebook's, a test worker's)."""
        global _first_signal
        self._done.set()
        with self._lock:
            self._in_flight = False
        self._monitor_thread.join()
        if in_main_thread():
            if self.signum is not None:
                _first_signal = self.signum
            signal.signal(signal.SIGALRM, self._alarm_before)
            install_default()

    @contextmanager
    def iteration(self) -> Iterator[None]:
        """One iteration in flight: the grace and the stall bound apply while it runs."""
        start = time.monotonic()
        bound = stall_bound(self.watchdog, self.durations)
        self.stall_seconds = bound
        if self._deadline is None and bound is not None:
            self._deadline = start + bound
        self._in_flight = True
        try:
            yield
        finally:
            with self._lock:
                self._in_flight = False
            self._deadline = None
        self.durations.append(time.monotonic() - start)

    @contextmanager
    def build(self) -> Iterator[None]:
        """The Algorithm's build: in flight like an iteration, under the first one's bound,
        which keeps running into the first iteration."""
        bound = stall_bound(self.watchdog, [])
        self.stall_seconds = bound
        self._deadline = None if bound is None else time.monotonic() + bound
        self._in_flight = True
        try:
            yield
        finally:
            with self._lock:
                self._in_flight = False

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.signum is not None:
            abort_now(signum, self.on_abort)
        self.signum, self._signal_at = signum, time.monotonic()
        print(
            f"{signal_name(signum)}: stopping after the iteration in flight (at most "
            f"{self.grace_seconds:g} s), then a checkpoint; send it again to abort now",
            file=sys.stderr,
            flush=True,
        )

    def _on_alarm(self, signum: int, frame: Any) -> None:
        if self.cause is not None and self._in_flight:
            raise KeyboardInterrupt(self.cause)
        self.cause = None  # the iteration ended first: the watch goes on

    def _monitor(self) -> None:
        while not self._done.wait(0.2):
            with self._lock:
                if not self._in_flight or self.cause is not None:
                    continue
                now = time.monotonic()
                if self.signum is not None and now - self._signal_at > self.grace_seconds:
                    self._break_in("abandoned")
                elif self._deadline is not None and now > self._deadline:
                    self._break_in("stalled")

    def _break_in(self, cause: str) -> None:
        """The main thread gets SIGALRM, whose handler raises; another thread (a Tune
        trial's) gets the KeyboardInterrupt raised in it when it next runs Python code
        (Ray's blocking gets wake up for that)."""
        self.cause = cause
        if self._main == threading.main_thread().ident:
            signal.pthread_kill(self._main, signal.SIGALRM)
        else:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(self._main), ctypes.py_object(KeyboardInterrupt)
            )
