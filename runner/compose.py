"""Composed config -> RLlib AlgorithmConfig, as one pure function (no Ray, no I/O).

Every section is passed through the AlgorithmConfig builder method it is named after,
so RLlib's own setter checks run; a key no builder takes fails here with the closest
valid keys, instead of as a TypeError deep inside RLlib.
"""

from __future__ import annotations

import functools
import inspect
from functools import cache
from typing import Any

from omegaconf import DictConfig, OmegaConf
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.algorithms.registry import ALGORITHMS

from runner import compile as compile_settings
from runner import compiled
from runner.compiled import CompileSpec
from runner.envs import AtariEnv
from runner.errors import ConfigError, did_you_mean

# The algo sections, in the order their builders are called.
ALGO_SECTIONS = (
    "training",
    "env_runners",
    "learners",
    "rl_module",
    "evaluation",
    "reporting",
    "framework",
    "fault_tolerance",
)
# Scaling keys that must be whole numbers >= this bound.
_COUNT_MINIMUM = {"num_env_runners": 0, "num_envs_per_env_runner": 1, "num_learners": 0}


@cache
def builder_params(config_cls: type[AlgorithmConfig], method: str) -> frozenset[str]:
    """Keyword arguments `config_cls.<method>()` takes, through its super() chain."""
    names: set[str] = set()
    for klass in config_cls.__mro__:
        fn = klass.__dict__.get(method)
        if fn is None:
            continue
        for p in list(inspect.signature(fn).parameters.values())[1:]:
            if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
                names.add(p.name)
    return frozenset(names)


def call_builder(config: AlgorithmConfig, method: str, where: str, kwargs: dict) -> None:
    """config.<method>(**kwargs), with unknown keys and RLlib's own errors as one line."""
    allowed = builder_params(type(config), method)
    for key in kwargs:
        if key not in allowed:
            raise ConfigError(
                f"unknown key '{where}.{key}': {type(config).__name__}.{method}() takes no "
                f"'{key}'{did_you_mean(key, allowed)}"
            )
    try:
        getattr(config, method)(**kwargs)
    except (ValueError, TypeError, KeyError) as ex:
        raise ConfigError(f"{where}: RLlib rejected {method}(): {ex}") from ex


def default_config_for(algo_name: str) -> AlgorithmConfig:
    """A fresh default AlgorithmConfig of the named RLlib algorithm."""
    if algo_name not in ALGORITHMS:
        raise ConfigError(
            f"unknown algo.name '{algo_name}'{did_you_mean(algo_name, ALGORITHMS)}; "
            f"RLlib has: {', '.join(ALGORITHMS)}"
        )
    return ALGORITHMS[algo_name]()[1]


def _container(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node


def check_scaling(scaling: dict[str, Any]) -> None:
    """Counts are whole and non-negative, resources non-negative: RLlib itself does not check."""
    for key, value in scaling.items():
        if value is None or isinstance(value, str):
            continue
        minimum = _COUNT_MINIMUM.get(key, 0)
        if value < minimum:
            raise ConfigError(f"scaling.{key} must be >= {minimum}, got {value}")


def _environment_kwargs(env: dict[str, Any]) -> dict[str, Any]:
    if env["atari"]:
        env_config = {"game": env["id"], "framestack": env["framestack"], **env["env_config"]}
        return {"env": AtariEnv, "env_config": env_config, **env["environment"]}
    return {"env": env["id"], "env_config": env["env_config"], **env["environment"]}


def _scaling_kwargs(config: AlgorithmConfig, scaling: dict[str, Any]) -> dict[str, dict]:
    """Split scaling keys between env_runners() and learners(), whichever takes each."""
    split: dict[str, dict] = {"env_runners": {}, "learners": {}}
    for key, value in scaling.items():
        if key == "num_cpus_per_learner" and value is None:
            value = "auto"
        method = next((m for m in split if key in builder_params(type(config), m)), None)
        if method is None:
            raise ConfigError(f"scaling.{key} is fed to no AlgorithmConfig builder")
        split[method][key] = value
    return split


def build_algorithm_config(cfg: DictConfig) -> AlgorithmConfig:
    """The AlgorithmConfig a composed runner config describes. Pure: starts nothing."""
    algo = _container(cfg.algo)
    scaling = _container(cfg.scaling)
    env = _container(cfg.env)
    check_scaling(scaling)
    compile_settings.validate(cfg.compile)

    config = default_config_for(algo["name"])
    call_builder(config, "environment", "env", _environment_kwargs(env))
    scaling_kwargs = _scaling_kwargs(config, scaling)
    for section in ALGO_SECTIONS:
        kwargs = dict(algo[section])
        for key in kwargs.keys() & scaling_kwargs.get(section, {}).keys():
            raise ConfigError(f"algo.{section}.{key} duplicates scaling.{key}; set it in scaling")
        kwargs.update(scaling_kwargs.get(section, {}))
        if section == "rl_module" and env["model_config"]:
            model_config = {**env["model_config"], **kwargs.get("model_config", {})}
            kwargs["model_config"] = model_config
        if kwargs:
            call_builder(config, section, f"algo.{section}", kwargs)
    # RLlib resets its logger to debugging.log_level when the Algorithm starts.
    call_builder(config, "debugging", "seed", {"seed": cfg.seed, "log_level": cfg.ray.log_level})
    _add_compile(config, compile_settings.spec(cfg.compile))
    return config


def _add_compile(config: AlgorithmConfig, spec: CompileSpec | None) -> None:
    """Compile through callbacks in every EnvRunner and Learner process (see compiled.py).

    A complete-update compile is RLlib's own (it works); the runner only wraps it to count.
    """
    if spec is None:
        return
    config.callbacks(
        on_algorithm_init=functools.partial(compiled.apply, spec=spec),
        on_env_runners_recreated=functools.partial(compiled.reapply, spec=spec),
    )
    if spec.learners and spec.learner_granularity == "complete_update":
        config.framework(
            torch_compile_learner=True,
            torch_compile_learner_what_to_compile="complete_update",
            torch_compile_learner_dynamo_backend=spec.backend,
            torch_compile_learner_dynamo_mode=spec.mode or "default",
        )
