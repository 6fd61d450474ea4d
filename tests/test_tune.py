"""Search and track, for real. The README's "Search and track" commands run here (a Ray
Tune search of 4 tiny PPO CartPole trials, 2 at a time, logged to MLflow's default local
store; its resume; its best trial as an experiment; a training run evaluated during
training and logged to MLflow and an offline W&B run at once, then evaluated from its best
checkpoint; a 2-job sweep logged to both), then what they wrote is read back: trials.csv
and Tune's own experiment, best.yaml, MLflow's runs with its own client, the W&B runs'
records, progress.csv and TensorBoard's events. A search interrupted with SIGINT is
continued with resume=. Bad input of the search: one line each."""

from __future__ import annotations

import csv
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import cli_call
import pytest
import yaml
from conftest import cli_env, compose_config, prepared, run_cli
from readme import commands
from test_readme import run_block
from wandb_records import offline_run

import runner
from runner.errors import ConfigError, RunnerError, one_line
from runner.results import checkpoints
from runner.settings.schema import typed
from runner.tasks.tune import _callbacks

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

README_SECTION = "Search and track"
DOCS_SECTION = "Studies and populations"  # docs/search.md's, run after the README's
RETURN = "env_runners/episode_return_mean"
EVAL_RETURN = f"evaluation/{RETURN}"
KEYS = [
    "algo.training.lr",
    "algo.training.minibatch_size",
    "algo.training.num_epochs",
    "scaling.num_envs_per_env_runner",
]
# 4 iterations of 500 env steps a trial: the searched minibatch sizes fit in the batch.
SMALL_SEARCH = (
    "task=tune",
    "search=ppo_cartpole",
    "stop.env_steps=2000",
    "algo.training.train_batch_size_per_learner=500",
)


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> Path:
    """The section's outputs/ dir; beside it, printed.json: what each command printed."""
    cwd = tmp_path_factory.mktemp("readme")
    printed = run_block([c.text for c in commands() if c.section == README_SECTION], cwd)
    printed |= run_block([c.text for c in commands() if c.section == DOCS_SECTION], cwd)
    (cwd / "printed.json").write_text(json.dumps(printed))
    return cwd / "outputs"


def printed(outputs: Path, fragment: str) -> str:
    """What the section's command containing `fragment` printed."""
    (out,) = [
        o
        for c, o in json.loads((outputs.parent / "printed.json").read_text()).items()
        if fragment in c
    ]
    return out


@pytest.fixture(scope="module")
def mlflow_client(outputs: Path) -> MlflowClient:
    """MLflow's own client on the default store the README's commands logged to (MLflow,
    and TensorBoard's reader below, imported where used: each xdist worker imports this
    module to collect it, and its fast tests read neither)."""
    from mlflow.tracking import MlflowClient

    return MlflowClient(f"sqlite:///{outputs / 'mlflow.db'}")


@pytest.mark.slow
def test_search_writes_every_trial_and_asha_stops_the_trailing_ones(outputs: Path):
    rows = _rows(outputs / "search" / "trials.csv")
    assert [int(r["trial"]) for r in rows] == [1, 2, 3, 4]
    statuses = {r["status"] for r in rows}
    assert statuses <= {"finished", "early_stopped"}, rows
    assert "early_stopped" in statuses and "finished" in statuses, rows
    for r in rows:
        steps = float(r["env_steps"])
        if r["status"] == "finished":
            assert steps >= 2000 and r["stop_reason"].startswith("env_steps")
        else:  # ASHA compared it at a rung before the budget and stopped it
            assert steps < 2000 and r["stop_reason"] == "stopped early by ASHA"
        assert float(r["best_objective"]) >= float(r["objective"]) > 0
    # Trial 1 ran the preset's own values (conf/algo/ppo.yaml, conf/scaling/default.yaml).
    assert [rows[0][k] for k in KEYS] == ["0.005", "250", "10", "8"]
    # Tune's own experiment agrees with trials.csv.
    from ray.tune import ExperimentAnalysis

    trials = ExperimentAnalysis(str(outputs / "search" / "tune")).trials
    assert {t.trial_id for t in trials} == {r["trial_id"] for r in rows}
    # A trial's actor runs a later trial: 4 trials, 2 at a time, in fewer processes.
    assert len({t.last_result["pid"] for t in trials}) < len(trials)
    summary = json.loads((outputs / "search" / "summary.json").read_text())
    best = max((r for r in rows if r["status"] == "finished"), key=lambda r: float(r["objective"]))
    assert summary["status"] == "finished"
    assert summary["best"]["trial"] == int(best["trial"])
    assert summary["preset"]["trial"] == 1
    for plot in ("trials_objective.png", "trials_best_so_far.png"):
        assert (outputs / "search" / plot).stat().st_size > 1000


@pytest.mark.slow  # its module's trained run
def test_the_search_keeps_its_study_and_reports_importances(outputs: Path):
    """The study is in the run dir's SQLite (optuna-dashboard listed its 4 trials: the
    section's block checks it), each trial told its final objective; the summary gives
    fANOVA's importances of the 4 searched keys."""
    import optuna

    search = outputs / "search"
    summary = json.loads((search / "summary.json").read_text())
    storage = f"sqlite:///{search.resolve() / 'optuna.db'}"
    assert summary["study"] == {"storage": storage, "name": str(search.resolve())}
    study = optuna.load_study(study_name=summary["study"]["name"], storage=storage)
    objectives = sorted(float(r["objective"]) for r in _rows(search / "trials.csv"))
    assert sorted(t.value for t in study.trials) == pytest.approx(objectives)
    assert {t.state.name for t in study.trials} == {"COMPLETE"}
    shares = summary["importances"]
    assert set(shares) == set(KEYS) and sum(shares.values()) == pytest.approx(1, abs=1e-3)
    assert "parameter importances (fANOVA): " in printed(outputs, "task=tune search=ppo_cartpole ")


@pytest.mark.slow  # its module's trained run
def test_a_population_trial_continues_with_its_mutated_lr(outputs: Path):
    """PBT's exploit: the trailing trial continues from one of the leading trial's
    checkpoints (its iterations go on from there) with a mutated lr, which RLlib's Learner
    really uses afterwards (its optimizer's learning rate metric), and which Tune's record
    of the trial's config ends with (ray-project/ray#62173: values dropped after a
    restore)."""
    tune_dir = outputs / "pbt" / "tune"
    # Each exploit, in order: [trailing trial, leading trial, their iterations, the leading
    # trial's values, the values the trailing one continues with].
    exploits = [json.loads(line) for line in (tune_dir / "pbt_global.txt").read_text().splitlines()]
    assert exploits, "no trial exploited another"
    trailing, _, _, _, before, after = exploits[0]
    assert after["algo.training.lr"] != before["algo.training.lr"]
    number = int(trailing.split("_")[0])
    (trial,) = [t for t in tune_dir.glob("trial_*") if t.name.endswith(f"_{number:05}")]
    rows = [json.loads(line) for line in (trial / "metrics.jsonl").read_text().splitlines()]
    lr = [r["metrics"]["learners/default_policy/default_optimizer_learning_rate"] for r in rows]
    mutated = next(
        i for i, value in enumerate(lr) if value == pytest.approx(after["algo.training.lr"])
    )
    assert mutated > 0 and all(v == lr[0] for v in lr[:mutated])  # its own lr until then
    # Restored from one of the leading trial's checkpoints (every 3 iterations; Tune's
    # record of where that trial was may lag its newest checkpoint): the iterations go on
    # from that checkpoint's, which the leading trial kept.
    restored_at = rows[mutated]["iteration"] - 1
    assert restored_at % 3 == 0 and restored_at > 0
    leader = [t for t in tune_dir.glob("trial_*") if t != trial]
    assert any((t / "checkpoints" / f"iter_{restored_at:06}").is_dir() for t in leader)
    final = json.loads((trial / "result.json").read_text().splitlines()[-1])["config"]
    (last, *_) = [e[5] for e in reversed(exploits) if e[0] == trailing]
    assert final["algo.training.lr"] == pytest.approx(last["algo.training.lr"])
    assert lr[-1] == pytest.approx(final["algo.training.lr"])
    summary = json.loads((outputs / "pbt" / "summary.json").read_text())
    assert summary["scheduler"] == "pbt" and summary["study"] is None
    assert summary["importances"] is None  # values changed as trials ran


@pytest.mark.slow  # its module's trained run
def test_best_trial_is_an_experiment_that_runs_with_its_values(outputs: Path):
    best = json.loads((outputs / "search" / "summary.json").read_text())["best"]
    text = (outputs / "search" / "experiment" / "best.yaml").read_text()
    assert text.startswith("# @package _global_\n")
    written = yaml.safe_load(text)
    assert written["stop"]["env_steps"] == 2000
    assert written["algo"]["training"]["train_batch_size_per_learner"] == 500
    ran = json.loads((outputs / "best" / "algorithm_config.json").read_text())
    assert ran["lr"] == pytest.approx(best["values"]["algo.training.lr"])
    assert ran["minibatch_size"] == best["values"]["algo.training.minibatch_size"]
    assert ran["num_epochs"] == best["values"]["algo.training.num_epochs"]
    assert ran["num_envs_per_env_runner"] == best["values"]["scaling.num_envs_per_env_runner"]
    assert json.loads((outputs / "best" / "summary.json").read_text())["status"] == "finished"


@pytest.mark.slow  # its module's trained run
def test_resuming_a_finished_search_reports_the_same_trials(outputs: Path):
    before = _rows(outputs / "search" / "trials.csv")
    after = _rows(outputs / "search_resumed" / "trials.csv")
    assert [r["trial_id"] for r in after] == [r["trial_id"] for r in before]
    assert [r["objective"] for r in after] == [r["objective"] for r in before]


@pytest.mark.slow  # its module's trained run
def test_mlflow_holds_one_run_per_trial_with_its_values(outputs: Path, mlflow_client):
    experiment = mlflow_client.get_experiment_by_name(str((outputs / "search").resolve()))
    runs = mlflow_client.search_runs([experiment.experiment_id])
    rows = {r["trial_id"]: r for r in _rows(outputs / "search" / "trials.csv")}
    assert sorted(run.info.run_name for run in runs) == sorted(f"trial_{i}" for i in rows)
    for run in runs:
        row = rows[run.info.run_name.removeprefix("trial_")]
        assert run.info.status == "FINISHED"
        lr = float(row["algo.training.lr"])
        assert float(run.data.params["algo.training.lr"]) == pytest.approx(lr)
        history = mlflow_client.get_metric_history(run.info.run_id, "episode_return_mean")
        assert len(history) == int(row["iterations"])
        assert history[-1].value == pytest.approx(float(row["objective"]))
        assert run.data.tags["task"] == "tune" and run.data.tags["algo"] == "PPO"


@pytest.mark.slow  # its module's trained run
def test_mlflow_holds_the_training_run_with_params_metrics_and_artifacts(
    outputs: Path, mlflow_client
):
    experiment = mlflow_client.get_experiment_by_name("runner")
    runs = mlflow_client.search_runs([experiment.experiment_id])
    assert sorted(r.info.run_name for r in runs) == ["tracked", "tracked_eval"]
    (run,) = [r for r in runs if r.info.run_name == "tracked"]
    assert run.info.status == "FINISHED"
    params = run.data.params
    # The run's settings as composed: the README's command with debug=tiny (conf/debug/).
    assert params["algo.name"] == "PPO" and params["scaling.num_envs_per_env_runner"] == "2"
    assert params["algo.training.train_batch_size_per_learner"] == "400"
    assert {k: run.data.tags[k] for k in ("task", "algo", "env", "hardware", "compile")} == {
        "task": "train",
        "algo": "PPO",
        "env": "CartPole-v1",
        "hardware": "cpu",
        "compile": "off",
    }
    lines = [json.loads(line) for line in (outputs / "tracked" / "metrics.jsonl").open()]
    for name in (RETURN, EVAL_RETURN, "training_iteration"):
        history = mlflow_client.get_metric_history(run.info.run_id, name)
        assert [(m.step, m.value) for m in history] == [
            (r["env_steps"], pytest.approx(r["metrics"][name])) for r in lines
        ]
    # Every metric, under RLlib's names (W&B's: below).
    assert set(run.data.metrics) == {k for r in lines for k in r["metrics"]}
    artifacts = {a.path for a in mlflow_client.list_artifacts(run.info.run_id)}
    assert {"summary.json", "plan.json", "learning_curve.png"} <= artifacts
    local = Path(mlflow_client.download_artifacts(run.info.run_id, "summary.json"))
    assert json.loads(local.read_text()) == json.loads(
        (outputs / "tracked" / "summary.json").read_text()
    )


@pytest.mark.slow  # its module's trained run
def test_mlflow_holds_a_sweep_as_one_experiment_with_a_run_per_job(outputs: Path, mlflow_client):
    experiment = mlflow_client.get_experiment_by_name("outputs/tracked_sweep")
    runs = mlflow_client.search_runs([experiment.experiment_id])
    assert sorted(run.data.params["seed"] for run in runs) == ["1", "2"]
    for run in runs:
        assert run.info.status == "FINISHED"
        assert run.info.run_name.startswith(f"job {int(run.data.params['seed']) - 1}: ")
        history = mlflow_client.get_metric_history(run.info.run_id, "training_iteration")
        assert [m.value for m in history] == [1, 2]
    # Each job's W&B run, grouped by the sweep.
    for job in ("0", "1"):
        recorded = offline_run(outputs / "tracked_sweep" / job)
        assert recorded["group"] == "outputs/tracked_sweep" and len(recorded["history"]) == 2


def _lines(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").open()]


@pytest.mark.slow  # its module's trained run
def test_wandb_gets_every_metric_under_rllibs_names_on_env_steps(outputs: Path):
    run = outputs / "tracked"
    lines = _lines(run)
    steps = [line["env_steps"] for line in lines]
    assert len(lines) == 4 and steps == sorted(set(steps))
    recorded = offline_run(run)
    assert recorded["project"] == "rllib-runner" and recorded["exit_code"] == 0
    assert recorded["config"]["algo"]["name"] == "PPO"
    history = recorded["history"]
    assert [h["_step"] for h in history] == steps
    for h, line in zip(history, lines, strict=True):
        logged = {k: v for k, v in h.items() if not k.startswith(("_", "videos/"))}
        assert logged == pytest.approx(line["metrics"])
    summary = json.loads((run / "summary.json").read_text())
    assert recorded["summary"]["status"] == "FINISHED"
    video = "videos/iter_000004-episode-0"  # logged when the run ends, at its last step
    assert recorded["summary"][f"{video}/_type"] == "video-file"
    assert recorded["summary"]["best_eval_return_mean"] == pytest.approx(
        summary["best_eval_return_mean"]
    )
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars(EVAL_RETURN)] == steps


@pytest.mark.slow  # its module's trained run
def test_progress_csv_has_a_row_per_iteration_and_a_column_per_metric(outputs: Path):
    lines = _lines(outputs / "tracked")
    with (outputs / "tracked" / "progress.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [int(r["training_iteration"]) for r in rows] == [1, 2, 3, 4]
    assert set(rows[0]) == {k for line in lines for k in line["metrics"]}
    assert [float(r[EVAL_RETURN]) for r in rows] == pytest.approx(
        [line["metrics"][EVAL_RETURN] for line in lines]
    )


@pytest.mark.slow  # its module's trained run
def test_evaluation_during_training_is_on_the_progress_line_and_in_the_summary(outputs: Path):
    run = outputs / "tracked"
    returns = [line["eval_return_mean"] for line in _lines(run)]
    assert all(r is not None for r in returns)
    out = printed(outputs, "eval.every=5")
    rows = [line for line in out.splitlines() if line.startswith("iter ")]
    assert all(f"eval {r:8.2f} |" in row for r, row in zip(returns, rows, strict=True))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["best_eval_return_mean"] == pytest.approx(max(returns))
    assert summary["final_eval_return_mean"] == pytest.approx(returns[-1])
    assert summary["checkpoints_ranked_by"] == "evaluation"
    # What ends the run, once, before the first iteration; the AlgorithmConfig (its
    # evaluation every iteration) in the run dir.
    assert out.count("stops at the first of:") == 1
    assert out.index("stops at the first of:") < out.index("iter    1")
    config = json.loads((run / "algorithm_config.json").read_text())
    assert config["evaluation_interval"] == 1
    assert (run / "learning_curve.png").stat().st_size > 1000


@pytest.mark.slow  # its module's trained run
def test_the_best_checkpoint_is_the_best_evaluated_and_evaluate_takes_it(outputs: Path):
    run = outputs / "tracked"
    lines = _lines(run)
    best = max(lines, key=lambda line: line["eval_return_mean"])["iteration"]
    kept = checkpoints.complete(run)  # keep=1: the newest; keep_best=1: the best
    assert kept == sorted({checkpoints.checkpoint_dir(run, i) for i in (best, 4)})
    best_dir = checkpoints.checkpoint_dir(run, best)
    assert checkpoints.best(run) == best_dir
    summary = json.loads((run / "summary.json").read_text())
    assert summary["best_checkpoint"] == str(best_dir.resolve())
    evaluated = json.loads((outputs / "tracked_eval" / "eval.json").read_text())
    assert evaluated["checkpoint"] == str(best_dir.resolve())


def test_wandb_without_its_package_is_one_line(monkeypatch):
    """The wandb package cannot be uninstalled from the tests' environment: a None in
    sys.modules makes it unimportable for this check, as a missing package is."""
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ConfigError, match=r"^logger=wandb needs the wandb package: pip install"):
        prepared(["logger=wandb", "logger.wandb.mode=offline"])


def test_a_search_logs_each_trial_through_tunes_own_wandb_callback():
    from ray.air.integrations.wandb import WandbLoggerCallback

    from runner.job.task import TaskRun

    overrides = ["task=tune", "search=ppo_cartpole", "logger=wandb", "logger.wandb.mode=offline"]
    settings = typed(compose_config([*overrides, "logger.wandb.tags=[nightly]"]))
    run = TaskRun(settings, None, None, Path("outputs/search"), {}, 0.0)  # type: ignore[arg-type]
    (callback,) = _callbacks(run, None)
    assert isinstance(callback, WandbLoggerCallback)
    assert callback.project == "rllib-runner" and callback.group == "outputs/search"
    assert callback.kwargs == {
        "entity": None,
        "tags": ["nightly", "PPO", "CartPole-v1"],
        "mode": "offline",
    }


def _wait_for_results(tune_dir: Path, lines: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = [
            p
            for p in tune_dir.glob("trial_*/result.json")
            if len(p.read_text().splitlines()) >= lines
        ]
        if len(done) >= 2:
            return
        time.sleep(0.5)
    raise AssertionError(f"no two trials reported {lines} results within {timeout} s")


@pytest.mark.slow
def test_interrupted_search_exits_130_and_resume_finishes_it(tmp_path: Path):
    # A budget of 8 iterations a trial, so the signal lands while the search runs (with 4,
    # a fast machine could finish the search before Tune's result files showed two).
    args = [*SMALL_SEARCH, "stop.env_steps=4000", "task.num_samples=4", "hydra.run.dir=first"]
    # The CLI as a process of its own (the signal's target), its trials on the shared Ray
    # (a Ray of the search's own is tests/test_faults.py's sweep's).
    search = cli_call.start(tmp_path, args, cli_env(), merged=False)
    try:
        _wait_for_results(tmp_path / "first" / "tune", 2, timeout=240)
        os.kill(search.pid, signal.SIGINT)
        ended = search.wait(timeout=120)
    finally:
        search.kill()
    err = ended.stderr
    assert ended.returncode == 130, err[-3000:]
    assert err.strip().splitlines()[-1].startswith("error: search interrupted with ")
    assert "continue it with resume=" in err
    first = _rows(tmp_path / "first" / "trials.csv")
    assert "not_finished" in {r["status"] for r in first} or len(first) < 4
    assert json.loads((tmp_path / "first" / "summary.json").read_text())["status"] == "interrupted"

    changed = run_cli(tmp_path, f"resume={tmp_path / 'first'}", "stop.env_steps=3000", run_dir="x")
    assert changed.returncode == 2, changed.stderr
    assert changed.stderr.strip().splitlines() == [
        f"error: resume={tmp_path / 'first'} continues a search as it began; drop the stop.* "
        "overrides (Ray Tune restores the search's own), or start a new search"
    ]
    resumed = run_cli(tmp_path, f"resume={tmp_path / 'first'}", run_dir="second")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    second = _rows(tmp_path / "second" / "trials.csv")
    assert len(second) == 4
    assert {r["status"] for r in second} <= {"finished", "early_stopped"}
    # The trials that had finished kept their results; the earlier run dir is as it was.
    finished = {r["trial_id"]: r["objective"] for r in first if r["status"] != "not_finished"}
    assert {r["trial_id"]: r["objective"] for r in second if r["trial_id"] in finished} == finished
    assert _rows(tmp_path / "first" / "trials.csv") == first
    # The resumed search continued its study, where the search began: every trial told.
    import optuna

    kept = json.loads((tmp_path / "second" / "summary.json").read_text())["study"]
    assert kept["storage"] == f"sqlite:///{(tmp_path / 'first').resolve() / 'optuna.db'}"
    study = optuna.load_study(study_name=kept["name"], storage=kept["storage"])
    told = [t.value for t in study.trials if t.state.name == "COMPLETE"]
    assert sorted(told) == pytest.approx(sorted(float(r["objective"]) for r in second))


def test_searched_values_apply_through_the_schema_and_rllib():
    """The search space composes typed; each sampled value is checked by RLlib's builder."""
    cfg = compose_config(["task=tune", "search=ppo_cartpole"])
    assert list(cfg.search.space) == KEYS
    assert cfg.search.space["algo.training.lr"].loguniform == [1.0e-4, 1.0e-2]
    assert cfg.stop.env_steps == 30000 and cfg.algo.name == "PPO"
    dqn = compose_config(["task=tune", "search=dqn_cartpole"])
    assert dqn.algo.name == "DQN" and "algo.training.n_step" in dqn.search.space


SPACE = "task=tune", "stop.env_steps=1000"
BAD = {
    "a search without a space": (["task=tune"], "task=tune needs a search space"),
    "a key that is no section": (
        [*SPACE, "+search.space={algo.trainin.lr: {choice: [0.1]}}"],
        "'algo.trainin.lr' is not a key of the composed config",
    ),
    "a misspelled typed key": (
        [*SPACE, "+search.space={scaling.num_envs_per_env_runnr: {choice: [2]}}"],
        "(did you mean num_envs_per_env_runner",
    ),
    "a key RLlib does not take": (
        [*SPACE, "+search.space={algo.training.lrr: {choice: [0.1]}}"],
        "takes no 'lrr' (did you mean lr?)",
    ),
    "an empty choice list": (
        [*SPACE, "+search.space={algo.training.lr: {choice: []}}"],
        "the choice list is empty",
    ),
    "a misspelled distribution": (
        [*SPACE, "+search.space={algo.training.lr: {logunifrom: [0.001, 0.01]}}"],
        "did you mean loguniform",
    ),
    "a loguniform from 0": (
        [*SPACE, "+search.space={algo.training.lr: {loguniform: [0, 0.01]}}"],
        "loguniform needs low > 0",
    ),
    "a key that sizes each trial": (
        [*SPACE, "+search.space={scaling.num_env_runners: {choice: [1, 2]}}"],
        "each trial's resources are reserved before it samples",
    ),
    "no trials": (
        ["task=tune", "search=ppo_cartpole", "task.num_samples=0"],
        "must each be at least 1",
    ),
    "more trials at once than the machine holds": (
        ["task=tune", "search=ppo_cartpole", "task.max_concurrent=3"],
        "lower task.max_concurrent",
    ),
    "a value RLlib rejects": (
        [*SMALL_SEARCH[:3], "algo.training.train_batch_size_per_learner=200"],
        "minibatch_size",
    ),
    "no budget to compare trials at": (
        ["task=tune", "search=ppo_cartpole", "stop.env_steps=null"],
        "set stop.env_steps or stop.iterations",
    ),
    "an unreachable tracking server": (
        ["logger=mlflow", "logger.mlflow.tracking_uri=http://127.0.0.1:9"],
        "logger=mlflow: cannot reach the tracking store http://127.0.0.1:9",
    ),
    "an unknown logger": (["logger=neptune"], "unknown option 'neptune' for config group 'logger'"),
    "a storage that is no database URL": (
        ["task=tune", "search=ppo_cartpole", "task.storage=optuna.db"],
        "task.storage=optuna.db: Could not parse SQLAlchemy URL",
    ),
    "mutations without a population": (
        [
            "task=tune",
            "search=ppo_cartpole",
            "+search.mutations={algo.training.lr: {uniform: [0, 1]}}",
        ],
        "which only population-based training does: set search.scheduler=pbt",
    ),
    "a population without mutations": (
        ["task=tune", "search=ppo_cartpole", "search.scheduler=pbt"],
        "search.scheduler=pbt needs search.mutations",
    ),
    "PB2 given a choice": (
        [
            "task=tune",
            "search=ppo_cartpole_pbt",
            "search.scheduler=pb2",
            "+search.mutations={algo.training.gamma: {choice: [0.9, 0.99]}}",
        ],
        "search.mutations.'algo.training.gamma': PB2 picks values within [low, high]: give "
        "it uniform or loguniform, not choice",
    ),
    "a synchronous population larger than what runs at once": (
        ["task=tune", "search=ppo_cartpole_pbt", "search.synch=true", "task.num_samples=4"],
        "only task.max_concurrent=2 of task.num_samples=4 run at once",
    ),
    "an unknown scheduler": (
        ["task=tune", "search=ppo_cartpole", "search.scheduler=hyperband"],
        "search.scheduler",
    ),
}


@pytest.mark.parametrize("name", BAD)
def test_bad_search_input_fails_fast_in_one_line(name: str, tmp_path: Path, monkeypatch):
    """Each refused in one line within seconds, in-process as `runner.run()` runs it (the
    CLI prints that line: tests/test_bad_input.py), nothing started or written."""
    monkeypatch.chdir(tmp_path)
    start = time.perf_counter()
    with pytest.raises(RunnerError) as refused:
        runner.run([*BAD[name][0], "hydra.run.dir=run"])
    line = one_line(refused.value)
    assert "\n" not in line and BAD[name][1] in line, line
    assert time.perf_counter() - start < 10
    assert set(tmp_path.iterdir()) <= {tmp_path / "run"}
    assert not (tmp_path / "run" / "tune").exists()
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.slow
def test_a_trial_stops_at_its_check_as_a_run_does(tmp_path: Path):
    """Each trial is the one training loop: check.* stops it once met (its verdict in
    trials.csv), and it writes metrics.jsonl in the run's format in its own dir."""
    result = run_cli(
        tmp_path,
        *SMALL_SEARCH,
        "task.num_samples=2",
        "task.searcher=random",
        "check.threshold=10",
        "check.env_steps=2000",
        run_dir="checked",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = _rows(tmp_path / "checked" / "trials.csv")
    assert len(rows) == 2
    for row in rows:
        assert row["check"] == "passed", row
        assert row["stop_reason"].startswith("check passed: env_runners/episode_return_mean")
        assert float(row["env_steps"]) < 2000  # stopped by the check, not the budget
    for trial_dir in (tmp_path / "checked" / "tune").glob("trial_*"):
        lines = (trial_dir / "metrics.jsonl").read_text().splitlines()
        first = json.loads(lines[0])
        assert first["iteration"] == 1 and "env_runners/episode_return_mean" in first["metrics"]
        assert (trial_dir / "checkpoints").is_dir()


def test_a_population_search_builds_tunes_scheduler_and_checkpoints_at_each_perturbation():
    """search.scheduler=pbt|pb2 become Tune's PBT (the mutations as Tune's domains) and PB2
    (their [low, high] as bounds), perturbing on iterations; the trials checkpoint at
    least every perturbation and start from a random population, with no study."""
    from ray.tune.schedulers import PopulationBasedTraining
    from ray.tune.schedulers.pb2 import PB2

    from runner.tasks import tune

    for name, kind in (("pbt", PopulationBasedTraining), ("pb2", PB2)):
        settings = typed(
            compose_config(["task=tune", "search=ppo_cartpole_pbt", f"search.scheduler={name}"])
        )
        scheduler = tune._scheduler(settings)
        assert type(scheduler) is kind
        assert tune.for_population(settings).checkpoint.every == 4  # conf: every 10
    pb2 = tune._scheduler(settings)
    assert pb2._hyperparam_bounds == {  # Tune keeps them as given
        "algo.training.lr": [1.0e-4, 1.0e-2],
        "algo.training.entropy_coeff": [0.0, 0.02],
    }
    asha = typed(compose_config(["task=tune", "search=ppo_cartpole"]))
    assert tune.for_population(asha) is asha
