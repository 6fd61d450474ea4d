"""The spine: one training loop, one env factory, one settings check, imports that flow
one way, the Python API, and run dirs no two runs share."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
from cli_call import start_many
from conftest import cli_env, compose_config

import runner
from runner import CONFIG_DIR, envs, report
from runner.api import compose, unique_dir
from runner.envs import video
from runner.errors import ConfigError
from runner.job.app import prepare
from runner.settings.schema import typed

RUNNER = Path(runner.__file__).resolve().parent
# The layers of docs/architecture.md, bottom first: a module imports from its own layer
# or below, never up (and never in a circle: test_no_import_circle).
LAYERS = [
    # foundation: data types, messages, files, the machine
    {
        "errors",
        "settings",
        "algorithms",
        "results",
        "settings.schema",
        "job",
        "console",
        "machine.budget",
        "settings.overrides",
        "job.guard",
        "job.check",
        "settings.help",
        "machine",
        "machine.measure_cache",
        "machine.slurm",
        "machine.plan",
        "settings.user_code",
        "machine.ray_session",
        "machine.short_stack",
        "machine.env_runner_errors",
        "settings.search",
        "results.files",
        "results.plots",
        "results.stats",
        "results.hub",
        "algorithms.flat_replay",
    },
    # results and faults
    {
        "results.checkpoints",
        "results.record",
        "results.jobs",
        "results.seeds",
        "results.tracking",
        "results.wandb_logger",
        "results.trials",
        "results.remote",
        "machine.shutdown",
        "job.resume",
    },
    # mechanism: envs, compile, the AlgorithmConfig, the preflight, trained policies
    {
        "envs",
        "envs.masking",
        "algorithms.sac_module",
        "algorithms.reward_scaling",
        "compile",
        "compile.settings",
        "compile.onnxrt",
        "compile.apply",
        "compile.report",
        "compile.auto",
        "machine.placement",
        "algorithms.fast_step",
        "algorithms.algorithm_config",
        "machine.preflight",
        "machine.scaling_auto",
        "algorithms.trained",
        "envs.video",
        "job.task",
    },
    # the one loop and what watches it, the one settings check, the ONNX export
    {"job.loop", "job.callbacks", "settings.validate", "settings.autos", "algorithms.onnx_export"},
    # tasks
    {
        "tasks",
        "tasks.train",
        "tasks.tune",
        "tasks.evaluate",
        "tasks.export",
        "tasks.autotune",
        "tasks.inference_bench",
        "tasks.exploration_bench",
        "tasks.push",
    },
    # one job, config -> plan -> preflight -> task
    {"job.app", "job.hooks"},
    # entry points and tools over results
    {"api", "__main__", "sweep", "compare", "report", "docs", "published"},
]


def _modules() -> dict[str, Path]:
    found = {}
    for path in RUNNER.rglob("*.py"):
        name = ".".join(path.relative_to(RUNNER).with_suffix("").parts)
        found[name.removesuffix(".__init__") if name != "__init__" else ""] = path
    return found


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The runner modules `path` imports, at the top, inside a function, or for type hints
    only (under `if TYPE_CHECKING`: a layer's types come from its own layer or below too,
    and a circle of hints is a circle)."""
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            if name.startswith("runner.") and name[7:] in modules:
                found.add(name[7:])
                break
    return found


def test_every_module_has_a_layer():
    layered = set().union(*LAYERS)
    assert set(_modules()) - {""} == layered


def test_imports_never_run_back_up_a_layer():
    modules = _modules()
    layer = {name: i for i, names in enumerate(LAYERS) for name in names}
    upward = [
        f"{name} (layer {layer[name]}) imports {target} (layer {layer[target]})"
        for name, path in modules.items()
        if name
        for target in _imports(path, modules)
        if layer[target] > layer[name]
    ]
    assert upward == []


def test_the_architecture_page_draws_these_layers():
    """docs/architecture.md's layers table names each layer's modules, as LAYERS does."""
    modules = set(_modules())
    page = (RUNNER.parent / "docs" / "architecture.md").read_text()
    rows = [line for line in page.splitlines() if re.match(r"\| \d ", line)]
    assert len(rows) == len(LAYERS)
    for row, layer in zip(rows, LAYERS, strict=True):
        named = set()
        for token in re.findall(r"`([^`]+)`", row.split("|")[2]):
            name = token.removesuffix(".py").replace("/", ".").removesuffix(".__init__")
            if name.endswith(".*"):
                named |= {m for m in modules if m.startswith(name[:-1]) or m == name[:-2]}
            elif name in modules:
                named.add(name)
        if "one module per task" in row:
            named |= {m for m in modules if m.startswith("tasks.")}
        assert named == layer, row


def test_no_import_circle():
    modules = _modules()
    graph = {name: _imports(path, modules) - {name} for name, path in modules.items() if name}
    state: dict[str, int] = {}

    def visit(name: str, trail: list[str]) -> None:
        state[name] = 1
        for target in graph[name]:
            assert state.get(target) != 1, " -> ".join([*trail, name, target])
            if target not in state:
                visit(target, [*trail, name])
        state[name] = 2

    for name in graph:
        if name not in state:
            visit(name, [])


def test_each_function_reads_in_one_sitting():
    """No function in runner/ over 60 lines; the job's own flow (app.run) in 40."""
    lengths = {
        f"{path.relative_to(RUNNER)}:{node.name}": node.end_lineno - node.lineno + 1
        for path in RUNNER.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno
    }
    assert {name: n for name, n in lengths.items() if n > 60} == {}
    assert lengths["job/app.py:run"] <= 40


def test_one_training_loop_calls_algorithm_train():
    calls = [
        f"{path.relative_to(RUNNER)}:{n}"
        for path in RUNNER.rglob("*.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "algo.train()" in line
    ]
    assert len(calls) == 1 and calls[0].startswith("job/loop.py:"), calls


def test_the_env_factory_builds_every_env_with_the_same_settings():
    """`env.env_config` reaches the driver's env (preflight, compile=auto, export), an
    RLlib EnvRunner's and video's: one factory, so an episode is cut at 7 steps in all."""
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

    config = prepare(
        typed(compose_config(["debug=tiny", "+env.env_config.max_episode_steps=7"]))
    ).config
    assert config.env is envs.RunnerEnv
    driver = envs.make_env(config)
    rollout = envs.random_rollout(driver, 0, 30)
    assert rollout["terminated"].sum() == 0 and rollout["truncated"].sum() == 4  # at 7 steps
    driver.reset(seed=0)
    steps = next(i for i in range(1, 20) if driver.step(driver.action_space.sample())[3])
    assert steps == 7
    env_runner = SingleAgentEnvRunner(config=config)
    try:
        episodes = env_runner.sample(num_episodes=2, random_actions=True)
    finally:
        env_runner.stop()
    assert all(len(e) <= 7 for e in episodes)
    rendering = envs.make_env(config, render_mode=video.RENDER)
    assert rendering.render_mode == video.RENDER and rendering.spec.max_episode_steps == 7


def test_misdispatched_task_is_refused_at_composition():
    with pytest.raises(ConfigError, match="unknown config key 'task.name'"):
        compose(["task=train", "task.name=evaluate"])
    assert compose(["task=evaluate"]).task.name == "evaluate"


def test_python_api_composes_typed_settings_and_refuses_a_typo():
    settings = compose(["algo=dqn", "stop.iterations=2"])
    assert (settings.algo.name, settings.stop.iterations) == ("DQN", 2)
    with pytest.raises(ConfigError, match=r"unknown option 'inductr'.*did you mean"):
        compose(["compile=inductr"])


@pytest.mark.slow
@pytest.mark.usefixtures("joins_shared_ray")
def test_python_api_runs_a_job_and_returns_its_summary(tmp_path: Path, monkeypatch):
    """runner.run returns the record as the job wrote it: summary.json is never read back
    while it runs (a read of it fails the run), and the file holds the same record."""
    monkeypatch.chdir(tmp_path)
    read_text, path_open, running = Path.read_text, Path.open, [True]

    def allowed(path: Path) -> Path:
        assert not (running[0] and path.name == "summary.json"), f"runner.run read {path}"
        return path

    monkeypatch.setattr(Path, "read_text", lambda p, *a, **k: read_text(allowed(p), *a, **k))
    monkeypatch.setattr(Path, "open", lambda p, *a, **k: path_open(allowed(p), *a, **k))
    summary = runner.run(["debug=tiny", "checkpoint.at_end=false"])
    running[0] = False
    run_dir = Path(summary["run_dir"])
    assert summary["status"] == "finished" and summary["iterations"] == 1
    assert run_dir.parent.parent == Path("outputs/runs")
    written = json.loads((run_dir / "summary.json").read_text())
    assert {**written, "run_dir": str(run_dir)} == summary  # and where it is
    with pytest.raises(ConfigError, match="scaling.num_env_runners must be >= 0"):
        runner.run(["scaling.num_env_runners=-1"])


def test_unique_dir_suffixes_a_taken_name(tmp_path: Path):
    base = str(tmp_path / "runs" / "12-00-00")
    Path(base).mkdir(parents=True)  # another run's
    made = unique_dir(base)
    assert made == f"{base}-2" and Path(made).is_dir()
    assert unique_dir(base) == f"{base}-3"  # each call a new dir, in one process too


@pytest.mark.slow  # it trains
@pytest.mark.usefixtures("joins_shared_ray")
def test_a_run_from_the_python_api_is_in_the_report(tmp_path: Path, monkeypatch, capsys):
    """A run started from `runner.run()` writes its own config and overrides (no Hydra
    files), so the report's verification table takes it as it takes a CLI run."""
    monkeypatch.chdir(tmp_path)
    summary = runner.run(["debug=tiny", "check.threshold=1", "checkpoint.every=0"])
    run_dir = Path(summary["run_dir"])
    assert not (run_dir / ".hydra").exists()
    assert (run_dir / "config.yaml").is_file() and (run_dir / "composed_overrides.yaml").is_file()
    assert report.main([str(tmp_path / "outputs"), "--out", str(tmp_path / "report")]) == 0
    assert "1 run(s) with a check, 1 rows" in capsys.readouterr().out
    table = (tmp_path / "report" / "verification.md").read_text()
    assert "debug=tiny | 1 | 1/1 |" in table  # its row: 1 seed, passed


def test_each_api_run_gets_its_own_run_dir(tmp_path: Path, monkeypatch):
    """Three `run()` calls in a row in one process (the clock's second mostly shared):
    three run dirs, each with its own plan."""
    monkeypatch.chdir(tmp_path)
    dirs = [runner.run(["dry_run=true", f"seed={n}"])["run_dir"] for n in range(3)]
    assert len(set(dirs)) == 3 and all((Path(d) / "plan.json").is_file() for d in dirs)


@pytest.mark.slow
def test_two_sweeps_launched_at_once_get_their_own_sweep_dirs(tmp_path: Path):
    """Two `-m` sweeps launched together, naming their sweep dir with the same second (the
    default's resolver, its time fixed): each gets its own dir, and each summary holds its
    own jobs only."""
    assert "dir: ${unique_dir:outputs/multirun/" in (Path(CONFIG_DIR) / "config.yaml").read_text()
    same = "hydra.sweep.dir=${unique_dir:outputs/multirun/same-second}"
    sweeps = [["-m", "dry_run=true", f"seed={a},{b}", same] for a, b in ((1, 2), (3, 4))]
    results = start_many([(tmp_path, args) for args in sweeps], cli_env())
    assert [r.returncode for r in results] == [0, 0], [r.stderr[-2000:] for r in results]
    dirs = sorted((tmp_path / "outputs" / "multirun").iterdir())
    assert [d.name for d in dirs] == ["same-second", "same-second-2"]
    seeds = sorted(
        sorted(json.loads((job / "job.json").read_text())["overrides"] for job in d.glob("[0-9]"))
        for d in dirs
    )
    assert seeds == [
        [["dry_run=True", "seed=1"], ["dry_run=True", "seed=2"]],
        [["dry_run=True", "seed=3"], ["dry_run=True", "seed=4"]],
    ]


@pytest.mark.slow
def test_four_runs_started_at_once_get_four_run_dirs(tmp_path: Path):
    """Four `python -m runner` launched together in one dir, each resolving the run dir
    through the default's resolver with the same name (a second shared by all four)."""
    assert "dir: ${unique_dir:outputs/runs/" in (Path(CONFIG_DIR) / "config.yaml").read_text()
    args = [
        "debug=tiny",
        "scaling.num_env_runners=0",
        "hydra.run.dir=${unique_dir:outputs/runs/same-second}",
    ]
    # Four processes at once, on the shared Ray.
    results = start_many([(tmp_path, args)] * 4, cli_env())
    assert [r.returncode for r in results] == [0] * 4, [r.stderr[-2000:] for r in results]
    dirs = sorted((tmp_path / "outputs" / "runs").iterdir())
    assert [d.name for d in dirs] == ["same-second", *(f"same-second-{n}" for n in (2, 3, 4))]
    summaries = [json.loads((d / "summary.json").read_text()) for d in dirs]
    assert [s["iterations"] for s in summaries] == [1] * 4
    assert all(len((d / "metrics.jsonl").read_text().splitlines()) == 1 for d in dirs)
