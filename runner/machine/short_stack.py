"""RLlib's connector pipelines, built on a thread of their own: a short stack.

Each RLlib connector piece (`ConnectorV2.__init__`) calls `inspect.stack()`, which reads
every frame of its caller's stack; a frame of code that is no file (`<frozen runpy>` under
`python -m runner`, `<string>` under exec, a notebook's cell) costs inspect a scan of
every module loaded (about 5 ms each with RLlib imported), per piece. On a fresh thread
the stack is that thread's few frames.

Only for builds that never wait on Ray (the driver's env-to-module pipelines): a build
that a signal or the watchdog breaks into runs on unwaited, and one waiting on Ray (the
Algorithm's, an EnvRunnerGroup's) would then call into the Ray its job is shutting down,
which can take the process down (a segfault). Those stay on the caller's thread, where
the interruption unwinds the build itself.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


def on_short_stack(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`fn(*args, **kwargs)`, run on a new thread; its result, or its exception raised here.

    The caller waits in short joins, so what breaks into it (a signal's handler in the
    main thread, the watchdog's asynchronous exception in a Tune trial's thread) still
    does; the build then runs on, unwaited, as a daemon thread."""
    results: list[T] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            results.append(fn(*args, **kwargs))
        except BaseException as ex:  # re-raised in the caller's thread
            errors.append(ex)

    name = f"runner-{getattr(fn, '__name__', 'build')}"
    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.1)
    if errors:
        raise errors[0]
    return results[0]
