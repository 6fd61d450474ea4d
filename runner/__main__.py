"""`python -m runner [overrides]`: Hydra's app, a thin shell over `app.run` (the Python
API, runner/api.py, is the other), with every error reduced to one line.

Only what composition needs is imported before Hydra composes, so bad input fails in
seconds; the rest (torch, Ray, RLlib) comes with the job.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import logging
import os
import sys
import threading
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any

START = time.perf_counter()

import hydra  # noqa: E402
from hydra.conf import HydraConf  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from hydra.types import RunMode  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from runner import CONFIG_DIR  # noqa: E402
from runner.api import composed, register_configs  # noqa: E402
from runner.errors import RunnerError, one_line  # noqa: E402
from runner.job import Job  # noqa: E402
from runner.machine import slurm  # noqa: E402
from runner.machine.shutdown import Interrupted, install_default, interrupted  # noqa: E402
from runner.results.files import REFUSED, read_status  # noqa: E402
from runner.settings.overrides import normalized  # noqa: E402


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def _app(cfg: DictConfig) -> None:
    """One job, here or as a SLURM job's task (runner/machine/slurm.py: a job of several
    tasks runs it in task 0, on a Ray across them all)."""
    hydra_cfg = HydraConfig.get()
    if slurm.allocation() is not None:  # in submitit's process: main() set no handlers
        slurm.take_requeue()
        install_default()
    slurm.run_job(Path(hydra_cfg.runtime.output_dir), lambda: _one_job(cfg, hydra_cfg))


def _one_job(cfg: DictConfig, hydra_cfg: HydraConf) -> None:
    """In a sweep its outcome goes to job.json, and a failure lets the sweep go on.
    Its settings are checked before torch, Ray and RLlib are imported (bad input is one
    line in about a second); a job that ends before its task runs leaves its record."""
    from runner.results.jobs import earlier_attempt, write_job

    job, began = _job(cfg, hydra_cfg), time.perf_counter()
    carry_on = None
    if job.sweep_dir is not None:
        skip, carry_on = earlier_attempt(job.run_dir, job.overrides)
        if skip:
            print(f"job {job.number}: finished in an earlier run of this sweep, skipped")
            return
    # Hydra's basic launcher runs a sweep's jobs one after another in this process: a job
    # leaves its Ray to the next (started again only for other ray.* settings) unless it
    # failed. Other launchers' jobs (joblib's worker processes) each stop their own.
    keep_ray = job.sweep_dir is not None and hydra_cfg.launcher._target_.endswith(".BasicLauncher")
    start = START if job.sweep_dir is None else began  # where the job's wall time starts
    try:
        _check_settings(cfg)
        job = replace(job, startup=_startup(cfg, job))
        from runner.job.app import run

        totals = run(job, start, carry_on)
        totals.pop("summary", None)  # summary.json: in the run dir
    except KeyboardInterrupt as ex:  # a signal (Ray's calls give up on nothing else)
        keep_ray = False
        stop = _interrupted(job, interrupted(ex), start, began)
        slurm.requeue(stop.signum)  # SLURM's warning: submitit requeues the job, and exits
        raise stop from None
    except Exception as ex:
        keep_ray = False
        _failed(job, ex, start, began)
        return
    finally:
        # Before the exit, not from Ray's exit handler, which sleeps 0.5 s first.
        if not keep_ray and "ray" in sys.modules:
            from runner.machine.ray_session import stop_ray

            stop_ray()
    if job.sweep_dir is not None:
        status = "dry_run" if cfg.dry_run else "finished"
        write_job(job.run_dir, status, job.overrides, wall_seconds=_since(began), **totals)


def _job(cfg: DictConfig, hydra_cfg: HydraConf) -> Job:
    """The job Hydra launched: its run dir, overrides and choices, and its sweep's."""
    in_sweep = hydra_cfg.mode == RunMode.MULTIRUN
    choices: dict[str, Any] = OmegaConf.to_container(hydra_cfg.runtime.choices)  # type: ignore[assignment]  # a dict node's container
    return Job(
        cfg=cfg,
        run_dir=Path(hydra_cfg.runtime.output_dir),
        overrides=list(hydra_cfg.overrides.task),
        choices=choices,
        sweep_dir=Path(hydra_cfg.sweep.dir) if in_sweep else None,
        number=hydra_cfg.job.num if in_sweep else None,
        compose=composed,  # Hydra's compose API, inside the app Hydra set up
    )


def _startup(cfg: DictConfig, job: Job) -> dict[str, float | None]:
    """The seconds before the job (summary.json's `startup`): the interpreter's start (a
    sweep's first job only), Ray's early start and the imports."""
    startup: dict[str, float | None] = {}
    if job.sweep_dir is None:
        startup["python_s"] = _python_seconds()
    startup |= _start_ray_early(cfg, job.choices["task"])
    began = time.perf_counter()
    importlib.import_module("runner.job.app")
    startup.setdefault("imports_s", time.perf_counter() - began)
    return startup


def _record_end(job: Job, ex: BaseException, start: float) -> None:
    from runner.results.record import ended_early

    known = {"overrides": job.overrides, "choices": job.choices}
    ended_early(job.run_dir, job.choices["task"], ex, time.perf_counter() - start, known)


def _interrupted(job: Job, stop: Interrupted, start: float, began: float) -> Interrupted:
    """A signal: the record, and a sweep job's job.json so a re-run continues it."""
    _record_end(job, stop, start)
    if job.sweep_dir is not None:
        from runner.results.jobs import write_job
        from runner.sweep import summarize

        write_job(
            job.run_dir, "interrupted", job.overrides, error=str(stop), wall_seconds=_since(began)
        )
        summarize(job.sweep_dir)
        print(f"sweep stopped at job {job.number}: run it again to continue")
    return stop


def _failed(job: Job, ex: Exception, start: float, began: float) -> None:
    """One line (a crash's traceback in the run dir); a lone job exits, a sweep's job
    writes job.json and lets the sweep go on."""
    from runner.results.jobs import ERROR_FILE, write_job

    _record_end(job, ex, start)
    message = one_line(ex)
    if not isinstance(ex, RunnerError):
        # A crash (not bad input): one line here, the whole traceback in the run dir.
        error_file = job.run_dir / ERROR_FILE
        error_file.write_text("".join(traceback.format_exception(ex)))
        message = f"{message} (traceback in {error_file})"
    if job.sweep_dir is None:
        _fail(message, getattr(ex, "exit_code", 2))
    status = REFUSED if read_status(job.run_dir) == REFUSED else "failed"
    write_job(job.run_dir, status, job.overrides, error=message, wall_seconds=_since(began))
    print(f"error: job {job.number}: {message}", file=sys.stderr)


def _check_settings(cfg: DictConfig) -> None:
    """The settings' own rules (runner/settings/validate.py's check_settings), before torch, Ray
    and RLlib are imported: the job checks them again with the rest. The user's code
    comes from ray.runtime_env.py_modules here too (a callback class is checked)."""
    from runner.machine.ray_session import import_py_modules_here
    from runner.settings.schema import typed
    from runner.settings.validate import check_settings

    settings = typed(cfg)
    import_py_modules_here(settings.ray.runtime_env)
    check_settings(settings)


def _python_seconds() -> float | None:
    """Seconds from the process's start to this module's first line: the interpreter's
    start and Hydra's import (Linux's /proc; None elsewhere, and where this module is
    imported rather than run: the tests call `main` in their own process)."""
    if __name__ != "__main__":
        return None
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    started_ago = uptime - ticks / os.sysconf("SC_CLK_TCK")
    return max(0.0, started_ago - (time.perf_counter() - START))


def _start_ray_early(cfg: DictConfig, task_name: str) -> dict[str, float]:
    """Start the job's local Ray while torch and RLlib import, in another thread: Ray's start
    mostly waits on its own processes, so the two overlap.
    Only where the Ray the job needs is known now: not a dry run, no cluster, no
    compile=auto (it measures before Ray takes the CPUs), nothing read from an earlier run
    (whose settings apply). The job's own start_ray then finds this Ray running. Anything
    amiss is left for the job to report; a process that imported the job already (a
    sweep's later jobs) has nothing to overlap. Returns the seconds each took."""
    if "runner.job.app" in sys.modules:
        return {}
    from runner import tasks
    from runner.machine.ray_session import cluster_address, start_ray
    from runner.settings.autos import measures_before_ray
    from runner.settings.schema import typed

    try:
        settings = typed(cfg)
        task = tasks.get(task_name)
        reads_earlier_run = task.checkpoint_source(cfg) is not None
    except Exception:  # the job says what is wrong, in one line
        return {}
    if (
        not task.needs_ray
        or settings.dry_run
        or cluster_address(settings.ray)
        or measures_before_ray(settings)
        or reads_earlier_run
    ):
        return {}
    took: dict[str, float] = {}
    importer = threading.Thread(target=_import_quietly, args=("runner.job.app", took), daemon=True)
    importer.start()
    began = time.perf_counter()
    with contextlib.suppress(Exception):  # the job's own start_ray tries again and reports
        start_ray(settings.ray, settings.compile.cache_dir)
    took["ray_start_s"] = time.perf_counter() - began
    importer.join()
    return took


def _import_quietly(name: str, took: dict[str, float]) -> None:
    """Import in the background, timed; a failure is raised again by the job's own import."""
    began = time.perf_counter()
    with contextlib.suppress(BaseException):
        importlib.import_module(name)
    took["imports_s"] = time.perf_counter() - began


def _since(start: float) -> float:
    return time.perf_counter() - start


def _fail(message: str, code: int = 2) -> None:
    """Print one line and exit; SystemExit passes through Hydra without its own banner."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(code)


def _refuse_used_run_dir(argv: list[str]) -> None:
    """Hydra writes .hydra/ before the task runs: refuse a run dir that holds results first
    (the job checks its run dir again, as a run from the Python API gets none of this)."""
    from runner.results.files import refuse_used

    for arg in argv:
        if arg.startswith("hydra.run.dir="):
            try:
                refuse_used(Path(arg.split("=", 1)[1]))
            except RunnerError as ex:
                _fail(str(ex))


def main() -> None:
    """Run the app; Hydra's errors propagate (HYDRA_FULL_ERROR) so they can be one line."""
    from runner.settings import help as runner_help
    from runner.sweep import FailedJobs

    install_default()
    if sys.argv[1:2] in (["--help"], ["-h"]):
        try:
            print(runner_help.text(CONFIG_DIR), flush=True)
        except BrokenPipeError:  # `--help | head`: the reader left; say nothing more
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return
    register_configs()
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")
    sys.argv[1:] = normalized(sys.argv[1:])
    _refuse_used_run_dir(sys.argv[1:])
    try:
        _app()
    except FailedJobs as failed:  # from the sweep summary, when a multirun ends
        _fail(str(failed), 1)
    except KeyboardInterrupt as ex:  # 128 + the signal's number, after the run kept what finished
        stop = interrupted(ex)
        _fail(str(stop), stop.exit_code)
    except Exception as ex:
        _fail(one_line(ex))


def cli() -> None:
    """`main`, then the exit a finished run needs and no more: the interpreter joins the
    threads and runs the exit handlers registered since (Ray's shutdown among them); the
    last of them, `_exit_now`, flushes the logs and the streams and ends the process
    there. The interpreter's teardown of torch's and RLlib's modules, which takes a second
    or more, is skipped: every result is on disk by then."""
    code = [0]

    def _exit_now() -> None:
        logging.shutdown()  # registered before this handler, so it would run after it
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError):  # a reader that left (`| head`) wants no more
                stream.flush()
        os._exit(code[0])

    atexit.register(_exit_now)  # before anything the run registers, so it runs after all
    try:
        main()
    except SystemExit as ex:
        code[0] = ex.code if isinstance(ex.code, int) else (0 if ex.code is None else 1)
    sys.exit(code[0])


if __name__ == "__main__":
    cli()
