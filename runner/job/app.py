"""One job, one way through: config -> plan -> preflight -> task -> results.

`prepare` starts nothing and writes no file: typed settings, the task, the compile spec, the
AlgorithmConfig and the resource plan. `run` adds the run dir, the preflight against this
machine or the cluster, the dry run, and runs the task on its `TaskRun` under the job's
hooks (runner/job/hooks.py: trackers, the record, Ray, ...). Nothing here knows any one
task: the registry in runner/tasks/ does.
"""

from __future__ import annotations

import json
import logging
import signal
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from rich.table import Table

from runner import machine, tasks
from runner.algorithms.algorithm_config import build_algorithm_config, default_config_for
from runner.algorithms.fast_step import describe as describe_training_step
from runner.algorithms.reward_scaling import describe as describe_rewards
from runner.compile.settings import CompileSpec
from runner.console import console
from runner.errors import ConfigError, PreflightError, RunEnded
from runner.job import Job, hooks
from runner.job.callbacks import describe_stops
from runner.job.check import Check
from runner.job.resume import SEARCH_DIR, compose_for_resume
from runner.job.task import Task, TaskRun
from runner.machine import placement, preflight
from runner.machine.plan import Plan, make_plan
from runner.machine.ray_session import (
    cluster_address,
    import_py_modules_here,
    joined_by_environment,
    quiet_ray,
)
from runner.machine.shutdown import Interrupted, Watch, signal_name
from runner.results import checkpoints, remote
from runner.results.files import (
    CONFIG,
    METRICS,
    PLAN,
    json_safe,
    refuse_used,
    versions,
    write_json,
    write_overrides,
)
from runner.settings import autos
from runner.settings.overrides import CUSTOM_ENV
from runner.settings.schema import BUDGETS, RunnerConfig, is_stop_default, setting, typed
from runner.settings.validate import validate

log = logging.getLogger("runner")


@dataclass
class Prepared:
    """A job composed and planned, before anything runs: no auto left in its settings or
    spec (`autos`: what each auto chose, for the record)."""

    settings: RunnerConfig
    task: Task
    spec: CompileSpec | None
    warnings: list[str]
    config: AlgorithmConfig
    plan: Plan
    resources: machine.Resources
    placement: placement.Placement
    autos: dict[str, Any]


def prepare(settings: RunnerConfig, resources: machine.Resources | None = None) -> Prepared:
    """The Learner layout for the machine the job plans on (`resources`, default this
    one), the settings checked once, compile=auto and scaling=auto resolved (measured, or
    read from their caches), then RLlib's AlgorithmConfig and the plan of what the task
    will start. Starts no training; imports the user's code named in the config (from
    ray.runtime_env.py_modules dirs too)."""
    import_py_modules_here(settings.ray.runtime_env)
    task = tasks.get(settings.task.name)
    resources = resources or machine.local_resources(settings.ray)
    placed = placement.resolve(settings, resources)
    spec, warnings = validate(settings, task)
    resolved = autos.resolve(settings, spec, task, resources, planned)
    settings, spec = resolved.settings, resolved.spec
    placement.compile_workers(settings, spec, placed)
    config = build_algorithm_config(settings, spec)
    task.configure(config, settings)
    plan = task.scale_plan(make_plan(config, placed.notes), settings)
    if placement.fit_aggregators(config, plan, resources, placed, settings.preflight.strict):
        plan = task.scale_plan(make_plan(config, placed.notes), settings)
    warnings += placed.warnings
    return Prepared(
        settings, task, spec, warnings, config, plan, resources, placed, resolved.record
    )


def planned(settings: RunnerConfig, resources: machine.Resources) -> tuple[AlgorithmConfig, Plan]:
    """The AlgorithmConfig and plan `prepare` makes: scaling=auto plans each layout so."""
    prepared = prepare(settings, resources)
    return prepared.config, prepared.plan


def _changed_settings(config: AlgorithmConfig, algo_name: str) -> dict[str, Any]:
    """The AlgorithmConfig entries that differ from RLlib's defaults for this algorithm."""
    ours = json_safe(config.to_dict())
    default = json_safe(default_config_for(algo_name).to_dict())
    return {k: v for k, v in ours.items() if default.get(k) != v}


def print_changed(prepared: Prepared) -> None:
    """The AlgorithmConfig's settings that differ from RLlib's: a dry run's middle
    section, and with `verbose=true` a run's too (algorithm_config.json holds them all)."""
    config, settings = prepared.config, prepared.settings
    console.rule(f"AlgorithmConfig ({type(config).__name__}): settings that differ from RLlib")
    console.print(json.dumps(_changed_settings(config, settings.algo.name), indent=2))


def start_lines(prepared: Prepared, choices: dict[str, Any], cfg: DictConfig) -> list[str]:
    """What the run is and what ends it, in a few lines (a run's first, before Ray's): the
    env and the option its settings came from, the hyperparameters' files (a tuned one,
    or none), every stop criterion and the check of a task that trains, and what the
    runner chose for this machine."""
    settings = prepared.settings
    option = choices.get("env")
    own = " (no preset: RLlib's defaults, no solved return)" if option == CUSTOM_ENV else ""
    lines = [f"env: {setting(settings.env)}, env={option}{own}"]
    if choices.get("experiment"):
        lines.append(f"experiment: {choices['experiment']}")
    algo = f"conf/algo/{choices.get('algo')}.yaml"
    tuned = settings.tuned
    changes = f"; changed: {tuned.changes}" if tuned is not None and tuned.changes else ""
    lines.append(
        f"hyperparameters: {settings.algo.name}, {algo} + {tuned.file} ({tuned.source}{changes})"
        if tuned is not None
        else f"hyperparameters: {settings.algo.name}, {algo} (no tuned file for "
        f"{choices.get('algo')} on env={option})"
    )
    if prepared.task.trains:
        stop = settings.stop
        defaults = [k for k in BUDGETS if is_stop_default(cfg.stop, k) and getattr(stop, k)]
        lines.append(describe_stops(stop, defaults))
        check = Check(settings.check).describe()
        lines += [check] if check else []
    step = describe_training_step(prepared.config, settings.algo.fast_step)
    rewards = describe_rewards(prepared.config)
    return lines + [x for x in (step, rewards) if x] + prepared.placement.chosen


def print_plan(plan: Plan, report: preflight.Report, res: machine.Resources) -> None:
    table = Table(title="resource plan", title_justify="left")
    for column in ("role", "count", "CPUs each", "GPUs each", "hosts"):
        table.add_column(column)
    for g in plan.groups:
        table.add_row(g.role, str(g.count), f"{g.cpus_each:g}", f"{g.gpus_each:g}", g.note)
    table.add_row("total", "", f"{plan.total_cpus:g}", f"{plan.total_gpus:g}", "")
    console.print(table)
    console.print(
        f"available on {res.where}: {res.cpus:g} CPUs, {res.gpus:g} GPUs"
        + (f" ({', '.join(res.gpu_names)})" if res.gpu_names else "")
    )
    for problem in report.problems:
        console.print(f"preflight would fail: {problem}")


def provenance(
    settings: RunnerConfig, resources: machine.Resources, choices: dict[str, Any]
) -> dict[str, Any]:
    """Where and with what a result was measured, and what it reproduces (for the report)."""
    reproduction = settings.reproduction
    return {
        "hardware": {"profile": settings.hardware.name, **vars(resources)},
        "versions": versions(),
        "experiment": choices.get("experiment"),
        "tuned": settings.tuned.file if settings.tuned else None,
        "scale": choices.get("scale"),
        "reproduction": asdict(reproduction) if reproduction else None,
    }


def carried_on(attempt: Path | None) -> tuple[Path | None, list[str]]:
    """An interrupted sweep job's newest good checkpoint, and its metrics.jsonl lines up
    to that checkpoint's iteration (the new attempt's file starts with them)."""
    checkpoint = checkpoints.latest(attempt) if attempt else None
    if attempt is None or checkpoint is None:
        return None, []
    checkpoint = checkpoints.verified(checkpoint)
    iteration = (checkpoints.manifest(checkpoint) or {}).get("iteration", 0)
    lines = (attempt / METRICS).read_text().splitlines()
    history = [line for line in lines if json.loads(line)["iteration"] <= iteration]
    console.print(f"continuing the interrupted job from {checkpoint}")
    return checkpoint, history


def run(job: Job, start_time: float, attempt: Path | None = None) -> dict[str, Any]:
    """Compose (an earlier run's overrides under resume= or checkpoint=), resolve, prepare,
    preflight, then dry-run or run the task under the job's hooks; every file lands in the
    job's run dir. `attempt`: an interrupted earlier attempt of this sweep job to continue.
    Returns the plan's CPU and GPU totals, for a sweep job's record, and the run's
    summary.json as written (a dry run: what its preflight would refuse)."""
    quiet_ray(job.cfg.ray.log_level)
    refuse_used(job.run_dir)
    checkpoint, history = carried_on(attempt)
    job, checkpoint = from_earlier_run(job, checkpoint)
    write_overrides(job.run_dir, job.overrides)
    startup = dict(job.startup)  # summary.json's `startup`: the seconds before training
    settings, cluster = joined(job, startup)
    prepared = prepare(settings, cluster)
    write_config(job, prepared)
    mirror = probed_mirror(prepared.settings, job.run_dir)
    refuse_another_kind(prepared.task, checkpoint)
    plan, config = prepared.plan, prepared.config
    report = preflight.check(
        prepared.settings, config, plan, prepared.resources, prepared.warnings, prepared.spec
    )
    write_json(job.run_dir / "algorithm_config.json", config.to_dict())
    write_json(job.run_dir / PLAN, {**plan.to_dict(), "preflight": report.to_dict()})
    for warning in report.warnings:
        log.warning(warning)
    totals = {"cpus": plan.total_cpus, "gpus": plan.total_gpus}
    if prepared.settings.dry_run:
        show_dry_run(prepared, report, job, mirror)
        return {**totals, "preflight_problems": report.problems}
    if not report.ok:
        raise PreflightError("; ".join(report.problems))
    if prepared.settings.verbose:
        print_changed(prepared)
    for line in start_lines(prepared, job.choices, job.cfg):
        console.print(line)
    task_run = make_task_run(prepared, job, start_time, checkpoint, history, startup)
    around = hooks.for_job(prepared.task, job, plan.main_gpus, mirror)
    hooks.run(around, task_run, lambda: supervised(prepared.task, task_run))
    return {**totals, "summary": task_run.summary}


def from_earlier_run(job: Job, checkpoint: Path | None) -> tuple[Job, Path | None]:
    """resume= or checkpoint=: the job composed again from the earlier run's overrides with
    this one's on top (runner/job/resume.py), and the checkpoint it names."""
    source = tasks.get(job.choices["task"]).checkpoint_source(job.cfg)
    if not source:
        return job, checkpoint
    if job.compose is None:
        raise ConfigError(f"{source[1]}={source[0]}: this job cannot compose another config")
    cfg, checkpoint, overrides, choices = compose_for_resume(
        job.cfg, job.overrides, *source, job.compose
    )
    if source[1] == "checkpoint":  # located (pulled from a URI) once: the task reads it
        cfg.task.checkpoint = str(checkpoint)
    return replace(
        job, cfg=cfg, overrides=overrides, choices={**job.choices, **choices}
    ), checkpoint


def joined(
    job: Job, startup: dict[str, float | None]
) -> tuple[RunnerConfig, machine.Resources | None]:
    """The typed settings, and the resources of the cluster the job joins (None: this
    machine's)."""
    settings = typed(job.cfg)
    address = cluster_address(settings.ray)
    if not address:
        return settings, None
    if message := joined_by_environment(settings.ray):
        console.print(message)
    hooks.timed_ray_start(settings, startup)
    return settings, machine.cluster_resources(address)


def write_config(job: Job, prepared: Prepared) -> None:
    """config.yaml: the composed config, with scaling=auto's choice where it chose."""
    cfg = job.cfg
    if section := prepared.autos.get("scaling_auto"):
        for key, value in section["chosen"].items():
            cfg.scaling[key] = value
        cfg.scaling.auto.enabled = False
    (job.run_dir / CONFIG).write_text(OmegaConf.to_yaml(cfg, resolve=True))


def probed_mirror(settings: RunnerConfig, run_dir: Path) -> remote.Mirror | None:
    """results.uri's copy of the run dir, its store tried with a write first."""
    if not settings.results.uri:
        return None
    mirror = remote.Mirror(settings.results.uri, run_dir)
    mirror.probe()
    return mirror


def refuse_another_kind(task: Task, checkpoint: Path | None) -> None:
    """resume= continues what the earlier run was: a search, or a training."""
    if checkpoint is not None and (checkpoint.name == SEARCH_DIR) != (task.resumes == "search"):
        raise ConfigError(
            f"task={task.name} cannot continue {checkpoint}: resume= a task=tune run dir "
            "continues that search (task=tune), a training run dir continues training"
        )


def show_dry_run(
    prepared: Prepared, report: preflight.Report, job: Job, mirror: remote.Mirror | None
) -> None:
    """What the job would run, on the console: the config, RLlib's changed settings, the
    start lines, the plan and what the preflight would refuse."""
    console.rule("resolved config")
    console.print(OmegaConf.to_yaml(job.cfg, resolve=True), end="")
    print_changed(prepared)
    for line in start_lines(prepared, job.choices, job.cfg):
        console.print(line)
    console.rule("plan")
    print_plan(prepared.plan, report, prepared.resources)
    mirrored = f" (results.uri: {mirror.uri} takes a write)" if mirror else ""
    done = "nothing trained" if prepared.autos else "nothing started"
    console.print(f"dry run: {done}; files in {job.run_dir}{mirrored}")


def supervised(task: Task, run: TaskRun) -> None:
    """Run the task under the watch a training gets. A task that trains has it from the
    loop (runner/job/loop.py) or, a search, from Ray Tune; any other (evaluate, export, the
    inference bench, autotune) is watched here as one step: a signal lets it finish for
    shutdown.grace_seconds, then abandons it (a second aborts, the record written first);
    the watchdog ends it after watchdog.seconds (else watchdog.first_iteration_seconds)
    with what Ray waits for, as a stalled training iteration."""
    if task.trains:
        task.run(run)
        return
    settings = run.settings

    watch = Watch(settings.shutdown.grace_seconds, settings.watchdog, lambda s: run.aborted(s, {}))
    with watch:
        try:
            with watch.build():
                task.run(run)
        except KeyboardInterrupt:
            if watch.cause == "stalled":
                from runner.machine.ray_session import waiting_for

                reason = (
                    f"stalled: task={task.name} did not finish within {watch.stall_seconds:g} s "
                    f"(watchdog.seconds); {waiting_for()}"
                )
                run.record.update(status="stalled", stop_reason=reason)
                raise RunEnded(reason) from None
            signum = watch.signum or signal.SIGINT
            abandoned = " (abandoned after shutdown.grace_seconds)" if watch.cause else ""
            raise Interrupted(signum, f"interrupted by {signal_name(signum)}{abandoned}") from None
    if watch.signum is not None:  # it finished within the grace: its files are whole
        raise Interrupted(watch.signum)


def make_task_run(
    prepared: Prepared,
    job: Job,
    start_time: float,
    checkpoint: Path | None,
    history: list[str],
    startup: dict[str, float | None],
) -> TaskRun:
    """The task's input, before the job's hooks fill in theirs."""
    settings = prepared.settings
    return TaskRun(
        settings=settings,
        config=prepared.config,
        spec=prepared.spec,
        run_dir=job.run_dir,
        provenance=provenance(settings, prepared.resources, job.choices),
        start_time=start_time,
        checkpoint=checkpoint,
        history=history,
        choices=job.choices,
        compose=job.compose,
        record={"startup": startup, **prepared.autos},  # what each auto chose
    )
