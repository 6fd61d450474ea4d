"""The user's own code, named in YAML: import paths, `_target_` objects, connector
factories and agent-to-policy tables.

RLlib takes classes, functions and objects where YAML holds strings. Two spellings reach
them anywhere inside an `algo.*` section:

- `pkg.module:Name` (the entry-point spelling of setuptools and gymnasium): the object
  itself, e.g. a callback class or a policy mapping function;
- a mapping with Hydra's `_target_` (`pkg.module.Name` or `pkg.module:Name`), its other
  keys the keyword arguments (`_args_` the positional ones): an instance, e.g. an
  RLModuleSpec. Nested targets are built first. Built here rather than by
  hydra.utils.instantiate, which would turn nested dataclass objects (RLModuleSpec) back
  into configs.

Keys ending in `_connector` take factories, because RLlib builds a connector in each
EnvRunner and Learner: a target (or list of targets) there becomes a `ConnectorFactory`,
and an import path names the user's own factory function.
Every failure is one `ConfigError` line naming the key and the path, raised while
composing, before Ray starts.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable, Hashable
from types import ModuleType
from typing import Any

from ray.rllib.callbacks.callbacks import RLlibCallback
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.core.rl_module.rl_module import RLModule

from runner.errors import ConfigError, did_you_mean

IMPORT_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
TARGET, ARGS = "_target_", "_args_"
# Keys whose value must be a class of this kind, wherever they appear.
CLASS_KINDS: dict[str, type] = {"callbacks_class": RLlibCallback, "module_class": RLModule}
WHERE_TO_INSTALL = (
    "install the package, put it on PYTHONPATH, or (on a cluster) list it in "
    "ray.runtime_env.py_modules"
)


class _NotAModule(Exception):
    """`name` is not an importable module (but may be an attribute of its parent)."""


def _import(name: str, path: str, where: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as ex:
        if ex.name and (name == ex.name or name.startswith(f"{ex.name}.")):
            raise _NotAModule(ex.name) from ex
        raise ConfigError(f"{where}: importing '{name}' for {path} failed: {ex}") from ex
    except Exception as ex:  # the user's module raised while importing
        raise ConfigError(
            f"{where}: importing '{name}' for {path} failed: {type(ex).__name__}: {ex}"
        ) from ex


def import_module(name: str, where: str) -> ModuleType:
    """The module `name`, or one ConfigError line naming `where` and how to make it importable."""
    try:
        return _import(name, name, where)
    except _NotAModule as ex:
        raise ConfigError(f"{where}: no module named '{ex}'; {WHERE_TO_INSTALL}") from ex


def locate(path: str, where: str) -> Any:
    """The object at `pkg.module:Name` or `pkg.module.Name`, or one ConfigError line."""
    if ":" in path:
        module_name, _, dotted = path.partition(":")
        candidates = [(module_name, dotted.split("."))]
    else:
        parts = path.split(".")
        candidates = [(".".join(parts[:i]), parts[i:]) for i in range(len(parts) - 1, 0, -1)]
    missing = path
    for module_name, attrs in candidates:
        try:
            obj = _import(module_name, path, where)
        except _NotAModule as ex:
            missing = str(ex)
            continue
        for attr in attrs:
            if not hasattr(obj, attr):
                public = [n for n in dir(obj) if not n.startswith("_")]
                raise ConfigError(
                    f"{where}: {path}: '{getattr(obj, '__name__', obj)}' has no "
                    f"'{attr}'{did_you_mean(attr, public)}"
                )
            obj = getattr(obj, attr)
        return obj
    raise ConfigError(
        f"{where}: cannot import {path}: no module named '{missing}'; {WHERE_TO_INSTALL}"
    )


def _check_kind(value: Any, key: str, where: str) -> None:
    kind = CLASS_KINDS.get(key)
    if kind is None:
        return
    for item in value if isinstance(value, list) else [value]:
        if not (isinstance(item, type) and issubclass(item, kind)):
            raise ConfigError(
                f"{where}: {getattr(item, '__qualname__', item)!s} is not a subclass of "
                f"{kind.__qualname__}; name a class such as pkg.module:My{kind.__name__}"
            )


def check_arguments(target: Callable, kwargs: dict[str, Any], where: str) -> None:
    """A keyword the target does not take fails here, with the closest ones it takes."""
    try:
        params = inspect.signature(target).parameters
    except (TypeError, ValueError):  # no signature to check (some builtins)
        return
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return
    for key in kwargs:
        if key not in params:
            name = getattr(target, "__qualname__", str(target))
            raise ConfigError(
                f"{where}.{key}: {name}() takes no '{key}'{did_you_mean(key, params)}"
            )


def build(node: dict[str, Any], where: str) -> Any:
    """Call a `_target_` mapping: nested values materialized first, then target(*args, **kw)."""
    target = locate(str(node[TARGET]), f"{where}.{TARGET}")
    args = [materialize(v, f"{where}.{ARGS}[{i}]") for i, v in enumerate(node.get(ARGS, []))]
    kwargs = {
        k: materialize(v, f"{where}.{k}", k) for k, v in node.items() if k not in (TARGET, ARGS)
    }
    check_arguments(target, kwargs, where)
    try:
        return target(*args, **kwargs)
    except Exception as ex:
        raise ConfigError(f"{where}: {node[TARGET]}(...) failed: {type(ex).__name__}: {ex}") from ex


def materialize(value: Any, where: str, key: str = "") -> Any:
    """Import-path strings and `_target_` mappings in `value` turned into objects; `key`
    (the value's own key) picks the spellings only some keys take."""
    if key.endswith("_connector") and value is not None and not isinstance(value, str):
        return ConnectorFactory(value, where)  # (a path names the user's own factory)
    if key == "policy_mapping_fn" and isinstance(value, dict) and TARGET not in value:
        return PolicyTable(value)
    if isinstance(value, str) and IMPORT_PATH.match(value):
        found = locate(value, where)
    elif isinstance(value, list):
        found = [materialize(v, f"{where}[{i}]") for i, v in enumerate(value)]
    elif isinstance(value, dict) and TARGET in value:
        found = build(value, where)
    elif isinstance(value, dict):
        found = {k: materialize(v, f"{where}.{k}", str(k)) for k, v in value.items()}
    else:
        return value
    _check_kind(found, key, where)
    return found


class ConnectorFactory:
    """A connector piece (or list of pieces) as RLlib wants it: a function of the env and
    spaces, called in each EnvRunner and Learner. The YAML node is kept as plain data, so
    the factory pickles to any actor and builds there; it is built once here to check it."""

    def __init__(self, node: Any, where: str) -> None:
        self.node = node
        self.where = where
        built = self()
        for piece in built if isinstance(built, list) else [built]:
            if not isinstance(piece, ConnectorV2):
                raise ConfigError(
                    f"{where}: {type(piece).__qualname__} is not a ConnectorV2; name a "
                    "connector piece such as ray.rllib.connectors.env_to_module.MeanStdFilter"
                )

    def __call__(self, *_: Any, **__: Any) -> Any:
        """RLlib passes the env, the spaces and the device; the pieces need none of them."""
        nodes = self.node if isinstance(self.node, list) else [self.node]
        if not all(isinstance(n, dict) and TARGET in n for n in nodes):
            raise ConfigError(
                f"{self.where}: give a mapping with _target_ (or a list of them), or an "
                "import path to a factory function, e.g. my_pkg.connectors:make"
            )
        if not isinstance(self.node, list):
            return build(self.node, self.where)
        return [build(n, f"{self.where}[{i}]") for i, n in enumerate(nodes)]


class PolicyTable:
    """policy_mapping_fn from a YAML table, agent id -> policy id. Agent ids are matched
    as text: YAML keys `0:` and `"0":` both name agent 0."""

    def __init__(self, table: dict[Hashable, str]) -> None:
        self.table = {str(agent): str(policy) for agent, policy in table.items()}

    def __call__(self, agent_id: Hashable, episode: Any = None, **_: Any) -> str:
        try:
            return self.table[str(agent_id)]
        except KeyError:
            raise KeyError(
                f"algo.multi_agent.policy_mapping_fn has no entry for agent {agent_id!r}; "
                f"it maps {sorted(self.table)}"
            ) from None


def beside(theirs: Callable | list[Callable] | None, ours: Callable) -> list[Callable]:
    """The user's callback functions (from algo.callbacks), then ours: both run."""
    if theirs is None:
        return [ours]
    return [*(theirs if isinstance(theirs, list) else [theirs]), ours]
