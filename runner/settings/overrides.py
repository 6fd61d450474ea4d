"""Hydra command-line overrides as data: which key an override sets, and to what.

Used by resume (the original run's overrides with this command's on top), by the sweep
summary (what the sweep varied, which job is a compile=none baseline), and by both entry
points before they compose: `checkpoint=` and an env named by its setting alone.
"""

from __future__ import annotations

from pathlib import Path

import yaml

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


# The env option of an env of the user's own (conf/env/custom.yaml): no preset's tuned
# hyperparameters, solved return or stop target; and the one any other ALE id takes.
CUSTOM_ENV = "custom"
ATARI_ENV = "atari"
ENV_SPELLINGS = ("env.id", "env.entry_point", "env.pettingzoo")


def env_presets(config_dir: str | Path) -> dict[str, str]:
    """Each env option of `config_dir`/env by the env it names: its id, entry point or
    PettingZoo function (CartPole-v1: cartpole)."""
    found: dict[str, str] = {}
    for path in sorted(Path(config_dir, "env").glob("*.yaml")):
        data = yaml.safe_load(path.read_text()) or {}
        for spelling in ENV_SPELLINGS:
            name = data.get(spelling.removeprefix("env."))
            if name:
                found.setdefault(str(name), path.stem)
    return found


def _env_option(name: str, presets: dict[str, str]) -> str:
    """The option an env named `name` takes: the preset that names it, env=atari for any
    other ALE id (RLlib's Atari preprocessing), else env=custom."""
    if name in presets:
        return presets[name]
    return ATARI_ENV if name.rpartition(":")[2].startswith("ALE/") else CUSTOM_ENV


def with_env_preset(argv: list[str], presets: dict[str, str]) -> list[str]:
    """`env=<option>` added where env.id, env.entry_point or env.pettingzoo names the env
    and neither env= nor experiment= picks its option: the default option
    (cartpole) would otherwise lend its tuned hyperparameters, solved return and stop
    target to another env. env.id=Acrobot-v1 takes env=acrobot, another ALE id env=atari,
    anything else env=custom; a sweep over envs of different options takes env=custom
    (env=atari where all are ALE games)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if any(key(arg) in ("env", "experiment") for arg in argv if "=" in arg):
        return argv
    named = [arg for arg in argv if key(arg) in ENV_SPELLINGS and not arg.startswith("~")]
    names: list[str] = []
    for override in OverridesParser.create().parse_overrides(named):
        if not override.is_sweep_override():
            names += [] if override.value() is None else [str(override.value())]
        elif override.is_choice_sweep():
            names += list(override.sweep_string_iterator())
        else:  # a range or glob of envs: none of them a preset's by name
            names.append(CUSTOM_ENV)
    options = {_env_option(name, presets) for name in names}
    if not options:
        return argv
    if len(options) == 1:
        (option,) = options
    else:  # ALE games all take env=atari's settings (env=breakout's are the same)
        ale = all(name.rpartition(":")[2].startswith("ALE/") for name in names)
        option = ATARI_ENV if ale else CUSTOM_ENV
    return [*argv, f"env={option}"]


def normalized(argv: list[str]) -> list[str]:
    """The overrides as both entry points take them, before they compose: `checkpoint=`
    as task.checkpoint=, an env named by its setting alone with its option."""
    from runner import CONFIG_DIR

    return with_env_preset(with_checkpoint_alias(argv), env_presets(CONFIG_DIR))
