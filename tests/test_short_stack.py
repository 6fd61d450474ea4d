"""RLlib's builds on a short stack (runner/machine/short_stack.py): what the caller gets back, and
what still breaks into it."""

from __future__ import annotations

import inspect
import signal
import time

import pytest
from ray.rllib.connectors.common.add_observations_from_episodes_to_batch import (
    AddObservationsFromEpisodesToBatch,
)

from runner.machine.short_stack import on_short_stack


def _no_file_frames() -> int:
    """Frames of code that is no file (`<string>`, `<frozen runpy>`) on this stack."""
    return sum(f.filename.startswith("<") for f in inspect.stack(context=0))


def test_a_connector_is_built_without_the_callers_frames():
    """Called from exec'd code (as pytest-xdist's workers and `python -m` run everything),
    the connector piece sees the build thread's stack only: its caller's frames, the
    `<string>` ones included, are not there; its constructor arguments are still kept."""
    scope = {"on_short_stack": on_short_stack, "frames": _no_file_frames, "inspect": inspect}
    exec("seen = on_short_stack(frames); here = frames()", scope)
    assert scope["here"] >= 1 and scope["seen"] == 0
    depth = len(inspect.stack(context=0))
    assert len(on_short_stack(inspect.stack, context=0)) < min(depth, 10)
    piece = on_short_stack(AddObservationsFromEpisodesToBatch, as_learner_connector=True)
    assert piece._ctor_kwargs["as_learner_connector"] is True


def test_the_builds_exception_is_raised_in_the_caller():
    def fail(value: int) -> int:
        raise ValueError(f"bad {value}")

    with pytest.raises(ValueError, match="bad 3"):
        on_short_stack(fail, 3)
    assert on_short_stack(max, 2, 5) == 5


def test_a_signal_handler_still_breaks_into_the_wait():
    """The watchdog breaks into a stalled build with SIGALRM, whose handler raises in the
    main thread: the caller leaves its wait at once, not when the build ends."""

    def raise_it(signum: int, frame: object) -> None:
        raise KeyboardInterrupt("stalled")

    previous = signal.signal(signal.SIGALRM, raise_it)
    started = time.monotonic()
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(KeyboardInterrupt, match="stalled"):
            on_short_stack(time.sleep, 30)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert time.monotonic() - started < 10
