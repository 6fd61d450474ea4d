"""task=tune's search space: distributions over composed keys (conf/search/), checked
against the composed config before anything starts, turned into Ray Tune's, and applied
to each trial's typed settings.

A key is a dotted path into the composed config, e.g. `algo.training.lr`. In a typed
section (`scaling`, `stop`, ...) it must exist; in a builder section (`algo.training`) it
may be new, and RLlib's builder checks it when a trial's AlgorithmConfig is built.
"""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from ray import tune
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

from runner.errors import ConfigError, did_you_mean
from runner.settings.schema import Distribution, RunnerConfig, Scheduler, SearchConfig

KINDS = tuple(f.name for f in fields(Distribution))
# Each trial's resources are reserved before its values are sampled.
RESOURCE_KEYS = (
    "scaling.num_env_runners",
    "scaling.num_cpus_per_env_runner",
    "scaling.num_gpus_per_env_runner",
    "scaling.num_learners",
    "scaling.num_cpus_per_learner",
    "scaling.num_gpus_per_learner",
)
# What a search may not change: the job itself, and where it writes.
NOT_SEARCHABLE = ("task", "search", "logger", "resume", "dry_run", "ray", "hardware")


def kind(key: str, dist: Distribution, section: str = "search.space") -> tuple[str, list[Any]]:
    """(distribution name, its arguments), checked: one line for a bad one."""
    given = [(name, getattr(dist, name)) for name in KINDS if getattr(dist, name) is not None]
    where = f"{section}.'{key}'"
    if len(given) != 1:
        names = ", ".join(name for name, _ in given) or "none"
        raise ConfigError(f"{where}: give exactly one of {', '.join(KINDS)} (got {names})")
    name, args = given[0]
    args = list(args)
    if name == "choice":
        if not args:
            raise ConfigError(f"{where}: the choice list is empty; list at least one value")
        return name, args
    wanted = 3 if name == "quniform" else 2
    if len(args) != wanted or not all(isinstance(a, int | float) for a in args):
        shape = "[low, high, step]" if name == "quniform" else "[low, high]"
        raise ConfigError(f"{where}: {name} takes {shape} as numbers, got {args}")
    if not args[0] < args[1]:
        raise ConfigError(f"{where}: {name} needs low < high, got {args[:2]}")
    if name == "loguniform" and args[0] <= 0:
        raise ConfigError(f"{where}: loguniform needs low > 0, got {args[0]}")
    return name, args


def to_tune(space: dict[str, Distribution]) -> dict[str, Any]:
    """Ray Tune's sample domains, keyed like the space."""
    domains = {}
    for key, dist in space.items():
        name, args = kind(key, dist)
        domains[key] = tune.choice(args) if name == "choice" else getattr(tune, name)(*args)
    return domains


def _check_key(cfg: DictConfig, key: str) -> None:
    root = key.split(".", 1)[0]
    if root in NOT_SEARCHABLE or key in RESOURCE_KEYS:
        why = (
            "each trial's resources are reserved before it samples"
            if key in RESOURCE_KEYS
            else "it is not a training setting"
        )
        raise ConfigError(f"search.space: '{key}' cannot be searched: {why}")
    parent_key, _, leaf = key.rpartition(".")
    parent = OmegaConf.select(cfg, parent_key) if parent_key else cfg
    if not isinstance(parent, DictConfig):
        raise ConfigError(
            f"search.space: '{key}' is not a key of the composed config ('{parent_key or key}' "
            "is no section); keys are dotted paths such as algo.training.lr"
        )
    structured = OmegaConf.get_type(parent) is not dict
    if structured and leaf not in parent:
        raise ConfigError(
            f"search.space: '{key}' is not a key of the composed config"
            f"{did_you_mean(leaf, [str(k) for k in parent])}"
        )


def check(
    space: dict[str, Distribution], settings: RunnerConfig, section: str = "search.space"
) -> None:
    """Every key exists (or may, in a builder section) and every distribution is whole."""
    cfg = OmegaConf.structured(settings)
    for key, dist in space.items():
        kind(key, dist, section)
        _check_key(cfg, key)


def searched(config: SearchConfig) -> dict[str, Distribution]:
    """What a trial's values are sampled from: the space, and under PBT or PB2 the mutated
    keys it leaves out (their mutation's distribution)."""
    if config.scheduler == Scheduler.asha:
        return dict(config.space)
    return {**config.mutations, **config.space}


def check_population(config: SearchConfig, settings: RunnerConfig) -> None:
    """search.scheduler=pbt|pb2's own settings: mutations to make, keys a trial can take,
    PB2's bounds, an interval and fractions in range. ASHA takes no mutations."""
    where = f"search.scheduler={config.scheduler.value}"
    if config.scheduler == Scheduler.asha:
        if config.mutations:
            raise ConfigError(
                "search.mutations change values during a trial, which only population-based "
                "training does: set search.scheduler=pbt (or pb2), or drop search.mutations"
            )
        return
    if not config.mutations:
        raise ConfigError(f"{where} needs search.mutations: the keys it changes during a trial")
    check(config.mutations, settings, "search.mutations")
    for key, dist in config.mutations.items():
        name, _ = kind(key, dist, "search.mutations")
        if config.scheduler == Scheduler.pb2 and name not in ("uniform", "loguniform"):
            raise ConfigError(
                f"search.mutations.'{key}': PB2 picks values within [low, high]: give it "
                f"uniform or loguniform, not {name} (or use search.scheduler=pbt)"
            )
    if config.perturbation_interval < 1:
        raise ConfigError(f"search.perturbation_interval={config.perturbation_interval}: "
                          "give at least 1 (iterations between perturbations)")  # fmt: skip
    for name in ("quantile_fraction", "resample_probability"):
        value = getattr(config, name)
        if not 0 <= value <= (0.5 if name == "quantile_fraction" else 1):
            top = "0.5" if name == "quantile_fraction" else "1"
            raise ConfigError(f"search.{name}={value} is out of range: give 0 to {top}")


def with_values(settings: RunnerConfig, values: dict[str, Any]) -> RunnerConfig:
    """A copy of `settings` with `values` set at their dotted keys, through the schema (a
    value of the wrong type is one line)."""
    cfg = OmegaConf.structured(settings)
    for key, value in values.items():
        try:
            OmegaConf.update(cfg, key, value, merge=False)
        except OmegaConfBaseException as ex:
            raise ConfigError(f"search.space: '{key}' = {value!r}: {ex.msg}") from ex
    return OmegaConf.to_object(cfg)  # type: ignore[return-value]  # a RunnerConfig node


def sample_each(space: dict[str, Distribution]) -> list[dict[str, Any]]:
    """Values that together touch every choice and both ends of every range: each is
    checked through RLlib's builders before the search starts."""
    ends: dict[str, list[Any]] = {}
    for key, dist in space.items():
        name, args = kind(key, dist)
        if name == "choice":
            ends[key] = args
        elif name == "randint":
            ends[key] = [args[0], args[1] - 1]
        else:
            ends[key] = args[:2]
    width = max((len(v) for v in ends.values()), default=0)
    return [{key: v[min(i, len(v) - 1)] for key, v in ends.items()} for i in range(width)]


def _inside(dist: Distribution, key: str, value: Any) -> bool:
    name, args = kind(key, dist)
    if name == "choice":
        return value in args
    if not isinstance(value, int | float) or isinstance(value, bool) or math.isnan(value):
        return False
    if name == "randint":
        return isinstance(value, int) and args[0] <= value < args[1]
    return args[0] <= value <= args[1]


def preset_values(
    space: dict[str, Distribution], settings: RunnerConfig, config: AlgorithmConfig
) -> tuple[dict[str, Any] | None, str]:
    """The values the composed config runs with for the searched keys (RLlib's default
    where the config leaves an algo key unset), or None and why when one is outside the
    space (the search then has no preset trial)."""
    cfg = OmegaConf.structured(settings)
    values: dict[str, Any] = {}
    for key, dist in space.items():
        value = OmegaConf.select(cfg, key)
        if value is None and key.startswith("algo."):
            value = getattr(config, key.rsplit(".", 1)[1], None)
        if isinstance(value, DictConfig) or not _inside(dist, key, value):
            return None, f"the preset's {key}={value!r} lies outside search.space"
        values[key] = value
    return values, ""
