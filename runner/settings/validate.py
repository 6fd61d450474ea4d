"""The one settings check: every rule on the typed settings, before anything is built.

`validate` runs once per job, on the settings `schema.typed` made: first the rules on
the settings alone (`check_settings`: counts and seconds in range, the env's spelling,
scaling=auto's candidates, the loggers and callbacks), which the entry points also run
before torch, Ray and RLlib are imported, so bad input is one line in about a second;
then the compile settings (what is valid, and where each compiled part may run: the
PLACEMENT table in runner/compile/settings.py) and the task's own rules. What needs the
AlgorithmConfig (RLlib's own checks, the user's code) is checked as it is built
(runner/algorithms/algorithm_config.py), and what needs the machine by the preflight
(runner/machine/preflight.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runner.errors import ConfigError
from runner.job.task import Task
from runner.results import remote
from runner.settings import autos
from runner.settings.schema import (
    SPELLINGS,
    AlgoConfig,
    CheckOn,
    EnvConfig,
    LoggerConfig,
    ReadsCheckpoint,
    RewardScalingConfig,
    RunnerConfig,
    ScalingConfig,
    setting,
)

if TYPE_CHECKING:
    from runner.compile.settings import CompileSpec

# Scaling keys that must be whole numbers >= this bound (RLlib itself does not check).
_COUNT_MINIMUM = {"num_env_runners": 0, "num_envs_per_env_runner": 1, "num_learners": 0}


def check_scaling(s: ScalingConfig) -> None:
    """Counts are whole and in range, resources non-negative."""
    for key in (
        "num_env_runners",
        "num_envs_per_env_runner",
        "num_cpus_per_env_runner",
        "num_gpus_per_env_runner",
        "num_learners",
        "num_gpus_per_learner",
        "num_cpus_per_learner",
    ):
        value = getattr(s, key)
        minimum = _COUNT_MINIMUM.get(key, 0)
        if value is not None and value < minimum:
            raise ConfigError(f"scaling.{key} must be >= {minimum}, got {value}")
    if s.num_gpus_per_env_runner > 0 and s.num_env_runners == 0:
        raise ConfigError(
            f"scaling.num_gpus_per_env_runner={s.num_gpus_per_env_runner:g} with "
            "scaling.num_env_runners=0: RLlib gives the local EnvRunner no GPU, so it would "
            "sample on the CPU; set scaling.num_env_runners>=1 for GPU EnvRunners, or "
            "scaling.num_gpus_per_env_runner=0"
        )
    if s.num_gpus_per_learner is not None and s.num_gpus_per_learner > 1:
        raise ConfigError(
            f"scaling.num_gpus_per_learner={s.num_gpus_per_learner:g}: a Learner uses one GPU "
            "(RLlib has no model parallelism), the rest would sit idle; the RLlib scaling "
            "guide scales over GPUs with one Learner each: scaling.num_learners=N "
            "scaling.num_gpus_per_learner=1"
        )


def check_run(settings: RunnerConfig) -> None:
    """Counts and seconds are never negative (a return may be: Pendulum's are); what the
    run keeps, its grace, its watchdog and its video in range."""
    stop, checkpoint, record = settings.stop, settings.checkpoint, settings.record
    counts = {
        "stop.iterations": stop.iterations,
        "stop.env_steps": stop.env_steps,
        "stop.seconds": stop.seconds,
        "checkpoint.every": checkpoint.every,
        "check.env_steps": settings.check.env_steps,
        "eval.every": settings.eval.every,
        "eval.num_env_runners": settings.eval.num_env_runners,
        "ray.num_cpus": settings.ray.num_cpus,
        "ray.num_gpus": settings.ray.num_gpus,
    }
    for key, value in counts.items():
        if value is not None and value < 0:
            raise ConfigError(f"{key} must be >= 0 (or null), got {value}")
    if checkpoint.keep is not None and checkpoint.keep < 1:
        raise ConfigError(
            f"checkpoint.keep={checkpoint.keep}: keep at least 1, or null to keep all"
        )
    if checkpoint.keep_best < 0:
        raise ConfigError("checkpoint.keep_best must be 0 or more")
    if settings.shutdown.grace_seconds < 0:
        raise ConfigError("shutdown.grace_seconds must be 0 or more")
    if settings.watchdog.seconds is not None and settings.watchdog.seconds <= 0:
        raise ConfigError("watchdog.seconds must be more than 0 (or null for the default bound)")
    if record.every < 0 or record.episodes < 1:
        raise ConfigError(
            f"record.every={record.every} (0: no video) and record.episodes="
            f"{record.episodes} (at least 1) are out of range"
        )
    if settings.guard.unsampled_iterations < 1:
        raise ConfigError(
            f"guard.unsampled_iterations must be >= 1, got {settings.guard.unsampled_iterations}"
        )
    check_eval(settings)
    uri = settings.results.uri
    if uri is not None and not remote.is_uri(uri):
        raise ConfigError(
            f"results.uri={uri}: not a filesystem URI; use s3://bucket/prefix, gs://bucket/prefix "
            "or file:///absolute/path (a local run dir needs no setting)"
        )
    check_loggers(settings.logger)
    check_callbacks(settings.callbacks)


def check_eval(settings: RunnerConfig) -> None:
    """eval.* and check.*: episodes to count, EnvRunners where they are needed, one way
    to the threshold."""
    if settings.eval.episodes < 1:
        raise ConfigError(f"eval.episodes must be >= 1, got {settings.eval.episodes}")
    if settings.eval.parallel and not settings.eval.num_env_runners:
        raise ConfigError(
            "eval.parallel=true evaluates on EnvRunners of its own beside training: set "
            "eval.num_env_runners >= 1"
        )
    check = settings.check
    if check.on == CheckOn.evaluation and check.enabled and not settings.eval.every:
        raise ConfigError(
            "check.on=evaluation reads the evaluation during training: set eval.every "
            "(e.g. eval.every=5)"
        )
    if check.baseline is not None and check.threshold is not None:
        raise ConfigError(
            f"check.baseline={check.baseline.value} measures the threshold: drop "
            f"check.threshold={check.threshold:g} (check.threshold=null), or check.baseline=null"
        )
    if check.baseline_episodes < 1:
        raise ConfigError(f"check.baseline_episodes must be >= 1, got {check.baseline_episodes}")


def check_callbacks(nodes: list[dict]) -> None:
    """Each of the user's callbacks names a runner.job.callbacks.Callback and keywords it takes
    (RLlib, which checking one imports, only where there is one)."""
    if not nodes:
        return
    from runner.job.callbacks import Callback
    from runner.settings.user_code import TARGET, check_arguments, locate

    for n, node in enumerate(nodes):
        where = f"callbacks[{n}]"
        if TARGET not in node:
            raise ConfigError(
                f"{where}: a callback is a mapping with {TARGET}, e.g. "
                "{_target_: my_pkg.callbacks.MyCallback, keyword: value}"
            )
        target = locate(str(node[TARGET]), f"{where}.{TARGET}")
        if not (isinstance(target, type) and issubclass(target, Callback)):
            raise ConfigError(
                f"{where}: {node[TARGET]} is not a subclass of runner.job.callbacks.Callback: "
                "subclass it and define the hooks you need (docs/bring_your_own.md)"
            )
        check_arguments(target, {k: v for k, v in node.items() if k != TARGET}, where)


def check_loggers(logger: LoggerConfig) -> None:
    """Each chosen logger can start: its package is installed, a W&B login for online."""
    if logger.wandb is not None:
        from runner.results import wandb_logger

        wandb_logger.check_ready(logger.wandb)


def check_n_step(algo: AlgoConfig) -> None:
    """DQN's n_step may be a range ([2, 5]: RLlib's tuned CartPole example), and RLlib's
    DQN validation compares an explicit rollout_fragment_length with it, which a range
    fails with a TypeError: one line naming both settings instead."""
    n_step = algo.training.get("n_step")
    fragment = algo.env_runners.get("rollout_fragment_length")
    if algo.name == "DQN" and isinstance(n_step, list | tuple) and isinstance(fragment, int):
        raise ConfigError(
            f"algo.env_runners.rollout_fragment_length={fragment} with algo.training.n_step="
            f"{list(n_step)}: RLlib's DQN checks a fragment length against one n-step value, "
            f"not a range; give one (e.g. algo.training.n_step={max(n_step)}), or leave "
            "rollout_fragment_length at auto"
        )


def check_spelling(env: EnvConfig) -> None:
    """Exactly one of env.id, env.entry_point and env.pettingzoo; Atari wraps an id."""
    given = {k: getattr(env, k) for k in SPELLINGS}
    if sum(v is not None for v in given.values()) != 1:
        raise ConfigError(
            "set exactly one of env.id (a gymnasium id, e.g. CartPole-v1 or my_pkg:MyEnv-v0), "
            "env.entry_point (an env class or factory, e.g. my_pkg.envs:MyEnv) and "
            "env.pettingzoo (a PettingZoo env function, e.g. mpe2.simple_spread_v3:parallel_env); "
            f"got {', '.join(f'env.{k}={v}' for k, v in given.items())}: an env named on the "
            "command line without env=... takes its own option; beside env=... set the "
            "option's own spelling to null (e.g. env.id=null)"
        )
    if env.atari is True and not env.id:
        raise ConfigError(f"env.atari=true wraps a gymnasium id: set env.id, not {setting(env)}")


def check_settings(settings: RunnerConfig) -> None:
    """The rules on the settings alone, in the order a user would fix them: no torch,
    Ray or RLlib needed (a user's callback class is imported to check it)."""
    check_spelling(settings.env)
    check_scaling(settings.scaling)
    autos.check_settings(settings)
    check_run(settings)
    check_n_step(settings.algo)
    if settings.algo.fast_step.updates_per_call < 1:
        raise ConfigError(
            f"algo.fast_step.updates_per_call={settings.algo.fast_step.updates_per_call}: "
            "give at least 1 (gradient updates per Learner call)"
        )
    check_reward_scaling(settings.algo.reward_scaling)


def check_reward_scaling(scaling: RewardScalingConfig) -> None:
    """Its numbers in range (whether the algorithm can have it:
    runner/algorithms/reward_scaling.py)."""
    if scaling.gamma is not None and not 0 < scaling.gamma <= 1:
        raise ConfigError(
            f"algo.reward_scaling.gamma={scaling.gamma}: give a discount in (0, 1], or null "
            "for the algorithm's gamma"
        )
    for name in ("clip", "epsilon"):
        value = getattr(scaling, name)
        if not value > 0:
            raise ConfigError(f"algo.reward_scaling.{name}={value}: give a number above 0")


def validate(settings: RunnerConfig, task: Task) -> tuple[CompileSpec | None, list[str]]:
    """Raise ConfigError on the first bad setting; else the compile spec (None: compile
    off, or a task that compiles nothing) and the warnings for settings that go unused."""
    from runner.compile import settings as compile_settings  # torch

    check_settings(settings)
    spec, warnings = None, autos.check(settings, task)
    if task.uses_compile and not autos.compile_auto(settings):  # auto: resolved after this
        spec, warnings = compile_settings.resolve(settings.compile)
    if isinstance(settings.task, ReadsCheckpoint) and not settings.task.checkpoint:
        raise ConfigError(
            f"task={task.name} needs checkpoint=<run dir or checkpoint dir> (a run this "
            "runner trained, e.g. outputs/runs/<date>/<time>)"
        )
    warnings += task.check(settings, spec)
    tuned = settings.tuned
    if tuned is not None and settings.env.name != tuned.env:
        warnings.append(
            f"{tuned.file} (picked by the algo and env options) is tuned for {tuned.env}, and "
            f"this run's env is {settings.env.name}: override algo.* where it does not suit"
        )
    if task.trains:
        spec, ddp = compile_settings.without_ddp_cuda_graphs(spec, settings.scaling)
        parts = compile_settings.compiled_parts(
            spec, settings.scaling, evaluation_runners(settings)
        )
        warnings += ddp + compile_settings.check_placement(spec, parts, settings.algo.name)
    return spec, warnings


def evaluation_runners(settings: RunnerConfig) -> int:
    """Remote evaluation EnvRunners during training: eval.*'s, else algo.evaluation's own."""
    if settings.eval.every:
        return settings.eval.num_env_runners
    evaluation = settings.algo.evaluation
    if not evaluation.get("evaluation_interval"):
        return 0
    return int(evaluation.get("evaluation_num_env_runners") or 0)
