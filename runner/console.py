"""The terminal: one rich Console for every line a job prints, and its progress bars.

No markup and no highlighting: printed values hold brackets (`.[ipex]`, `[1, 4, 16]`)
that rich would otherwise take for style tags.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

console = Console(highlight=False, soft_wrap=True, markup=False)


@contextmanager
def progress(description: str, total: int) -> Iterator[Callable[[int], None]]:
    """A progress bar of `total` steps; yields `done(n)`, which sets how many are done.
    On a terminal it redraws in place; in a log it is one line when it ends."""
    columns = (TextColumn(description), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n: bar.update(task, completed=n)
