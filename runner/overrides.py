"""Hydra command-line overrides as data: which key an override sets, and to what.

Used by resume (the original run's overrides with this command's on top) and by the sweep
summary (what the sweep varied, which job is a compile=none baseline).
"""

from __future__ import annotations

# Overrides that concern one invocation and are never carried into a resumed run.
PER_INVOCATION = ("resume", "dry_run")


def key(override: str) -> str:
    """'+a.b=1' -> 'a.b': the config key an override sets."""
    return override.split("=", 1)[0].lstrip("+~")


def value(overrides: list[str], wanted: str) -> str | None:
    """The value `overrides` give the key `wanted`, or None."""
    for o in overrides:
        if key(o) == wanted:
            return o.split("=", 1)[1] if "=" in o else None
    return None


def is_compile(override: str) -> bool:
    """True for compile=... and compile.*=... overrides."""
    k = key(override)
    return k == "compile" or k.startswith("compile.")


def merge(saved: list[str], current: list[str]) -> list[str]:
    """Saved overrides with the current ones on top (one value per key, later wins),
    without the per-invocation ones."""
    merged: dict[str, str] = {}
    for override in saved + current:
        if key(override) not in PER_INVOCATION:
            merged[key(override)] = override
    return list(merged.values())


def with_checkpoint_alias(argv: list[str]) -> list[str]:
    """`checkpoint=<path>` on the command line is task.checkpoint=<path> (task=evaluate and
    task=export read it): the config's own `checkpoint` section holds training's settings."""
    return [f"task.{arg}" if arg.startswith("checkpoint=") else arg for arg in argv]
