"""task=tune: a hyperparameter search on Ray Tune over `search.space` (conf/search/).

Each trial is a training run of the composed config with its sampled values: the same
AlgorithmConfig build (compile included), the same stop criteria (`stop.*`), the same
iteration figures, run inside a Tune actor with RLlib's own resource request. Optuna's
TPE (or Tune's random search) picks the values, its study kept in an RDB (`task.storage`,
SQLite in the run dir where the search began) that a resumed search continues and
optuna-dashboard opens; ASHA stops weak trials early, comparing them at the same env
steps (or iterations). `search.scheduler=pbt|pb2` trains a population instead (Tune's
PBT or PB2 over a random start: Tune's searchers cannot drive it). The objective is the
episode return mean, the last known one (SAC and DQN iterations often end no episode),
higher is better.

Tune's experiment lives in <run dir>/tune/; the results (trials.csv, best experiment
file, plots, summary.json) come from it (runner/results/trials.py), so an interrupted
search, continued with resume=<run dir>, is reported whole.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, cast

from omegaconf import OmegaConf

from runner.console import console
from runner.errors import ConfigError, RunnerError, one_line
from runner.job.callbacks import Callback, Decision, Iteration
from runner.job.task import Task, TaskRun, own_settings
from runner.machine.shutdown import HANDLED, Interrupted, in_main_thread, install_default
from runner.results.files import CONFIG
from runner.settings.schema import RunnerConfig, Scheduler, TaskSettings

if TYPE_CHECKING:  # light at import: the task's heavy modules load when it runs
    from ray import tune
    from ray.rllib.algorithms.algorithm import Algorithm

    from runner.compile.settings import CompileSpec
    from runner.job.callbacks import Training
    from runner.machine.plan import Plan


METRIC, MODE = "objective", "max"  # Training.objective (runner/job/loop.py)
SEARCHERS = ("optuna", "random")
STUDY_FILE = "optuna.db"  # the Optuna study's SQLite file in the run dir (task.storage)


@dataclass
class TuneSettings(TaskSettings):
    name: ClassVar[str] = "tune"
    num_samples: int = 16
    max_concurrent: int = 2
    searcher: str = "optuna"
    grace_fraction: float = 0.25
    reduction_factor: int = 2
    baseline_first: bool = True
    storage: str | None = None  # Optuna's RDB URL; null: sqlite:///<run dir>/optuna.db
    study_name: str | None = None  # null: the run dir where the search began


def budget(settings: RunnerConfig) -> tuple[str, int]:
    """ASHA's clock and each trial's budget on it: env steps, else iterations."""
    if settings.stop.env_steps:
        return "env_steps", settings.stop.env_steps
    if settings.stop.iterations:
        return "training_iteration", settings.stop.iterations
    raise ConfigError(
        "task=tune compares trials at a budget: set stop.env_steps or stop.iterations"
    )


def check(settings: RunnerConfig, spec: CompileSpec | None) -> list[str]:
    """The search's own settings, then every searched value through RLlib's builders."""
    from runner.algorithms.algorithm_config import build_algorithm_config
    from runner.settings import search

    task = own_settings(settings, TuneSettings)
    search.check_population(settings.search, settings)
    if not search.searched(settings.search):
        raise ConfigError(
            "task=tune needs a search space: choose one with search=ppo_cartpole (conf/search/) "
            "or set search.space"
        )
    if task.num_samples < 1 or task.max_concurrent < 1:
        raise ConfigError(
            f"task.num_samples={task.num_samples} and task.max_concurrent={task.max_concurrent}"
            " must each be at least 1"
        )
    if task.searcher not in SEARCHERS:
        raise ConfigError(f"task.searcher={task.searcher}: use one of {', '.join(SEARCHERS)}")
    if not 0 < task.grace_fraction <= 1 or task.reduction_factor < 2:
        raise ConfigError(
            f"task.grace_fraction={task.grace_fraction} (in (0, 1]) and task.reduction_factor="
            f"{task.reduction_factor} (at least 2) are out of range"
        )
    if task.storage is not None:
        _check_storage_url(task.storage)
    if settings.search.synch and task.max_concurrent < task.num_samples:
        raise ConfigError(
            f"search.synch waits for every trial at each perturbation, and only "
            f"task.max_concurrent={task.max_concurrent} of task.num_samples={task.num_samples} "
            "run at once: raise max_concurrent to num_samples, or drop search.synch"
        )
    budget(settings)
    search.check(settings.search.space, settings)
    for values in search.sample_each(search.searched(settings.search)):
        build_algorithm_config(search.with_values(settings, values), spec)
    return []


# What Ray Tune's restore keeps from the search's start (its TuneConfig) or what the
# trials resumed from their checkpoints must share with the finished ones.
FIXED_WHEN_RESUMED = ("task", "search", "stop")


def same_as_begun(settings: RunnerConfig, run_dir: Path) -> None:
    """A resumed search runs with the settings it began with: refuse a change to them."""
    saved = run_dir / CONFIG
    if not saved.is_file():
        return
    began = OmegaConf.to_container(OmegaConf.load(saved), resolve=True)
    now = OmegaConf.to_container(OmegaConf.structured(settings), resolve=True, enum_to_str=True)
    changed = [k for k in FIXED_WHEN_RESUMED if began.get(k) != now.get(k)]  # type: ignore[union-attr]  # both are dicts: the saved and this config
    if changed:
        raise ConfigError(
            f"resume={run_dir} continues a search as it began; drop the {', '.join(changed)}.* "
            "overrides (Ray Tune restores the search's own), or start a new search"
        )


def scale_plan(plan: Plan, settings: RunnerConfig) -> Plan:
    """`max_concurrent` trials at once (no more than there are), each all of a run's actors."""
    task = own_settings(settings, TuneSettings)
    n = min(task.max_concurrent, task.num_samples)
    return plan.trials(n, f"x{n}: task.max_concurrent trials at once")


def trial(values: dict[str, Any], settings: RunnerConfig) -> None:
    """One trial, inside its Tune actor: the one training loop (runner/job/loop.py) over the
    composed config with `values`, its files in the trial's dir (metrics.jsonl in the
    run's format, checkpoints), `check.*`, the guard and the watchdog as in a run; each
    iteration reported to Tune, with a checkpoint every checkpoint.every iterations and
    at the end, so an interrupted search continues the trial."""
    from ray import tune

    from runner import tasks
    from runner.algorithms.algorithm_config import build_algorithm_config
    from runner.job import loop
    from runner.machine.ray_session import import_py_modules_here
    from runner.settings import search
    from runner.settings.validate import validate

    settings = search.with_values(settings, values)
    import_py_modules_here(settings.ray.runtime_env)
    # The trial's settings checked as a training run's are (the sampled values included).
    spec, _ = validate(settings, tasks.get("train"))
    config = build_algorithm_config(settings, spec)
    trial_dir = Path(tune.get_context().get_trial_dir())
    # The trial's working dir: on the trial dir's disk, and no sync copies it.
    scratch = Path(tune.get_context().get_storage().trial_working_directory)
    scratch.mkdir(parents=True, exist_ok=True)
    checkpoint = tune.get_checkpoint()
    with contextlib.ExitStack() as stack:
        restore = None if checkpoint is None else stack.enter_context(checkpoint.as_directory())
        run = TaskRun(
            settings=settings,
            config=config,
            spec=spec,
            run_dir=trial_dir,
            provenance={},
            start_time=time.perf_counter(),
            checkpoint=Path(restore) if restore else None,
            scratch=scratch,
        )
        figures = loop.train(run, extra=[TuneReporter()])
    error = figures["progress"].error
    if error is not None:
        raise error


def check_verdict(training: Any, reason: str) -> str:
    """The trial's pass criterion so far: passed, failed (ended without it), pending, or
    '' without a check."""
    check = training.progress.check
    if not check.active:
        return ""
    if check.passed:
        return "passed"
    return "failed" if reason else "pending"


class TuneReporter(Callback):
    """Each iteration to Tune: the run's objective (Training.objective), the budget's
    clock, the stop reason and the check's verdict, with the checkpoint the loop saved
    in that iteration. A trial that ends cleanly without one asks the loop for it (a
    resumed search then has it whole) and reports once it is saved. Last among the run's
    callbacks, so this iteration's stop reason is known."""

    def __init__(self) -> None:
        self.pending: dict[str, Any] | None = None  # a report waiting for its checkpoint

    def on_iteration(self, training: Training, it: Iteration) -> Decision | None:
        reason = training.progress.reason
        report = {
            "episode_return_mean": it.row["last_episode_return_mean"],
            "env_steps": it.row["env_steps"] or 0,
            "return_age": it.row["return_age"],
            "env_steps_per_s": it.row["env_steps_per_s"],
            "stop_reason": reason,
            "check": check_verdict(training, reason),
        }
        if training.objective is not None:  # ASHA skips a result without it
            report[METRIC] = training.objective
        if training.saved is None and reason and training.progress.status == "finished":
            self.pending = report
            return Decision(checkpoint=True)
        _report(report, training.saved)
        return None

    def on_checkpoint(self, training: Training, path: Path) -> None:
        if self.pending is not None:  # the checkpoint this iteration's report waited for
            report, self.pending = self.pending, None
            _report(report, path)


def _report(report: dict[str, Any], checkpoint: Path | None) -> None:
    from ray import tune

    if checkpoint is None:
        tune.report(report)
    else:
        tune.report(report, checkpoint=tune.Checkpoint.from_directory(str(checkpoint)))


def population(settings: RunnerConfig) -> bool:
    """Whether the search trains a population (PBT, PB2), not trials of fixed values."""
    return settings.search.scheduler != Scheduler.asha


def study(run: TaskRun) -> dict[str, str] | None:
    """The Optuna study of an Optuna search: its storage's URL (task.storage, else SQLite in
    the run dir where the search began, which a resumed search continues) and its name."""
    task = own_settings(run.settings, TuneSettings)
    if task.searcher != "optuna" or population(run.settings):
        return None
    began = began_in(run).resolve()
    return {
        "storage": task.storage or f"sqlite:///{began / STUDY_FILE}",
        "name": task.study_name or str(began),
    }


def _check_storage_url(url: str) -> None:
    """task.storage parses as a database URL whose driver is installed (connecting to it
    waits for the search's start, `_storage`)."""
    from sqlalchemy.engine import make_url

    try:
        make_url(url).get_dialect()
    except Exception as ex:  # SQLAlchemy's ArgumentError, NoSuchModuleError, ImportError
        raise ConfigError(
            f"task.storage={url}: {one_line(ex)}; give an RDB URL Optuna opens, such as "
            "sqlite:////abs/path/optuna.db or postgresql://user@host/db"
        ) from None


def _storage(url: str) -> Any:
    """Optuna's RDB storage at `url`, reached before the search starts: one line if not."""
    import optuna

    try:
        return optuna.storages.RDBStorage(url)
    except Exception as ex:  # SQLAlchemy's and the drivers' errors have no common base
        raise ConfigError(
            f"task.storage={url}: {one_line(ex)}; give an RDB URL Optuna opens, such as "
            "sqlite:////abs/path/optuna.db or postgresql://user@host/db"
        ) from None


def _searcher(run: TaskRun, preset: dict[str, Any] | None) -> Any:
    from ray.tune.search import BasicVariantGenerator

    first = [preset] if preset else None
    kept = study(run)
    if kept is None:
        return BasicVariantGenerator(points_to_evaluate=first, random_state=run.settings.seed)
    import optuna  # here: its import costs every other job a quarter second
    from ray.tune.search.optuna import OptunaSearch

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = optuna.samplers.TPESampler(seed=run.settings.seed)
    storage = _storage(kept["storage"])
    console.print(f"the study {kept['name']!r}: optuna-dashboard {kept['storage']}")
    return OptunaSearch(
        points_to_evaluate=first, sampler=sampler, study_name=kept["name"], storage=storage
    )


def _scheduler(settings: RunnerConfig) -> Any:
    """ASHA at the budget's clock, or PBT / PB2 every search.perturbation_interval
    iterations (trials checkpoint at least that often: `for_population`)."""
    from ray.tune.schedulers import ASHAScheduler, PopulationBasedTraining
    from ray.tune.schedulers.pb2 import PB2

    from runner.settings import search

    config = settings.search
    if config.scheduler == Scheduler.asha:
        task = own_settings(settings, TuneSettings)
        clock, max_t = budget(settings)
        return ASHAScheduler(
            time_attr=clock,
            max_t=max_t,
            grace_period=max(1, int(max_t * task.grace_fraction)),
            reduction_factor=task.reduction_factor,
        )
    if config.scheduler == Scheduler.pb2:
        bounds: dict[str, dict | list | tuple] = {
            key: list(search.kind(key, d)[1]) for key, d in config.mutations.items()
        }
        return PB2(
            time_attr="training_iteration",
            perturbation_interval=config.perturbation_interval,
            quantile_fraction=config.quantile_fraction,
            hyperparam_bounds=bounds,
            synch=config.synch,
        )
    return PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=config.perturbation_interval,
        quantile_fraction=config.quantile_fraction,
        synch=config.synch,
        hyperparam_mutations=search.to_tune(config.mutations),
        resample_probability=config.resample_probability,
    )


def for_population(settings: RunnerConfig) -> RunnerConfig:
    """A population's trials checkpoint at least every perturbation, whose exploit step
    continues a trailing trial from a leading trial's newest checkpoint."""
    if not population(settings):
        return settings
    interval = settings.search.perturbation_interval
    every = settings.checkpoint.every
    checkpoint = replace(settings.checkpoint, every=min(every or interval, interval))
    return replace(settings, checkpoint=checkpoint)


def began_in(run: TaskRun) -> Path:
    """The run dir where the search began (a resumed search's earlier one)."""
    return run.checkpoint.parent if run.checkpoint is not None else run.files


def mlflow_experiment(run: TaskRun) -> str | None:
    """logger=mlflow: the search's MLflow experiment (logger.mlflow.experiment_name, else
    the run dir where the search began), made with its artifact root; None without MLflow."""
    from runner.results import tracking

    mlflow = run.settings.logger.mlflow
    if mlflow is None:
        return None
    name = mlflow.experiment_name or str(began_in(run))
    tracking.mlflow_experiment(mlflow.tracking_uri, name)
    return name


def _callbacks(run: TaskRun, experiment: str | None) -> list[Any]:
    """One MLflow run and one W&B run per trial, through Ray Tune's own callbacks (W&B's
    grouped by the run dir where the search began)."""
    from runner.results import tracking

    settings, callbacks = run.settings, list[Any]()
    if experiment is not None:
        from ray.air.integrations.mlflow import MLflowLoggerCallback

        assert settings.logger.mlflow is not None
        callbacks.append(
            MLflowLoggerCallback(
                tracking_uri=tracking.tracking_uri(settings.logger.mlflow.tracking_uri),
                experiment_name=experiment,
                tags=tracking.tags(settings, run.files, run.compiled),
            )
        )
    if settings.logger.wandb is not None:
        from ray.air.integrations.wandb import WandbLoggerCallback

        from runner.results.wandb_logger import init_kwargs

        kwargs = init_kwargs(settings.logger.wandb, settings, str(began_in(run)))
        callbacks.append(WandbLoggerCallback(**kwargs))
    return callbacks


def _say_population(settings: RunnerConfig) -> None:
    """What a population's search does that its settings did not spell out."""
    if population(settings):
        interval = settings.search.perturbation_interval
        console.print(
            f"population ({settings.search.scheduler.value}): perturbed every {interval} "
            f"iterations, from a random start; each trial checkpoints every "
            f"{settings.checkpoint.every} iterations and keeps every checkpoint, and restarts "
            "in an actor of its own"
        )


def make_tuner(run: TaskRun, experiment: str | None) -> tune.Tuner:
    """A new search, or the interrupted one restored from a copy of its Tune experiment
    (the earlier run dir stays as it was)."""
    from ray import tune

    from runner.job.resume import SEARCH_DIR
    from runner.settings import search

    settings, tune_dir = for_population(run.settings), run.files / SEARCH_DIR
    # RLlib types algo_class as a plain type; the config's is an Algorithm's, whose new API
    # stack asks for bundles.
    request = cast("type[Algorithm]", run.config.algo_class).default_resource_request(run.config)
    assert isinstance(request, tune.PlacementGroupFactory), type(request)
    trainable = tune.with_resources(tune.with_parameters(trial, settings=settings), request)
    if run.checkpoint is not None:
        same_as_begun(settings, run.checkpoint.parent)
        shutil.copytree(run.checkpoint, tune_dir)
        console.print(f"continuing the search of {run.checkpoint.parent}")
        return tune.Tuner.restore(
            str(tune_dir.resolve()), trainable, resume_unfinished=True, resume_errored=True
        )
    task = own_settings(settings, TuneSettings)
    _say_population(settings)
    preset = None
    if task.baseline_first:
        preset, why = search.preset_values(search.searched(settings.search), settings, run.config)
        if preset is None:
            console.print(f"no preset trial: {why}")
    return tune.Tuner(
        trainable,
        param_space=search.to_tune(search.searched(settings.search)),
        tune_config=tune.TuneConfig(
            metric=METRIC,
            mode=MODE,
            num_samples=task.num_samples,
            max_concurrent_trials=task.max_concurrent,
            search_alg=_searcher(run, preset),
            scheduler=_scheduler(settings),
            # A finished (or stopped) trial's actor runs the next one, as every trial asks
            # for the same resources: RLlib and torch import once per concurrent trial.
            # (A population's trial that exploits another restarts in an actor of its own:
            # a reused one ran it from the wrong checkpoint and lost iterations.)
            reuse_actors=not population(settings),
            trial_name_creator=lambda t: f"trial_{t.trial_id}",
            trial_dirname_creator=lambda t: f"trial_{t.trial_id}",
        ),
        run_config=tune.RunConfig(
            storage_path=str(run.files.resolve()),
            name=SEARCH_DIR,
            callbacks=_callbacks(run, experiment),
            # A population's trailing trial restores a leading trial's checkpoint after
            # that trial went on, and Tune's pruning of a trial's checkpoints fails after
            # such a restore: a population's trials keep theirs.
            checkpoint_config=tune.CheckpointConfig(
                num_to_keep=None if population(settings) else 1
            ),
            failure_config=tune.FailureConfig(max_failures=0),
            verbose=1,
        ),
    )


def fit(tuner: tune.Tuner) -> int | None:
    """Run the search. Tune stops it cleanly on SIGINT (saving its state); SIGTERM and
    SIGHUP are turned into that SIGINT. Returns the first signal taken, or None."""
    taken: list[int] = []

    def to_sigint(signum: int, frame: Any) -> None:
        taken.append(signum)
        signal.raise_signal(signal.SIGINT)

    for s in HANDLED:
        if s != signal.SIGINT and in_main_thread():
            signal.signal(s, to_sigint)
    os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")  # see report_to_tune()
    try:
        tuner.fit()
    finally:
        install_default()
    return taken[0] if taken else None


class TrialsFailed(RunnerError):
    """Some trials raised: exit code 1 (trials.csv says which, and why)."""

    exit_code = 1


def run(run: TaskRun) -> None:
    """The search, then its results from Tune's experiment; the exit a signal (130 for
    Ctrl-C, with the search resumable) or a failed trial (1) calls for."""
    from runner.job.resume import SEARCH_DIR
    from runner.results import tracking, trials
    from runner.settings import search

    settings, run_dir = run.settings, run.files
    task = own_settings(settings, TuneSettings)
    start = time.perf_counter()
    experiment = mlflow_experiment(run)
    signum = fit(make_tuner(run, experiment))
    if experiment is not None:
        uri = settings.logger.mlflow.tracking_uri  # type: ignore[union-attr]  # logger=mlflow here
        _, experiment_id = tracking.mlflow_experiment(uri, experiment)
        tracking.end_running(uri, experiment_id)
    rows = trials.read(run_dir / SEARCH_DIR, METRIC)
    space = search.searched(settings.search)
    preset = None
    if task.baseline_first:
        preset, _ = search.preset_values(space, settings, run.config)
    summary = trials.write(run_dir, rows, space, METRIC, preset, fixed=not population(settings))
    summary["scheduler"] = settings.search.scheduler.value
    summary["study"] = study(run)
    best = summary["best"]
    if best:
        assert run.compose is not None  # app.started passes the entry point's on
        trials.write_experiment(
            run_dir, run.choices, settings, best["values"], summary, run.compose
        )
    done = summary["trials_by_status"]
    unfinished = task.num_samples - sum(
        n for status, n in done.items() if status != trials.NOT_FINISHED
    )
    status = "finished" if unfinished == 0 else "interrupted"
    run.record.update({"status": status, "wall_seconds": time.perf_counter() - start, **summary})
    console.print(trials.describe(summary, run_dir))
    if status == "interrupted":
        raise Interrupted(
            signum or signal.SIGINT,
            f"search interrupted with {unfinished} of {task.num_samples} trials not finished; "
            f"continue it with resume={run_dir}",
        )
    errors = [r for r in rows if r["status"] == trials.ERROR]
    if errors:
        raise TrialsFailed(
            f"{len(errors)} of {len(rows)} trials failed; the first: trial {errors[0]['trial']}: "
            f"{errors[0]['error']} (trials.csv, {run_dir / SEARCH_DIR})"
        )


TASK = Task(
    settings=TuneSettings,
    run=run,
    check=check,
    scale_plan=scale_plan,
    resumes="search",
    tracked=False,
    trains=True,
)
