"""`python -m runner --help`'s page (runner/settings/help.py), read from conf/: every option a user
can pick with its line, none of the internal groups, and the README's first commands."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from readme import README, commands

from runner import CONFIG_DIR
from runner.settings.help import GROUPS, HIDDEN, START, TUNED, describe, text

CONF = Path(CONFIG_DIR)
VISIBLE = (
    "hardware",
    "compile",
    "scaling",
    "algo",
    "env",
    "task",
    "search",
    "logger",
    "scale",
    "experiment",
    "debug",
)


def _options(group: str) -> list[Path]:
    return sorted((CONF / group).glob("*.yaml"))


def _section(page: str, group: str) -> list[str]:
    """The page's lines for one group: from its header to the next unindented line."""
    lines = page.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{group} (default: "))
    end = next(
        (i for i in range(start + 1, len(lines)) if not lines[i].startswith(" ")), len(lines)
    )
    return lines[start:end]


def test_visible_groups_in_order_with_their_defaults():
    page = text(CONFIG_DIR)
    headers = [line.split(" (default")[0] for line in page.splitlines() if "(default: " in line]
    assert headers == list(VISIBLE) == list(GROUPS)
    assert "hardware (default: cpu)" in page
    assert "compile (default: none)" in page
    assert "experiment (default: none)" in page
    assert "debug (default: none)\n  tiny  The smallest run through a path" in page


def _expand(name: str) -> list[str]:
    """A folded row's options: `inductor_{default,ma,ro}` is three."""
    stem, brace, rest = name.partition("_{")
    return [f"{stem}_{s}" for s in rest.rstrip("}").split(",")] if brace else [name]


def test_internal_groups_are_absent():
    page = text(CONFIG_DIR)
    lines = page.splitlines()
    for internal in HIDDEN:
        assert not any(line.startswith(internal) for line in lines), internal
    assert "runner_schema" not in page
    # A compile preset's backend file, and scale=local's own parts, are no options.
    rows = {n for line in _section(page, "compile")[1:] for n in _expand(line.split()[0])}
    assert rows == {p.stem for p in _options("compile")}
    assert "inductor" not in rows and "onnxrt" not in rows
    for part in (CONF / "scale").glob("*/*.yaml"):
        assert part.stem not in page, part
    assert [line.split()[0] for line in _section(page, "scale")[1:]] == ["local"]


def test_a_description_is_its_files_first_sentence(tmp_path: Path):
    option = tmp_path / "x.yaml"
    option.write_text(
        "# @package _global_\n# Two lines, e.g. this one, make one\n# sentence. Not this one.\n"
        "#\n# Nor this paragraph.\nkey: 1\n"
    )
    assert describe(option) == "Two lines, e.g. this one, make one sentence."


def test_every_option_of_each_visible_group_with_its_line():
    page = text(CONFIG_DIR)
    for group in VISIBLE:
        if group == "experiment":
            continue
        rows = {
            name: line for line in _section(page, group)[1:] for name in _expand(line.split()[0])
        }
        assert sorted(rows) == [p.stem for p in _options(group)], group
        for path in _options(group):
            line = describe(path)
            assert line, f"{path} has no leading comment line"
            assert not line.startswith("@"), path
            # A whole sentence, though its comment runs over lines: none stops mid-way.
            assert line.endswith(".") and "  " not in line, (path, line)
            if "{" in rows[path.stem].split()[0]:  # a folded row: "<what> + <a> / <b>."
                what, _, variant = line.rstrip(".").partition(" + ")
                assert f"{what} + " in rows[path.stem] and variant in rows[path.stem], path
            else:
                assert rows[path.stem].endswith(line), path


def test_tuned_presets_listed_apart_from_reproductions():
    page = text(CONFIG_DIR)
    section = _section(page, "experiment")
    tuned = [p for p in _options("experiment") if p.stem.startswith(TUNED)]
    others = [p for p in _options("experiment") if not p.stem.startswith(TUNED)]
    assert len(tuned) == 16 and len(others) == 48
    listed = [line.split()[0] for line in section if line.startswith("    tuned_")]
    assert listed == [p.stem for p in tuned]
    for path in tuned:
        assert describe(path) in page
    # The reproductions: counted and pointed to, not listed.
    assert any("tuned presets" in line for line in section)
    assert any(f"{len(others)} reproductions" in line for line in section)
    assert "docs/reproductions.md" in page and "python -m runner.published" in page
    for path in others:
        assert path.stem not in page, path.stem


def test_page_fits_and_ends_with_the_first_commands():
    page = text(CONFIG_DIR)
    lines = page.splitlines()
    assert len(lines) <= 100
    assert lines[0].startswith("usage: python -m runner [group=option ...] [key=value ...]")
    assert "python -m runner -m " in lines[1]
    # The five commands to start with are the README's first screen's, in its order.
    first_screen = [c.text for c in commands([README]) if c.line <= 45]
    starts = [command for _, command in START]
    assert [what for what, _ in START] == ["train", "watch", "evaluate", "export", "sweep"]
    assert [c for c in first_screen if c in starts] == starts
    for command in starts:
        assert command in page
    assert "--cfg job" in page and "--hydra-help" in page
    assert page.index(starts[0]) > page.index("experiment (default: ")


def test_importing_it_loads_no_hydra_ray_or_torch():
    code = (
        "import sys\n"
        "from runner import CONFIG_DIR\n"
        "from runner.settings import help\n"
        "help.text(CONFIG_DIR)\n"
        "heavy = {m.split('.')[0] for m in sys.modules} & {'hydra', 'omegaconf', 'ray', 'torch'}\n"
        "print(sorted(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_a_reader_that_stops_early_gets_no_traceback():
    """`python -m runner --help | head -2`: the pipe closes under the page."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "runner", "--help"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        bufsize=0,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the page is written: the write finds no reader
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0 and err == "", err
