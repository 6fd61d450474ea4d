"""The one env factory: every env the runner touches is built by `build`.

RLlib's EnvRunners get `RunnerEnv` as `AlgorithmConfig.environment(env=...)`, with the
env's settings (`env.*`) carried in `env_config` under one reserved key, so RLlib calls
the factory in every actor. The driver's envs (preflight, compile=auto, export's parity
check, the inference bench, a trained policy's spaces) come from `make_env(config)`, and
video's from `make_env(config, render_mode="rgb_array")`: the same call an EnvRunner
makes, so a setting under `env.*` applies everywhere by construction.

Four spellings: a gymnasium id (`module:EnvId` imports `module` first, in every
process), an env class or factory by import path (`env.entry_point`, called with RLlib's
EnvContext; a MultiAgentEnv makes the run multi-agent), a PettingZoo env function
(`env.pettingzoo`, called with env_config as keywords, in RLlib's own PettingZoo
wrappers), and Atari ids wrapped as RLlib wraps Atari for the new API stack. Then
`env.wrappers` in order, `env.framestack` (beyond Atari's own), and integer observations
as floats (`float_observations`), on every single-agent env; action masks as RLlib's
masking RLModule takes them (runner/envs/masking.py), on any env.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import asdict
from itertools import islice
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np
from ray.rllib.env.env_context import EnvContext
from ray.rllib.env.multi_agent_env import MultiAgentEnv

from runner.errors import ConfigError, did_you_mean
from runner.settings.schema import EnvConfig, setting
from runner.settings.user_code import TARGET, check_arguments, import_module, locate, materialize

# env_config's reserved key: the env's settings, as a plain dict (pickled to each actor).
SETTINGS_KEY = "_runner_env"
# What `environment()` gets besides env and env_config is RLlib's, not the env's.
_OWN_FIELDS = ("id", "entry_point", "pettingzoo", "atari", "framestack", "wrappers", "action_mask")


def _register_ale() -> None:
    """ALE's envs in gymnasium's registry; its banner off (bad input must stay one line)."""
    import ale_py

    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)
    gym.register_envs(ale_py)


def wraps_atari(env: EnvConfig | dict[str, Any]) -> bool:
    """Whether the env gets RLlib's Atari preprocessing: `env.atari`, or, left null, an
    ALE id (`ALE/Pong-v5`, `ale_py:ALE/Pong-v5`), whose raw 210x160 frames no default
    model takes well."""
    values = env if isinstance(env, dict) else asdict(env)
    if values.get("atari") is not None:
        return bool(values["atari"])
    return (values.get("id") or "").rpartition(":")[2].startswith("ALE/")


def check_env_id(env_id: str) -> None:
    """Fail with one line if gymnasium does not know `env_id`, after importing the module
    of a `module:EnvId` id as gymnasium does (without building the env)."""
    module, _, name = env_id.rpartition(":")
    if module:
        import_module(module, f"env.id={env_id}")
    if name.startswith("ALE/"):
        try:
            _register_ale()
        except ImportError as ex:
            raise ConfigError(f"env.id={env_id} needs ale-py: pip install ale-py ({ex})") from ex
    if name not in gym.registry:
        registered = f"; '{module}' registers no env of that name" if module else ""
        raise ConfigError(
            f"unknown env.id '{env_id}'{did_you_mean(name, gym.registry)}{registered}; "
            "use a gymnasium id such as CartPole-v1 (or my_pkg:MyEnv-v0), "
            "env=cartpole|pendulum|breakout, or env.entry_point=my_pkg.envs:MyEnv"
        )


def _callable(path: str, where: str, what: str) -> Any:
    """The callable at import path `path` (the setting `where`), or one line saying it is not."""
    found = locate(path, where)
    if not callable(found):
        raise ConfigError(f"{where}={path} is a {type(found).__name__}, not {what}")
    return found


def _maker(own: dict[str, Any]) -> Any:
    """The user's env class or factory (env.entry_point)."""
    return _callable(own["entry_point"], "env.entry_point", "an env class or factory")


def _pettingzoo(own: dict[str, Any], kwargs: dict[str, Any]) -> MultiAgentEnv:
    """The PettingZoo env `env.pettingzoo` makes from `kwargs`, in RLlib's wrapper for its
    kind (ParallelPettingZooEnv for a parallel env, PettingZooEnv for an AEC env)."""
    from pettingzoo.utils.env import AECEnv, ParallelEnv
    from ray.rllib.env.wrappers.pettingzoo_env import ParallelPettingZooEnv, PettingZooEnv

    where = f"env.pettingzoo={own['pettingzoo']}"
    made = _callable(own["pettingzoo"], "env.pettingzoo", "a PettingZoo env function")(**kwargs)
    if isinstance(made, ParallelEnv):
        return ParallelPettingZooEnv(made)
    if isinstance(made, AECEnv):
        return PettingZooEnv(made)
    raise ConfigError(
        f"{where} made a {type(made).__qualname__}, not a PettingZoo env (a ParallelEnv or an "
        "AECEnv): name the game's env function, e.g. mpe2.simple_spread_v3:parallel_env"
    )


def wrappers(own: dict[str, Any]) -> list[tuple[Callable[..., Any], dict[str, Any]]]:
    """`env.wrappers` as (wrapper, keyword arguments), each checked: it imports, is
    callable and takes its keywords; else one line naming its place in the list."""
    found = []
    for i, item in enumerate(own.get("wrappers") or []):
        where = f"env.wrappers[{i}]"
        if isinstance(item, str):
            wrapper, kwargs = locate(item, where), {}
        elif isinstance(item, dict) and TARGET in item:
            wrapper = locate(str(item[TARGET]), f"{where}.{TARGET}")
            kwargs = {k: materialize(v, f"{where}.{k}", k) for k, v in item.items() if k != TARGET}
        else:
            raise ConfigError(
                f"{where}: {item!r} names no wrapper; write pkg.module:Wrapper or "
                "{_target_: pkg.module.Wrapper, keyword: value}"
            )
        if not callable(wrapper):
            raise ConfigError(f"{where}: {item!r} is a {type(wrapper).__name__}, not a wrapper")
        check_arguments(wrapper, kwargs, where)
        found.append((wrapper, kwargs))
    return found


def stack_frames(env: gym.Env, n: int) -> gym.Env:
    """The last `n` observations on the observation's last axis, as RLlib's Atari wrapper
    and frame-stacking connector stack them: a Box of shape (..., c) becomes (..., c*n),
    so RLlib's default encoders take it (an MLP a flat vector, a CNN more channels); a
    2-D frame (h, w) gets a channel axis: (h, w, n)."""
    space = env.observation_space
    if not isinstance(space, gym.spaces.Box) or not space.shape:
        raise ConfigError(
            f"env.framestack={n} stacks array observations (a gymnasium Box); this env's "
            f"are {space}: drop env.framestack, or add a wrapper that makes a Box first"
        )
    join = np.stack if len(space.shape) == 2 else np.concatenate  # a new axis, or the last
    low, high = join([space.low] * n, axis=-1), join([space.high] * n, axis=-1)
    return gym.wrappers.TransformObservation(
        gym.wrappers.FrameStackObservation(env, n),
        lambda frames: join(list(frames), axis=-1),
        # gymnasium types dtype as a scalar type; a Box's own dtype is what it takes.
        gym.spaces.Box(low, high, dtype=space.dtype),  # type: ignore[arg-type]
    )


def float_observations(env: gym.Env) -> gym.Env:
    """Integer Box observations (an image's uint8 pixels, a grid's cell codes) as float32
    in [0, 1], scaled by the space's own bounds: RLlib's default encoders and their
    float weights take floats, and unscaled pixels make a policy's updates explode.
    Other observations pass as they are."""
    space = env.observation_space
    if not isinstance(space, gym.spaces.Box) or not np.issubdtype(space.dtype, np.integer):
        return env
    low = space.low.astype(np.float32)
    span = space.high.astype(np.float32) - low
    span[span <= 0] = 1.0  # a constant entry: 0 after the shift

    def scale(obs: np.ndarray) -> np.ndarray:
        return (np.asarray(obs, dtype=np.float32) - low) / span

    return gym.wrappers.TransformObservation(
        env, scale, gym.spaces.Box(0.0, 1.0, shape=space.shape, dtype=np.float32)
    )


def _wrapped(env: Any, own: dict[str, Any]) -> Any:
    """`env.wrappers` in order, then `env.framestack` (Atari's wrapper stacks its own),
    then action masks as the masking module takes them (unless env.action_mask=false),
    then integer observations as floats."""
    from runner.envs.masking import env_is_masked, with_masks

    stack = None if own["atari"] else own["framestack"]
    if own.get("wrappers") or stack:
        if not isinstance(env, gym.Env):
            raise ConfigError(
                f"{setting(own)}: env.wrappers and env.framestack wrap single-agent gymnasium "
                f"envs; this one is a {type(env).__qualname__}: wrap it in your env's own code"
            )
        for i, (wrapper, kwargs) in enumerate(wrappers(own)):
            try:
                env = wrapper(env, **kwargs)
            except Exception as ex:
                name = getattr(wrapper, "__qualname__", str(wrapper))
                raise ConfigError(
                    f"env.wrappers[{i}]: {name}(env, ...) failed: {type(ex).__name__}: {ex}"
                ) from ex
        if stack:
            env = stack_frames(env, stack)
    masked = isinstance(env, gym.Env | MultiAgentEnv) and env_is_masked(env)
    if own.get("action_mask") is not False and masked:
        env = with_masks(env)
    return float_observations(env) if isinstance(env, gym.Env) else env


def build(own: dict[str, Any], context: EnvContext, render_mode: str | None = None) -> Any:
    """One env from the runner's env settings (`own`) and RLlib's EnvContext (the user's
    env_config, worker and vector index); `render_mode` for video."""
    kwargs = dict(context)
    if render_mode is not None and not own["entry_point"]:
        kwargs["render_mode"] = render_mode
    if own["pettingzoo"]:
        return _wrapped(_pettingzoo(own, kwargs), own)
    if own["atari"]:
        from ray.rllib.env.wrappers.atari_wrappers import wrap_atari_for_new_api_stack

        _register_ale()
        kwargs.setdefault("frameskip", 1)  # RLlib's wrapper skips frames itself
        env = wrap_atari_for_new_api_stack(
            gym.make(own["id"], **kwargs), framestack=own["framestack"]
        )
    elif own["entry_point"]:  # RLlib passes an EnvContext to a class or factory
        env = _maker(own)(context)
    else:
        env = gym.make(own["id"], **kwargs)
    return _wrapped(env, own)


class RunnerEnv:
    """What every EnvRunner gets as its env: a class (RLlib takes an env class or a
    registered id, and a class needs no registration in each actor) whose construction
    returns the env `build` makes from the settings in env_config, not an instance of
    this class."""

    def __new__(cls, env_context: dict[str, Any]) -> Any:
        from runner.machine.env_runner_errors import report_from_here

        report_from_here()  # in an EnvRunner's process: its errors reach the driver
        context = env_context if isinstance(env_context, EnvContext) else EnvContext(env_context, 0)
        user_config = {k: v for k, v in context.items() if k != SETTINGS_KEY}
        return build(context[SETTINGS_KEY], context.copy_with_overrides(env_config=user_config))


def _own(env: EnvConfig) -> dict[str, Any]:
    """The env's settings the factory reads, as the plain dict each actor gets (`atari`
    resolved)."""
    own = {k: v for k, v in asdict(env).items() if k in _OWN_FIELDS}
    return {**own, "atari": wraps_atari(env)}


def environment_kwargs(env: EnvConfig) -> dict[str, Any]:
    """Keyword arguments for AlgorithmConfig.environment(): the factory, the user's
    env_config with the env's settings beside it, and `env.environment`'s extras (the
    spelling checked by runner/settings/validate.py)."""
    own = _own(env)
    if env.id and not wraps_atari(env):
        check_env_id(env.id)
    elif env.entry_point:
        _maker(own)
    elif env.pettingzoo:
        _callable(env.pettingzoo, "env.pettingzoo", "a PettingZoo env function")
    if env.framestack is not None and env.framestack < 1:
        raise ConfigError(f"env.framestack={env.framestack}: stack 1 or more frames, or null")
    wrappers(own)
    env_config = {**env.env_config, SETTINGS_KEY: own}
    return {"env": RunnerEnv, "env_config": env_config, **env.environment}


def own_settings(env_config: dict[str, Any]) -> dict[str, Any]:
    """The env's settings from an AlgorithmConfig's env_config (one line if missing: a
    config the runner did not build)."""
    if SETTINGS_KEY not in env_config:
        raise ConfigError("the AlgorithmConfig's env was not set by the runner (env.*)")
    return env_config[SETTINGS_KEY]


def make_env(config: Any, render_mode: str | None = None) -> gym.Env | MultiAgentEnv:
    """One env in this process, as an EnvRunner of `config` (an AlgorithmConfig) makes
    it; a failure is one line naming the setting."""
    own = own_settings(config.env_config)
    user_config = {k: v for k, v in config.env_config.items() if k != SETTINGS_KEY}
    return _made_here(own, user_config, render_mode)


def from_settings(env: EnvConfig) -> gym.Env | MultiAgentEnv:
    """One env in this process from the env settings alone, as an EnvRunner makes it: for
    a tool over saved runs, which has no AlgorithmConfig (runner.compare's random returns)."""
    return _made_here(_own(env), dict(env.env_config), None)


def observation_spaces(env: EnvConfig) -> tuple[list[Any] | None, dict[Any, gym.Space]]:
    """A multi-agent env's agent ids (None for a single-agent env) and the observation
    space each agent gets (under None for a single-agent env), as the EnvRunners' envs
    have them: from one env built here."""
    built = _made_here(_own(env), dict(env.env_config), None)
    try:
        if isinstance(built, MultiAgentEnv):
            agents = agent_ids(built)
            return agents, {a: built.get_observation_space(a) for a in agents}
        return None, {None: built.observation_space}
    finally:
        built.close()


def agent_ids(env: MultiAgentEnv) -> list[Any]:
    """A multi-agent env's agent ids: its possible_agents, else those of its first reset."""
    return list(getattr(env, "possible_agents", None) or []) or list(env.reset(seed=0)[0])


def _made_here(
    own: dict[str, Any], user_config: dict[str, Any], render_mode: str | None
) -> gym.Env | MultiAgentEnv:
    """One env built in this process; a failure is one line naming the setting."""
    where = setting(own)
    try:
        built = build(own, EnvContext(user_config, worker_index=0), render_mode)
    except ConfigError:
        raise
    except gym.error.DependencyNotInstalled as ex:
        if "Box2D" not in str(ex):
            raise ConfigError(f"{where}: {ex}") from ex
        raise ConfigError(
            f"{where} needs Box2D, which is not installed: install the project's box2d extra "
            "(pip install -e '.[box2d]', or pip install box2d==2.3.10)"
        ) from ex
    except Exception as ex:
        mode = f" with render_mode='{render_mode}'" if render_mode else ""
        raise ConfigError(
            f"{where}: making the env{mode} failed: {type(ex).__name__}: {ex}"
        ) from ex
    if not isinstance(built, gym.Env | MultiAgentEnv):
        raise ConfigError(
            f"{where} made a {type(built).__qualname__}, not a gymnasium.Env or an "
            "RLlib MultiAgentEnv"
        )
    return built


def random_steps(env: gym.Env | MultiAgentEnv, seed: int | None) -> Iterator[tuple]:
    """Uniformly random actions, an episode after another, as (obs, action, next obs,
    reward, terminated, truncated); a multi-agent env's reward summed over its agents, as
    RLlib's episode_return_mean sums them."""
    spaces: dict[Any, gym.Space] = {}

    def space(agent: Any) -> gym.Space:  # one seeded space per agent, made when it acts
        if agent not in spaces:
            own = env.get_action_space(agent) if isinstance(env, MultiAgentEnv) else None
            chosen = own or env.action_space
            assert chosen is not None  # RLlib types a MultiAgentEnv's spaces optional
            spaces[agent] = chosen
            spaces[agent].seed(None if seed is None else seed + len(spaces))
        return spaces[agent]

    obs, _ = env.reset(seed=seed)
    ended: set[Any] = set()  # a multi-agent env's agents whose episode ended before the rest
    while True:
        if isinstance(env, MultiAgentEnv):
            action = {agent: space(agent).sample() for agent in obs if agent not in ended}
            next_obs, rewards, terminateds, truncateds, _ = env.step(action)
            ended |= {a for a in action if terminateds.get(a) or truncateds.get(a)}
            reward: SupportsFloat = sum(rewards.values())
            terminated, truncated = (d.get("__all__", False) for d in (terminateds, truncateds))
        else:
            action = space(None).sample()
            next_obs, reward, terminated, truncated, _ = env.step(action)
        yield obs, action, next_obs, float(reward), terminated, truncated
        if terminated or truncated:
            (obs, _), ended = env.reset(), set()
        else:
            obs = next_obs


def random_rollout(env: gym.Env, seed: int | None, n: int) -> dict[str, np.ndarray]:
    """n real transitions of the env, random actions: what a batch is made of."""
    columns = zip(*islice(random_steps(env, seed), n), strict=True)
    names = ("obs", "action", "next", "reward", "terminated", "truncated")
    return {name: np.asarray(values) for name, values in zip(names, columns, strict=True)}


def random_returns(env: gym.Env | MultiAgentEnv, seed: int | None, episodes: int) -> list[float]:
    """Whole episodes' returns with random actions: a baseline to beat."""
    steps, returns = random_steps(env, seed), list[float]()
    while len(returns) < episodes:
        total = 0.0
        for *_, reward, terminated, truncated in steps:
            total += reward
            if terminated or truncated:
                break
        returns.append(total)
    return returns
