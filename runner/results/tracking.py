"""Experiment tracking beside the run dir and its TensorBoard events (`logger=`): any of
MLflow and Weights & Biases (runner/results/wandb_logger.py), each fed the same metrics.

Every logger gets every numeric metric of each iteration under RLlib's own names
(`env_runners/episode_return_mean`), with the env steps sampled so far as its step and
the iteration as the metric `training_iteration`.

With `logger=mlflow` a run becomes one MLflow run: the flattened composed config as
params; task, algo, env, hardware and compile as tags; the metrics; summary.json,
plan.json (and eval.json, trials.csv) and the plots as artifacts when it ends, with its
status. A sweep's jobs share one MLflow experiment named after the sweep dir; a search
logs one run per trial through Ray Tune's own `MLflowLoggerCallback` (runner/tasks/tune.py).

The default store is a SQLite file under outputs/ (MLflow 3 refuses its file store),
with artifacts beside it: no server to start.
"""

from __future__ import annotations

import logging
import os
import re
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from runner.errors import ConfigError, one_line
from runner.job import Job
from runner.results.files import env_step
from runner.settings.schema import RunnerConfig

DEFAULT_STORE = Path("outputs")
ARTIFACTS = ("summary.json", "plan.json", "eval.json", "bench.json", "trials.csv")
# MLflow's limits: values per param, params and metrics per log_batch call.
MAX_PARAM_CHARS = 6000
BATCH = 100
METRIC_BATCH = 1000
# MLflow takes these in a metric name; RLlib's names use no others, a user's module id may.
NOT_IN_A_METRIC_NAME = re.compile(r"[^\w\-. :/]")
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
    """logger.mlflow.experiment_name, else the sweep dir for a sweep's jobs, else `runner`."""
    assert settings.logger.mlflow is not None
    if settings.logger.mlflow.experiment_name:
        return settings.logger.mlflow.experiment_name
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


def tags(settings: RunnerConfig, run_dir: Path, compiled: str) -> dict[str, str]:
    """`compiled`: the compile preset the run uses (compile=auto's choice), or "off"."""
    return {
        "task": settings.task.name,
        "algo": settings.algo.name,
        "env": settings.env.name,
        "hardware": settings.hardware.name,
        "compile": compiled,
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
            f"{type(ex).__name__}: {str(ex).splitlines()[0]}; fix logger.mlflow.tracking_uri"
        ) from ex
    return client, experiment.experiment_id


class MlflowTracker:
    """One MLflow run, through MlflowClient (no process-wide active run: a sweep's jobs
    may run in one process)."""

    def __init__(self, settings: RunnerConfig, job: Job, compiled: str) -> None:
        from mlflow.entities import Param

        assert settings.logger.mlflow is not None
        name = experiment_name(settings, job)
        self.client, experiment_id = mlflow_experiment(settings.logger.mlflow.tracking_uri, name)
        tagged = tags(settings, job.run_dir, compiled)
        run = self.client.create_run(experiment_id, run_name=job.display_name, tags=tagged)
        self.run_id = run.info.run_id
        params = [Param(k, v) for k, v in flat_params(job.cfg).items()]
        for i in range(0, len(params), BATCH):
            self.client.log_batch(self.run_id, params=params[i : i + BATCH])

    def log(self, row: dict[str, Any], metrics: dict[str, float]) -> None:
        """One iteration's metrics, at its env steps."""
        from mlflow.entities import Metric

        now, step = int(time.time() * 1000), env_step(row)
        logged = [
            Metric(NOT_IN_A_METRIC_NAME.sub("_", key), value, now, step)
            for key, value in metrics.items()
        ]
        for i in range(0, len(logged), METRIC_BATCH):
            self.client.log_batch(self.run_id, metrics=logged[i : i + METRIC_BATCH])

    def finish(self, run_dir: Path, status: str) -> None:
        """The run's result files and plots as artifacts, then its end status. A store
        that fails now is a warning: the run's own error, if any, is what goes up."""
        try:
            self._finish(run_dir, status)
        except Exception as ex:
            log.warning("logger=mlflow: the run's end was not logged: %s", one_line(ex))

    def _finish(self, run_dir: Path, status: str) -> None:
        files = [run_dir / name for name in ARTIFACTS] + sorted(run_dir.glob("**/*.png"))
        for path in files:
            if path.is_file():
                folder = path.parent.relative_to(run_dir).as_posix()
                self.client.log_artifact(self.run_id, str(path), None if folder == "." else folder)
        self.client.set_terminated(self.run_id, status)


class Trackers:
    """The loggers a run feeds (none, one or several), fed alike."""

    def __init__(self, trackers: list[Any] | None = None) -> None:
        self.trackers = trackers or []

    def log(self, row: dict[str, Any], metrics: dict[str, float]) -> None:
        for tracker in self.trackers:
            tracker.log(row, metrics)

    def finish(self, run_dir: Path, status: str) -> None:
        for tracker in self.trackers:
            tracker.finish(run_dir, status)


def start(settings: RunnerConfig, job: Job, compiled: str) -> Trackers:
    """The run's loggers, each started (validate checked that each can be); `compiled`:
    the compile preset, for MLflow's tags."""
    trackers: list[Any] = []
    if settings.logger.mlflow is not None:
        trackers.append(MlflowTracker(settings, job, compiled))
    if settings.logger.wandb is not None:
        from runner.results.wandb_logger import WandbTracker

        trackers.append(WandbTracker(settings, job))
    return Trackers(trackers)
