"""A measurement's time budget and its progress, for compile=auto and scaling=auto.

Each measures candidates one by one before a run; `Budget` says whether the next may start
(it would end within the budget, taken to last as long as the longest so far, with room
kept for what must follow), prints one line per candidate measured with how many are
done of how many and the seconds spent of the budget, and draws a progress bar.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager

from runner.console import console, progress


class Budget:
    """`seconds` for at most `total` measurements, named `what` (e.g. "scaling=auto"),
    `reserve` of them kept for the end (a final re-measurement)."""

    def __init__(self, what: str, seconds: float, total: int, reserve: int = 0) -> None:
        self.what, self.seconds, self.total, self.reserve = what, seconds, total, reserve
        self.start = time.perf_counter()
        self.longest = 0.0  # the longest measurement so far
        self.done = 0
        self._began = self.start
        self._bar: Callable[[int], None] | None = None
        self._show: Callable[[], Callable[[int], None]] | None = None

    @contextmanager
    def shown(self, unit: str) -> Iterator[Budget]:
        """The progress bar of `unit` measured, from the first measurement on (none where
        everything came from a cache) to the end of the block."""
        description = f"{self.what}: {unit} (budget {self.seconds:g} s)"
        with ExitStack() as stack:
            self._show = lambda: stack.enter_context(progress(description, self.total))
            yield self
        self._bar = self._show = None

    @property
    def spent(self) -> float:
        return time.perf_counter() - self.start

    def affordable(self, keep: float = 0.0) -> bool:
        """Whether one more measurement, the reserved ones and `keep` seconds more (what
        must follow) end within the budget."""
        return self.spent + self.longest * (1 + self.reserve) + keep <= self.seconds

    def begin(self) -> None:
        self._began = time.perf_counter()
        if self._bar is None and self._show is not None:
            self._bar = self._show()

    def measured(self, line: str) -> None:
        """One measurement ended (begun at `begin`): its line, the bar one step on."""
        self.longest = max(self.longest, time.perf_counter() - self._began)
        self.done += 1
        if self._bar is not None:
            self._bar(self.done)
        console.print(
            f"{self.what} [{self.done} of at most {self.total}, {self.spent:.0f} of "
            f"{self.seconds:g} s]: {line}"
        )
