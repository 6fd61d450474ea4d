"""One-line error reporting: bad input gets one line naming the problem and the fix.

Hydra and OmegaConf raise multi-line messages with a stack trace; the entry point turns
any of them, and the runner's own `RunnerError`, into a single line on stderr.
"""

from __future__ import annotations

import difflib
import json
import re
import sys
from collections.abc import Callable, Iterable

from hydra.errors import MissingConfigException, OverrideParseException
from omegaconf import OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

# Ray's ActorDiedError text: the class, the pid and how the worker exited.
_ACTOR_DIED = re.compile(
    r"actor died unexpectedly.*?class_name: (\S+).*?pid: (\d+).*?Worker exit type: (\w+)"
)


class RunnerError(Exception):
    """An error whose message is already one line naming the problem and the fix."""


class ConfigError(RunnerError):
    """The composed config is invalid (caught before Ray starts)."""


class RunDirUsed(ConfigError):
    """The run dir holds another run's results: the job writes nothing there."""


class RunEnded(RunnerError):
    """A run stopped on a stall, a non-finite value or an EnvRunner error that repeated:
    exit code 1 (its record says why)."""

    exit_code = 1


class PreflightError(RunnerError):
    """The plan asks for resources that are not there (caught before any actor starts)."""


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """' (did you mean x?)' for the closest choices, or '' when none is close."""
    close = difflib.get_close_matches(word, list(choices), n=3, cutoff=0.6)
    return f" (did you mean {' or '.join(close)}?)" if close else ""


def _squash(text: str) -> str:
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def _options_of(ex: MissingConfigException) -> list[str]:
    return [o for o in (ex.options or []) if not o.startswith("_")]


def _unknown_key(ex: OmegaConfBaseException) -> str:
    """A typo'd key: the closest keys of its section, or how to add a free-form setting."""
    key = ex.full_key or str(ex.key)
    bad = key.rsplit(".", 1)[-1]
    node = ex.parent_node
    keys = [str(k) for k in node] if node is not None else []
    hint = did_you_mean(bad, keys)
    typed = node is not None and OmegaConf.get_type(node) not in (dict, None)
    if hint or typed:
        return f"unknown config key '{key}'{hint}; `python -m runner --cfg job` lists the keys"
    return f"'{key}' is not in the config; to add a setting there, prefix it with '+': +{key}=..."


def one_line(ex: BaseException) -> str:
    """The shortest faithful one-line message for an exception raised while composing or running."""
    if isinstance(ex, RunnerError):
        return str(ex)
    if isinstance(ex, MissingConfigException):
        group = (ex.missing_cfg_file or "").rsplit("/", 1)
        if len(group) == 2 and ex.options:
            options = _options_of(ex)
            listed = (
                f"choose one of: {', '.join(options)}"
                if len(options) <= 20
                else f"{len(options)} options, listed by `python -m runner --help`"
            )
            return (
                f"unknown option '{group[1]}' for config group '{group[0]}'"
                f"{did_you_mean(group[1], options)}; {listed}"
            )
        return _squash(str(ex))
    if isinstance(ex, OverrideParseException):
        first = str(ex).splitlines()[0]
        if "~" in str(ex):
            return (
                f"malformed override: {first}; Hydra's grammar takes no bare '~' in a value: "
                """quote it, e.g. 'compile.cache_dir="~/.cache/rllib-runner"'"""
            )
        return f"malformed override: {first}; write overrides as key=value (see --help)"
    cause = ex.__cause__ if isinstance(ex.__cause__, OmegaConfBaseException) else ex
    if isinstance(cause, ConfigKeyError | ConfigAttributeError):
        return _unknown_key(cause)
    if isinstance(cause, OmegaConfBaseException):
        msg = str(cause).splitlines()[0]
        key = getattr(cause, "full_key", None)
        return f"invalid value for '{key}': {msg}" if key else _squash(str(cause))
    died = _ACTOR_DIED.search(" ".join(str(ex).split()))
    if died:
        name, pid, kind = died.groups()
        name = name.rsplit(".", 1)[-1]
        if name == "_WrappedExecutable":  # Ray Train's actor around a remote Learner
            name = "a Learner (Ray Train's _WrappedExecutable)"
        return (
            f"a Ray actor died: {name} (pid {pid}), {kind}: its process "
            "was killed, ran out of memory or crashed (its log is under Ray's session dir)"
        )
    text = _squash(str(ex)) or type(ex).__name__
    return re.sub(r"\s*Set the environment variable HYDRA_FULL_ERROR.*$", "", text)


def tool_exit_code(work: Callable[[], int]) -> int:
    """Run a `python -m runner.<tool>` command: bad input, a missing or unreadable file is
    one line on stderr and exit code 2; otherwise the work's own exit code."""
    try:
        return work()
    except (RunnerError, OSError, json.JSONDecodeError) as ex:
        print(f"error: {one_line(ex)}", file=sys.stderr)
        return 2
