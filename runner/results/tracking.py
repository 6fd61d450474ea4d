"""Experiment tracking beside the run dir (`logger=`): nothing, or MLflow.

With `logger=mlflow` a run becomes one MLflow run: the flattened composed config as
params; task, algo, env, hardware and compile as tags; each iteration's headline figures
as metrics at its iteration; summary.json, plan.json (and eval.json, trials.csv) and the
plots as artifacts when it ends, with its status. A sweep's jobs share one MLflow
experiment named after the sweep dir; a search logs one run per trial through Ray Tune's
own `MLflowLoggerCallback` (runner/tasks/tune.py).

The default store is a SQLite file under outputs/ (MLflow 3 refuses its file store),
with artifacts beside it: no server to start.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from runner.errors import ConfigError, one_line
from runner.job import Job
from runner.results import plots
from runner.schema import RunnerConfig

DEFAULT_STORE = Path("outputs")
ARTIFACTS = ("summary.json", "plan.json", "eval.json", "bench.json", "trials.csv")
# MLflow's limits: values per param, entries per log_batch call.
MAX_PARAM_CHARS = 6000
BATCH = 100
log = logging.getLogger("runner")


def tracking_uri(uri: str | None) -> str:
    return uri or f"sqlite:///{(DEFAULT_STORE / 'mlflow.db').resolve()}"


def end_running(uri_setting: str | None, experiment_id: str, status: str = "KILLED") -> None:
    """Mark the runs of an experiment still RUNNING as ended: a search's trials that an
    interruption left open (Tune's callback does not end them) once the search is over."""
    client = mlflow_client(uri_setting)
    for run in client.search_runs([experiment_id], "attributes.status = 'RUNNING'"):
        client.set_terminated(run.info.run_id, status)


def artifact_root(uri: str | None, experiment: str) -> str | None:
    """Where a new experiment keeps its artifacts: beside a SQLite store (the default one
    included), in mlflow-artifacts/; a server's own default otherwise."""
    uri = tracking_uri(uri)
    if not uri.startswith("sqlite:///"):
        return None
    folder = experiment.strip("/").replace("/", "_")
    store = Path(uri.removeprefix("sqlite:///")).parent
    return (store / "mlflow-artifacts" / folder).resolve().as_uri()


def experiment_name(settings: RunnerConfig, job: Job) -> str:
    """logger.experiment_name, else the sweep dir for a sweep's jobs, else `runner`."""
    if settings.logger.experiment_name:
        return settings.logger.experiment_name
    return str(job.sweep_dir) if job.sweep_dir is not None else "runner"


def flat_params(cfg: DictConfig) -> dict[str, str]:
    """The composed config, resolved, as dotted keys with text values."""
    flat: dict[str, str] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict) and node:
            for key, value in node.items():
                walk(value, f"{prefix}{key}.")
        else:
            flat[prefix[:-1]] = str(node)[:MAX_PARAM_CHARS]

    walk(OmegaConf.to_container(cfg, resolve=True), "")
    return flat


def tags(settings: RunnerConfig, run_dir: Path) -> dict[str, str]:
    return {
        "task": settings.task.name,
        "algo": settings.algo.name,
        "env": settings.env.name,
        "hardware": settings.hardware.name,
        "compile": "off" if settings.compile.backend is None else settings.compile.backend,
        "run_dir": str(run_dir),
    }


def mlflow_client(uri_setting: str | None) -> Any:
    from mlflow.tracking import MlflowClient

    # A tracking server that does not answer is one line within seconds, not minutes
    # of MLflow's default retries.
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    logging.getLogger("urllib3").setLevel(logging.ERROR)
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    return MlflowClient(tracking_uri(uri_setting))


def mlflow_experiment(uri_setting: str | None, name: str) -> tuple[Any, str]:
    """(MlflowClient, experiment id) for experiment `name`, created with its artifact root
    when new; an unreachable store is one line."""
    uri = tracking_uri(uri_setting)
    client = mlflow_client(uri_setting)
    try:
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            try:
                client.create_experiment(name, artifact_location=artifact_root(uri_setting, name))
            except Exception:
                if client.get_experiment_by_name(name) is None:  # not a parallel job's
                    raise
            experiment = client.get_experiment_by_name(name)
    except Exception as ex:
        raise ConfigError(
            f"logger=mlflow: cannot reach the tracking store {uri}: "
            f"{type(ex).__name__}: {str(ex).splitlines()[0]}; fix logger.tracking_uri"
        ) from ex
    return client, experiment.experiment_id


def learning_curve(run_dir: Path) -> None:
    """learning_curve.png from metrics.jsonl: the (last known) episode return mean over
    env steps, for the tracker's artifacts."""
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    points = [
        (r["env_steps"], r["last_episode_return_mean"])
        for r in rows
        if r.get("env_steps") is not None and r.get("last_episode_return_mean") is not None
    ]
    if points:
        plots.lines(
            run_dir / "learning_curve.png",
            {"episode return mean": points},
            "env steps",
            "episode return mean",
        )


class NoTracker:
    """logger=none: the run dir is the record."""

    def log_row(self, row: dict[str, Any]) -> None:
        return None

    def finish(self, run_dir: Path, status: str) -> None:
        return None


class MlflowTracker:
    """One MLflow run, through MlflowClient (no process-wide active run: a sweep's jobs
    may run in one process)."""

    def __init__(self, settings: RunnerConfig, job: Job) -> None:
        from mlflow.entities import Param

        name = experiment_name(settings, job)
        self.client, experiment_id = mlflow_experiment(settings.logger.tracking_uri, name)
        shown = [o for o in job.overrides if not o.startswith("logger")]
        run_name = (
            f"job {job.number}: {' '.join(shown)}"
            if job.sweep_dir is not None
            else job.run_dir.name
        )
        tagged = tags(settings, job.run_dir)
        run = self.client.create_run(experiment_id, run_name=run_name, tags=tagged)
        self.run_id = run.info.run_id
        params = [Param(k, v) for k, v in flat_params(job.cfg).items()]
        for i in range(0, len(params), BATCH):
            self.client.log_batch(self.run_id, params=params[i : i + BATCH])

    def log_row(self, row: dict[str, Any]) -> None:
        """One iteration's headline figures (the numbers), at its iteration."""
        from mlflow.entities import Metric

        now, step = int(time.time() * 1000), int(row["iteration"])
        metrics = [
            Metric(key, float(value), now, step)
            for key, value in row.items()
            if isinstance(value, int | float) and not isinstance(value, bool) and key != "iteration"
        ]
        self.client.log_batch(self.run_id, metrics=metrics)

    def finish(self, run_dir: Path, status: str) -> None:
        """The run's result files and plots as artifacts, then its end status. A store
        that fails now is a warning: the run's own error, if any, is what goes up."""
        try:
            self._finish(run_dir, status)
        except Exception as ex:
            log.warning("logger=mlflow: the run's end was not logged: %s", one_line(ex))

    def _finish(self, run_dir: Path, status: str) -> None:
        learning_curve(run_dir)
        files = [run_dir / name for name in ARTIFACTS] + sorted(run_dir.glob("**/*.png"))
        for path in files:
            if path.is_file():
                folder = path.parent.relative_to(run_dir).as_posix()
                self.client.log_artifact(self.run_id, str(path), None if folder == "." else folder)
        self.client.set_terminated(self.run_id, status)


def start(settings: RunnerConfig, job: Job) -> NoTracker | MlflowTracker:
    """The run's tracker (validate checked logger.name)."""
    if settings.logger.name == "mlflow":
        return MlflowTracker(settings, job)
    return NoTracker()
