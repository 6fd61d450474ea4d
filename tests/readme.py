"""The commands README.md shows, read the way a user copies them.

Used by tests/test_readme.py (every command runs in a test) and by .ci/run (CI runs the
README's own set-up commands), so it needs nothing but the standard library:

    python3 tests/readme.py setup test     # the command that installs and runs the tests
    python3 tests/readme.py list           # every command, with its section
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
SHELL = ("bash", "sh", "shell", "console")
# Inline code that is a command rather than a name: what a user would paste into a shell.
PROGRAMS = ("python ", "python3 ", "bash ", "ray ", "tensorboard ", "pip ")
# The set-up commands, by what they run last.
SETUP = {
    "main": "python -m runner",
    "test": "python -m pytest -q",
    "ipex": "python -m pytest -q -m ipex",
}


@dataclass(frozen=True)
class Command:
    section: str
    block: int  # the fenced block's number in the section, 0 for inline code
    text: str


def commands(readme: Path = README) -> list[Command]:
    """Every shell command in fenced shell blocks and inline code, in README order."""
    found: list[Command] = []
    section, blocks, fence = "", 0, None
    for line in readme.read_text().splitlines():
        if fence is None and line.startswith("## "):
            section, blocks = line[3:].strip(), 0
        elif line.startswith("```"):
            if fence is None:
                fence = line[3:].strip()
                blocks += 1
            else:
                fence = None
        elif fence in SHELL:
            text = re.split(r"\s+#\s", line, maxsplit=1)[0].strip()
            if text and not text.startswith("#"):
                found.append(Command(section, blocks, text))
        elif fence is None:
            for code in re.findall(r"`([^`]+)`", line):
                if code.startswith(PROGRAMS):
                    found.append(Command(section, 0, code))
    return found


def python_blocks(section: str, readme: Path = README) -> list[str]:
    """The fenced python blocks of a section, as a user would save them to a file."""
    found: list[str] = []
    current, fence, lines = "", None, []
    for line in readme.read_text().splitlines():
        if fence is None and line.startswith("## "):
            current = line[3:].strip()
        elif line.startswith("```"):
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
    """The set-up command that ends in SETUP[name]."""
    (match,) = [
        c.text
        for c in commands(readme)
        if c.text.startswith("python3 -m venv") and c.text.split(" && ")[-1] == SETUP[name]
    ]
    return match


if __name__ == "__main__":
    if sys.argv[1:2] == ["setup"]:
        print(setup(sys.argv[2]))
    else:
        for c in commands():
            print(f"{c.section} [{c.block}]: {c.text}")
