"""Every command README.md and the docs/ pages show runs here, block by block, as a user
pastes it.

`tests/readme.py` reads the commands (fenced shell blocks and inline code) of README.md
and every docs/*.md page. Each has an entry in WAYS saying how it runs: as written where
it finishes in about a minute on a 2-core CPU, otherwise with a tiny stop (the overrides
appended; Hydra and argparse take the last value) or a dry run, or as a command that must
refuse with one line. A command added to a page without an entry fails
`test_every_readme_command_has_a_way_to_run`. A command shown more than once runs once
(see `where_it_runs`): the README's first screen shows commands that its later sections
run. The set-up commands are the ones `.ci/run` runs.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import cli_call
import pytest
from conftest import cli_env
from readme import README, SETUP, Command, commands, python_blocks, setup

ROOT = Path(__file__).resolve().parent.parent
# `python -m runner <overrides>` with nothing for a shell to do but split the words.
RUNNER_COMMAND = re.compile(r"python -m runner(\s|$)")
SHELL_SYNTAX = set("|&;<>$`*?")
ONE_ITERATION = ("stop.iterations=1",)
# The tiny run's settings (conf/debug/), for commands that train as written.
TINY = ("debug=tiny",)


@dataclass(frozen=True)
class Way:
    """How a README command runs here: `extra` appended, the exit code and a text expected."""

    extra: tuple[str, ...] = ()
    code: int = 0
    expect: str = ""
    absent: str = ""  # a text it must not print (a warning it must not give)
    env: dict[str, str] = field(default_factory=dict)
    in_repo: bool = False  # runs in the repository (pytest finds the tests there)
    # Starts a Ray of its own, as on a user's machine; else it joins the test process's
    # shared Ray, as a command in a Ray job would (tests/shared_ray.py).
    own_ray: bool = False


AS_WRITTEN = Way()
SET_UP = Way(expect="set-up: .ci/run runs it")
REFUSES_HERE = "refuses on this CPU machine"

WAYS: dict[str, Way] = {
    # README, Quick start and Tests: the set-up commands are what .ci/run runs (see
    # test_ci_runs_...); the first screen's others run in the sections that show them again.
    "python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 "
    "uv && uv pip install --compile-bytecode -e . && python -m runner": SET_UP,
    "python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 "
    "uv && uv pip install --compile-bytecode -e '.[test]' && python -m pytest -q": SET_UP,
    "python3 -m venv .venv-ipex && . .venv-ipex/bin/activate && pip install "
    "-e '.[test,ipex]' && python -m pytest -q -m \"ipex or box\"": SET_UP,
    "python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 uv && uv pip "
    "install --compile-bytecode -e '.[test]' && bash scripts/slurm_local.sh start && "
    "python -m pytest -q -m cluster -n 0": SET_UP,
    # Quick start and Config groups
    "python -m runner --help": Way(expect="tuned presets"),  # runner/settings/help.py's page
    "python -m runner --cfg job": Way(expect="num_env_runners:"),
    # Tests: the fast subset, collected only: running the suite inside the suite would recurse.
    'python -m pytest -m "not slow"': Way(
        ("--collect-only", "-q", "-p", "no:cacheprovider"), expect="tests collected", in_repo=True
    ),
    # Overrides
    "python -m runner algo.training.lr=1e-4 +algo.training.grad_clip=40 "
    "+algo.rl_module.model_config.fcnet_hiddens=[64,64] stop.iterations=2": Way(
        TINY, expect="done (iterations 2 >= 2)"
    ),
    "python -m runner algo=sac env=pendulum stop.iterations=2": Way(
        expect="done (iterations 2 >= 2)"
    ),
    # Planned: Atari trains in tests/test_tuned.py (an Atari preset at local scale).
    "python -m runner env=breakout stop.iterations=1 "
    "algo.training.train_batch_size_per_learner=512": Way(
        ("dry_run=true",), expect="dry run: nothing started"
    ),
    "python -m runner +algo.training.lrr=1": Way(code=2, expect="(did you mean lr?)"),
    "python -m runner check.threshold=450 check.env_steps=300000": Way(
        ("check.threshold=1", *TINY),
        expect="done (check passed: env_runners/episode_return_mean",
    ),
    "python -m runner debug=tiny algo=dqn": Way(expect="done (iterations 1 >= 1)"),
    # Bring your own (the block's test uninstalls the example package afterwards), and
    # docs/bring_your_own.md
    "pip install -e examples/my_rl_pkg": Way(expect="Successfully installed my-rl-pkg"),
    "python -m runner --config-dir examples/my_rl_pkg/conf experiment=corridor_ppo": Way(
        ONE_ITERATION, expect="done (iterations 1 >= 1)"
    ),
    # Planned, its RLModule built: tests/test_bring_your_own.py trains the package's env
    # on a remote EnvRunner, and tests/test_env_wrappers.py the MiniGrid example.
    "python -m runner env.id=my_rl_pkg:MyRL/Corridor-v0 scaling.num_env_runners=1 "
    "stop.iterations=3": Way(("dry_run=true",), expect="dry run: nothing started"),
    "pip install minigrid==3.2.0": Way(expect="minigrid"),  # the test extra has it
    "python -m runner --config-dir examples/minigrid/conf experiment=minigrid_empty_ppo": Way(
        ("dry_run=true",), expect="dry run: nothing started"
    ),
    # Pixels, grids and Atari: the same envs through runner.compose/preflight in
    # tests/test_observations.py.
    "python -m runner env.id=minigrid:MiniGrid-Empty-5x5-v0 "
    "'env.wrappers=[minigrid.wrappers:ImgObsWrapper]' scaling.num_env_runners=1": Way(
        (*TINY, "stop.iterations=2"), expect="done (iterations 2 >= 2)"
    ),
    # Pong's CNN (Atari at more scale: tests/test_tuned.py): an ALE id named alone takes
    # env=atari (one iteration); the README's runs its 2 iterations, its own budget, which
    # no default stop.seconds cuts (a small batch: the same iterations, sooner).
    "python -m runner env.id=ALE/Pong-v5 stop.iterations=2": Way(
        (*TINY, "stop.iterations=1"), expect="done (iterations 1 >= 1)"
    ),
    "python -m runner env=atari env.id=ALE/Pong-v5 stop.iterations=2": Way(
        TINY, expect="done (iterations 2 >= 2)", absent="(default)"
    ),
    # Action masks (tests/test_masks.py: the masks honoured, the win rate logged); the
    # preset's 5 seeds: docs/tuned.md.
    "python -m runner env=tictactoe stop.iterations=2": Way(
        TINY, expect="done (iterations 2 >= 2)"
    ),
    "python -m runner experiment=tuned_ppo_tictactoe": Way(
        ("dry_run=true",), expect="dry run: nothing started"
    ),
    "python -m runner env.framestack=4 "
    "'env.wrappers=[{_target_:gymnasium.wrappers.TimeLimit,max_episode_steps:200}]' "
    "stop.iterations=2": Way(TINY, expect="done (iterations 2 >= 2)"),
    # Trained for two iterations by tests/test_bring_your_own.py.
    "python -m runner experiment=tuned_ppo_multi_agent_cartpole": Way(
        ("dry_run=true",), expect="dry run: nothing started"
    ),
    # Tuned presets (their full runs are benchmarks: benchmarks/tuned_experiments.sh)
    "python -m runner algo=dqn env=cartpole": Way(
        ("dry_run=true",),
        expect="hyperparameters: DQN, conf/algo/dqn.yaml + conf/tuned/dqn_cartpole.yaml",
    ),
    "python -m runner experiment=tuned_dqn_cartpole": Way(
        (*ONE_ITERATION, "check.threshold=1"), expect="done (check passed"
    ),
    "python -m runner experiment=tuned_sac_pendulum": Way(
        (*ONE_ITERATION, "check.enabled=false"), expect="done (iterations 1 >= 1)"
    ),
    # Their runs: docs/tuned.md; reward scaling trains in tests/test_reward_scaling.py.
    "python -m runner experiment=tuned_ppo_acrobot": Way(
        ("dry_run=true",), expect="rewards: scaled for the Learner as SB3's VecNormalize"
    ),
    "python -m runner experiment=tuned_dqn_acrobot": Way(
        ("dry_run=true",), expect="fast off-policy step (32 updates per Learner call"
    ),
    # 4 EnvRunners and a remote Learner: remote actors train in tests/test_train.py.
    "python -m runner experiment=tuned_ppo_cartpole ray.num_cpus=8": Way(
        ("dry_run=true",), expect="dry run: nothing started"
    ),
    # Planned: seeds are swept and grouped by tests/test_sweep.py, over 3 seeds.
    "python -m runner -m experiment=tuned_dqn_cartpole seed=0,1,2,3,4": Way(
        ("dry_run=true",), expect="dry run: 5 jobs, 0 invalid"
    ),
    # docs/tuned.md
    "DOC=docs/tuned.md bash benchmarks/tuned_experiments.sh": Way(
        env={"ONLY": "main_job", "SEEDS": "0", "EXTRA": "stop.iterations=1 check.threshold=1"},
        expect="refreshed docs/tuned.md",
    ),
    # One cheap preset for 2 s (with no names it measures five for 45 s each).
    "bash benchmarks/tuned_speed.sh": Way(
        ("tuned_ppo_mountaincar",),
        env={"SECS": "2"},
        expect="tuned_ppo_mountaincar: ",
    ),
    # Plan and preflight
    "python -m runner hardware=a100 compile=inductor_ro scaling.num_learners=2 dry_run=true": Way(
        expect="preflight would fail: hardware=a100 expects an NVIDIA A100 GPU"
    ),
    "python -m runner hardware=a100 compile=inductor_ro scaling.num_learners=2": Way(
        code=2, expect="error: hardware=a100 expects an NVIDIA A100 GPU"
    ),
    "python -m runner experiment=exploration_ipex_default scale=local dry_run=true": Way(
        expect="dry run: nothing started"
    ),
    # The scaling guide's layout for this CPU machine, without a warning about its defaults
    # (on simulated GPU machines: tests/test_gpu_paths.py).
    "python -m runner algo=appo dry_run=true": Way(
        expect="takes the RLlib scaling guide's layout: scaling.num_learners=1 "
        "scaling.num_gpus_per_learner=0",
        absent="WARNING",
    ),
    # docs/compile.md
    "python -m runner compile=inductor_default "
    "'compile.cache_dir=\"~/.cache/rllib-runner/inductor\"' stop.iterations=2": Way(
        TINY,
        expect="compile inductor/default: took effect on 1/1 EnvRunner(s) and 1/1 Learner(s)",
    ),
    # Planned: tests/test_compile.py trains it (the remote EnvRunner's session rebuilt with
    # the weights each sync brings).
    "python -m runner compile=onnxrt_default scaling.num_env_runners=1 stop.iterations=2": Way(
        ("dry_run=true",), expect="dry run: nothing started"
    ),
    # The benchmark's main workload then decides from the first command's cached figures.
    "python -m runner compile=auto stop.iterations=2": Way(expect="compile=auto chose"),
    "python -m runner task=autotune env=breakout scale=local": Way(
        ("task.components=[env_runners]", "compile.auto.candidates=[onnxrt/default]"),
        expect="choice: ",
    ),
    "python benchmarks/compile_auto.py --iterations 10 --repeats 2 --readme docs/compile.md": Way(
        ("--iterations", "1", "--repeats", "1", "--workloads", "main"),
        expect="refreshed docs/compile.md",
    ),
    "python benchmarks/onnx_exporters.py": Way(("--calls", "50"), expect="torchscript "),
    # docs/benchmarks.md, scaling=auto: two layouts in the main process, then the benchmark's
    # main workload on this machine, one iteration a side.
    "python -m runner scaling=auto dry_run=true": Way(
        (
            "scaling.auto.env_runners=[0]",
            "scaling.auto.envs_per_env_runner=[8,16]",
            "scaling.auto.vectorize_modes=[sync]",
            "scaling.auto.seconds=0.5",
        ),
        expect="scaling=auto chose",
    ),
    "python benchmarks/scaling_auto.py --repeats 3 --cpus 0,8 --readme docs/benchmarks.md": Way(
        (
            *("--iterations", "1", "--repeats", "1", "--workloads", "main", "--cpus", "0"),
            *("scaling.auto.env_runners=[0]", "scaling.auto.envs_per_env_runner=[8,16]"),
            *("scaling.auto.vectorize_modes=[sync]", "scaling.auto.seconds=0.5"),
        ),
        expect="refreshed docs/benchmarks.md",
    ),
    # docs/benchmarks.md
    "python -m runner task=inference_bench env=cartpole compile=onnxrt_default "
    "task.batch_sizes=[1,4,16,64]": Way(("task.iterations=50",), expect="batch  64 |"),
    # Planned: the same bench runs for real in docs/reproductions.md's block (run by
    # tests/test_reproductions.py, which checks what it measured).
    "python -m runner task=exploration_bench compile=onnxrt_default scaling.num_env_runners=1 "
    "task.timed_iterations=2": Way(("dry_run=true",), expect="dry run: nothing started"),
    # One batch size and two backends, each a compile of its own; aot_eager, not inductor,
    # whose cold compile tests/test_bench.py times through the same measure().
    "python benchmarks/compile_forward.py --envs cartpole --iterations 100": Way(
        ("--batch-sizes", "16", "--backends", "eager", "aot_eager"),
        expect="cartpole  aot_eager  batch  16",
    ),
    # docs/reproductions.md (--help: --write would rewrite conf/experiment/ in the checkout)
    "python -m runner.published --write": Way(("--help",), expect="regenerate conf/experiment/"),
    "python -m runner.published": Way(expect="headline_a100_21n"),
    # The section runs in tests/test_reproductions.py, which reads what these two wrote.
    "python -m runner experiment=inference_cpu_201_onnxrt_default": Way(
        ("task.iterations=20", "task.burn_in=2"), expect="batch  16 |"
    ),
    "python -m runner experiment=headline_a100_21n": Way(code=2, expect="or add scale=local"),
    "python -m runner experiment=exploration_onnxrt_default scale=local": Way(
        (
            "task.warmup_iterations=1",
            "algo.training.train_batch_size_per_learner=250",
            "algo.training.minibatch_size=125",
        ),
        expect="env steps/s over 1 timed iteration(s)",
    ),
    "python -m runner.report outputs/ --doc docs/reproductions.md": Way(
        expect="refreshed docs/reproductions.md"
    ),
    # One onnxrt table (the inductor bench compiles per batch size: tests/test_bench.py).
    "bash benchmarks/cpu_reproductions.sh": Way(
        env={
            "ONLY": "inference_cpu_201_onnxrt_ma",
            "EXTRA": "task.iterations=20 task.burn_in=2",
        },
        expect="report.md",
    ),
    "python -m runner.docs docs/reproductions.md": Way(expect="refreshed docs/reproductions.md"),
    # Sweeps: the first screen's sweep, planned (its jobs' parts run in the sweep below,
    # tests/test_sweep.py and tests/test_compile.py), then two of their own
    "python -m runner -m compile=none,inductor_default scaling.num_env_runners=0,1": Way(
        ("dry_run=true",), expect="dry run: 4 jobs, 0 invalid"
    ),
    "python -m runner -m compile=none,eager stop.iterations=2 "
    "hydra.sweep.dir=outputs/my_sweep": Way(TINY, expect="sweep: 2 jobs, 0 failed"),
    "python -m runner -m hardware=cpu,a100 scaling.num_env_runners=1,2 dry_run=true": Way(
        expect="dry run: 4 jobs, 0 invalid"
    ),
    "python -m runner.sweep outputs/my_sweep": Way(expect="2 jobs, 0 failed."),
    "python -m runner.compare outputs/my_sweep": Way(
        expect="comparison: outputs/my_sweep/compare/compare.md"
    ),
    # docs/compare.md: the sweep with 2 tiny jobs (the last seed= wins), then its comparison
    "python -m runner -m algo=ppo,appo seed=0,1,2 stop.iterations=5": Way(
        (*TINY, "seed=0"), expect="sweep: 2 jobs, 0 failed"
    ),
    "python -m runner.compare outputs/multirun/": Way(
        expect="comparison: outputs/multirun/compare"
    ),
    # docs/cluster.md (the block starts a real one-node cluster and stops it)
    "ray start --head --num-cpus=8": Way(
        ("--disable-usage-stats",), expect="Ray runtime started", own_ray=True
    ),
    # One EnvRunner, not six: the same remote placement, on this 2-core machine, while no
    # other Ray test runs (the block's `ray stop` would stop their Rays). The parallel jobs
    # sample in their drivers: placement is the run's above (and tests/test_cluster.py's).
    "python -m runner ray.address=auto scaling.num_env_runners=6 stop.iterations=1": Way(
        (*TINY, "scaling.num_env_runners=1"), expect="done (iterations 1 >= 1)", own_ray=True
    ),
    "python -m runner -m hydra/launcher=joblib hydra.launcher.n_jobs=2 ray.address=auto "
    "compile=none,eager scaling.num_env_runners=2 stop.iterations=1": Way(
        (*TINY, "scaling.num_env_runners=0"), expect="sweep: 2 jobs, 0 failed", own_ray=True
    ),
    "ray stop": Way(expect="Stopped", own_ray=True),
    # docs/cluster.md, Ray Jobs (run by tests/test_ray_jobs.py, whose head of its own, on
    # ports of its own, stands in for the page's `ray start`; run dirs go to a temp dir).
    "ray start --head --include-dashboard=true": Way(expect="Ray runtime started"),
    "ray job submit --working-dir . -- python -m runner scaling.num_env_runners=1 "
    "stop.iterations=2 hydra.run.dir=/tmp/rllib-runner/job": Way(TINY, expect="succeeded"),
    "ray job submit --working-dir . -- python -m runner -m seed=1,2 stop.iterations=1 "
    "hydra.sweep.dir=/tmp/rllib-runner/job_sweep": Way(TINY, expect="sweep: 2 jobs, 0 failed"),
    # docs/cluster.md, Results in object storage (run by tests/test_results_uri.py against
    # a local S3 server, with a bucket it makes; the last three in a dir of their own).
    "python -m runner results.uri=s3://my-bucket/rllib checkpoint.every=1 stop.iterations=2 "
    "hydra.run.dir=outputs/runs/first": Way(
        ("debug=tiny", "scaling.num_env_runners=0"), expect="results mirrored to"
    ),
    "python -m runner resume=s3://my-bucket/rllib/outputs/runs/first check.threshold=150 "
    "check.env_steps=100000 hydra.run.dir=outputs/runs/resumed": Way(
        ("check.threshold=5", "stop.iterations=3"), expect="results mirrored to"
    ),
    "python -m runner task=evaluate checkpoint=s3://my-bucket/rllib/outputs/runs/first:best "
    "task.episodes=5": Way(("task.episodes=2",), expect="results mirrored to"),
    "python -m runner.report s3://my-bucket/rllib/outputs/runs": Way(
        expect="1 run(s) with a check"
    ),
    # docs/search.md, Studies and populations (run by tests/test_tune.py after the README's
    # search, whose study the dashboard opens: see serve_dashboard). A population of 2
    # trials of 6 iterations, perturbed every 3 with both there (synch): the trailing one
    # exploits the other at iteration 3, where both have a checkpoint.
    "optuna-dashboard sqlite:///outputs/search/optuna.db": Way(expect="listed 4 trials"),
    "python -m runner task=tune search=ppo_cartpole_pbt task.num_samples=4 "
    "task.max_concurrent=2 hydra.run.dir=outputs/pbt": Way(
        (
            "task.num_samples=2",
            "stop.env_steps=null",
            "stop.iterations=6",
            "search.perturbation_interval=3",
            "search.synch=true",
            "search.quantile_fraction=0.5",
            "algo.training.train_batch_size_per_learner=500",
        ),  # fmt: skip
        expect="search: 2 trials (2 finished)",
    ),
    # docs/cluster.md, SLURM (run by tests/test_slurm.py, CI's cluster lane, on the local
    # SLURM the script starts: one node of 2 CPUs, so the two-node job runs as two tasks of
    # one node, each its Ray node; `stop` is followed by a `start` for the lane's next test).
    "bash scripts/slurm_local.sh start": Way(expect="SLURM is up: local* 1 node", in_repo=True),
    "python -m runner -m hydra/launcher=slurm seed=0,1 hydra.launcher.cpus_per_task=1 "
    "hydra.launcher.partition=local stop.iterations=2": Way(
        TINY, expect="sweep: 2 jobs, 0 failed", own_ray=True
    ),
    "python -m runner -m hydra/launcher=slurm hydra.launcher.nodes=2 "
    "hydra.launcher.cpus_per_task=8 scaling.num_env_runners=14 stop.iterations=2": Way(
        (
            *TINY,
            "hydra.launcher.nodes=1",
            "hydra.launcher.tasks_per_node=2",
            "hydra.launcher.cpus_per_task=1",
            "scaling.num_env_runners=1",
        ),  # fmt: skip
        expect="sweep: 1 jobs, 0 failed",
        own_ray=True,
    ),
    "bash scripts/slurm_local.sh stop": Way(expect="SLURM stopped", in_repo=True),
    # docs/gpu.md (run by tests/test_gpu_smoke.py, which checks what the dry run planned)
    "python benchmarks/gpu_smoke.py --dry-run": Way(expect="written: outputs/gpu_smoke/smoke.md"),
    "python benchmarks/gpu_smoke.py": Way(code=2, expect="sees no CUDA GPU here"),
    # docs/gpu.md, on a bare GPU machine (run by tests/test_gpu_bundle.py in a Python 3.12
    # venv made like that machine)
    "python benchmarks/gpu_bundle.py": Way(expect="written: "),
    "bash .gpu_bundle/run.sh dry": Way(expect="run.sh: dry passed"),
    "bash .gpu_bundle/run.sh check": Way(code=2, expect="sees no CUDA GPU here"),
    "bash .gpu_bundle/run.sh smoke": Way(code=2, expect="sees no CUDA GPU here"),
    # Results and resume
    # The resumed run composes these overrides, the small batch with them.
    "python -m runner stop.iterations=2 hydra.run.dir=outputs/my_run": Way(
        TINY, expect="done (iterations 2 >= 2)"
    ),
    "python -m runner resume=outputs/my_run stop.iterations=3": Way(
        expect="done (iterations 3 >= 3)"
    ),
    "tensorboard --logdir outputs": Way(expect="served the runs"),  # see serve_tensorboard
    # Use what you trained (run by tests/test_use_trained.py, which checks what each wrote):
    # two small iterations, a video after the second; two remote evaluation EnvRunners.
    "python -m runner record.every=10 hydra.run.dir=outputs/cartpole": Way(
        (*TINY, "stop.iterations=2", "record.every=2"), expect="iterations 2 >= 2"
    ),
    "python -m runner task=evaluate checkpoint=outputs/cartpole task.episodes=20 "
    "hydra.run.dir=outputs/cartpole_eval": Way(
        ("scaling.num_env_runners=2",), expect="evaluated 20 episodes (greedy)"
    ),
    "python -m runner task=evaluate checkpoint=outputs/cartpole task.video=true task.episodes=3 "
    "hydra.run.dir=outputs/cartpole_video": Way(expect="evaluated 3 episodes (greedy)"),
    "python -m runner task=export checkpoint=outputs/cartpole "
    "hydra.run.dir=outputs/cartpole_onnx": Way(expect="exported DefaultPPOTorchRLModule"),
    # Search and track (run by tests/test_tune.py, which checks what each wrote): 4 trials
    # of 4 small iterations (a batch the searched minibatch sizes fit in).
    "python -m runner task=tune search=ppo_cartpole task.num_samples=16 task.max_concurrent=2 "
    "logger=mlflow hydra.run.dir=outputs/search": Way(
        (
            "task.num_samples=4",
            "stop.env_steps=2000",
            "algo.training.train_batch_size_per_learner=500",
        ),
        expect="search: 4 trials",
    ),
    "python -m runner resume=outputs/search": Way(
        ("hydra.run.dir=outputs/search_resumed",), expect="search: 4 trials"
    ),
    "python -m runner experiment=best 'hydra.searchpath=[file://outputs/search]'": Way(
        ("stop.iterations=1", "hydra.run.dir=outputs/best"), expect="done (iterations 1 >= 1)"
    ),
    # 4 small iterations, each evaluated (2 episodes) and checkpointed; the newest and
    # the best evaluated checkpoint kept; a video at the end, for W&B.
    "python -m runner 'logger=[mlflow,wandb]' logger.wandb.mode=offline eval.every=5 "
    "eval.episodes=10 hydra.run.dir=outputs/tracked": Way(
        (*TINY, "stop.iterations=4", "eval.every=1", "eval.episodes=2")
        + ("checkpoint.every=1", "checkpoint.keep=1", "record.every=4"),
        expect="done (iterations 4 >= 4)",
    ),
    "python -m runner task=evaluate checkpoint=outputs/tracked:best "
    "hydra.run.dir=outputs/tracked_eval": Way(
        ("task.episodes=2",), expect="evaluated 2 episodes (greedy)"
    ),
    "python -m runner -m 'logger=[mlflow,wandb]' logger.wandb.mode=offline seed=1,2": Way(
        (*TINY, "stop.iterations=2", "hydra.sweep.dir=outputs/tracked_sweep"),
        expect="sweep: 2 jobs, 0 failed",
    ),
    # docs/benchmarks.md, Against RL Baselines3 Zoo: one pair, one seed, each side stopped
    # at 2 s of training (a miss each: the table still fills, with both sides' rates).
    "python benchmarks/vs_zoo.py --seeds 0,1,2 --readme docs/benchmarks.md": Way(
        ("--seeds", "0", "--pairs", "ppo_cartpole", "--max-seconds", "2"),
        expect="refreshed docs/benchmarks.md",
    ),
    # docs/benchmarks.md, The main job's wall time: one seed, the README's main job as a
    # user's machine runs it (its own Ray), kept for test_readme_block_runs to read.
    "python benchmarks/main_job.py --seeds 0,1,2 --readme docs/benchmarks.md": Way(
        ("--seeds", "0", "--out", "outputs/main_job"),
        expect="refreshed docs/benchmarks.md",
        own_ray=True,
    ),
    # docs/benchmarks.md, Off-policy throughput: one preset on one step, two iterations.
    "python benchmarks/offpolicy_profile.py --iterations 12 --rounds 3 "
    "--readme docs/benchmarks.md": Way(
        ("--iterations", "2", "--presets", "tuned_sac_pendulum", "--steps", "fast"),
        expect="refreshed docs/benchmarks.md",
    ),
    # docs/benchmarks.md, Runner overhead
    # One repeat a side: both run and the configs compare (the spread needs the five).
    "python benchmarks/overhead.py --iterations 10 --repeats 5": Way(
        ("--iterations", "1", "--repeats", "1"), expect="(min and max left out: 1 repeat(s)"
    ),
}

COMMANDS = commands()  # README.md, then docs/*.md
# Sections whose commands another test runs (with run_block), then checks what they wrote.
RUN_ELSEWHERE = {
    "Use what you trained": "tests/test_use_trained.py",
    "Search and track": "tests/test_tune.py",
    "On a GPU": "tests/test_gpu_smoke.py",
    "On a bare GPU machine": "tests/test_gpu_bundle.py",
    "Reproductions": "tests/test_reproductions.py",
    "Ray Jobs": "tests/test_ray_jobs.py",
    "Results in object storage": "tests/test_results_uri.py",
    "SLURM": "tests/test_slurm.py",
    "Studies and populations": "tests/test_tune.py",
}
# The README's first screen: install, then train, watch, evaluate, export, sweep, search.
FIRST_SCREEN = 45


def where_it_runs(shown: list[Command]) -> dict[str, Command]:
    """Where each command runs: a command shown more than once runs where a fenced block
    shows it last (a block's commands run in order, in one dir, so the ones before it are
    there), else where it is last shown inline (a mention). The README's first screen runs
    none of its own: its later sections show each command again with what it needs."""
    chosen: dict[str, Command] = {}
    for c in shown:
        if c.block or c.text not in chosen or not chosen[c.text].block:
            chosen[c.text] = c
    return chosen


RUNS = where_it_runs(COMMANDS)


def _key(c: Command) -> tuple[str, str, int]:
    return (c.page, c.section, c.block)


def _block_texts(block: tuple[str, str, int]) -> list[str]:
    """The commands a block runs here, in page order (a command shown again later runs there)."""
    return [c.text for c in COMMANDS if _key(c) == block and RUNS[c.text] == c]


BLOCKS = [
    block
    for block in dict.fromkeys(_key(c) for c in COMMANDS if c.section not in RUN_ELSEWHERE)
    if any(WAYS.get(text) is not SET_UP for text in _block_texts(block))
]


def _block_id(block: tuple[str, str, int]) -> str:
    page, section, number = block
    name = f"{section.split()[0].lower()}-{number}"
    return name if page == "README.md" else f"{Path(page).stem}:{name}"


def test_every_readme_command_has_a_way_to_run():
    """Every command on every page (README.md and docs/*.md) has its Way, and runs once."""
    shown = {c.text for c in COMMANDS}
    assert shown - WAYS.keys() == set(), "commands on a page without an entry in WAYS"
    assert WAYS.keys() - shown == set(), "entries in WAYS no page shows any longer"
    assert {c.page for c in COMMANDS} > {"README.md"}, "no docs page read"
    for text, c in RUNS.items():
        if WAYS[text] is SET_UP:
            continue
        ran = c.section in RUN_ELSEWHERE or _key(c) in BLOCKS
        assert ran and text in _block_texts(_key(c)), f"{c.page}, {c.section}: {text}"


def test_first_screen_goes_from_install_to_search():
    """The README's first screen: the main set-up command, then one command each to train,
    watch, evaluate, export, sweep and search, each run where a later section shows it."""
    first = [c for c in COMMANDS if c.page == "README.md" and c.line <= FIRST_SCREEN]
    texts = [c.text for c in first]
    assert setup("main") in texts
    tour = [c for c in first if WAYS[c.text] is not SET_UP and c.block]
    steps = ("hydra.run.dir=", "tensorboard --logdir", "task=evaluate", "task=export", " -m ")
    for step in (*steps, "task=tune"):
        assert any(step in c.text for c in tour), f"the first screen shows no '{step}'"
    for c in tour:
        assert RUNS[c.text].line > c.line, f"shown on the first screen alone: {c.text}"
    assert "```text" in "\n".join(README.read_text().splitlines()[:FIRST_SCREEN])


def test_readme_stays_a_readme():
    """The README's budget: 300 lines, the rest in docs/ (each page linked from it)."""
    text = README.read_text()
    assert len(text.splitlines()) <= 300, "README.md is over 300 lines: move detail to docs/"
    pages = sorted(p.name for p in (README.parent / "docs").glob("*.md"))
    assert [p for p in pages if f"docs/{p}" not in text] == []


@pytest.mark.slow
def test_python_api_example_runs(tmp_path: Path):
    """The README's Python API example, as a user saves and runs it (its outputs/ here),
    in a Ray job's environment: it joins the shared Ray (its own Ray is the main job's)."""
    (script,) = python_blocks("Python API")
    (tmp_path / "home").mkdir()
    (tmp_path / "example.py").write_text(script)
    proc = subprocess.run(
        [sys.executable, "example.py"],
        cwd=tmp_path,
        env=_env(tmp_path / "home", cli_env()),
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    status, iterations, run_dir = proc.stdout.strip().splitlines()[-1].split()
    assert (status, iterations) == ("finished", "2"), proc.stdout[-3000:]
    summary_file = (tmp_path / run_dir / "summary.json").resolve()
    assert summary_file.is_relative_to(tmp_path.resolve()) and summary_file.is_file()


def test_ci_runs_the_readme_set_up_commands():
    """.ci/run takes its commands from this README, so they cannot drift apart."""
    ci = (ROOT / ".ci" / "run").read_text()
    for name in ("test", "ipex", "cluster"):
        assert f"python3 tests/readme.py setup {name}" in ci
        assert setup(name).endswith(SETUP[name])
    # The main command installs what the test command installs, without the test extra.
    main, test = setup("main").split(" && "), setup("test").split(" && ")
    assert main[:-1] == [part.replace("'.[test]'", ".") for part in test[:-1]]
    assert main[-1] == "python -m runner"


def _env(home: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """`base` (this environment, with no shared Ray), with this interpreter's python, ray
    and tensorboard first on PATH, and a throwaway HOME."""
    base = cli_env(own_ray=True) if base is None else base
    path = f"{Path(sys.executable).parent}{os.pathsep}{base['PATH']}"
    return {**base, "PATH": path, "HOME": str(home)}


def serve_tensorboard(command: str, cwd: Path, env: dict[str, str]) -> str:
    """Start TensorBoard as written (on a free port), wait until it lists a run, stop it."""
    proc = subprocess.Popen(
        ["bash", "-c", f"exec {command} --port 0"],
        cwd=cwd,
        env={**env, "PYTHONUNBUFFERED": "1"},  # its address line, before it exits
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = None
        deadline = time.monotonic() + 120
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            found = re.search(r"http://\S+?:\d+/", line)
            url = found.group(0) if found else None
        assert url, "TensorBoard printed no address"
        while time.monotonic() < deadline:
            runs = json.loads(urllib.request.urlopen(f"{url}data/runs", timeout=10).read())
            if any("my_run" in run for run in runs):
                return "served the runs"
            time.sleep(1)
        raise AssertionError(f"TensorBoard at {url} listed no run of outputs/")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_dashboard(command: str, cwd: Path, env: dict[str, str]) -> str:
    """Start optuna-dashboard as written (on a free port), read its API's trials of the
    study, stop it."""
    port = _free_port()
    proc = subprocess.Popen(
        ["bash", "-c", f"exec {command} --port {port}"],
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                api = f"http://127.0.0.1:{port}/api/studies"
                (study,) = json.loads(urllib.request.urlopen(api, timeout=10).read())[
                    "study_summaries"
                ]
                trials = json.loads(
                    urllib.request.urlopen(f"{api}/{study['study_id']}", timeout=10).read()
                )["trials"]
                return f"listed {len(trials)} trials"
            except OSError:
                time.sleep(0.5)
        raise AssertionError(f"optuna-dashboard answered nothing on port {port}")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def run_block(commands_in_block: list[str], cwd: Path) -> dict[str, str]:
    """Each command as its Way says, checked; what each printed (stdout, then stderr)."""
    printed = {}
    for command in commands_in_block:
        way = WAYS[command]
        if way is SET_UP:
            continue
        env = _env(cwd / "home", cli_env(way.own_ray, way.env))
        if command.startswith("tensorboard "):
            assert serve_tensorboard(command, cwd, env) == way.expect
            continue
        if command.startswith("optuna-dashboard "):
            assert serve_dashboard(command, cwd, env) == way.expect
            continue
        line = " ".join([command, *way.extra])
        at = ROOT if way.in_repo else cwd
        if RUNNER_COMMAND.match(line) and not SHELL_SYNTAX & set(line):
            # The CLI's own entry point, called in this process (tests/cli_call.py).
            proc = cli_call.call(at, shlex.split(line)[3:], env, timeout=600)
        else:
            proc = subprocess.run(
                ["bash", "-c", line], cwd=at, env=env, capture_output=True, text=True, timeout=600
            )
        out = printed[command] = proc.stdout + proc.stderr
        assert proc.returncode == way.code, f"{line}\n{out[-3000:]}"
        assert way.expect in out, f"{line}\n{out[-3000:]}"
        assert not way.absent or way.absent not in out, f"{line}\n{out[-3000:]}"
        if way.code == 2:
            assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "Traceback" not in out, f"{line}\n{out[-3000:]}"
    return printed


def as_user_dir(path: Path) -> Path:
    """`path` as a user's dir: the pages' relative paths (benchmarks/, docs/, examples/,
    README.md) are there, and a HOME of its own."""
    for name in ("benchmarks", "docs", "examples"):
        shutil.copytree(ROOT / name, path / name)
    shutil.copy2(ROOT / "README.md", path / "README.md")
    (path / "home").mkdir()
    return path


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return as_user_dir(tmp_path)


# docs/cluster.md's `ray stop` stops every Ray on the machine: no other test runs beside it
# (it runs in CI's cluster lane, with the other tests of Ray clusters, one at a time).
ALONE = {("docs/cluster.md", "On a Ray cluster")}


def _param(block: tuple[str, str, int]) -> object:
    marks = [pytest.mark.alone, pytest.mark.cluster] if block[:2] in ALONE else []
    return pytest.param(block, marks=marks, id=_block_id(block))


@pytest.mark.slow
@pytest.mark.parametrize("block", [_param(b) for b in BLOCKS])
def test_readme_block_runs(block: tuple[str, str, int], workdir: Path):
    page, section, number = block
    try:
        run_block(_block_texts(block), workdir)
    finally:
        if (page, section) in ALONE:
            subprocess.run(["bash", "-c", "ray stop"], env=_env(workdir), capture_output=True)
        if block == ("README.md", "Bring your own", 1):
            # The install pointed into this temp dir: leave the environment as it was.
            pip = [sys.executable, "-m", "pip", "uninstall", "-y", "-q", "my-rl-pkg"]
            subprocess.run(pip, capture_output=True)
    if block == ("docs/compile.md", "torch.compile", 1):
        assert any((workdir / "home" / ".cache" / "rllib-runner" / "inductor").iterdir())
    if block == MAIN_JOB_BLOCK:
        main_job_solved_cartpole(workdir / "outputs" / "main_job" / "seed_0")


# docs/benchmarks.md's main-job block runs the README's main job (`python -m runner`, its
# seed and run dir given) as a fresh process with a Ray of its own, as on a user's machine.
MAIN_JOB_BLOCK = ("docs/benchmarks.md", "The main job's wall time", 1)


def main_job_solved_cartpole(run_dir: Path) -> None:
    """The main job: PPO on CartPole to 450, and where its start-up went (the block's
    table): every phase timed, each within the run's own seconds; Ray started while torch
    and RLlib imported."""
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stop_reason"].startswith("episode_return_mean")
    assert summary["final_episode_return_mean"] >= 450
    startup = summary["startup"]
    assert set(startup) == {"python_s", "imports_s", "ray_start_s", "build_s", "first_iteration_s"}
    assert 0 <= startup["python_s"] < 5, startup  # /proc's clock ticks: 10 ms steps
    timed = [startup[k] for k in ("imports_s", "ray_start_s", "build_s", "first_iteration_s")]
    assert all(0 < seconds < summary["wall_seconds"] for seconds in timed), startup
    assert startup["imports_s"] + startup["ray_start_s"] > summary["first_iteration_seconds"]
