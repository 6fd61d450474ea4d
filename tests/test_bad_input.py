"""Bad input: one line naming the problem and the fix, within seconds, and nothing
written outside the run's own new dir. Each case runs the job as `runner.run()` does, in
this process (the runner's error, its one line as the CLI prints it); the CLI's own
part (exit code 2, the line on stderr, no traceback) is a real `python -m runner`."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

import runner
from runner.errors import RunnerError, one_line

CASES = {
    "no gradient update per Learner call": (
        ["algo=dqn", "algo.fast_step.updates_per_call=0"],
        "algo.fast_step.updates_per_call=0: give at least 1 (gradient updates per Learner call)",
    ),
    "a reward-scaling discount above 1": (
        ["algo=ppo", "algo.reward_scaling.enabled=true", "algo.reward_scaling.gamma=1.5"],
        "algo.reward_scaling.gamma=1.5: give a discount in (0, 1], or null for the "
        "algorithm's gamma",
    ),
    "a negative reward clip": (
        ["algo=ppo", "algo.reward_scaling.enabled=true", "algo.reward_scaling.clip=-1"],
        "algo.reward_scaling.clip=-1.0: give a number above 0",
    ),
    "reward scaling for a multi-agent run": (
        ["algo=ppo", "env=multi_agent_cartpole", "algo.reward_scaling.enabled=true"],
        "a multi-agent run's rewards are per agent, which it does not scale",
    ),
    "reward scaling over two Learners": (
        [
            "algo=ppo",
            "algo.reward_scaling.enabled=true",
            "scaling.num_learners=2",
            "scaling.num_cpus_per_learner=1",
        ],
        "scaling.num_learners=2: each would keep its own statistics",
    ),
    "reward scaling with a Learner class of the user's": (
        [
            "algo=ppo",
            "algo.reward_scaling.enabled=true",
            "+algo.learners.learner_class=runner.algorithms.fast_step:FastDQNLearner",
        ],
        "algo.reward_scaling.enabled=true: algo.learners.learner_class=FastDQNLearner is the "
        "user's own; drop it for this run",
    ),
    "reward scaling on a framework other than torch": (
        ["algo=ppo", "+algo.framework.framework=tf2", "algo.reward_scaling.enabled=true"],
        "algo.reward_scaling.enabled=true: framework=tf2: the runner's Learners are torch's",
    ),
    "reward scaling for an algorithm other than PPO": (
        ["algo=dqn", "algo.reward_scaling.enabled=true"],
        "algo.reward_scaling.enabled=true: it scales PPO's rewards, not DQN's; drop it for "
        "this run",
    ),
    "misspelled key": (["scaling.num_env_runnrs=1"], "did you mean num_env_runners"),
    # Added with '+', a key no setting reads (OmegaConf drops it when it types the config).
    "misspelled key added": (
        ["+stop.iteratons=3"],
        "unknown config key 'stop.iteratons' (did you mean iterations?): no setting reads it",
    ),
    "a callback that is no Callback": (
        ["callbacks=[{_target_:collections.OrderedDict}]"],
        "callbacks[0]: collections.OrderedDict is not a subclass of runner.job.callbacks.Callback",
    ),
    "a callback's unknown keyword": (
        ["callbacks=[{_target_:runner.job.callbacks.StopCriteria,every:2}]"],
        "callbacks[0].every: StopCriteria() takes no 'every'",
    ),
    "misspelled top-level key added": (["+seeed=3"], "'seeed' (did you mean seed?)"),
    "a task's key added to another task": (
        ["+task.num_samples=3"],
        "unknown config key 'task.num_samples': no setting reads it",
    ),
    "unknown group option": (["compile=inductr"], "unknown option 'inductr' for config group"),
    # RLlib's own check fails on the tuned file's n_step range with a TypeError.
    "a DQN fragment length beside an n-step range": (
        ["experiment=tuned_dqn_cartpole", "+algo.env_runners.rollout_fragment_length=4"],
        "algo.env_runners.rollout_fragment_length=4 with algo.training.n_step=[2, 5]: RLlib's "
        "DQN checks a fragment length against one n-step value, not a range; give one (e.g. "
        "algo.training.n_step=5), or leave rollout_fragment_length at auto",
    ),
    "negative EnvRunner count": (["scaling.num_env_runners=-1"], "num_env_runners must be >= 0"),
    "scaling=auto for a task that is not one training run": (
        ["scaling=auto", "task=evaluate"],
        "scaling=auto picks the layout of one training run, not task=evaluate's",
    ),
    "scaling=auto beside compile=auto": (
        ["scaling=auto", "compile=auto"],
        "scaling=auto and compile=auto each measure with the other's choice fixed",
    ),
    "scaling=auto with no env per EnvRunner": (
        ["scaling=auto", "scaling.auto.envs_per_env_runner=[0,4]"],
        "scaling.auto.envs_per_env_runner counts start at 1, got [0, 4]",
    ),
    "scaling=auto with a negative EnvRunner count": (
        ["scaling=auto", "scaling.auto.env_runners=[-1]"],
        "must be non-empty lists of counts >= 0, got [-1] and",
    ),
    "scaling=auto sampling for no time": (
        ["scaling=auto", "scaling.auto.seconds=0"],
        "scaling.auto.seconds and budget_seconds must be > 0 and margin >= 0, got 0.0, 30 and 0.05",
    ),
    "scaling=auto with no time to measure": (
        ["scaling=auto", "scaling.auto.budget_seconds=-1"],
        "scaling.auto.seconds and budget_seconds must be > 0",
    ),
    "compile=auto with no time to measure": (
        ["compile=auto", "compile.auto.budget_seconds=0"],
        "compile.auto.budget_seconds must be > 0, got 0",
    ),
    "no iteration without samples allowed": (
        ["guard.unsampled_iterations=0"],
        "guard.unsampled_iterations must be >= 1, got 0",
    ),
    "scaling=auto's cache where no dir can be": (
        ["scaling=auto", "scaling.auto.cache_dir=/dev/null/layouts"],
        "scaling.auto.cache_dir '/dev/null/layouts' is not writable (Not a directory)",
    ),
    "scaling=auto with GPU EnvRunners and only local sampling to try": (
        [
            "scaling=auto",
            "scaling.num_env_runners=1",
            "scaling.num_gpus_per_env_runner=0.5",
            "scaling.auto.env_runners=[0]",
        ],
        "needs EnvRunner actors, and scaling.auto.env_runners=[0] has no count above 0",
    ),
    "scaling=auto with an unknown vectorization": (
        ["scaling=auto", "scaling.auto.vectorize_modes=[sync,asnyc]"],
        "scaling.auto.vectorize_modes must name some of sync, async",
    ),
    "fractional EnvRunner count": (
        ["scaling.num_env_runners=1.5"],
        "could not be converted to Integer",
    ),
    "GPU count on a CPU profile": (
        ["scaling.num_gpus_per_learner=1"],
        "hardware=cpu but the plan asks",
    ),
    "GPU profile on a CPU machine": (["hardware=a100"], "expects an NVIDIA A100 GPU"),
    "too many EnvRunners": (["scaling.num_env_runners=8"], "actors need 8 CPU(s)"),
    "no cluster at ray.address": (
        ["ray.address=127.0.0.1:1"],
        "ray.address=127.0.0.1:1: no Ray cluster answers there ([Errno 111] Connection refused)"
        ": start one (ray start --head) or pass ray.address=local",
    ),
    "W&B online without a login": (
        ["logger=wandb"],
        "logger=wandb with logger.wandb.mode=online needs a W&B login: run `wandb login`",
    ),
    "parallel evaluation without its EnvRunners": (
        ["eval.every=1", "eval.parallel=true"],
        "set eval.num_env_runners >= 1",
    ),
    "negative stop criterion": (["stop.iterations=-3"], "stop.iterations must be >= 0"),
    "unknown env id": (["env.id=CartPol-v1"], "did you mean CartPole-v1"),
    "unknown env wrapper": (
        ["env.wrappers=[gymnasium.wrappers:FlattenObservatio]"],
        "env.wrappers[0]: gymnasium.wrappers:FlattenObservatio: 'gymnasium.wrappers' has no "
        "'FlattenObservatio' (did you mean FlattenObservation or ",
    ),
    "env wrapper's unknown keyword": (
        [
            "env.wrappers=[gymnasium.wrappers:FlattenObservation,"
            "{_target_:gymnasium.wrappers.TimeLimit,max_steps:7}]"
        ],
        "env.wrappers[1].max_steps: TimeLimit() takes no 'max_steps' (did you mean "
        "max_episode_steps?)",
    ),
    "env wrapper that fails on the env": (
        ["env.wrappers=[gymnasium.wrappers:ClipAction]"],
        "env.wrappers[0]: ClipAction(env, ...) failed: ",
    ),
    "an algo without the env's action space": (
        ["algo=dqn", "env=pendulum"],
        "DQN takes a Discrete action space, and env.id=Pendulum-v1 has Box(-2.0, 2.0, (1,), "
        "float32): pick an algo that takes it (algo=ppo takes any), or another env",
    ),
    "policies for a single-agent env": (
        ["env.policies=shared"],
        "env.policies=shared is for multi-agent envs; env.id=CartPole-v1 is single-agent",
    ),
    "policies generated and declared": (
        ["experiment=tuned_ppo_multi_agent_cartpole", "env.policies=per_agent"],
        "env.policies=per_agent and algo.multi_agent both set the policies: keep one",
    ),
    "frames stacked of a discrete observation": (
        ["env.id=FrozenLake-v1", "env.framestack=4"],
        "env.framestack=4 stacks array observations (a gymnasium Box); this env's are Discrete(16)",
    ),
    "unknown algo option": (["algo=ppoo"], "unknown option 'ppoo' for config group 'algo'"),
    "unknown algo name": (["algo.name=PPOO"], "unknown algo.name 'PPOO'"),
    "unknown RLlib setting": (["+algo.training.lrr=1"], "takes no 'lrr' (did you mean lr?)"),
    "malformed override": (["stop.iterations=["], "malformed override"),
    "override without value": (["scaling.num_env_runners"], "malformed override"),
    "keeping no checkpoint": (["checkpoint.keep=0"], "keep at least 1, or null to keep all"),
    "unknown guard mode": (["guard.non_finite=maybe"], "invalid value for 'guard.non_finite'"),
    "missing resume path": (
        ["resume=does/not/exist"],
        "resume path 'does/not/exist' does not exist",
    ),
    "missing checkpoint path": (
        ["task=evaluate", "checkpoint=does/not/exist"],
        "checkpoint path 'does/not/exist' does not exist",
    ),
    "evaluate without a checkpoint": (["task=evaluate"], "task=evaluate needs checkpoint="),
    "export from a dir without checkpoints": (
        ["task=export", "checkpoint=."],
        "checkpoint path '.' holds no checkpoint",
    ),
    "unknown compile backend": (
        ["compile.backend=inductr", "compile.env_runners=true"],
        "unknown compile.backend 'inductr' (did you mean inductor?)",
    ),
    "unknown compile mode": (
        ["compile=inductor_default", "compile.mode=fast"],
        "unknown compile.mode",
    ),
    "onnxrt on Learners": (["compile=onnxrt_default", "compile.learners=true"], "inference only"),
    "ipex without the extra": (["compile=ipex_default"], "pip install -e '.[ipex]'"),
    "compile=auto with no usable candidate": (
        ["compile=auto", "compile.auto.candidates=[cudagraphs/default]"],
        "compile=auto leaves no candidate for the env runners on cpu (cudagraphs/default: CUDA",
    ),
    "unknown compile=auto candidate": (
        ["compile=auto", "compile.auto.candidates=[indcutor/default]"],
        "unknown backend in 'indcutor/default' (did you mean inductor?)",
    ),
    "unwritable compile=auto cache": (
        ["compile=auto", "compile.auto.cache_dir=/dev/null/decisions"],
        "compile.auto.cache_dir '/dev/null/decisions' is not writable (Not a directory)",
    ),
    "compile=auto in a one-preset bench": (
        ["task=inference_bench", "compile=auto"],
        "compare them all with task=autotune",
    ),
    # The task is the group's choice: no second name to disagree with it.
    "a task named twice": (["task=train", "task.name=evaluate"], "unknown config key 'task.name'"),
    "RLlib's own check": (["scaling.gym_env_vectorize_mode=asyn"], "gym_env_vectorize_mode"),
    "unknown scale option": (["scale=locl"], "unknown option 'locl' for config group 'scale'"),
    "unknown experiment": (["experiment=headline_a100"], "for config group 'experiment'"),
    "exploration bench without timed iterations": (
        ["task=exploration_bench", "compile=eager", "task.timed_iterations=0"],
        "task.timed_iterations must be >= 1",
    ),
    "unquoted ~ in an override": (["compile.cache_dir=~/x"], """'compile.cache_dir="~/"""),
    "negative seconds": (["stop.seconds=-1"], "stop.seconds must be >= 0"),
    "a results.uri that is a path": (["results.uri=outputs/x"], "not a filesystem URI"),
    "a results.uri no filesystem opens": (["results.uri=foo://x/y"], "no filesystem opens"),
    "negative check budget": (["check.env_steps=-5"], "check.env_steps must be >= 0"),
    "a typed threshold beside a measured one": (
        ["check.baseline=random", "check.threshold=5"],
        "check.baseline=random measures the threshold: drop check.threshold=5",
    ),
    "negative Ray CPUs": (["ray.num_cpus=-1"], "ray.num_cpus must be >= 0"),
    "misspelled log level": (["ray.log_level=EROR"], "expected one of [DEBUG, INFO"),
    "another task's setting": (["task.batch_sizes=[1]"], "unknown config key 'task.batch_sizes'"),
    "inference bench batch size 0": (
        ["task=inference_bench", "compile=eager", "task.batch_sizes=[0]"],
        "task.batch_sizes must be whole numbers >= 1",
    ),
    "env id whose module does not import": (
        ["env.id=nope_pkg:Env-v0"],
        "no module named 'nope_pkg'",
    ),
    "env class that does not exist": (
        ["env.id=null", "env.entry_point=gymnasium.envs.classic_control:CartPoleEnvv"],
        "has no 'CartPoleEnvv' (did you mean CartPoleEnv",
    ),
    # Named alone, an entry point takes env=custom; beside an env option, its id stays.
    "both an env id and an entry point": (
        ["env=cartpole", "env.entry_point=my:Env"],
        "set exactly one of env.id",
    ),
    "an env of the user's own that does not import": (
        ["env.entry_point=my:Env"],
        "env.entry_point: cannot import my:Env: no module named 'my'",
    ),
    "env constructor error": (["+env.env_config.bogus=1"], "env.id=CartPole-v1: making the env"),
    "not a callback class": (
        ["+algo.callbacks.callbacks_class=[gymnasium:Env]"],
        "algo.callbacks.callbacks_class: Env is not a subclass of RLlibCallback",
    ),
    "_target_ with a wrong argument": (
        [
            "+algo.rl_module.rl_module_spec._target_=ray.rllib.core.rl_module.RLModuleSpec",
            "+algo.rl_module.rl_module_spec.modle_config={}",
        ],
        "RLModuleSpec() takes no 'modle_config' (did you mean model_config",
    ),
    "not a connector": (
        ["+algo.env_runners.env_to_module_connector._target_=collections:OrderedDict"],
        "OrderedDict is not a ConnectorV2",
    ),
    "PettingZoo env function that is not one": (
        ["env.pettingzoo=math:pi", "env.id=null"],
        "env.pettingzoo=math:pi is a float, not a PettingZoo env function",
    ),
    "agent mapped to an undeclared policy": (
        ["experiment=tuned_ppo_multi_agent_cartpole", "algo.multi_agent.policy_mapping_fn.1=p2"],
        "policy_mapping_fn names policy 'p2', which is not one of algo.multi_agent.policies",
    ),
    "RLModule that cannot be built": (
        ["+algo.rl_module.model_config.fcnet_hiddens=[0]"],
        "algo.rl_module: building the RLModule failed: IndexError",
    ),
    "exploration reproduction on this CPU machine": (
        ["experiment=exploration_onnxrt_default"],
        "or add scale=local",
    ),
    "onnxrt on GPU EnvRunners": (
        ["hardware=gpu", "compile=onnxrt_default", "scaling.num_env_runners=1"]
        + ["scaling.num_gpus_per_env_runner=0.5"],
        "runs on onnxruntime's CPU provider, but the EnvRunners run on a GPU",
    ),
    "onnxrt bench on a GPU profile": (
        ["task=inference_bench", "compile=onnxrt_default", "hardware=a100"],
        "but the benchmarked module runs on a GPU",
    ),
    "fractional GPUs over several Learners": (
        ["hardware=t4", "scaling.num_learners=2", "scaling.num_gpus_per_learner=0.5"],
        "'Duplicate GPU detected'",
    ),
    "GPUs for the local EnvRunner": (
        ["hardware=gpu", "scaling.num_gpus_per_env_runner=0.5"],
        "RLlib gives the local EnvRunner no GPU",
    ),
    "several GPUs per Learner": (
        ["hardware=a100", "scaling.num_gpus_per_learner=2"],
        "a Learner uses one GPU",
    ),
    "more async env processes than cores": (
        ["scaling=async", "scaling.num_envs_per_env_runner=64"],
        "async runs 64 env processes",
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_bad_input_fails_fast_in_one_line(name: str, tmp_path: Path, monkeypatch):
    overrides, expected = CASES[name]
    monkeypatch.chdir(tmp_path)
    start = time.perf_counter()
    with pytest.raises(RunnerError) as refused:
        runner.run([*overrides, "hydra.run.dir=run"])
    seconds = time.perf_counter() - start
    line = one_line(refused.value)
    assert "\n" not in line and expected in line, line
    assert seconds < 10, f"took {seconds:.1f} s"
    run_dir = tmp_path / "run"
    assert set(tmp_path.iterdir()) <= {run_dir}
    if run_dir.exists():
        assert not (run_dir / "checkpoints").exists()
        assert not (run_dir / "metrics.jsonl").exists()


def test_the_cli_prints_the_one_line_and_exits_2(tmp_path: Path):
    """The CLI's part, in a process of its own: `error: <the line>` on stderr, nothing
    else, exit code 2, within seconds of the start."""
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "runner", "scaling.num_env_runnrs=1", "hydra.run.dir=run"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: unknown config key") and "did you mean" in line, line
    assert "Traceback" not in proc.stdout + proc.stderr
    assert time.perf_counter() - start < 30


# The CLI's entry point in a fresh interpreter, then which heavy modules it had imported.
_REFUSED_BEFORE = """
import sys
import runner.__main__ as cli
sys.argv = ["runner", *sys.argv[1:]]
try:
    cli.main()
except SystemExit as ex:
    print("exit", ex.code)
print("imported", [m for m in ("torch", "ray", "gymnasium") if m in sys.modules])
"""


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("scaling.num_env_runners=-1", "scaling.num_env_runners must be >= 0, got -1"),
        ("stop.seconds=-1", "stop.seconds must be >= 0 (or null), got -1.0"),
        ("env.id=null", "set exactly one of env.id"),
    ],
)
def test_a_setting_out_of_range_is_refused_before_torch_or_ray_is_imported(
    override: str, expected: str, tmp_path: Path
):
    """The settings' own rules run before the job imports torch, Ray and RLlib (seconds of
    a bad run's time): the one line, exit 2, and a record that says refused and why."""
    proc = subprocess.run(
        [sys.executable, "-c", _REFUSED_BEFORE, override, "hydra.run.dir=run"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.stdout.splitlines()[-2:] == ["exit 2", "imported []"], proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"error: {expected}"), line
    record = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert record["status"] == "refused" and record["error"] == line.removeprefix("error: ")
    assert record["overrides"] == [override] and record["task"] == "train"


def test_a_refused_runs_dir_takes_the_same_command_fixed(tmp_path: Path, monkeypatch):
    """A refused run's record is no result: the fixed command may use its run dir."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RunnerError):
        runner.run(["stop.iterations=-3", "hydra.run.dir=run"])
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "refused"
    dry = runner.run(["stop.iterations=3", "dry_run=true", "hydra.run.dir=run"])
    assert dry["run_dir"] == "run" and (tmp_path / "run" / "plan.json").is_file()


BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
# The benchmarks' own arguments, refused before anything trains: (script and arguments,
# exit code: argparse's 2, the script's own refusal 1, and the last line's text).
BENCHMARK_CASES = {
    "a seed list with a typo": (
        ["main_job.py", "--seeds", "0,x"],
        2,
        "error: argument --seeds: ",
    ),
    "an --out it cannot write": (
        ["main_job.py", "--seeds", "0", "--out", "/proc/rllib-runner"],
        1,
        "error: --out /proc/rllib-runner: ",
    ),
    "an unknown preset": (
        ["offpolicy_profile.py", "--presets", "tuned_dqn_cartpol"],
        1,
        "error: unknown preset 'tuned_dqn_cartpol'",
    ),
    "an unknown training step": (
        ["offpolicy_profile.py", "--steps", "slow"],
        1,
        "error: unknown step 'slow': pick from rllib, fast",
    ),
}


@pytest.mark.parametrize("name", BENCHMARK_CASES)
def test_a_benchmark_refuses_bad_arguments_in_one_line(name: str, tmp_path: Path):
    args, code, text = BENCHMARK_CASES[name]
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / args[0]), *args[1:]],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == code, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert text in line and "Traceback" not in proc.stderr, proc.stderr
    assert not any(tmp_path.iterdir())
