"""Faults, for real: signals to the CLI's process (sent from Python: a shell's
background job ignores SIGINT), SIGKILL to a real EnvRunner and Learner actor, a NaN
reward, a stall, truncated and bit-flipped checkpoints, and a sweep interrupted in its
second job and run again. Each asserts the exit code, what is on disk, and that what was
kept resumes."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import cli_call
import pytest
import ray
from conftest import cli_env, run_cli
from ray.rllib.algorithms.ppo import PPOConfig

from runner.__main__ import _refuse_used_run_dir as refuse_used_run_dir
from runner.errors import RunnerError
from runner.job import guard
from runner.job.loop import learners_in_service
from runner.machine.ray_session import descendants
from runner.machine.shutdown import stall_bound
from runner.results import checkpoints
from runner.settings.schema import WatchdogConfig

TESTS = Path(__file__).resolve().parent
FAULTY_ENV = ("env.entry_point=faulty_env:FaultyCartPole",)
WITH_TESTS = {"PYTHONPATH": str(TESTS)}  # the runs import faulty_env from here
# A tiny local run whose rewards turn NaN at step 250 of each env copy (iteration 2).
NAN_AT_250 = (
    "debug=tiny",
    *FAULTY_ENV,
    "+env.env_config.nan_at_step=250",
    "scaling.num_env_runners=0",
)


class Cli:
    """`python -m runner` as a process of its own (tests/cli_call.py: the signal's
    target), with a Ray of its own (the processes it leaves behind are its descendants)
    unless not `own_ray`; its output read line by line as it comes."""

    def __init__(self, cwd: Path, *args: str, own_ray: bool = True) -> None:
        self.run = cli_call.start(cwd, list(args), cli_env(own_ray, WITH_TESTS))
        self.pid = self.run.pid
        self.lines: list[str] = []
        self.processes: list[int] = []  # everything it started, when `until` matched
        self.sent_at = 0.0

    def until(self, text: str, then: Callable[[], None]) -> None:
        """Read until a line holds `text`, then note the process tree and call `then`."""
        for line in self.run.lines:
            self.lines.append(line)
            if text in line:
                self.processes = descendants(self.pid)
                self.sent_at = time.monotonic()
                then()
                return
        raise AssertionError(f"'{text}' never came:\n{self.output}")

    def signal_group(self, signum: int) -> None:
        """To every process of its group (it leads one), as `timeout`, `kill -- -<pgid>`
        and a terminal's Ctrl-C send it."""
        os.killpg(self.pid, signum)

    def signal(self, signum: int, times: int = 1) -> None:
        for _ in range(times):
            os.kill(self.pid, signum)
            time.sleep(0.5)

    def wait(self) -> tuple[int, float]:
        """Exit code, and seconds from the fault to the exit."""
        ended = self.run.wait(timeout=120)
        self.lines = ended.stdout.splitlines(keepends=True)
        return ended.returncode, time.monotonic() - self.sent_at

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def left_behind(self) -> list[int]:
        """Processes it started that still run a few seconds after it exited."""
        deadline = time.monotonic() + 10
        while True:
            alive = [p for p in self.processes if _alive(p)]
            if not alive or time.monotonic() > deadline:
                return alive
            time.sleep(0.5)


def record(fault: str, code: int, seconds: float, kept: str, since: str = "the fault") -> None:
    """benchmarks/faults.py sets FAULT_REPORT: each fault's measured outcome goes there
    (`seconds` to the exit, counted from `since`)."""
    if os.environ.get("FAULT_REPORT"):
        row = {"fault": fault, "exit": code, "seconds": seconds, "since": since, "kept": kept}
        with open(os.environ["FAULT_REPORT"], "a") as f:
            f.write(json.dumps(row))
            f.write("\n")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def _actor_pid(root: int, name: str) -> int:
    for pid in descendants(root):
        try:
            if name in Path(f"/proc/{pid}/cmdline").read_text():
                return pid
        except OSError:
            continue
    raise AssertionError(f"no {name} process under {root}")


def _kill_an_env_runner(cli: Cli, at: str = "iter    2") -> tuple[int, float]:
    """SIGKILL to one remote EnvRunner once the run prints `at`; its exit code and the
    seconds from the kill to the exit."""
    cli.until(at, lambda: os.kill(_actor_pid(cli.pid, "ray::SingleAgentEnvRunner"), signal.SIGKILL))
    return cli.wait()


@pytest.mark.slow
def test_sigterm_keeps_the_last_iteration_and_resume_continues(tmp_path: Path, capsys):
    """Kubernetes' preemption: SIGTERM mid-run, with a remote EnvRunner."""
    cli = Cli(
        tmp_path,
        "debug=tiny",
        "scaling.num_env_runners=1",
        "stop.iterations=50",
        "checkpoint.every=1",
        "hydra.run.dir=first",
    )
    cli.until("iter    2", lambda: cli.signal(signal.SIGTERM))
    code, seconds = cli.wait()
    run = tmp_path / "first"
    assert code == 143, cli.output
    assert seconds < 30
    assert "SIGTERM received" not in cli.output  # Ray's C++ handler's stack dump
    assert cli.left_behind() == []
    summary = _summary(run)
    assert summary["status"] == "interrupted" and summary["signal"] == "SIGTERM"
    assert (run / "learning_curve.png").stat().st_size > 1000  # drawn on a signal too
    last = summary["iterations"]
    assert last >= 2
    rows = _jsonl(run / "metrics.jsonl")
    assert [r["iteration"] for r in rows] == list(range(1, last + 1))
    newest = checkpoints.checkpoint_dir(run, last)
    assert summary["checkpoint"] == str(newest)
    assert checkpoints.problem(newest) is None
    manifest = checkpoints.manifest(newest)
    assert manifest["iteration"] == last and manifest["env_steps"] == rows[-1]["env_steps"]
    assert set(manifest["versions"]) == {"runner", "python", "torch", "ray"}
    assert not list((run / "checkpoints").glob(".*"))  # no temporary dir left
    plan = json.loads((run / "plan.json").read_text())
    assert [g["role"] for g in plan["groups"]] == ["main", "env_runner"]
    assert f"resume={run}" in cli.output.splitlines()[-1]
    kept = f"{last} iterations in metrics.jsonl, checkpoint iter_{last}, no Ray process left"
    record("SIGTERM (one remote EnvRunner)", code, seconds, kept)

    # The same run dir is never written into twice (checked before Hydra writes .hydra/).
    with pytest.raises(SystemExit) as refused_dir:
        refuse_used_run_dir([f"hydra.run.dir={run}"])
    assert refused_dir.value.code == 2
    assert "already holds a run's results" in capsys.readouterr().err

    # Resume: the original overrides come back, counting carries on, every file is there.
    resumed = run_cli(tmp_path, f"resume={run}", f"stop.iterations={last + 1}", run_dir="second")
    assert resumed.returncode == 0, resumed.stderr
    more = resumed.jsonl("metrics.jsonl")
    assert [r["iteration"] for r in more] == [last + 1]
    assert more[0]["env_steps"] > rows[-1]["env_steps"]
    assert "learners/default_policy/policy_loss" in more[0]["metrics"]
    assert resumed.json("algorithm_config.json")["_train_batch_size_per_learner"] == 400
    for name in (".hydra/config.yaml", "plan.json", "composed_overrides.yaml"):
        assert (resumed.run_dir / name).is_file(), name
    assert list((resumed.run_dir / "tensorboard").glob("events.out.tfevents.*"))
    done = resumed.json("summary.json")
    assert done["status"] == "finished" and done["stop_reason"].startswith("iterations")
    assert done["resumed_from"] == str(newest) and done["signal"] is None
    assert done["env_steps"] == more[0]["env_steps"] and done["env_steps_per_s"] > 0
    assert done["compile"]["requested"] is False and done["hardware"]["cpus"] >= 1
    compiled = done["compile"]["components"]  # compile=none: no dynamo frame anywhere
    assert {c["component"] for c in compiled} == {"env_runner/0", "env_runner/1", "learner/0"}
    assert all(c["process_frames"] == 0 for c in compiled)
    assert "compile off: 0 dynamo frames" in resumed.stdout
    assert f"iter    {last + 1}" in resumed.stdout

    # A checkpoint whose file was truncated, then one with a flipped bit: refused with
    # one line naming the file and the newest older checkpoint that verifies.
    victim = max(
        (p for p in newest.rglob("*") if p.is_file() and p.name != "manifest.json"),
        key=lambda p: p.stat().st_size,
    )
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])
    refused = run_cli(tmp_path, f"resume={run}", run_dir="third", timeout=60)
    assert refused.returncode == 2
    line = refused.stderr.strip()
    assert "\n" not in line and str(victim) in line and "truncated or overwritten" in line
    assert line.endswith(f"use resume={checkpoints.checkpoint_dir(run, last - 1)}")
    assert refused.seconds < 20
    victim.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])  # the same size
    assert str(victim) in checkpoints.problem(newest)
    record(
        "resume of a truncated checkpoint (a bit-flipped one fails its sha256 the same way)",
        2,
        refused.seconds,
        "refused in one line naming the file and the newest good checkpoint",
        since="the command's start",
    )


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_to_the_process_group_leaves_the_run_whole(signum: int, tmp_path: Path):
    """The signal reaches every process of the CLI's group: its local Ray's processes
    (GCS, raylet) are in a group of their own (runner/machine/ray_session.py), so the
    driver finishes the iteration in flight, checkpoints on a Ray still up, writes its
    record and curve, and exits 128 + n within the grace (20 s) and 10 s more."""
    cli = Cli(
        tmp_path,
        "debug=tiny",
        "scaling.num_env_runners=1",
        "stop.iterations=50",
        "hydra.run.dir=run",
    )
    cli.until("iter    2", lambda: cli.signal_group(signum))
    code, seconds = cli.wait()
    name = signal.Signals(signum).name
    assert code == 128 + signum, cli.output
    assert seconds < 30, cli.output
    assert "Failed to connect to GCS" not in cli.output
    assert cli.left_behind() == []
    run = tmp_path / "run"
    summary = _summary(run)
    assert (summary["status"], summary["signal"]) == ("interrupted", name)
    last = summary["iterations"]
    assert last >= 2
    final = checkpoints.checkpoint_dir(run, last)
    assert summary["checkpoint"] == str(final) and checkpoints.problem(final) is None
    assert (run / "learning_curve.png").stat().st_size > 1000
    kept = f"summary.json, the curve, checkpoint iter_{last}, no Ray process left"
    record(f"{name} to the process group (one remote EnvRunner)", code, seconds, kept)


@pytest.mark.slow
def test_sigterm_while_scaling_auto_measures_ends_as_a_run_does(tmp_path: Path):
    """scaling=auto joins (or starts) Ray, whose SIGTERM handler would dump a C++ stack: a
    signal while a layout samples (inside a Ray call, which gives up on KeyboardInterrupt
    only) is the runner's one line, exit 143, the record. It joins the test process's
    Ray, as a run in a Ray job does: ray.init sets that handler there too."""
    cli = Cli(
        tmp_path,
        "debug=tiny",
        "scaling=auto",
        "scaling.auto.seconds=2",
        "scaling.auto.budget_seconds=600",  # more layouts follow the first, on a slow machine too
        "scaling.auto.vectorize_modes=[sync]",
        f"scaling.auto.cache_dir={tmp_path / 'layouts'}",
        "dry_run=true",
        "hydra.run.dir=run",
        own_ray=False,
    )
    cli.until("scaling=auto [1 of at most", lambda: cli.signal(signal.SIGTERM))
    code, seconds = cli.wait()
    assert code == 143, cli.output
    assert cli.output.strip().splitlines()[-1] == "error: interrupted by SIGTERM"
    assert "SIGTERM received" not in cli.output and "Traceback" not in cli.output
    assert seconds < 15
    summary = _summary(tmp_path / "run")
    assert (summary["status"], summary["signal"]) == ("interrupted", "SIGTERM")
    assert not list((tmp_path / "layouts").glob("*.json"))  # no half measurement cached
    record("SIGTERM while scaling=auto measures", code, seconds, "the record, no cache entry")


@pytest.mark.slow
def test_second_signal_aborts_at_once_and_leaves_whole_files(tmp_path: Path):
    """Both signals land inside iteration 2 (3 s of slow steps on a remote EnvRunner). The
    second is sent once the first was taken: two of one signal sent before the process
    runs its handler reach it as one."""
    cli = Cli(
        tmp_path,
        "debug=tiny",
        *FAULTY_ENV,
        "+env.env_config.step_seconds=0.015",
        "algo.training.train_batch_size_per_learner=200",
        "scaling.num_env_runners=1",
        "stop.iterations=50",
        "hydra.run.dir=run",
    )
    cli.until("iter    1", lambda: (time.sleep(0.5), cli.signal(signal.SIGHUP)))
    cli.until("SIGHUP: stopping after the iteration in flight", lambda: cli.signal(signal.SIGHUP))
    code, seconds = cli.wait()
    assert code == 128 + signal.SIGHUP, cli.output
    assert seconds < 10
    assert "SIGHUP again: aborting now" in cli.output
    assert "Traceback" not in cli.output
    assert cli.left_behind() == []
    summary = _summary(tmp_path / "run")
    assert summary["status"] == "aborted" and summary["signal"] == "SIGHUP"
    rows = _jsonl(tmp_path / "run" / "metrics.jsonl")  # every line whole
    assert rows[-1]["iteration"] == summary["iterations"] == 1
    kept = f"{len(rows)} whole lines in metrics.jsonl, summary.json 'aborted', no Ray process left"
    record("SIGHUP twice", code, seconds, kept)


def test_second_signal_while_the_run_winds_down_aborts_without_a_traceback(tmp_path: Path):
    """After training took a signal, the process still unwinds (the final checkpoint,
    Ray's shutdown, the exit): a second signal then aborts at once, quietly."""
    code = (
        "import time\n"
        "from runner.machine import shutdown\n"
        "shutdown.install_default()\n"
        "try:\n"
        "    print('ready', flush=True); time.sleep(30)\n"
        "except shutdown.Interrupted:\n"
        "    print('unwinding', flush=True); time.sleep(30)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.strip() in ("ready", "unwinding"):
            proc.send_signal(signal.SIGTERM)
        if line.strip() == "unwinding":
            break
    lines += proc.stdout.readlines()
    assert proc.wait(timeout=10) == 128 + signal.SIGTERM
    assert "".join(lines).splitlines()[-1] == "SIGTERM again: aborting now"
    assert "Traceback" not in "".join(lines)


@pytest.mark.slow
def test_iteration_that_outlives_the_grace_is_abandoned(tmp_path: Path):
    """A slow env: each iteration takes seconds; SIGINT with a 0.5 s grace abandons the
    iteration in flight, and the checkpoint of the last finished one stays the newest."""
    cli = Cli(
        tmp_path,
        "debug=tiny",
        *FAULTY_ENV,
        "+env.env_config.step_seconds=0.015",
        "algo.training.train_batch_size_per_learner=200",
        "stop.iterations=50",
        "checkpoint.every=1",
        "shutdown.grace_seconds=0.5",
        "hydra.run.dir=run",
        own_ray=False,  # it samples in the driver: the shared Ray will do
    )
    # Iteration 1's checkpoint first, then iteration 2 (3 s of steps) is in flight.
    cli.until("iter    1", lambda: (time.sleep(1), cli.signal(signal.SIGINT)))
    code, seconds = cli.wait()
    assert code == 130, cli.output
    assert seconds < 12
    run = tmp_path / "run"
    summary = _summary(run)
    assert summary["status"] == "interrupted" and summary["iterations"] == 1
    assert "abandoned after 0.5 s" in summary["stop_reason"]
    assert [p.name for p in checkpoints.complete(run)] == ["iter_000001"]
    assert len(_jsonl(run / "metrics.jsonl")) == 1
    record(
        "SIGINT, iteration longer than a 0.5 s grace",
        code,
        seconds,
        "iteration 1 and its checkpoint; iteration 2 abandoned",
    )


@pytest.mark.slow
def test_killed_env_runner_is_recreated_and_recompiled_from_the_shared_cache(tmp_path: Path):
    """SIGKILL to one of two remote EnvRunners compiling with inductor into one cache:
    RLlib recreates it, the compile callback compiles the new one, which loads the graph
    the first ones wrote (a cache hit, no compile of its own); summary.json records the
    loss and the restart; only the newest and the best checkpoints are kept."""
    cache = tmp_path / "inductor_cache"
    cli = Cli(
        tmp_path,
        "debug=tiny",
        "scaling=runners2",
        "scaling.num_envs_per_env_runner=2",
        "compile=inductor_default",
        "compile.learners=false",
        f"compile.cache_dir={cache}",
        "stop.iterations=9",
        "checkpoint.every=1",
        "checkpoint.keep=2",
        "checkpoint.keep_best=1",
        "hydra.run.dir=run",
    )
    code, seconds = _kill_an_env_runner(cli)
    assert code == 0, cli.output
    run = tmp_path / "run"
    summary = _summary(run)
    assert summary["status"] == "finished" and summary["iterations"] == 9
    lost, restarted = summary["restarts"]["env_runners"]  # RLlib took 2 iterations here
    assert lost["lost"] == 1 and lost["iteration"] >= 3
    assert restarted["restarted"] == 1 and restarted["iteration"] > lost["iteration"]
    parts = {c["component"]: c for c in summary["compile"]["components"]}
    assert parts["env_runner/0"]["calls"] == 0  # sampling happens on the remote EnvRunners
    runners = [parts["env_runner/1"], parts["env_runner/2"]]
    new = [c for c in runners if c["pid"] not in cli.processes]
    assert len(new) == 1, runners
    for c in runners:
        assert c["took_effect"] and c["calls"] > 0 and c["recompiles"] == 0, c
        assert c["max_abs_diff"] <= 1e-5
        assert (c["cache_misses"], c["cache_hits"]) in ((1, 0), (0, 1))
    assert (new[0]["cache_misses"], new[0]["cache_hits"]) == (0, 1)
    assert any(cache.iterdir())
    kept = checkpoints.complete(run)
    returns = [r["last_episode_return_mean"] for r in _jsonl(run / "metrics.jsonl")]
    best = 1 + returns.index(max(returns))
    assert {p.name for p in kept} == {f"iter_{i:06d}" for i in {8, 9, best}}
    record(
        "SIGKILL to 1 of 2 remote EnvRunners (compile=inductor_default)",
        code,
        seconds,
        f"run finished; lost at iteration {lost['iteration']}, recreated and compiled "
        f"(from the shared cache) by iteration {restarted['iteration']}",
    )


@pytest.mark.slow
def test_fast_step_survives_a_killed_env_runner_and_restores_across_steps(tmp_path: Path):
    """DQN on the fast step (runner/algorithms/fast_step.py) sampling two remote EnvRunners: SIGKILL
    to one, RLlib recreates it and the run finishes, trained throughout. Its checkpoint
    resumed on RLlib's step, and that one's on the fast step again: each continues the
    count and trains (sampling in the main process: no EnvRunner actors to start)."""
    cli = Cli(
        tmp_path,
        "algo=dqn",
        "debug=tiny",
        "scaling=runners2",
        # RLlib's replay ratio and 8 updates a call, not the CartPole preset's one update
        # per env step: iterations of well under a second, and enough of them for RLlib to
        # recreate the EnvRunner (a new process) before the run ends.
        "algo.training.training_intensity=null",
        "algo.fast_step.updates_per_call=8",
        "stop.iterations=10",
        "hydra.run.dir=fast",
    )
    code, seconds = _kill_an_env_runner(cli)
    assert code == 0, cli.output
    assert "fast off-policy step" in cli.output
    run = tmp_path / "fast"
    summary = _summary(run)
    assert summary["status"] == "finished" and summary["iterations"] == 10
    lost, restarted = summary["restarts"]["env_runners"]
    assert lost["lost"] == 1 and restarted["restarted"] == 1
    rows = _jsonl(run / "metrics.jsonl")
    assert all("learners/default_policy/qf_loss" in r["metrics"] for r in rows[1:])
    record("SIGKILL to 1 of 2 remote EnvRunners (DQN, fast step)", code, seconds, "run finished")

    steps = [rows[-1]["env_steps"]]
    previous = run
    for name, enabled, last in (("rllib", "false", 11), ("fast_again", "true", 12)):
        resumed = run_cli(
            tmp_path, f"resume={previous}", f"algo.fast_step.enabled={enabled}",
            f"stop.iterations={last}", "scaling.num_env_runners=0", run_dir=name,
        )  # fmt: skip
        assert resumed.returncode == 0, resumed.stderr
        assert ("fast off-policy step" in resumed.stdout) == (enabled == "true")
        more = resumed.jsonl("metrics.jsonl")
        assert [r["iteration"] for r in more] == [last]
        assert "learners/default_policy/qf_loss" in more[0]["metrics"]
        steps.append(more[0]["env_steps"])
        previous = resumed.run_dir
    assert steps == sorted(steps) and len(set(steps)) == 3


@pytest.mark.slow
def test_killed_learner_fails_the_run_and_keeps_the_checkpoints(tmp_path: Path):
    cli = Cli(
        tmp_path,
        "debug=tiny",
        "scaling.num_learners=1",
        "stop.iterations=50",
        "checkpoint.every=1",
        "hydra.run.dir=run",
    )
    cli.until(
        "iter    2",
        lambda: os.kill(_actor_pid(cli.pid, "ray::_WrappedExecutable"), signal.SIGKILL),
    )
    code, seconds = cli.wait()
    assert code == 2, cli.output
    assert seconds < 30
    error = cli.output.strip().splitlines()[-1]
    assert error.startswith("error: a Ray actor died: a Learner (Ray Train's"), error
    run = tmp_path / "run"
    summary = _summary(run)
    assert summary["status"] == "failed" and summary["stop_reason"] in error
    assert checkpoints.complete(run) and checkpoints.problem(checkpoints.latest(run)) is None
    assert (run / "learning_curve.png").stat().st_size > 1000  # drawn on a crash too
    assert cli.left_behind() == []
    newest = checkpoints.latest(run).name
    record(
        "SIGKILL to the remote Learner",
        code,
        seconds,
        f"summary.json 'failed' with the reason, checkpoint {newest}, no Ray process left",
    )


@pytest.mark.slow
def test_a_learner_lost_without_an_error_is_named_and_its_checkpoint_not_kept(tmp_path: Path):
    """RLlib does not check the result of its Learner call while writing a checkpoint: a
    Learner killed right then leaves the group short with no error, the checkpoint lacks
    its state, and the next update fails with an IndexError (a CI run hit this)."""
    environ = dict(os.environ)  # ray.init sets RAY_AUTH_MODE etc. for this process
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        config = (
            PPOConfig()
            .environment("CartPole-v1")
            .env_runners(num_env_runners=0)
            .learners(num_learners=1)
            .training(train_batch_size_per_learner=200, minibatch_size=100, num_epochs=1)
        )
        algo = config.build_algo()
        algo.train()
        [pid] = [r.get() for r in algo.learner_group.foreach_learner(lambda _: os.getpid())]

        class DiesWhileSaving:  # the real save, then the death it would not notice
            iteration = algo.iteration

            def save_to_path(self, path: str) -> None:
                algo.save_to_path(path)
                os.kill(pid, signal.SIGKILL)
                while _alive(pid):
                    time.sleep(0.1)
                algo.learner_group.foreach_learner(lambda _: None)  # unchecked, as RLlib's

        verify = lambda: learners_in_service(algo)  # noqa: E731
        with pytest.raises(RunnerError, match=r"^a Ray actor died: a Learner .*1 of 1 out of"):
            checkpoints.save(DiesWhileSaving(), tmp_path, {}, verify=verify)
        assert not list((tmp_path / "checkpoints").iterdir())  # nothing half-written kept
        with pytest.raises(RunnerError, match="^a Ray actor died: a Learner"):
            learners_in_service(algo)  # what the next iteration checks before `train`
        algo.stop()
    finally:
        ray.shutdown()
        os.environ.clear()  # later tests' subprocesses (`ray start`) must not inherit them
        os.environ.update(environ)


@pytest.mark.slow
def test_nan_reward_stops_the_run_and_keeps_the_last_finite_checkpoint(tmp_path: Path):
    result = run_cli(
        tmp_path, *NAN_AT_250, "stop.iterations=10", "checkpoint.every=1", env=WITH_TESTS
    )
    assert result.returncode == 1, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("error: non-finite ") and "at iteration 2" in line
    assert line.endswith(f"the last good checkpoint is {result.run_dir}/checkpoints/iter_000001")
    summary = result.json("summary.json")
    assert summary["status"] == "non_finite" and summary["iterations"] == 2
    assert summary["non_finite"]
    assert [p.name for p in checkpoints.complete(result.run_dir)] == ["iter_000001"]
    record(
        "NaN reward from step 250 of each env copy",
        result.returncode,
        result.seconds,
        "stopped at iteration 2, naming the loss; checkpoint iter_000001 only",
        since="the command's start",
    )


@pytest.mark.slow
def test_guard_warn_goes_on_past_a_nan(tmp_path: Path):
    result = run_cli(
        tmp_path, *NAN_AT_250, "stop.iterations=3", "guard.non_finite=warn", env=WITH_TESTS
    )
    assert result.returncode == 0, result.stderr
    assert "warning: non-finite " in result.stdout and "guard.non_finite=warn" in result.stdout
    summary = result.json("summary.json")
    assert summary["status"] == "finished" and summary["iterations"] == 3
    assert summary["non_finite"] == {}
    assert checkpoints.latest(result.run_dir).name == "iter_000003"


@pytest.mark.slow
def test_stall_stops_with_what_ray_waits_for(tmp_path: Path):
    """More EnvRunners than CPUs, past the preflight: Ray never places the third. The
    Algorithm's build, which the watchdog broke into, unwound: nothing of it runs on in
    this process (the CLI's entry point runs here) against a Ray the job let go."""
    before = set(threading.enumerate())
    result = run_cli(
        tmp_path,
        "debug=tiny",
        "scaling.num_env_runners=3",
        "ray.num_cpus=2",
        "preflight.strict=false",
        "watchdog.seconds=5",
    )
    assert result.returncode == 1, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("error: stalled: no iteration finished within 5 s")
    # At least the third EnvRunner (the others may still be starting).
    assert re.search(r"waiting to place [123] SingleAgentEnvRunner actors?;", line), line
    assert "free: 0 of 2 CPU" in line
    assert result.json("summary.json")["status"] == "stalled"
    assert result.seconds < 60
    assert not [t.name for t in threading.enumerate() if t not in before]
    record(
        "3 EnvRunners on 2 CPUs, preflight.strict=false, watchdog.seconds=5",
        result.returncode,
        result.seconds,
        "stopped naming the pending EnvRunner",
        since="the command's start",
    )


@pytest.mark.slow
def test_a_hung_evaluation_is_ended_by_the_watchdog_with_the_cause_in_its_record(
    tmp_path: Path,
):
    """task=evaluate is watched as a training is: its evaluation EnvRunner's env hangs in
    its first step (a step of 10 minutes), and the watchdog ends the job within seconds,
    exit code 1, the stall and what Ray waits for in one line and in summary.json."""
    trained = run_cli(tmp_path, "debug=tiny", *FAULTY_ENV, env=WITH_TESTS, run_dir="trained")
    assert trained.returncode == 0, trained.stderr
    hung = run_cli(
        tmp_path,
        "task=evaluate",
        "checkpoint=trained",
        "task.episodes=2",
        "+env.env_config.step_seconds=600",
        "watchdog.seconds=5",
        env=WITH_TESTS,
        run_dir="evaluated",
    )
    assert hung.returncode == 1, hung.stderr
    line = hung.stderr.strip().splitlines()[-1]
    assert line.startswith("error: stalled: task=evaluate did not finish within 5 s"), line
    summary = hung.json("summary.json")
    assert (summary["task"], summary["status"]) == ("evaluate", "stalled")
    assert summary["stop_reason"] == line.removeprefix("error: ")
    assert hung.seconds < 90


@pytest.mark.slow
def test_sweep_interrupted_in_its_second_job_continues_it(tmp_path: Path):
    """After its dry run, Ctrl-C during job 1: it is recorded as interrupted and the sweep
    stops; the same sweep run again skips job 0 and continues job 1 from its checkpoint.
    The jobs share one Ray (both EnvRunners sit on its node): the sweep's process keeps it
    between jobs with the same ray.* settings."""
    args = (
        "-m",
        "seed=0,1",
        "debug=tiny",
        "scaling.num_env_runners=1",
        "stop.iterations=4",
        "checkpoint.every=1",
        "hydra.sweep.dir=sweep",
    )
    plan = run_cli(tmp_path, *args, "dry_run=true", own_ray=True)
    assert plan.returncode == 0, plan.stderr
    sweep = tmp_path / "sweep"
    assert json.loads((sweep / "0" / "job.json").read_text())["status"] == "dry_run"

    cli = Cli(tmp_path, *args)
    cli.until("iter    2", lambda: None)  # job 0
    cli.until("iter    2", lambda: cli.signal(signal.SIGINT))  # job 1
    code, seconds = cli.wait()
    assert code == 130, cli.output
    assert not list((sweep / "0").glob("attempt-*"))  # a dry run's record is only a plan
    jobs = [json.loads((sweep / n / "job.json").read_text()) for n in ("0", "1")]
    assert [j["status"] for j in jobs] == ["finished", "interrupted"]
    nodes = [_summary(sweep / n)["env_runner_nodes"] for n in ("0", "1")]
    assert len(nodes[0]) == 1 and nodes[0] == nodes[1]
    stopped_at = _summary(sweep / "1")["iterations"]
    assert stopped_at < 4

    interrupted = code
    again = run_cli(tmp_path, *args)  # on the shared Ray: the CLI called in this process
    assert again.returncode == 0, again.stderr
    said = again.stdout + again.stderr
    assert "job 0: finished in an earlier run of this sweep, skipped" in said
    assert "continuing the interrupted job" in said
    job = sweep / "1"
    assert (job / "attempt-1" / "job.json").is_file()
    summary = _summary(job)
    assert summary["resumed_from"].endswith(f"iter_{stopped_at:06d}")
    assert [r["iteration"] for r in _jsonl(job / "metrics.jsonl")] == [1, 2, 3, 4]
    record(
        "SIGINT in a sweep's second job, then the sweep again",
        interrupted,
        seconds,
        f"job 0 skipped; job 1 continued from iteration {stopped_at}",
    )


# In-process: the file-level promises, without a run.


def test_incomplete_checkpoints_are_never_chosen_and_prune_keeps_newest_and_best(tmp_path):
    def fake(iteration: int, ret: float | None, manifest: bool = True) -> Path:
        path = checkpoints.checkpoint_dir(tmp_path, iteration)
        path.mkdir(parents=True)
        (path / "state.pkl").write_bytes(bytes([iteration]) * 10)
        if manifest:
            digest = checkpoints._sha256(path / "state.pkl")
            (path / checkpoints.MANIFEST).write_text(
                json.dumps(
                    {
                        "iteration": iteration,
                        "episode_return_mean": ret,
                        "files": {"state.pkl": digest},
                    }
                )
            )
        return path

    for i, ret in enumerate([10.0, 50.0, None, 20.0, 30.0], start=1):
        fake(i, ret)
    half_written = fake(6, 99.0, manifest=False)
    (tmp_path / "checkpoints" / ".iter_000007.tmp").mkdir()
    assert checkpoints.latest(tmp_path).name == "iter_000005"
    removed = checkpoints.prune(tmp_path, keep=2, keep_best=1)
    assert [p.name for p in removed] == ["iter_000001", "iter_000003"]
    assert [p.name for p in checkpoints.complete(tmp_path)] == [
        "iter_000002",
        "iter_000004",
        "iter_000005",
    ]
    assert half_written.is_dir()  # not ours to judge: never chosen, never removed
    (checkpoints.checkpoint_dir(tmp_path, 5) / "state.pkl").write_bytes(b"x")
    try:
        checkpoints.verified(checkpoints.checkpoint_dir(tmp_path, 5))
    except checkpoints.CorruptCheckpoint as ex:
        assert str(ex).endswith(f"use resume={checkpoints.checkpoint_dir(tmp_path, 4)}")
    else:
        raise AssertionError("a corrupt checkpoint was accepted")


def test_metrics_log_holds_only_whole_lines_when_the_disk_fills(tmp_path):
    """A file-size limit (RLIMIT_FSIZE) stands in for a full disk: the write that does
    not fit is cut short, and the log takes it back out."""
    script = f"""
import resource, signal, json
from pathlib import Path
from runner.results.files import MetricsLog
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))
log = MetricsLog(Path({str(tmp_path)!r}))
for i in range(100):
    try:
        log.write({{"iteration": i, "env_steps": 10 * i}}, {{"x": 1.5, "y": i}})
    except OSError as ex:
        print("stopped at", i, ex.errno)
        break
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert "stopped at" in proc.stdout, proc.stderr
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines(keepends=True)
    assert lines and all(line.endswith("\n") for line in lines)
    assert [json.loads(line)["iteration"] for line in lines] == list(range(len(lines)))
    text = (tmp_path / "progress.csv").read_bytes().decode()  # csv's own \r\n line ends
    rows = text.splitlines()
    assert text.endswith("\r\n") and rows[0] == "x,y"
    assert [row.split(",")[1] for row in rows[1:]] == [str(i) for i in range(len(rows) - 1)]


def test_guard_watches_losses_gradient_norms_and_returns():
    nan, inf = float("nan"), float("inf")
    result = {
        "learners": {
            "default_policy": {
                "num_module_steps_trained": 512,
                "total_loss": nan,
                "gradients_default_optimizer_global_norm": inf,
                "curr_kl_coeff": nan,
            }
        },
        "env_runners": {
            "num_episodes": 4,
            "episode_return_mean": 1.0,
            "module_episode_returns_mean": {"p0": nan},
        },
        "timers": {"x": nan},
    }
    found = guard.non_finite(result)
    assert set(found) == {
        "learners/default_policy/total_loss",
        "learners/default_policy/gradients_default_optimizer_global_norm",
        "env_runners/module_episode_returns_mean/p0",
    }
    assert guard.describe(found, 7).startswith(
        "non-finite env_runners/module_episode_returns_mean/p0 = nan at iteration 7"
    )


def test_guard_ignores_the_nan_return_of_an_iteration_that_ended_no_episode():
    """SAC on Pendulum with 8 envs, measured here: iteration 8 ended no episode, and
    RLlib's result held episode_return_mean = nan beside num_episodes = 0. An iteration
    whose only EnvRunner was killed (measured here: PPO, one remote EnvRunner, SIGKILL)
    held a nan mean and no num_episodes at all: no episode ended there either."""
    nan = float("nan")
    quiet = {"env_runners": {"num_episodes": 0, "episode_return_mean": nan}}
    assert guard.non_finite(quiet) == {}
    broken = {"env_runners": {"num_episodes": 8, "episode_return_mean": nan}}
    assert set(guard.non_finite(broken)) == {"env_runners/episode_return_mean"}
    loss = {
        "env_runners": {"num_episodes": 0},
        "learners": {"p": {"num_module_steps_trained": 64, "total_loss": nan}},
    }
    assert set(guard.non_finite(loss)) == {"learners/p/total_loss"}
    # The Learner trained on nothing there: RLlib reported NaN losses of no update.
    lost = {
        "env_runners": {"num_episodes_lifetime": 47.0, "episode_return_mean": nan},
        "learners": {"p": {"num_module_steps_trained_lifetime": 1536.0, "total_loss": nan}},
    }
    assert guard.non_finite(lost) == {}
    # Another such iteration (the same run, measured here) held NaN counts instead.
    counted_nan = {
        "env_runners": {"num_episodes": nan, "episode_return_mean": nan},
        "learners": {"p": {"num_module_steps_trained": nan, "total_loss": nan}},
    }
    assert guard.non_finite(counted_nan) == {}


# The watchdog's monitor thread decides to break in and, descheduled (simulated: its
# pthread_kill is delayed 0.5 s, as a loaded machine may delay a thread), signals late,
# after the iteration it decided for would have ended and the watch closed.
_LATE_BREAK_IN = """
import signal, time
from runner.machine import shutdown
from runner.settings.schema import WatchdogConfig

real = signal.pthread_kill
def late(thread, signum):
    time.sleep(0.5)
    real(thread, signum)
signal.pthread_kill = late
def mine(signum, frame):
    print("the process's own SIGALRM handler ran")
signal.signal(signal.SIGALRM, mine)
watch = shutdown.Watch(30, WatchdogConfig(seconds=0.3), on_abort=lambda signum: None)
outcome = "finished"
with watch:
    try:
        with watch.iteration():
            time.sleep(0.45)
    except KeyboardInterrupt:
        outcome = watch.cause
print(outcome, watch.cause, signal.getsignal(signal.SIGALRM) is mine)
time.sleep(1.0)
print("alive")
"""


def test_a_late_break_in_lands_in_its_iteration_and_never_after_the_watch():
    """The break-in lands in the iteration the monitor decided it for (which had passed
    its bound), or, that iteration ended first, nowhere and claims no stall; the watch
    closes only after its monitor has ended, with the process's own SIGALRM handler back.
    Before, the late SIGALRM met the default handler the watch had put back and killed
    the process (a pytest worker in CI; a notebook running runner.run)."""
    proc = subprocess.run(
        [sys.executable, "-c", _LATE_BREAK_IN], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert proc.stdout.split("\n")[:2] in (
        ["stalled stalled True", "alive"],
        ["finished None True", "alive"],
    ), proc.stdout


def test_stall_bound_is_fixed_or_follows_the_median_iteration():
    config = WatchdogConfig(first_iteration_seconds=900, median_multiple=10, min_seconds=60)
    assert stall_bound(config, []) == 900
    assert stall_bound(config, [1.0, 2.0, 30.0]) == 60
    assert stall_bound(config, [10.0, 12.0, 11.0]) == 110
    assert stall_bound(WatchdogConfig(seconds=5), [100.0]) == 5
    assert stall_bound(WatchdogConfig(enabled=False), []) is None


def test_a_checkpoint_that_fails_to_write_leaves_the_earlier_ones(tmp_path):
    """A full disk cannot be made safely here (a file-size limit would also kill Ray's own
    processes), so a stand-in Algorithm's save fails half-way, as a full disk would."""
    import errno

    class FullDisk:
        iteration = 2

        def save_to_path(self, path: str) -> None:
            (Path(path) / "learner").mkdir(parents=True)
            (Path(path) / "learner" / "state.pkl").write_bytes(b"half")
            raise OSError(errno.ENOSPC, "No space left on device")

    earlier = checkpoints.checkpoint_dir(tmp_path, 1)
    earlier.mkdir(parents=True)
    try:
        checkpoints.save(FullDisk(), tmp_path, {"iteration": 2})
    except OSError as ex:
        assert ex.errno == errno.ENOSPC
    else:
        raise AssertionError("the failed save was not reported")
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["iter_000001"]


def test_a_resumed_trial_supersedes_the_checkpoint_its_interrupted_attempt_left(tmp_path):
    """A search resumed on the Ray session it was interrupted on (tests/test_tune.py's, on
    the shared Ray) finds its trial dir as it was: the iteration it repeats is saved over
    the abandoned attempt's (a rename onto it failed with 'Directory not empty')."""

    class Trial:
        iteration = 8

        def save_to_path(self, path: str) -> None:
            Path(path).mkdir(parents=True)
            (Path(path) / "algorithm_state.pkl").write_bytes(b"resumed")

    scratch = tmp_path / "working_dir"
    abandoned = checkpoints.checkpoint_dir(tmp_path, 8)
    abandoned.mkdir(parents=True)
    (abandoned / "algorithm_state.pkl").write_bytes(b"abandoned")
    (abandoned / "learner_group").mkdir()
    saved = checkpoints.save(Trial(), tmp_path, {"iteration": 8}, scratch=scratch)
    assert saved == abandoned and (saved / "algorithm_state.pkl").read_bytes() == b"resumed"
    assert not (saved / "learner_group").exists()
    assert checkpoints.problem(saved) is None
    assert list(scratch.iterdir()) == []


@pytest.mark.slow
@pytest.mark.usefixtures("joins_shared_ray")
def test_a_run_record_the_full_disk_refused_is_no_success(tmp_path: Path, monkeypatch):
    """summary.json is written after the task: where the disk refuses it (an OSError, as a
    full disk raises), a finished run fails on that, in one line; the checkpoints and
    metrics it wrote stay."""
    import errno

    import runner
    from runner.results import record

    def full_disk(run_dir: Path, fields: dict) -> dict:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(record, "write", full_disk)
    with pytest.raises(RunnerError, match="the run record could not be written in run: "):
        runner.run(["debug=tiny", "checkpoint.at_end=true", "hydra.run.dir=run"])
    assert checkpoints.latest(tmp_path / "run") is not None
    assert (tmp_path / "run" / "metrics.jsonl").read_text().count("\n") == 1
    assert not (tmp_path / "run" / "summary.json").exists()


# The rules that end a run whose EnvRunners fail every time (runner/job/callbacks.py's
# EnvRunnerFaults): its error back after the restart, or nothing sampled for
# guard.unsampled_iterations (2 here: one restart fewer than the default 3, which leaves a
# single killed EnvRunner its restart); which comes first depends on how fast Ray restarts.
REPEATED = r"an EnvRunner failed the same way in iterations 1 and \d+"
UNSAMPLED = "the EnvRunners sampled nothing in 2 iterations in a row since one failed"
# Deterministic failures of the one remote EnvRunner, by the env: (its env_config, the
# message the run must end with, the rules that may end it).
ENV_RUNNER_CRASHES = {
    "raises in its first step": (
        "+env.env_config.fail_at_step=1",
        "ValueError: FaultyCartPole fails at step 1 (fail_at_step)",
        f"{REPEATED}|{UNSAMPLED}",
    ),
    "raises after 50 steps": (
        "+env.env_config.fail_at_step=50",
        "ValueError: FaultyCartPole fails at step 50 (fail_at_step)",
        f"{REPEATED}|{UNSAMPLED}",
    ),
    # No Python error: the process ends (as a segfault in an env's C code would).
    "calls os._exit in a step": (
        "+env.env_config.exit_at_step=20",
        "its last output: FaultyCartPole exits at step 20 (exit_at_step)",
        UNSAMPLED,
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("crash", ENV_RUNNER_CRASHES)
def test_an_env_runner_that_fails_every_time_fails_the_run_in_one_line(crash: str, tmp_path: Path):
    """The env fails deterministically in its one remote EnvRunner: RLlib's EnvRunner
    logs a raised error and exits (or the process just ends), Ray restarts it, and it
    fails again; nothing is sampled. The run ends in seconds (RLlib waits 60 s before each
    restart; the runner 1 s): exit 1, the env's own message in the last line, its
    traceback (or the dead process's log) kept, no checkpoint of it."""
    setting, cause, rule = ENV_RUNNER_CRASHES[crash]
    result = run_cli(
        tmp_path,
        "debug=tiny",
        "env.entry_point=faulty_env:FaultyCartPole",  # no env.id=null: env=custom is taken
        setting,
        "scaling.num_env_runners=1",
        "guard.unsampled_iterations=2",
        "stop.iterations=10",
        "checkpoint.at_end=true",
        env=WITH_TESTS,
        timeout=120,
    )
    assert result.returncode == 1, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert re.match(f"error: ({rule})", last) and cause in last, last
    assert str(result.run_dir / "env_runner_error.txt") in last
    assert result.seconds < 60
    summary = result.json("summary.json")
    assert summary["status"] == "failed" and cause in summary["error"]
    assert summary["env_runner_error"]["iterations"][0] == 1
    assert summary["env_steps"] in (0, None) and summary["iterations"] < 10
    kept = (result.run_dir / "env_runner_error.txt").read_text()
    assert kept == summary["env_runner_error"]["traceback"]
    assert ("faulty_env.py" if "raises" in crash else "FaultyCartPole exits at step 20") in kept
    assert not list((result.run_dir / "checkpoints").glob("iter_*"))
    record(f"the one EnvRunner's env {crash}", 1, result.seconds, "its cause", "the start")


def test_an_env_runner_error_is_named_by_the_first_exception_of_its_chain():
    """RLlib raises RuntimeError from the env's own error: the env's is the cause."""
    from runner.job.callbacks import error_line

    chained = (
        'Traceback (most recent call last):\n  File "env.py", line 3, in step\n'
        "ValueError: bad step\n\n"
        "The above exception was the direct cause of the following exception:\n\n"
        'Traceback (most recent call last):\n  File "env_runner.py", line 291\n'
        "RuntimeError\n"
    )
    assert error_line(chained) == "ValueError: bad step"
    assert error_line("Traceback ...\nKeyError: 'obs'\n") == "KeyError: 'obs'"
