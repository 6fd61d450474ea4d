"""The terminal: one rich Console for every line a job prints.

No markup and no highlighting: printed values hold brackets (`.[ipex]`, `[1, 4, 16]`)
that rich would otherwise take for style tags.
"""

from rich.console import Console

console = Console(highlight=False, soft_wrap=True, markup=False)
