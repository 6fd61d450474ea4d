"""compile=auto: per component kind, the fastest compile preset on this machine, measured.

For each component kind that compiles, the real RLModule is timed eager and compiled with
every candidate preset usable here, on inputs shaped like the real ones:
- EnvRunners: `forward_exploration` on the batch their vectorized envs produce;
- Learners: `forward_train` and its backward pass on a minibatch.

The eager and compiled calls are alternated round-robin after a warm-up. Each candidate is
charged its compile seconds, spread over the calls the run is expected to make. The fastest
one wins if it beats eager by `compile.auto.margin`; otherwise eager stays. A candidate that
fails to compile, or that disagrees with eager, is recorded as failed and skipped.

Measurements are cached on disk, keyed by what decides them: the device, thread count,
versions, module architecture, input shape and the candidates. A second run therefore
decides without timing anything. The choice is remade from the cached figures with this
run's expected calls and margin.
"""

from __future__ import annotations

import copy
import importlib.metadata
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
import torch._dynamo
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.torch import TorchRLModule
from torch._dynamo.utils import counters

from runner.algorithms.algorithm_config import build_module
from runner.compile.apply import compile_function
from runner.compile.settings import (
    IDLE,
    MODES,
    REFUSE,
    CompileSpec,
    available_backends,
    ipex_problem,
    module_device,
    placement,
)
from runner.envs import make_env, random_rollout
from runner.errors import ConfigError, did_you_mean, one_line
from runner.machine import cpu_model, measure_cache
from runner.machine.budget import Budget
from runner.machine.measure_cache import cache_dir, cache_file, writable
from runner.settings.schema import COMPONENT_KINDS, AutoConfig, RunnerConfig

KINDS = COMPONENT_KINDS
METHODS = {"env_runners": "forward_exploration", "learners": "forward_train"}
# A candidate must give eager's outputs within this, relative to their largest magnitude.
AGREEMENT = 1e-5
FALLBACK_ITERATIONS = 100


@dataclass(frozen=True)
class Component:
    """One component kind as the run will use it: where, how often, on what input."""

    kind: str
    batch_size: int
    threads: int
    device: str
    dynamic: bool | None  # compile.dynamic, as the run compiles with it
    expected_calls: int
    calls_from: str  # how expected_calls was estimated


def decisions_dir(auto: AutoConfig) -> Path:
    return cache_dir(auto.cache_dir, "compile-auto")


def parse(preset: str) -> tuple[str, str | None]:
    """'backend/mode' (or a bare backend) as (backend, mode); one line if unknown."""
    backend, _, mode = preset.partition("/")
    backends = available_backends()
    if backend not in backends:
        raise ConfigError(
            f"compile.auto.candidates: unknown backend in '{preset}'"
            f"{did_you_mean(backend, backends)}; torch has: {', '.join(backends)}"
        )
    if mode and mode not in MODES:
        raise ConfigError(
            f"compile.auto.candidates: unknown mode in '{preset}'{did_you_mean(mode, MODES)}; "
            f"use one of: {', '.join(MODES)}"
        )
    return backend, (mode or None)


def skip_reason(preset: str, kind: str, device: str) -> str | None:
    """Why `preset` cannot run for this component kind on this device, or adds nothing
    there (compile/settings.py's PLACEMENT table); None when it is a candidate."""
    backend, mode = parse(preset)
    verdict = placement(backend, mode, kind, device)
    if verdict is not None and verdict[0] in (REFUSE, IDLE):
        return verdict[1]
    if backend == "ipex":
        return ipex_problem()
    return None


def wanted_kinds(settings: RunnerConfig) -> list[str]:
    """The component kinds a run compiles (compile.env_runners, compile.learners)."""
    flags = {"env_runners": settings.compile.env_runners, "learners": settings.compile.learners}
    return [k for k in KINDS if flags[k]]


def component(settings: RunnerConfig, config: AlgorithmConfig, kind: str) -> Component:
    """The component kind as this run's scaling and stop criteria describe it."""
    s, auto = settings.scaling, settings.compile.auto
    steps_per_iteration = max(1, config.total_train_batch_size)
    iterations, calls_from = auto.expected_iterations, "compile.auto.expected_iterations"
    if iterations is None:
        budget = settings.stop.env_steps or settings.check.env_steps
        if settings.stop.iterations:
            iterations, calls_from = settings.stop.iterations, "stop.iterations"
        elif budget:
            iterations = math.ceil(budget / steps_per_iteration)
            calls_from = "stop.env_steps" if settings.stop.env_steps else "check.env_steps"
        else:
            iterations, calls_from = FALLBACK_ITERATIONS, "no stop bound: an assumed"
    driver_threads = torch.get_num_threads()
    if kind == "env_runners":
        runners = max(1, s.num_env_runners)
        calls = iterations * steps_per_iteration / (s.num_envs_per_env_runner * runners)
        threads = max(1, int(s.num_cpus_per_env_runner)) if s.num_env_runners else driver_threads
        batch = s.num_envs_per_env_runner
    else:
        per_learner = config.train_batch_size_per_learner
        batch = min(getattr(config, "minibatch_size", None) or per_learner, per_learner)
        calls = iterations * getattr(config, "num_epochs", 1) * math.ceil(per_learner / batch)
        cpus = s.num_cpus_per_learner or 1
        threads = max(1, int(cpus)) if s.num_learners else driver_threads
    return Component(
        kind=kind,
        batch_size=int(batch),
        threads=threads,
        device=module_device(s, kind),
        dynamic=settings.compile.dynamic,
        expected_calls=max(1, int(calls)),
        calls_from=f"{calls_from} {iterations} iterations",
    )


def check(settings: RunnerConfig, kinds: list[str] | None = None) -> None:
    """compile=auto's settings, before anything is built: candidates that exist, at least
    one usable per component kind (`kinds`, default: those the run compiles), timing
    counts, a writable cache dir."""
    auto = settings.compile.auto
    if settings.algo.multi_agent:
        raise ConfigError(
            "compile=auto times one RLModule; for a multi-agent run pick a preset, e.g. "
            "compile=inductor_default"
        )
    if kinds is None and settings.compile.learner_granularity.value != "forward_train":
        raise ConfigError(
            "compile=auto times forward_train; drop compile.learner_granularity=complete_update"
        )
    if min(auto.timed_calls - 1, auto.warmup_calls, auto.margin, auto.timed_seconds) < 0:
        raise ConfigError(
            "compile.auto.timed_calls must be >= 1, and warmup_calls, timed_seconds and "
            f"margin >= 0, got {auto.timed_calls}, {auto.warmup_calls}, "
            f"{auto.timed_seconds} and {auto.margin}"
        )
    if auto.budget_seconds <= 0:
        raise ConfigError(f"compile.auto.budget_seconds must be > 0, got {auto.budget_seconds:g}")
    if auto.expected_iterations is not None and auto.expected_iterations < 1:
        raise ConfigError(
            f"compile.auto.expected_iterations must be >= 1 (or null), "
            f"got {auto.expected_iterations}"
        )
    kinds = wanted_kinds(settings) if kinds is None else kinds
    if not kinds:
        raise ConfigError(
            "compile=auto applies to no component: set compile.env_runners=true or "
            "compile.learners=true"
        )
    for kind in kinds:
        device = module_device(settings.scaling, kind)
        reasons = {c: skip_reason(c, kind, device) for c in auto.candidates}
        if all(reasons.values()):
            why = "; ".join(f"{c}: {r}" for c, r in reasons.items()) or "the list is empty"
            raise ConfigError(
                f"compile=auto leaves no candidate for the {kind.replace('_', ' ')} on "
                f"{device} ({why}); add one to compile.auto.candidates, e.g. "
                "inductor/default"
            )
    writable(decisions_dir(auto), "compile.auto.cache_dir")


def module_and_batch(
    config: AlgorithmConfig, comp: Component
) -> tuple[TorchRLModule, dict[str, torch.Tensor]]:
    """The component's RLModule, as its actor builds it, and an input batch for it."""
    env = make_env(config)
    try:
        # RLlib's torch framework builds a TorchRLModule (single-agent: checked by `check`).
        built = build_module(config, env, inference_only=comp.kind == "env_runners")
        module = cast(TorchRLModule, built).to(comp.device)
        data = random_rollout(env, config.seed, comp.batch_size)
    finally:
        env.close()

    def tensor(values: np.ndarray, dtype: torch.dtype | None = None) -> torch.Tensor:
        return torch.as_tensor(values, dtype=dtype, device=comp.device)

    batch = {Columns.OBS: tensor(data["obs"])}
    if comp.kind == "learners":
        module.train()
        batch.update(
            {
                Columns.NEXT_OBS: tensor(data["next"]),
                Columns.ACTIONS: tensor(data["action"]),
                Columns.REWARDS: tensor(data["reward"], torch.float32),
                Columns.TERMINATEDS: tensor(data["terminated"], torch.bool),
                Columns.TRUNCATEDS: tensor(data["truncated"], torch.bool),
            }
        )
    else:
        module.eval()
    return module, batch


def _caller(module: TorchRLModule, batch: dict, kind: str, cuda: bool) -> Callable[[], Any]:
    """One call as the component makes it: exploration under no_grad; a Learner's
    forward_train with the backward pass of its outputs."""

    def explore() -> Any:
        with torch.no_grad():
            out = module.forward_exploration(batch, t=0)
        if cuda:
            torch.cuda.synchronize()
        return out

    def train() -> Any:
        out = module.forward_train(batch)
        loss = sum(v.float().mean() for v in out.values() if torch.is_tensor(v) and v.requires_grad)
        if torch.is_tensor(loss):
            loss.backward()
        module.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        return out

    return explore if kind == "env_runners" else train


def _gap(ours: dict, theirs: dict) -> float:
    """The largest |compiled - eager| over the outputs, relative to their magnitude."""
    gaps, scale = [0.0], 1.0
    for key, value in theirs.items():
        if torch.is_tensor(value) and value.is_floating_point():
            gaps.append(float((ours[key].detach() - value.detach()).abs().max()))
            scale = max(scale, float(value.detach().abs().max()))
    return max(gaps) / scale


# A candidate the budget left no time to compile.
BUDGET_SPENT = "left out: compile.auto.budget_seconds spent"


def _compiled(
    row: dict[str, Any], comp: Component, module: TorchRLModule, batch: dict, reference: Any
) -> Callable[[], Any] | None:
    """A copy of the module with row["preset"] compiled into the component's method, its
    first call timed and compared with eager's `reference`; its caller, or None where it
    failed or disagrees (the row says why)."""
    backend, mode = parse(row["preset"])
    twin = copy.deepcopy(module)
    method = f"_{METHODS[comp.kind]}"
    spec = CompileSpec(backend, mode, comp.dynamic, True, True, "forward_train")
    setattr(twin, method, compile_function(spec, getattr(twin, method)))
    call = _caller(twin, batch, comp.kind, comp.device == "cuda")
    try:
        start = time.perf_counter()
        out = call()
        row["compile_seconds"] = time.perf_counter() - start
        row["max_rel_diff"] = _gap(out, reference)
    except Exception as ex:  # a backend that cannot compile this module
        row.update(status="failed", reason=one_line(ex))
        return None
    if row["max_rel_diff"] > AGREEMENT:
        row.update(
            status="failed",
            reason=f"differs from eager by {row['max_rel_diff']:.1e} (> {AGREEMENT:g})",
        )
        return None
    row["status"] = "measured"
    return call


def measure(
    comp: Component,
    module: TorchRLModule,
    batch: dict,
    auto: AutoConfig,
    budget: Budget,
    kinds_left: int = 1,
) -> dict[str, Any]:
    """Eager and every usable candidate, timed round-robin; per candidate its status,
    compile seconds, median seconds per call and gap to eager. A candidate compiles only
    where the budget leaves it time beside the timed rounds of this kind and the
    `kinds_left` - 1 after it."""
    torch._dynamo.reset()
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(comp.threads)
    try:
        eager = _caller(module, batch, comp.kind, comp.device == "cuda")
        reference = eager()
        results: list[dict[str, Any]] = []
        callers = {"eager": eager}
        for preset in auto.candidates:
            row: dict[str, Any] = {"preset": preset}
            results.append(row)
            reason = skip_reason(preset, comp.kind, comp.device)
            if reason:
                row.update(status="skipped", reason=reason)
                continue
            if not budget.affordable(keep=auto.timed_seconds * kinds_left):
                row.update(status="skipped", reason=BUDGET_SPENT)
                continue
            budget.begin()
            call = _compiled(row, comp, module, batch, reference)
            what = f"{comp.kind.replace('_', ' ')}: {preset}"
            seconds = row.get("compile_seconds")
            budget.measured(
                f"{what} failed" if seconds is None else f"{what} compiled in {seconds:.1f} s"
            )
            if call is not None:
                callers[preset] = call
        seconds = _alternate(callers, auto.warmup_calls, auto.timed_calls, auto.timed_seconds)
    finally:  # the run's own compile counts start from nothing
        torch.set_num_threads(previous_threads)
        torch._dynamo.reset()
        counters.clear()
    for row in results:
        if row["status"] == "measured":
            row["call_seconds"] = seconds[row["preset"]]
    return {"eager_call_seconds": seconds["eager"], "candidates": results}


def _alternate(
    callers: dict[str, Callable], warmup: int, timed: int, seconds: float
) -> dict[str, float]:
    """Median seconds per call of each, calls alternated one by one (the starting one
    rotates each round), so every caller sees the same machine. The timed rounds stop
    after `timed`, or once `seconds` have passed (after at least 5 rounds)."""
    names = list(callers)
    for _ in range(warmup):
        for name in names:
            callers[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    deadline = time.perf_counter() + seconds
    for round_ in range(timed):
        if round_ >= 5 and time.perf_counter() > deadline:
            break
        for i in range(len(names)):
            name = names[(round_ + i) % len(names)]
            start = time.perf_counter()
            callers[name]()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def decide(measured: dict[str, Any], comp: Component, margin: float) -> dict[str, Any]:
    """The choice from the figures: each candidate's per-call seconds plus its compile
    seconds spread over the expected calls, against eager."""
    eager = measured["eager_call_seconds"]
    rows = [dict(row) for row in measured["candidates"]]
    scored = [row for row in rows if row["status"] == "measured"]
    for row in scored:
        row["effective_call_seconds"] = (
            row["call_seconds"] + row["compile_seconds"] / comp.expected_calls
        )
        row["call_speedup"] = eager / row["call_seconds"] - 1
        row["speedup"] = eager / row["effective_call_seconds"] - 1
    best = max(scored, key=lambda row: row["speedup"], default=None)
    spread = f"compile seconds spread over {comp.expected_calls:,} calls ({comp.calls_from})"
    if best is not None and best["speedup"] > margin:
        choice = best["preset"]
        why = (
            f"{choice} {best['speedup']:+.1%} over eager ({best['compile_seconds']:.1f} s "
            f"compile, {spread})"
        )
    else:
        choice = "eager"
        why = (
            f"no candidate beat eager by {margin:.0%} (best: {best['preset']} "
            f"{best['speedup']:+.1%}, {spread})"
            if best
            else "no candidate could be measured"
        )
    return {
        **asdict(comp),
        "eager_call_seconds": eager,
        "candidates": rows,
        "choice": choice,
        "why": why,
    }


def _versions() -> dict[str, str | None]:
    def version(name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    return {
        "torch": torch.__version__,
        "onnxruntime": version("onnxruntime"),
        "ipex": version("intel-extension-for-pytorch"),
    }


def _device_name(comp: Component) -> str:
    if comp.device == "cuda":
        return torch.cuda.get_device_name(0)
    return cpu_model()


def cache_key(
    comp: Component, module: torch.nn.Module, batch: dict, auto: AutoConfig
) -> dict[str, Any]:
    """Everything that decides a measurement (not the run's length: the choice is remade)."""
    return {
        "kind": comp.kind,
        "device": _device_name(comp),
        "threads": comp.threads,
        "dynamic": comp.dynamic,
        "versions": _versions(),
        "architecture": repr(module),
        "input": {k: [*v.shape, str(v.dtype)] for k, v in sorted(batch.items())},
        "candidates": list(auto.candidates),
        "timing": [auto.warmup_calls, auto.timed_calls, auto.timed_seconds],
        "budget_seconds": auto.budget_seconds,  # a bigger one may measure what this left out
    }


def figures_for(
    settings: RunnerConfig,
    config: AlgorithmConfig,
    comp: Component,
    refresh: bool,
    budget: Budget,
    kinds_left: int = 1,
) -> tuple[dict[str, Any], str, float]:
    """The figures for this component kind: from the cache unless `refresh`; and where
    they came from ("cache" or "measured") and the seconds it took."""
    start = time.perf_counter()
    auto = settings.compile.auto
    module, batch = module_and_batch(config, comp)
    key = cache_key(comp, module, batch, auto)
    path = cache_file(decisions_dir(auto), comp.kind, key)
    figures, source = measure_cache.measured_or_cached(
        path,
        key,
        refresh,
        lambda: measure(comp, module, batch, auto, budget, kinds_left),
        "compile.auto.cache_dir",
    )
    return figures, source, time.perf_counter() - start


def choose(
    settings: RunnerConfig,
    config: AlgorithmConfig,
    kinds: list[str] | None = None,
    refresh: bool | None = None,
) -> dict[str, Any]:
    """Per component kind (default: those the run compiles): the figures, read from the
    cache or measured now (always with `refresh`, default compile.auto.refresh), and the
    choice."""
    auto = settings.compile.auto
    if settings.compile.cache_dir:  # inductor's cache, which the actors then load from
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(settings.compile.cache_dir).resolve())
    section: dict[str, Any] = {"margin": auto.margin, "cache_dir": str(decisions_dir(auto))}
    refresh = auto.refresh if refresh is None else refresh
    comps = [
        component(settings, config, k) for k in (wanted_kinds(settings) if kinds is None else kinds)
    ]
    usable = sum(
        skip_reason(c, comp.kind, comp.device) is None for comp in comps for c in auto.candidates
    )
    budget = Budget("compile=auto", auto.budget_seconds, usable)
    with budget.shown("candidates compiled"):
        for n, comp in enumerate(comps):
            kind = comp.kind
            left = len(comps) - n
            figures, source, seconds = figures_for(settings, config, comp, refresh, budget, left)
            section[kind] = {**decide(figures, comp, auto.margin), "source": source}
            section[kind]["decision_seconds"] = seconds
    return section


def chosen_spec(settings: RunnerConfig, section: dict[str, Any]) -> CompileSpec | None:
    """The compile spec the choices make: each kind's preset, or that kind left eager."""

    def preset(kind: str) -> tuple[str, str | None] | None:
        choice = section.get(kind, {}).get("choice", "eager")
        return None if choice == "eager" else parse(choice)

    runners, learners = preset("env_runners"), preset("learners")
    first = runners or learners
    if first is None:
        return None
    spec = CompileSpec(
        backend=first[0],
        mode=first[1],
        dynamic=settings.compile.dynamic,
        env_runners=runners is not None,
        learners=learners is not None,
        learner_granularity="forward_train",
    )
    return (
        replace(spec, learner_backend=learners[0], learner_mode=learners[1]) if learners else spec
    )


def describe(section: dict[str, Any]) -> str:
    """One line: per component kind, the choice, why, and whether it was measured now."""
    parts = []
    for kind in KINDS:
        if kind in section:
            entry = section[kind]
            source = (
                "cached decision"
                if entry["source"] == "cache"
                else f"measured in {entry['decision_seconds']:.0f} s"
            )
            parts.append(f"{kind.replace('_', ' ')} -> {entry['choice']}: {entry['why']}; {source}")
    return "compile=auto: " + "; ".join(parts)
