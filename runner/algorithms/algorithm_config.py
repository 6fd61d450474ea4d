"""Typed settings -> RLlib AlgorithmConfig, as one function (no Ray, no I/O; an env is
built once to read its agent ids and observation spaces: an image's shape, an action
mask).

Every section is passed through the AlgorithmConfig builder method it is named after, so
RLlib's own setter checks run. The fixed scaling fields go through explicit
`env_runners(...)` and `learners(...)` calls; the free-form `algo.*` sections are checked
key by key against the builder's parameters, so a key no builder takes fails here with
the closest valid keys instead of as a TypeError deep inside RLlib. Classes, functions
and objects in those sections are named by import path or `_target_` (runner/settings/user_code.py).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Hashable, Mapping
from functools import cache
from typing import Any

from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.algorithms.registry import ALGORITHMS
from ray.rllib.utils.from_config import NotProvided

from runner.algorithms.fast_step import choose as choose_training_step
from runner.algorithms.reward_scaling import choose as choose_reward_scaling
from runner.compile.apply import add_to_config
from runner.compile.settings import CompileSpec
from runner.envs import environment_kwargs, observation_spaces, setting, wraps_atari
from runner.envs.masking import (
    MAIN,
    RANDOM,
    MaskedPPO,
    RandomLegalMoves,
    Seats,
    is_masked,
    log_game,
)
from runner.errors import ConfigError, did_you_mean
from runner.settings.schema import (
    AlgoConfig,
    EnvConfig,
    EvalConfig,
    Opponent,
    Policies,
    RunnerConfig,
    ScalingConfig,
)
from runner.settings.user_code import PolicyTable, beside, materialize

# The free-form algo sections, in the order their builders are called.
ALGO_SECTIONS = (
    "training",
    "env_runners",
    "learners",
    "rl_module",
    "evaluation",
    "reporting",
    "framework",
    "fault_tolerance",
    "callbacks",
    "multi_agent",
)


@cache
def builder_params(config_cls: type[AlgorithmConfig], method: str) -> dict[str, str]:
    """Keyword arguments `config_cls.<method>()` takes, through its super() chain, with
    their type annotations (the most derived class's) as text."""
    params: dict[str, str] = {}
    for klass in config_cls.__mro__:
        fn = klass.__dict__.get(method)
        if fn is None:
            continue
        for p in list(inspect.signature(fn).parameters.values())[1:]:
            if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
                params.setdefault(p.name, str(p.annotation))
    return params


def _as_annotated(value: Any, annotation: str) -> Any:
    """YAML has no tuples: a list becomes one where RLlib's builder takes a tuple and no
    list (DQN's and SAC's `n_step: [2, 5]`, a range RLlib samples from)."""
    text = annotation.lower()
    if isinstance(value, list) and "tuple" in text and "list" not in text:
        return tuple(value)
    return value


def _call(builder: Callable[..., Any], where: str, kwargs: dict[str, Any]) -> None:
    """builder(**kwargs), RLlib's own rejection as one line naming where the user set it."""
    try:
        builder(**kwargs)
    except (ValueError, TypeError, KeyError) as ex:
        raise ConfigError(f"{where}: RLlib rejected {builder.__name__}(): {ex}") from ex


def call_builder(config: AlgorithmConfig, method: str, where: str, kwargs: dict) -> None:
    """config.<method>(**kwargs) for a free-form section: unknown keys fail first."""
    allowed = builder_params(type(config), method)
    for key in kwargs:
        if key not in allowed:
            raise ConfigError(
                f"unknown key '{where}.{key}': {type(config).__name__}.{method}() takes no "
                f"'{key}'{did_you_mean(key, allowed)}"
            )
    kwargs = {key: _as_annotated(value, allowed[key]) for key, value in kwargs.items()}
    _call(getattr(config, method), where, kwargs)


def default_config_for(algo_name: str) -> AlgorithmConfig:
    """A fresh default AlgorithmConfig of the named RLlib algorithm."""
    if algo_name not in ALGORITHMS:
        raise ConfigError(
            f"unknown algo.name '{algo_name}'{did_you_mean(algo_name, ALGORITHMS)}; "
            f"RLlib has: {', '.join(ALGORITHMS)}"
        )
    return ALGORITHMS[algo_name]()[1]


def env_runner_scaling(s: ScalingConfig) -> dict[str, Any]:
    """The scaling fields `AlgorithmConfig.env_runners()` takes."""
    return {
        "num_env_runners": s.num_env_runners,
        "num_envs_per_env_runner": s.num_envs_per_env_runner,
        "gym_env_vectorize_mode": s.gym_env_vectorize_mode,
        "num_cpus_per_env_runner": s.num_cpus_per_env_runner,
        "num_gpus_per_env_runner": s.num_gpus_per_env_runner,
    }


def learner_scaling(s: ScalingConfig) -> dict[str, Any]:
    """The scaling fields `AlgorithmConfig.learners()` takes (null CPUs: RLlib's default)."""
    cpus = NotProvided if s.num_cpus_per_learner is None else s.num_cpus_per_learner
    return {
        "num_learners": s.num_learners,
        "num_gpus_per_learner": s.num_gpus_per_learner,
        "num_cpus_per_learner": cpus,
    }


def evaluation_settings(e: EvalConfig, config: AlgorithmConfig) -> dict[str, Any]:
    """The fields `AlgorithmConfig.evaluation()` takes for eval.* (evaluation during
    training), over any algo.evaluation.evaluation_config."""
    return {
        "evaluation_interval": e.every,
        "evaluation_duration": e.episodes,
        "evaluation_duration_unit": "episodes",
        "evaluation_parallel_to_training": e.parallel,
        "evaluation_num_env_runners": e.num_env_runners,
        "evaluation_config": {**(config.evaluation_config or {}), "explore": e.explore},
    }


def check_policies(config: AlgorithmConfig) -> None:
    """A policy id the mapping table, the policies to train or the module specs name must be
    one of algo.multi_agent.policies."""
    policies = set(config.policies)
    mapping = config.policy_mapping_fn
    named = {
        "algo.multi_agent.policy_mapping_fn": mapping.table.values()
        if isinstance(mapping, PolicyTable)
        else (),
        "algo.multi_agent.policies_to_train": config.policies_to_train
        if isinstance(config.policies_to_train, list | set | tuple)
        else (),
        "algo.rl_module.rl_module_spec": getattr(config.rl_module_spec, "rl_module_specs", {})
        if config.is_multi_agent
        else (),
    }
    for where, ids in named.items():
        for policy in sorted(set(ids) - policies):
            raise ConfigError(
                f"{where} names policy '{policy}', which is not one of algo.multi_agent."
                f"policies ({', '.join(sorted(policies))}){did_you_mean(policy, policies)}"
            )


def generated_policies(env: EnvConfig, agents: list[Any] | None) -> dict[str, Any] | None:
    """algo.multi_agent for a multi-agent env (`agents`: its agent ids) that declares
    none: one policy per agent id (`env.policies: per_agent`, the default) or one for all
    (`shared`), or, against an opponent, `main` (trained) and the opponent's; None for a
    single-agent env."""
    for name, value in (("policies", env.policies), ("opponent", env.opponent)):
        if agents is None and value is not None:
            raise ConfigError(
                f"env.{name}={value.value} is for multi-agent envs; {setting(env)} "
                f"is single-agent: drop env.{name}"
            )
    if agents is None:
        return None
    if env.opponent is not None:
        if env.policies is not None:
            raise ConfigError(
                f"env.opponent={env.opponent.value} and env.policies={env.policies.value} "
                "both set the policies (against an opponent: main and the opponent's): keep one"
            )
        return {
            "policies": [MAIN, RANDOM],
            "policy_mapping_fn": Seats(agents),
            "policies_to_train": [MAIN],
        }
    shared = env.policies == Policies.shared
    table: dict[Hashable, str] = {
        str(agent): "shared" if shared else str(agent) for agent in agents
    }
    return {"policies": sorted(set(table.values())), "policy_mapping_fn": PolicyTable(table)}


def _multi_agent_replay(config: AlgorithmConfig) -> None:
    """Off-policy algorithms on a multi-agent env sample from RLlib's multi-agent episode
    buffer (RLlib's multi-agent examples switch to it; the single-agent one fails on
    multi-agent episodes)."""
    buffer = getattr(config, "replay_buffer_config", None) or {}
    kind = buffer.get("type")
    if not config.is_multi_agent or not isinstance(kind, str):
        return
    if kind.endswith("EpisodeReplayBuffer") and not kind.startswith("MultiAgent"):
        replay = {"replay_buffer_config": {**buffer, "type": f"MultiAgent{kind}"}}
        call_builder(config, "training", "algo.training", replay)


def conv_filters_for(shape: tuple[int, ...]) -> list[list[Any]]:
    """A conv stack for images of `shape` (h, w, c): RLlib's own where its catalog has one
    for the size (84x84 Atari, 64x64, ...), else one derived from it, as RLlib's are
    built ("same" padding): 4x4 kernels of stride 2, 16 channels doubling, until the
    image is 8 pixels or less a side (at most 4 layers); images of 8 or less get three
    2x2 layers of stride 1, as MiniGrid's 7x7 grid is encoded in its own examples."""
    from ray.rllib.models.utils import get_filter_config

    try:
        return get_filter_config(shape)
    except ValueError:
        pass
    side = min(shape[0], shape[1])
    if side <= 8:
        return [[16, [2, 2], 1], [32, [2, 2], 1], [64, [2, 2], 1]]
    filters: list[list[Any]] = []
    while side > 8 and len(filters) < 4:
        filters.append([16 * 2 ** len(filters), [4, 4], 2])
        side = math.ceil(side / 2)
    return filters


def image_model_defaults(
    env: EnvConfig, model_config: Mapping[str, Any], spaces: Mapping[Any, Any]
) -> dict[str, Any]:
    """`conv_filters` for a single-agent env's image observation (a 3-D Box; `spaces`
    from observation_spaces) of any size, unless the model config names its own:
    RLlib's catalog has defaults for a few sizes only and stops the module's build at
    any other. Atari's frames are 84x84, one of those sizes."""
    if wraps_atari(env) or None not in spaces or model_config.get("conv_filters"):
        return {}
    shape = getattr(spaces[None], "shape", None) or ()
    if len(shape) != 3:
        return {}
    return {"conv_filters": conv_filters_for(shape)}


def masking_modules(
    config: AlgorithmConfig, env: EnvConfig, spaces: Mapping[Any, Any], algo: AlgoConfig
) -> None:
    """The RLModules an env's masks and opponent need, unless algo.rl_module names its
    own: MaskedPPO (RLlib's action masking, which is PPO's) for every trained policy where
    the observations hold an action mask, and random legal moves for the opponent."""
    masked = env.action_mask is not False and any(is_masked(s) for s in spaces.values())
    if env.action_mask and not masked:
        raise ConfigError(
            f"env.action_mask=true, but {setting(env)}'s observations hold no action mask "
            "(a Dict observation with an `action_mask` beside the observation): drop "
            "env.action_mask, or have the env return one"
        )
    if not masked and env.opponent is None:
        return
    if masked and algo.name != "PPO":
        raise ConfigError(
            f"{setting(env)}'s observations hold an action mask, which RLlib's "
            f"action-masking RLModule applies for PPO only, not {algo.name}: use algo=ppo, or "
            "env.action_mask=false to train on the observation dict unmasked"
        )
    if "rl_module_spec" in algo.rl_module:
        return  # the user's own module (algo.rl_module.rl_module_spec) masks or not
    from ray.rllib.core.rl_module.multi_rl_module import MultiRLModuleSpec
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    def spec(policy: str) -> RLModuleSpec:
        if env.opponent == Opponent.random and policy == RANDOM:
            return RLModuleSpec(module_class=RandomLegalMoves)
        return RLModuleSpec(module_class=MaskedPPO if masked else None)

    if config.is_multi_agent:
        specs = {str(p): spec(str(p)) for p in config.policies}
        call_builder(
            config,
            "rl_module",
            "env.action_mask",
            {"rl_module_spec": MultiRLModuleSpec(rl_module_specs=specs)},
        )
    else:
        call_builder(config, "rl_module", "env.action_mask", {"rl_module_spec": spec(MAIN)})
    if env.opponent is not None:
        config.callbacks(on_episode_end=beside(config.callbacks_on_episode_end, log_game))


def build_module(
    config: AlgorithmConfig,
    env: Any,
    inference_only: bool = False,
    spaces: dict[str, Any] | None = None,
) -> Any:
    """The RLModule `config` gives `env`, built as RLlib's actors build it (a MultiRLModule
    for a multi-agent config; an EnvRunner's, without the training-only parts, with
    `inference_only`; `spaces` as an EnvRunner's get_spaces() gives them, where its
    connectors change the observation): the one place the driver builds one (the
    preflight, compile=auto, the inference bench)."""
    if config.is_multi_agent:
        spec = config.get_multi_rl_module_spec(
            env=env, spaces=spaces, inference_only=inference_only
        )
        return spec.build()
    return config.get_rl_module_spec(env=env, spaces=spaces, inference_only=inference_only).build()


def build_algorithm_config(settings: RunnerConfig, spec: CompileSpec | None) -> AlgorithmConfig:
    """The AlgorithmConfig the typed settings describe, compiling per `spec`. Starts nothing."""
    algo, scaling, env = settings.algo, settings.scaling, settings.env
    config = default_config_for(algo.name)
    call_builder(config, "environment", "env", environment_kwargs(env))
    agents, spaces = observation_spaces(env)
    fixed = {"env_runners": env_runner_scaling(scaling), "learners": learner_scaling(scaling)}
    for section in ALGO_SECTIONS:
        kwargs = {
            key: materialize(value, f"algo.{section}.{key}", key)
            for key, value in getattr(algo, section).items()
        }
        for key in kwargs.keys() & fixed.get(section, {}).keys():
            raise ConfigError(f"algo.{section}.{key} duplicates scaling.{key}; set it in scaling")
        given = kwargs.get("model_config", {})
        if section == "rl_module" and isinstance(given, Mapping):
            merged = {**env.model_config, **given}
            merged = {**image_model_defaults(env, merged, spaces), **merged}
            if merged:
                kwargs["model_config"] = merged
        if kwargs:
            call_builder(config, section, f"algo.{section}", kwargs)
    if not algo.multi_agent:
        generated = generated_policies(env, agents)
        if generated:
            call_builder(config, "multi_agent", "env.policies", generated)
    else:
        for name, value in (("policies", env.policies), ("opponent", env.opponent)):
            if value is not None:
                raise ConfigError(
                    f"env.{name}={value.value} and algo.multi_agent both set the policies: keep one"
                )
    masking_modules(config, env, spaces, algo)
    if settings.eval.every:
        evaluation = evaluation_settings(settings.eval, config)
        for key in algo.evaluation.keys() & evaluation.keys() - {"evaluation_config"}:
            raise ConfigError(f"algo.evaluation.{key} and eval.* both set it: keep eval.*")
        _call(config.evaluation, "eval", evaluation)
    check_policies(config)
    _multi_agent_replay(config)
    _call(config.env_runners, "scaling", fixed["env_runners"])
    _call(config.learners, "scaling", fixed["learners"])
    # RLlib resets its logger to debugging.log_level when the Algorithm starts.
    _call(
        config.debugging, "seed", {"seed": settings.seed, "log_level": settings.ray.log_level.value}
    )
    choose_training_step(config, algo.fast_step)
    choose_reward_scaling(config, algo.reward_scaling)  # on the Learner the step chose
    add_to_config(config, spec)
    return config
