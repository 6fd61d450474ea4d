"""task=evaluate: whole episodes with a trained policy, through RLlib's own evaluation.

    python -m runner task=evaluate checkpoint=<run dir or checkpoint dir> task.episodes=20

The config is the checkpoint's run's (as resume= composes it) with this command's
overrides on top, so `env.env_config` changes can be evaluated. The Algorithm is built
with no training EnvRunners and a local Learner, restored, and `Algorithm.evaluate()` runs
`task.episodes` episodes on evaluation EnvRunners sized by scaling.num_env_runners (0:
the local one), one env each: with several envs per EnvRunner the episodes that end first
(the short ones) would fill the count. Greedy unless `task.explore=true`. Each episode's
return and length are logged by an on_episode_end callback in the EnvRunner that ran it:
episodes.csv, and eval.json's figures computed from those rows (RLlib's own mean beside
them). `task.video=true` then records `task.video_episodes` more episodes (runner/envs/video.py).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from runner.console import console, progress
from runner.errors import ConfigError
from runner.job.task import Task, TaskRun, own_settings
from runner.results.files import EVAL, versions, write_csv, write_json
from runner.settings.schema import ReadsCheckpoint, RunnerConfig

if TYPE_CHECKING:  # light at import: the task's heavy modules load when it runs
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
    from ray.rllib.env.env_runner import EnvRunner

    from runner.compile.settings import CompileSpec


EPISODE_COLUMNS = ("episode", "env_runner", "episode_return", "episode_len")
_LOG = "_runner_episodes"  # where each EnvRunner keeps its episodes' rows
_COUNTER, _COUNTER_HANDLE = "runner_evaluation_episodes", "_runner_episode_counter"


@dataclass
class EvaluateSettings(ReadsCheckpoint):
    """Whole episodes with the trained policy; what they returned and, if asked, a video."""

    name: ClassVar[str] = "evaluate"

    episodes: int = 20
    explore: bool = False  # sample from the action distribution instead of its mode
    video: bool = False
    video_episodes: int = 1


def check(settings: RunnerConfig, spec: CompileSpec | None) -> list[str]:
    """Bad settings: one line before anything is built."""
    task = own_settings(settings, EvaluateSettings)
    if task.episodes < 1 or task.video_episodes < 1:
        raise ConfigError(
            f"task.episodes={task.episodes} and task.video_episodes={task.video_episodes} "
            "must be at least 1"
        )
    return []


def configure(config: AlgorithmConfig, settings: RunnerConfig) -> None:
    """Evaluation EnvRunners sized by the scaling group, no training ones, a local Learner
    (only its restored weights are used); the checkpoint's policy checked against the env."""
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

    from runner.algorithms import trained
    from runner.envs import video
    from runner.job.resume import find_checkpoint
    from runner.settings.user_code import beside

    task = own_settings(settings, EvaluateSettings)
    if task.video:
        video.check_renders(config)
    assert task.checkpoint is not None  # validate() refused a missing checkpoint=
    checkpoint, _ = find_checkpoint(task.checkpoint, "checkpoint")
    trained.check_fits(trained.load_modules(checkpoint), config, settings.env)
    config.env_runners(num_env_runners=0)
    config.learners(num_learners=0)
    config.evaluation(
        evaluation_interval=1,
        evaluation_num_env_runners=settings.scaling.num_env_runners,
        evaluation_duration=task.episodes,
        evaluation_duration_unit="episodes",
        evaluation_parallel_to_training=False,
        evaluation_config=AlgorithmConfig.overrides(
            explore=task.explore, num_envs_per_env_runner=1
        ),
    )
    config.callbacks(on_episode_end=beside(config.callbacks_on_episode_end, log_episode))


class EpisodeCounter:
    """Finished evaluation episodes, counted as they end in whichever EnvRunner, for the
    driver's progress bar (RLlib returns only when all have ended): a Ray actor, made
    with ray.remote where it starts (Ray is not imported with the task)."""

    def __init__(self) -> None:
        self.episodes = 0

    def add(self) -> None:
        self.episodes += 1

    def count(self) -> int:
        return self.episodes


def log_episode(*, episode: Any, env_runner: EnvRunner, **_: Any) -> None:
    """An on_episode_end callback: the finished episode's return and length, kept in the
    EnvRunner that ran it until the task collects them; the counter told."""
    import ray

    from runner.envs.masking import episode_return

    if _COUNTER_HANDLE not in env_runner.__dict__:
        try:
            env_runner.__dict__[_COUNTER_HANDLE] = ray.get_actor(_COUNTER)
        except ValueError:  # no progress bar to feed
            env_runner.__dict__[_COUNTER_HANDLE] = None
    counter = env_runner.__dict__[_COUNTER_HANDLE]
    if counter is not None:
        counter.add.remote()
    rows = env_runner.__dict__.setdefault(_LOG, [])
    rows.append(
        {
            "env_runner": env_runner.worker_index,
            "episode_return": episode_return(episode),
            "episode_len": len(episode),
        }
    )


def _collect(algo: Any) -> list[dict[str, Any]]:
    per_runner = algo.eval_env_runner_group.foreach_env_runner(
        lambda runner: runner.__dict__.get(_LOG, []), local_env_runner=True
    )
    rows = [row for rows in per_runner for row in rows]
    return [{"episode": i, **row} for i, row in enumerate(rows)]


def figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """eval.json's figures, from episodes.csv's rows (std over episodes, ddof=0)."""
    import numpy as np

    returns = np.array([r["episode_return"] for r in rows], dtype=float)
    lengths = np.array([r["episode_len"] for r in rows], dtype=float)
    return {
        "episode_return_mean": float(returns.mean()),
        "episode_return_std": float(returns.std()),
        "episode_return_min": float(returns.min()),
        "episode_return_max": float(returns.max()),
        "episode_len_mean": float(lengths.mean()),
        "episodes": len(rows),
    }


@contextlib.contextmanager
def episode_progress(episodes: int) -> Iterator[None]:
    """A progress bar over the evaluation episodes while the body runs: a thread polls the
    counter the EnvRunners' callbacks feed."""
    import ray

    # Any: Ray types options().remote() as the class or a handle, and no handle's methods.
    counter: Any = ray.remote(num_cpus=0)(EpisodeCounter).options(name=_COUNTER).remote()
    stop = threading.Event()
    with progress("evaluation episodes", episodes) as done:

        def poll() -> None:
            while not stop.wait(0.5):
                done(min(episodes, ray.get(counter.count.remote())))

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        try:
            yield
        finally:
            stop.set()
            poller.join()
            done(min(episodes, ray.get(counter.count.remote())))
            ray.kill(counter)


def run(run: TaskRun) -> None:
    from runner.envs import video

    settings, run_dir = run.settings, run.files
    task = own_settings(settings, EvaluateSettings)
    assert run.checkpoint is not None  # app.run resolves checkpoint= before the task runs
    algo = run.config.build_algo()
    videos: list[str] = []
    try:
        algo.restore_from_path(str(run.checkpoint.resolve()))
        started = time.perf_counter()
        with episode_progress(task.episodes):
            result = algo.evaluate()
        seconds = time.perf_counter() - started
        rows = _collect(algo)
        if task.video:
            files = video.record(
                run.config,
                algo.env_runner.get_state(),
                run_dir / "videos",
                task.video_episodes,
                task.explore,
                "eval",
            )
            strip = video.frame_strip(files[0], run_dir / "videos" / "eval-strip.png")
            videos = [str(p.relative_to(run_dir)) for p in [*files, strip]]
    finally:
        algo.stop()
    if not rows:
        raise ConfigError("no evaluation episode finished: check the env ends its episodes")
    write_csv(run_dir / "episodes.csv", rows, EPISODE_COLUMNS)
    found = figures(rows)
    rllib = result.get("env_runners", {}).get("episode_return_mean")
    evaluated = {
        **found,
        "explore": task.explore,
        "seed": settings.seed,
        "checkpoint": str(run.checkpoint.resolve()),
        "env": settings.env.name,
        "algo": settings.algo.name,
        "rllib_episode_return_mean": rllib,
        "seconds": seconds,
        "videos": videos,
        "versions": versions(),
    }
    write_json(run_dir / EVAL, evaluated)
    run.record["evaluate"] = evaluated
    console.print(
        f"evaluated {found['episodes']} episodes ({'sampled' if task.explore else 'greedy'}) "
        f"of {settings.env.name}: return {found['episode_return_mean']:.2f} "
        f"± {found['episode_return_std']:.2f} (min {found['episode_return_min']:.2f}, "
        f"max {found['episode_return_max']:.2f}), length {found['episode_len_mean']:.1f}; "
        f"results in {run_dir}"
    )


TASK = Task(
    settings=EvaluateSettings,
    run=run,
    check=check,
    configure=configure,
    uses_compile=False,
)
