"""The commands README.md and the docs/ pages show, read the way a user copies them.

Used by tests/test_readme.py (every command runs in a test) and by .ci/run (CI runs the
README's own set-up commands), so it needs nothing but the standard library:

    python3 tests/readme.py setup test     # the command that installs and runs the tests
    python3 tests/readme.py list           # every command, with its page and section

A command's section is the heading (`#` or `##`) above it. Generated blocks
(`<!-- NAME:begin -->` ... `<!-- NAME:end -->`, written by runner/docs.py and the
benchmarks) are output, not documentation, and are not read.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
SHELL = ("bash", "sh", "shell", "console")
# Inline code that is a command rather than a name: what a user would paste into a shell.
PROGRAMS = ("python ", "python3 ", "bash ", "ray ", "tensorboard ", "pip ")
# The set-up commands, by what they run last.
SETUP = {
    "main": "python -m runner",
    "test": "python -m pytest -q",
    "ipex": 'python -m pytest -q -m "ipex or box"',
    "cluster": "python -m pytest -q -m cluster -n 0",
}
HEADING = re.compile(r"^#{1,2} (.+)$")
GENERATED = re.compile(r"^<!-- [\w-]+:(begin|end) -->$")


def pages(root: Path = ROOT) -> list[Path]:
    """README.md, then every docs page, by name."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def page_name(path: Path) -> str:
    """A page as the repository names it: README.md, docs/tuned.md."""
    try:
        return path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return path.name


def _lines(path: Path) -> Iterable[tuple[int, str, str]]:
    """(line number, section, line) for a page's lines outside its generated blocks."""
    section, fence, generated = "", False, False
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        marker = GENERATED.match(line.strip())
        if marker and not fence:
            generated = marker.group(1) == "begin"
            continue
        if generated:
            continue
        if line.startswith("```"):
            fence = not fence
        elif not fence and HEADING.match(line):
            section = HEADING.match(line).group(1).strip()
        yield number, section, line


@dataclass(frozen=True)
class Command:
    page: str  # README.md, docs/<name>.md
    section: str
    block: int  # the fenced block's number in the section, 0 for inline code
    text: str
    line: int = 0  # where the page shows it


def commands(paths: Iterable[Path] | None = None) -> list[Command]:
    """Every shell command in fenced shell blocks and inline code: README.md first, then
    the docs pages by name, each in page order."""
    found: list[Command] = []
    for path in pages() if paths is None else paths:
        page, current, blocks, fence = page_name(path), None, 0, None
        for number, section, line in _lines(path):
            if section != current:
                current, blocks = section, 0
            if line.startswith("```"):
                if fence is None:
                    fence = line[3:].strip()
                    blocks += 1
                else:
                    fence = None
            elif fence in SHELL:
                text = re.split(r"\s+#\s", line, maxsplit=1)[0].strip()
                if text and not text.startswith("#"):
                    found.append(Command(page, section, blocks, text, number))
            elif fence is None:
                for code in re.findall(r"`([^`]+)`", line):
                    if code.startswith(PROGRAMS):
                        found.append(Command(page, section, 0, code, number))
    return found


def python_blocks(section: str, paths: Iterable[Path] | None = None) -> list[str]:
    """The fenced python blocks of a section (on any page), as a user would save them."""
    found: list[str] = []
    for path in pages() if paths is None else paths:
        fence, lines = None, []
        for _, current, line in _lines(path):
            if line.startswith("```"):
                if fence is None:
                    fence, lines = line[3:].strip(), []
                else:
                    if fence == "python" and current == section:
                        found.append("\n".join(lines) + "\n")
                    fence = None
            elif fence is not None:
                lines.append(line)
    return found


def setup(name: str, readme: Path = README) -> str:
    """The set-up command that ends in SETUP[name]: README.md's alone."""
    (match,) = [
        c.text
        for c in commands([readme])
        if c.text.startswith("python3 -m venv") and c.text.split(" && ")[-1] == SETUP[name]
    ]
    return match


if __name__ == "__main__":
    if sys.argv[1:2] == ["setup"]:
        print(setup(sys.argv[2]))
    else:
        for c in commands():
            print(f"{c.page}: {c.section} [{c.block}]: {c.text}")
