"""Structured schemas for every config group, registered with Hydra's ConfigStore.

The YAML under conf/ is the data; these dataclasses are its types. Because the root
config starts from `RunnerConfig`, every group file is merged into a typed node, so a
misspelled key or a wrong type fails at composition, before anything runs.
Sections inside `algo` are named after the AlgorithmConfig builder method they feed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, ClassVar

from omegaconf import MISSING, DictConfig, OmegaConf

# The component kinds compile settings apply to (compile.env_runners, compile.learners).
COMPONENT_KINDS = ("env_runners", "learners")


class Accelerator(str, Enum):
    cpu = "cpu"
    cuda = "cuda"


class LogLevel(str, Enum):
    DEBUG = "DEBUG"
    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"
    CRITICAL = "CRITICAL"


class Policies(str, Enum):
    """The policies a multi-agent env gets when algo.multi_agent declares none."""

    shared = "shared"  # one policy every agent maps to
    per_agent = "per_agent"  # one policy per agent id, named after it


class Opponent(str, Enum):
    """Who a multi-agent game's other seats are, when they are not trained."""

    random = "random"  # uniformly random legal moves (the action mask's ones)


class LearnerGranularity(str, Enum):
    """What a Learner compiles: each sub-module's forward_train, or the whole update step."""

    forward_train = "forward_train"
    complete_update = "complete_update"


@dataclass
class HardwareConfig:
    """A hardware profile: what the run expects to find, and its GPU defaults."""

    name: str = MISSING
    accelerator: Accelerator = MISSING
    # The GPU model the profile expects, e.g. "A100": matched as a whole model number in
    # torch's and Ray's GPU names (A100-SXM4-80GB is one, an RTX A1000 is not).
    gpu_name: str | None = None
    num_gpus_per_learner: float = 0.0
    num_gpus_per_env_runner: float = 0.0


@dataclass
class AutoConfig:
    """compile=auto: the presets that compete per component kind, how they are timed,
    and where the measurements are cached (runner/compile/auto.py)."""

    # "backend/mode" each; those not usable on the device or not installed are skipped.
    candidates: list[str] = field(
        default_factory=lambda: [
            "inductor/default",
            "inductor/reduce-overhead",
            "inductor/max-autotune",
            "cudagraphs/default",
            "onnxrt/default",
            "ipex/default",
        ]
    )
    # A candidate must beat eager by this fraction, its compile seconds included.
    margin: float = 0.03
    warmup_calls: int = 20
    timed_calls: int = 200
    # Each kind's timed rounds also stop after this many seconds (at least 5 rounds).
    timed_seconds: float = 10.0
    # The whole measurement's time: no candidate starts compiling where it (as long as
    # the longest compile so far) and the timed rounds left would end past it.
    budget_seconds: float = 180.0
    # Training iterations the compile seconds are spread over; null: from stop.* or
    # check.env_steps, else 100.
    expected_iterations: int | None = None
    refresh: bool = False  # measure again, ignoring (and replacing) a cached measurement
    # null: $XDG_CACHE_HOME/rllib-runner/compile-auto (~/.cache/...); `~` is expanded.
    cache_dir: str | None = None


AUTO = "auto"  # compile=auto: a preset per component kind, measured before the run


@dataclass
class CompileConfig:
    """torch.compile settings; `backend: null` means compile is off, `auto` measures."""

    backend: str | None = None
    # default, reduce-overhead or max-autotune (a string: OmegaConf enums match names).
    mode: str | None = None
    env_runners: bool = False
    learners: bool = False
    learner_granularity: LearnerGranularity = LearnerGranularity.forward_train
    dynamic: bool | None = None
    # Inductor's FX graph cache, shared by every actor on a node; null keeps inductor's
    # default (one dir per user in the temp dir, already shared by the node's actors).
    # `~` is expanded (quote it on the command line: 'compile.cache_dir="~/x"').
    cache_dir: str | None = None
    auto: AutoConfig = field(default_factory=AutoConfig)


@dataclass
class ScalingAutoConfig:
    """scaling=auto: the sampling layouts that compete, how long each samples, and where
    the measurements are cached (runner/machine/scaling_auto.py)."""

    enabled: bool = False
    # Each count that fits the CPU plan on the machine the run plans on competes.
    env_runners: list[int] = field(default_factory=lambda: [0, 1, 2, 4, 8, 16, 32, 64])
    envs_per_env_runner: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64])
    vectorize_modes: list[str] = field(default_factory=lambda: ["sync", "async"])
    seconds: float = 2.0  # timed sampling per layout, after one warm-up round
    # The whole measurement's time: no candidate starts that would end past it (the
    # configured layout and the final re-measurements always run).
    budget_seconds: float = 30.0
    # A layout replaces the configured one only if it samples this fraction faster.
    margin: float = 0.05
    refresh: bool = False  # measure again, ignoring (and replacing) a cached measurement
    # null: $XDG_CACHE_HOME/rllib-runner/scaling-auto (~/.cache/...); `~` is expanded.
    cache_dir: str | None = None


@dataclass
class ScalingConfig:
    """RLlib's three scaling axes and the resources of each actor.

    The EnvRunner keys feed `AlgorithmConfig.env_runners()`, the Learner keys `.learners()`
    (see algorithm_config.py). `num_learners` and `num_gpus_per_learner` null: the runner
    picks for the machine it plans on (runner/machine/placement.py: the scaling guide's layout for
    IMPALA and APPO, else a local Learner with the hardware profile's GPUs).
    `num_cpus_per_learner: null` keeps RLlib's own default, auto (1 CPU per CPU Learner,
    0 per GPU one), except for a compiling remote GPU Learner (runner/machine/placement.py).
    """

    num_env_runners: int = MISSING
    num_envs_per_env_runner: int = MISSING
    # "sync" or "async" (gymnasium.VectorizeMode values, checked by RLlib's own validate).
    gym_env_vectorize_mode: str = "sync"
    num_cpus_per_env_runner: float = 1.0
    num_gpus_per_env_runner: float = MISSING
    num_learners: int | None = None
    num_gpus_per_learner: float | None = None
    num_cpus_per_learner: float | None = None
    auto: ScalingAutoConfig = field(default_factory=ScalingAutoConfig)


@dataclass
class FastStepConfig:
    """DQN's and SAC's training step (runner/algorithms/fast_step.py): a flat replay buffer and
    several gradient updates per Learner call, at the configured replay ratio; for PPO,
    RLlib's step with the same cheap Learner updates (fused Adam, one finiteness check,
    fused clipping). A config it cannot run takes RLlib's own, and the run's first lines
    say why."""

    enabled: bool = True
    # Gradient updates per Learner call (and per weight sync to the EnvRunners), the
    # env steps for them sampled first in one call.
    updates_per_call: int = 8


@dataclass
class RewardScalingConfig:
    """PPO's rewards scaled as Stable-Baselines3's VecNormalize scales them
    (runner/algorithms/reward_scaling.py): divided by the running standard deviation of each env's
    discounted return and clipped, for the Learner only; the statistics are checkpointed."""

    enabled: bool = False
    # The discount of the running returns (null: the algorithm's gamma, as RL Zoo sets it).
    gamma: float | None = None
    clip: float = 10.0
    epsilon: float = 1e-8


@dataclass
class AlgoConfig:
    """An RLlib algorithm; each dict is passed as keyword arguments to its builder method."""

    name: str = MISSING  # RLlib's registered name, e.g. PPO
    training: dict[str, Any] = field(default_factory=dict)
    env_runners: dict[str, Any] = field(default_factory=dict)
    learners: dict[str, Any] = field(default_factory=dict)
    rl_module: dict[str, Any] = field(default_factory=dict)
    evaluation: dict[str, Any] = field(default_factory=dict)
    reporting: dict[str, Any] = field(default_factory=dict)
    framework: dict[str, Any] = field(default_factory=dict)
    # RLlib's EnvRunner sleeps this long after an error before its process exits and Ray
    # restarts it (RLlib's default: 60 s); a deterministic error then fails the run in
    # seconds (runner/job/callbacks.py's EnvRunnerFaults).
    fault_tolerance: dict[str, Any] = field(
        default_factory=lambda: {"delay_between_env_runner_restarts_s": 1.0}
    )
    callbacks: dict[str, Any] = field(default_factory=dict)
    multi_agent: dict[str, Any] = field(default_factory=dict)
    fast_step: FastStepConfig = field(default_factory=FastStepConfig)
    reward_scaling: RewardScalingConfig = field(default_factory=RewardScalingConfig)


@dataclass
class EnvConfig:
    """The env every EnvRunner makes: a gymnasium id (`module:EnvId` imports the module
    first, in the driver and in each actor), or an env class or factory by import path
    (`entry_point`, called with `env_config` as RLlib's EnvContext; a MultiAgentEnv makes
    the run multi-agent), or a PettingZoo env function (`pettingzoo`, called with
    `env_config` as keywords; multi-agent). Atari ids are wrapped the way RLlib wraps Atari
    for the new API stack; `wrappers`, then `framestack`, wrap any single-agent env."""

    id: str | None = None
    entry_point: str | None = None
    # A PettingZoo parallel or AEC env function, e.g. `mpe2.simple_spread_v3:parallel_env`,
    # wrapped in RLlib's ParallelPettingZooEnv or PettingZooEnv.
    pettingzoo: str | None = None
    env_config: dict[str, Any] = field(default_factory=dict)
    # RLlib's Atari preprocessing (wrap_atari_for_new_api_stack); null: for ALE ids
    # (ALE/Pong-v5, ale_py:ALE/Pong-v5), however they are named.
    atari: bool | None = None
    # The last n observations stacked on the observation's last axis (any Box env; Atari's
    # own wrapper stacks its frames the same way).
    framestack: int | None = None
    # gymnasium wrappers applied in order to every env built, each an import path
    # (`gymnasium.wrappers:FlattenObservation`) or `{_target_: path, keyword: value}`.
    wrappers: list[Any] = field(default_factory=list)
    # A multi-agent env without algo.multi_agent: per_agent (null) or shared policies.
    policies: Policies | None = None
    # Action masks (RLlib's action-masking RLModule, PPO's): null applies them where the
    # observation is a Dict with an `action_mask` beside the observation (PettingZoo's
    # classic games), true requires one, false leaves the Dict as it is.
    action_mask: bool | None = None
    # A multi-agent game against a policy that is not trained (`random`: uniformly random
    # legal moves): the trained policy `main` takes one seat per game, in turn; the
    # EnvRunners log its win_rate and loss_rate over the last 100 games.
    opponent: Opponent | None = None
    # Extra keyword arguments for AlgorithmConfig.environment(), e.g. clip_rewards.
    environment: dict[str, Any] = field(default_factory=dict)
    # Env-specific model settings, merged under algo.rl_module.model_config.
    model_config: dict[str, Any] = field(default_factory=dict)
    # Episode return mean that counts as solved; the default stop criterion.
    solved_return: float | None = None

    @property
    def name(self) -> str:
        """How results and plots name the env."""
        return self.id or self.entry_point or self.pettingzoo or "?"


# The env settings that name an env, one of which a config sets.
SPELLINGS = ("id", "entry_point", "pettingzoo")


def setting(env: EnvConfig | dict[str, Any]) -> str:
    """The env's setting as the user wrote it, for messages."""
    values = env if isinstance(env, dict) else dataclasses.asdict(env)
    key = next((k for k in SPELLINGS[1:] if values.get(k)), "id")
    return f"env.{key}={values[key]}"


@dataclass
class TunedConfig:
    """Which conf/tuned/<algo>_<env>.yaml a run's algo settings came from (the defaults
    list picks it by the algo and env options), the env id it was tuned for, its source,
    and what it changes from that source that bears on learning (null: nothing), which a
    run's start line shows beside the source's name so neither is taken for the other."""

    file: str = MISSING
    env: str = MISSING
    source: str = MISSING
    changes: str | None = None


@dataclass
class StopConfig:
    """Training stops at whichever criterion is met first; null disables one. The root
    config's budgets are defaults (`${stop_default:N}`) that give way to any budget set
    elsewhere (`default_gives_way`)."""

    iterations: int | None = None
    env_steps: int | None = None
    episode_return_mean: float | None = None
    seconds: float | None = None


# The resolver that marks a stop budget as the runner's default, and the budgets it may mark.
STOP_DEFAULT = "stop_default"
BUDGETS = ("iterations", "env_steps", "seconds")


def is_stop_default(stop: DictConfig, key: str) -> bool:
    """Whether stop.`key` is still the root config's default (no one set it)."""
    if not OmegaConf.is_interpolation(stop, key):
        return False
    return str(stop._get_node(key)._value()).startswith("${" + STOP_DEFAULT + ":")  # type: ignore[union-attr]  # a node's raw value


def default_gives_way(value: Any, *, _root_: DictConfig) -> Any:
    """The `stop_default` resolver: a default budget (200 iterations, 90 s) holds only
    where no budget was set by anyone (the command line, an experiment, a preset, a
    check's env-step budget); otherwise it is null, so a wall-clock default never cuts a
    budget the user chose."""
    stop, check = _root_.stop, _root_.check
    own = any(stop[k] is not None for k in BUDGETS if not is_stop_default(stop, k))
    checked = check.enabled and (check.threshold is not None or check.baseline is not None)
    return None if own or (checked and check.env_steps is not None) else value


class CheckOn(str, Enum):
    training = "training"
    evaluation = "evaluation"


class CheckBaseline(str, Enum):
    random = "random"


@dataclass
class CheckConfig:
    """A pass criterion as RLlib's tuned examples state one: `metric` (a path into RLlib's
    result) reaches `threshold` within `env_steps`. No threshold: no check. A run stops
    when it passes or spends the budget (or a `stop` criterion ends it first), and exits 1
    if it did not pass."""

    enabled: bool = True
    metric: str = "env_runners/episode_return_mean"
    threshold: float | None = None
    env_steps: int | None = None
    source: str = ""  # where the criterion is stated, e.g. RLlib's tuned example file
    # training: `metric` in the training result; evaluation: in the result of evaluation
    # during training (eval.*), e.g. the greedy policy's return.
    on: CheckOn = CheckOn.training
    # For an env no source states a criterion for: `random` makes the threshold a random
    # policy's return, measured by the run before it trains (its mean over
    # `baseline_episodes` episodes, summed over agents as RLlib sums them), plus
    # `baseline_stds` standard deviations of those episodes' returns. threshold stays null.
    baseline: CheckBaseline | None = None
    baseline_episodes: int = 100
    baseline_stds: float = 1.0


@dataclass
class EvalConfig:
    """Evaluation during training (AlgorithmConfig.evaluation): every `every` iterations
    (0: none), `episodes` whole episodes, greedy unless `explore`; `parallel` runs it beside
    the iteration's training (RLlib's evaluation_parallel_to_training, on evaluation
    EnvRunners), on `num_env_runners` EnvRunners of its own (0: one in the driver). Its
    return goes on the progress line, into metrics, summary.json and every logger, and
    ranks the checkpoints kept as best."""

    every: int = 0
    episodes: int = 10
    explore: bool = False
    parallel: bool = False
    num_env_runners: int = 0


@dataclass
class RayConfig:
    """Where to run: a local Ray sized to this machine, or an existing cluster.

    `address`: a cluster (`auto`, `host:port`, `ray://...`); `local`: a Ray of the run's
    own; unset: the cluster in RAY_ADDRESS (Ray sets it inside a Ray job), else local."""

    address: str | None = None
    num_cpus: int | None = None
    num_gpus: int | None = None
    log_level: LogLevel = LogLevel.ERROR
    # Ray's runtime_env for every actor, e.g. {py_modules: [path/to/my_pkg]} to ship the
    # user's package to a cluster's nodes, or {working_dir: .}.
    runtime_env: dict[str, Any] = field(default_factory=dict)


@dataclass
class ResultsConfig:
    """`uri`: a filesystem URI (s3://bucket/prefix, gs://..., file:///abs/path) the run dir
    is mirrored to, under its own path there (runner/results/remote.py); null: local only."""

    uri: str | None = None


@dataclass
class PreflightConfig:
    """Resource checks before any actor starts; strict=false turns failures into warnings."""

    strict: bool = True


@dataclass
class CheckpointConfig:
    every: int = 10  # iterations; 0 = only at the end
    at_end: bool = True
    # Keep the newest `keep` checkpoints (null: all) and the `keep_best` best ones (by the
    # evaluation return with eval.every, else by the training return mean); the rest are
    # removed as the run goes.
    keep: int | None = 3
    keep_best: int = 1


@dataclass
class RecordConfig:
    """Video while training: every `every` iterations (0: never), `episodes` evaluation
    episodes played with the current weights and recorded to <run dir>/videos/."""

    every: int = 0
    episodes: int = 1
    explore: bool = False


@dataclass
class ShutdownConfig:
    """On SIGTERM, SIGINT or SIGHUP the iteration in flight may finish for `grace_seconds`
    (inside Kubernetes' default 30 s before its SIGKILL); then it is abandoned."""

    grace_seconds: float = 20.0


class NonFinite(str, Enum):
    stop = "stop"
    warn = "warn"
    off = "off"


@dataclass
class GuardConfig:
    """What fails a run that goes on in name only. `non_finite`: a NaN or inf in a Learner
    loss, a gradient norm or the episode return stops the run (keeping the last finite
    checkpoint), warns, or is ignored. `unsampled_iterations`: this many iterations in a
    row in which the EnvRunners sampled nothing since one failed end the run with the
    failure's cause (runner/job/callbacks.py's EnvRunnerFaults)."""

    non_finite: NonFinite = NonFinite.stop
    unsampled_iterations: int = 3


@dataclass
class WatchdogConfig:
    """Stop a run in which no iteration finishes in time, saying what Ray waits for.

    `seconds` fixes the bound; null bounds the first iteration (with the Algorithm's
    build) by `first_iteration_seconds`, and each later one by `median_multiple` times
    the median iteration so far, at least `min_seconds`. `enabled: false` turns it off."""

    enabled: bool = True
    seconds: float | None = None
    first_iteration_seconds: float = 900.0
    median_multiple: float = 10.0
    min_seconds: float = 60.0


@dataclass
class Distribution:
    """One searched key's distribution: exactly one field set (runner/settings/search.py turns it
    into Ray Tune's). A misspelled distribution fails at composition."""

    uniform: list[float] | None = None  # [low, high]
    loguniform: list[float] | None = None  # [low, high], both > 0
    quniform: list[float] | None = None  # [low, high, step]
    randint: list[int] | None = None  # [low, high), high excluded
    choice: list[Any] | None = None


class Scheduler(str, Enum):
    asha = "asha"  # stops trailing trials early (task.grace_fraction, task.reduction_factor)
    pbt = "pbt"  # population-based training: trailing trials take a leader's checkpoint
    pb2 = "pb2"  # PBT whose new values a Gaussian-process bandit picks within bounds


@dataclass
class SearchConfig:
    """A search space for task=tune: composed keys (`algo.training.lr`) to distributions.
    The conf/search/ files set it; empty unless one is chosen.

    `scheduler: pbt | pb2` trains a population: every `perturbation_interval` iterations
    the bottom `quantile_fraction` of trials continue from a top trial's checkpoint with
    its values, the `mutations` keys changed (PBT: perturbed by 0.8 or 1.2, a list's
    neighbour, or resampled with `resample_probability`; PB2: picked within their
    [low, high], so uniform or loguniform only). A mutated key not in `space` starts
    sampled from its mutation's distribution. `synch`: each perturbation waits for every
    trial to reach it (all of them running at once), so the trailing ones always exploit a
    leader's checkpoint of that moment; else a trial is compared as it arrives."""

    space: dict[str, Distribution] = field(default_factory=dict)
    scheduler: Scheduler = Scheduler.asha
    mutations: dict[str, Distribution] = field(default_factory=dict)
    perturbation_interval: int = 4
    quantile_fraction: float = 0.25
    resample_probability: float = 0.25
    synch: bool = False


@dataclass
class MlflowConfig:
    """logger=mlflow (runner/results/tracking.py). `tracking_uri: null` is a local store
    under outputs/ (SQLite: MLflow 3 refuses its file store); `experiment_name: null` is
    `runner` for a run, the sweep dir's name for a sweep's jobs, the run dir's name for a
    search's trials."""

    tracking_uri: str | None = None
    experiment_name: str | None = None


class WandbMode(str, Enum):
    online = "online"  # needs a login (`wandb login` or WANDB_API_KEY)
    offline = "offline"  # written under the run dir's wandb/; `wandb sync` uploads it
    disabled = "disabled"


@dataclass
class WandbConfig:
    """logger=wandb (runner/results/wandb_logger.py). `group: null` is the sweep dir for a
    sweep's jobs, the run dir for a search's trials, none for a run."""

    project: str = "rllib-runner"
    entity: str | None = None
    group: str | None = None
    tags: list[str] = field(default_factory=list)
    mode: WandbMode = WandbMode.online


@dataclass
class LoggerConfig:
    """Where each iteration's metrics go besides the run dir and TensorBoard (always on):
    any of `logger=[mlflow,wandb]`; each option fills its own section."""

    mlflow: MlflowConfig | None = None
    wandb: WandbConfig | None = None

    @property
    def names(self) -> list[str]:
        return [name for name in ("mlflow", "wandb") if getattr(self, name) is not None]


@dataclass
class TaskSettings:
    """What a job does. Each task in runner/tasks/ subclasses this with its own settings;
    its conf/task/ file merges that schema in, so another task's key fails at composition.
    `name` is the class's, not a key: the task is the one Hydra's `task` group chose."""

    name: ClassVar[str] = ""


@dataclass
class ReadsCheckpoint(TaskSettings):
    """The settings of a task that reads a trained checkpoint (evaluate, export): its run's
    config is composed as resume= composes one, and it needs the checkpoint named."""

    checkpoint: str | None = None  # a run dir or checkpoint dir (`checkpoint=` for short)


@dataclass
class ReproductionConfig:
    """The published result a checked-in experiment reproduces, with its figures as published.

    `published` rows: inference {batch_size, eager_calls_per_s, compiled_calls_per_s, speedup}
    (speedup a fraction); exploration {speedup} (a fraction of env steps sampled per second).
    """

    name: str = MISSING
    kind: str = MISSING  # inference | exploration
    source: str = MISSING
    hardware: str = MISSING  # as published: CPU, T4, V100, A100, or a GPU Learner
    torch: str = MISSING
    backend: str = MISSING
    mode: str = MISSING
    settings: str = ""  # the published run's settings, in words
    # The same settings as numbers, held against the run's own by the report.
    method: dict[str, Any] = field(default_factory=dict)
    note: str = ""
    published: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class RunnerConfig:
    hardware: HardwareConfig = MISSING
    compile: CompileConfig = MISSING
    scaling: ScalingConfig = MISSING
    algo: AlgoConfig = MISSING
    env: EnvConfig = MISSING
    task: TaskSettings = MISSING
    stop: StopConfig = field(default_factory=StopConfig)
    check: CheckConfig = field(default_factory=CheckConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    results: ResultsConfig = field(default_factory=ResultsConfig)
    preflight: PreflightConfig = field(default_factory=PreflightConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    record: RecordConfig = field(default_factory=RecordConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    shutdown: ShutdownConfig = field(default_factory=ShutdownConfig)
    guard: GuardConfig = field(default_factory=GuardConfig)
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)
    # The user's own run callbacks (runner/job/callbacks.py), each a `_target_` mapping.
    callbacks: list[dict[str, Any]] = field(default_factory=list)
    # Set only by the reproduction files in conf/experiment/.
    reproduction: ReproductionConfig | None = None
    tuned: TunedConfig | None = None
    seed: int | None = 0
    dry_run: bool = False
    # The AlgorithmConfig's settings that differ from RLlib's, printed at the run's start
    # too (a dry run prints them; algorithm_config.json always holds the whole config).
    verbose: bool = False
    # A run dir or checkpoint dir, local (`~` is expanded) or under a URI (results.uri).
    resume: str | None = None


def _expand(path: str | None) -> str | None:
    return str(Path(path).expanduser()) if path and "://" not in path else path


def unread_keys(cfg: DictConfig, path: str = "") -> list[tuple[str, list[str]]]:
    """The keys of typed sections that their schema has no field for, each with the
    section's fields: a key added with `+` that nothing would read (OmegaConf.to_object
    drops it without a word). Free-form sections (a dict's keys) are read as they are."""
    kind = OmegaConf.get_type(cfg)
    names = [f.name for f in dataclasses.fields(kind)] if dataclasses.is_dataclass(kind) else None
    found = []
    for key, value in cfg.items_ex(resolve=False):
        full = f"{path}.{key!s}" if path else str(key)
        if names is not None and key not in names:
            found.append((full, names))
        elif (
            isinstance(value, DictConfig)
            and not OmegaConf.is_missing(cfg, key)
            and cfg.get(key) is not None  # an optional section that is set
        ):
            found += unread_keys(value, full)
    return found


def typed(cfg: DictConfig) -> RunnerConfig:
    """The composed config as typed objects, made once at the boundary: everything after
    this point gets dataclasses (per-task settings included), not a DictConfig. A key
    no setting reads is refused in one line."""
    from runner.errors import ConfigError, did_you_mean

    for key, names in unread_keys(cfg):
        raise ConfigError(
            f"unknown config key '{key}'{did_you_mean(key.rsplit('.', 1)[-1], names)}: no "
            "setting reads it; `python -m runner --cfg job` lists the keys"
        )
    settings: RunnerConfig = OmegaConf.to_object(cfg)  # type: ignore[assignment]  # its node's type
    settings.compile.cache_dir = _expand(settings.compile.cache_dir)
    settings.compile.auto.cache_dir = _expand(settings.compile.auto.cache_dir)
    settings.scaling.auto.cache_dir = _expand(settings.scaling.auto.cache_dir)
    settings.resume = _expand(settings.resume)
    return settings
