"""The page `python -m runner --help` prints: usage, the config groups and their options.

Read from the config dir on each call, so a new option file shows up without a code change:
each option's line is the first sentence of its YAML file's first comment, past any Hydra
header (`# @package ...`). Standard library and PyYAML only, so the page prints at once: no Hydra,
Ray or torch import.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

# The groups a user picks from, in the order the page lists them (others found after these).
GROUPS = (
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
# Internal groups: the schema (Hydra's ConfigStore), a compile preset's backend file, the
# parts scale=local and debug=tiny add by themselves, and the tuned hyperparameters the
# algo and env options pick. Only a group's own *.yaml files are its options, so the
# folders below a group are never listed; a top-level one named here is skipped too, as
# is `hydra`, Hydra's own groups (hydra/launcher=slurm: docs/cluster.md).
HIDDEN = (
    "schema",
    "compile/backend",
    "scale/task",
    "scale/experiment",
    "debug/algo",
    "tuned",
    "hydra",
)
TUNED = "tuned_"
# The README's first screen, one command each (tests/test_help.py checks they match).
START = (
    ("train", "python -m runner record.every=10 hydra.run.dir=outputs/cartpole"),
    ("watch", "tensorboard --logdir outputs"),
    (
        "evaluate",
        "python -m runner task=evaluate checkpoint=outputs/cartpole task.episodes=20 "
        "hydra.run.dir=outputs/cartpole_eval",
    ),
    (
        "export",
        "python -m runner task=export checkpoint=outputs/cartpole "
        "hydra.run.dir=outputs/cartpole_onnx",
    ),
    ("sweep", "python -m runner -m compile=none,inductor_default scaling.num_env_runners=0,1"),
)
COMMENT = re.compile(r"^#\s?(.*)$")


# A sentence's end: a stop and a space or the end, not an abbreviation's ("e.g. x").
SENTENCE_END = re.compile(r"(?<!\be\.g)(?<!\bi\.e)\.(\s|$)")


def describe(path: Path) -> str:
    """The first sentence of an option file's first comment, whole (it may run over
    lines), Hydra's `# @` header lines skipped."""
    words: list[str] = []
    for line in path.read_text().splitlines():
        found = COMMENT.match(line.strip())
        if found is None or (not found.group(1).strip() and words):
            break  # the comment ended, or its first paragraph did
        if not found.group(1).startswith("@"):
            words.append(found.group(1).strip())
    text = " ".join(w for w in words if w)
    end = SENTENCE_END.search(text)
    return text[: end.start() + 1] if end else text


def groups(config_dir: str | Path) -> dict[str, dict[str, str]]:
    """Each visible group's options (file stem to its line), in the page's order."""
    root = Path(config_dir)
    found = sorted(p.name for p in root.iterdir() if p.is_dir() and p.name not in HIDDEN)
    ordered = [g for g in GROUPS if g in found] + [g for g in found if g not in GROUPS]
    return {
        group: {p.stem: describe(p) for p in sorted((root / group).glob("*.yaml"))}
        for group in ordered
    }


def defaults(config_dir: str | Path) -> dict[str, str | None]:
    """The option config.yaml's defaults list picks per group (None: none picked)."""
    config = yaml.safe_load((Path(config_dir) / "config.yaml").read_text()) or {}
    picked: dict[str, str | None] = {}
    for entry in config.get("defaults", []):
        if isinstance(entry, dict):
            for key, value in entry.items():
                picked[key] = value
    return picked


def _folded(options: dict[str, str]) -> dict[str, str]:
    """Options that differ by a suffix only, described as "<what> + <variant>." (compile's
    backend + mode presets), on one line: `inductor_{default,ma,ro}  inductor + default /
    max-autotune / reduce-overhead.`"""
    families: dict[str, list[tuple[str, str]]] = {}
    for name, line in options.items():
        stem, _, suffix = name.rpartition("_")
        what, plus, variant = line.rstrip(".").partition(" + ")
        if stem and plus and what == stem:
            families.setdefault(stem, []).append((suffix, variant))
    folded: dict[str, str] = {}
    for name, line in options.items():
        stem = name.rpartition("_")[0]
        family = families.get(stem, [])
        if len(family) < 2:
            folded[name] = line
        elif family[0][0] == name.rpartition("_")[2]:  # the family's first: its one line
            suffixes = ",".join(s for s, _ in family)
            folded[f"{stem}_{{{suffixes}}}"] = f"{stem} + {' / '.join(v for _, v in family)}."
    return folded


def _rows(options: dict[str, str], indent: str) -> list[str]:
    width = max(map(len, options), default=0)
    return [f"{indent}{name.ljust(width)}  {line}".rstrip() for name, line in options.items()]


def text(config_dir: str) -> str:
    """The help page for the config dir `config_dir` (runner.CONFIG_DIR)."""
    picked = defaults(config_dir)
    lines = [
        "usage: python -m runner [group=option ...] [key=value ...]",
        "       python -m runner -m [group=a,b ...] [key=a,b ...]   a sweep: a job per combination",
        "",
        "Config groups (conf/), group=option picks one:",
    ]
    for group, options in groups(config_dir).items():
        default = picked.get(group)
        lines.append(f"{group} (default: {default or 'none'})")
        if group != "experiment":
            lines += _rows(_folded(options), "  ")
            continue
        tuned = {name: line for name, line in options.items() if name.startswith(TUNED)}
        others = [name for name in options if not name.startswith(TUNED)]
        lines.append(
            "  a file that overrides any of the above; the tuned presets, with their pass criteria "
            "(docs/tuned.md):"
        )
        lines += _rows(tuned, "    ")
        lines.append(
            f"  and {len(others)} reproductions of RLlib's torch.compile tables "
            "(docs/reproductions.md): `python -m runner.published`."
        )
    lines += [
        "",
        "Other keys (the README's Config groups): stop.*, check.*, checkpoint.*, record.*,",
        "seed, ray.*, callbacks, dry_run=true, resume=<run dir>; group files: --config-dir DIR.",
        "",
        "To start with (the README's first screen):",
        *(f"  {what.ljust(8)}  {command}" for what, command in START),
        "--cfg job prints the composed config and runs nothing; --hydra-help is Hydra's own help.",
    ]
    return "\n".join(lines)  # print() ends it
