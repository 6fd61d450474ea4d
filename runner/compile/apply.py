"""torch.compile applied inside EnvRunners and Learners, each compiled method counted.

RLlib 2.60 compiles nothing here on the new API stack (its EnvRunners never read
`torch_compile_worker`; its Learner's forward_train loop tests the wrong object), so the
runner compiles the modules itself, from `on_algorithm_init` (and again for EnvRunners
that Ray recreates), in every process that holds one: the local and remote EnvRunners and
Learners. Each compiled method is wrapped in a `CompiledCall` that counts what dynamo did
for it, so every run can report, per component, whether compile took effect (`report`).
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import ray
import torch
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.multi_rl_module import MultiRLModule
from ray.rllib.utils.actor_manager import RemoteCallResults

from runner.compile.settings import MODE_BACKENDS, CompileSpec
from runner.settings.user_code import beside

if TYPE_CHECKING:  # dynamo (about 1 s to import) loads where a compile runs, not before
    from torch._dynamo.callback import CallbackArgs

ENV_RUNNER_METHODS = ("_forward_exploration", "_forward_inference")
LEARNER_METHODS = ("_forward_train",)


def compile_function(spec: CompileSpec, fn: Callable) -> Callable:
    """torch.compile(fn) with this spec; inductor freezing stays off (weights change)."""
    load_backend(spec.backend)
    watch_cuda_graphs()
    kwargs: dict[str, Any] = {"backend": spec.backend, "dynamic": spec.dynamic}
    if spec.backend in MODE_BACKENDS and spec.mode not in (None, "default"):
        kwargs["mode"] = spec.mode
    if spec.backend == "onnxrt":
        kwargs["dynamic"] = False  # the exported graph has a dynamic batch dim instead
    return torch.compile(fn, **kwargs)


def load_backend(backend: str) -> None:
    """Register the backends torch does not ship, in the calling process."""
    if backend == "inductor":
        import torch._inductor.config

        # Freezing folds weights into the graph as constants: a weight sync would be lost.
        torch._inductor.config.freezing = False
    elif backend == "onnxrt":
        from runner.compile import onnxrt

        onnxrt.register()
    elif backend == "ipex":
        import intel_extension_for_pytorch  # noqa: F401 - registers the "ipex" backend


# What a CompiledCall counts: its share of the process-wide counters of dynamo, inductor
# (CUDA graphs it skipped), the onnxrt backend (sessions rebuilt with new weights after a
# weight sync) and watch_cuda_graphs (CUDA graphs recorded).
COUNTED = {
    "frames": ("frames", "ok"),
    "unique_graphs": ("stats", "unique_graphs"),
    "cache_hits": ("inductor", "fxgraph_cache_hit"),
    "cache_misses": ("inductor", "fxgraph_cache_miss"),
    "cudagraph_skips": ("inductor", "cudagraph_skips"),
    "cudagraph_recordings": ("cudagraphs", "recordings"),
    "session_rebuilds": ("onnxrt", "rebuilds"),
    "rebuild_seconds": ("onnxrt", "rebuild_seconds"),
}
# Why torch skipped CUDA graphs, in this process, as it logged each skip (in order).
SKIP_REASONS: list[str] = []
SKIP_PREFIX = "skipping cudagraphs due to "


def counts() -> dict[str, int]:
    """The process-wide counters COUNTED names, now."""
    from torch._dynamo.utils import counters

    return {name: counters[group][key] for name, (group, key) in COUNTED.items()}


def _count_recording(args: CallbackArgs) -> None:
    from torch._dynamo.callback import CallbackTrigger
    from torch._dynamo.utils import counters

    if args.callback_trigger == CallbackTrigger.CUDAGRAPH_RECORDING:
        counters["cudagraphs"]["recordings"] += 1


# Where torch logs a CUDA-graph skip: its cudagraphs artifact (torch 2.13), its perf
# hints (torch 2.8, the ipex extra's).
SKIP_LOGGERS = (
    "torch._inductor.cudagraph_utils.__cudagraphs",
    "torch._inductor.cudagraph_utils.__perf_hints",
)


class _SkipReasons(logging.Handler):
    """Keeps the reason of each CUDA-graph skip torch logs ("skipping cudagraphs due to
    ..."; a CPU-only graph is skipped without one), and nothing else those loggers say."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        reason = record.getMessage().split(". Found from", 1)[0].splitlines()[0]
        if not reason.startswith(SKIP_PREFIX):
            return
        while reason.startswith(SKIP_PREFIX):
            reason = reason[len(SKIP_PREFIX) :]
        SKIP_REASONS.append(reason)


def watch_cuda_graphs() -> None:
    """Count CUDA graphs as torch records them (its CUDAGRAPH_RECORDING callback, which
    dynamo.reset() clears) and keep why it skips them; idempotent, in the calling process.

    Inductor counts only skips: a CUDA-graph mode that never recorded a graph would
    otherwise look like compile took full effect."""
    from torch._dynamo.callback import callback_handler

    if _count_recording not in callback_handler.end_callbacks:
        callback_handler.register_end_callback(_count_recording)
    for name in SKIP_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(h, _SkipReasons) for h in logger.handlers):
            logger.addHandler(_SkipReasons())


def limit_compile_threads() -> None:
    """In an actor, no more inductor compile workers than the CPUs Ray gave it (at least
    one); inductor's own default is min(32, the node's cores) in every process, so 64
    one-CPU EnvRunners on a 64-core node would start 2,048. Before the actor's first
    compile, which starts the workers. The driver, and a TORCHINDUCTOR_COMPILE_THREADS of
    the user's (their ray.runtime_env's env_vars, or their shell's), are left as they are."""
    if "TORCHINDUCTOR_COMPILE_THREADS" in os.environ:
        return
    context = ray.get_runtime_context()
    if context.worker.mode != ray.WORKER_MODE:
        return
    import torch._inductor.config

    cpus = context.get_assigned_resources().get("CPU", 0)
    torch._inductor.config.compile_threads = max(1, int(cpus))


class CompiledCall:
    """A compiled method that records its compile time and what dynamo compiled for it.

    Counters are process-wide, so each call takes the difference around itself: two
    components in one process (the local EnvRunner and the local Learner) keep theirs apart.
    """

    def __init__(self, eager: Callable, compiled: Callable, name: str) -> None:
        self.eager = eager
        self.compiled = compiled
        self.name = name
        self.calls = 0
        self.first_call_seconds: float | None = None
        self.recompiles = 0
        self.counts = dict.fromkeys(COUNTED, 0)
        self.skip_reasons: list[str] = []
        # The last real call's arguments, for max_abs_diff's replay (None before one).
        self.last_call: tuple[tuple, dict] | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self._counted(args, kwargs)
        self.calls += 1
        self.last_call = args, kwargs
        return out

    def _counted(self, args: tuple, kwargs: dict) -> Any:
        """The compiled call, with what it made dynamo, inductor or onnxrt do."""
        before, reasons, start = counts(), len(SKIP_REASONS), time.perf_counter()
        out = self.compiled(*args, **kwargs)
        seconds = time.perf_counter() - start
        after = counts()
        if self.calls == 0:
            self.first_call_seconds = seconds
        elif after["frames"] > before["frames"]:
            self.recompiles += 1
        for name in COUNTED:
            self.counts[name] += after[name] - before[name]
        for reason in SKIP_REASONS[reasons:]:
            if reason not in self.skip_reasons:
                self.skip_reasons.append(reason)
        return out

    def max_abs_diff(self) -> float | None:
        """Replay the last real input through compiled and eager code: the largest gap.
        None where eager code gives two answers to one input: a forward pass that samples
        (DQN's epsilon-greedy exploration) has no gap to measure."""
        if self.last_call is None:
            return None
        args, kwargs = self.last_call
        # Same grad mode as the real call, so the replay hits the compiled graph as it is.
        ours = self._counted(args, kwargs)
        theirs = self.eager(*args, **kwargs)
        again = self.eager(*args, **kwargs)
        if any(
            torch.is_tensor(v) and not torch.equal(v.detach(), again[k].detach())
            for k, v in theirs.items()
        ):
            return None
        gaps = [
            (ours[k].detach() - v.detach()).abs().max()
            for k, v in theirs.items()
            if torch.is_tensor(v)
        ]
        return max((float(g) for g in gaps), default=0.0)

    def stats(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "first_call_seconds": self.first_call_seconds,
            "recompiles": self.recompiles,
            **self.counts,
            "cudagraph_skip_reasons": self.skip_reasons,
        }


def _torch_modules(module: Any) -> dict[str, Any]:
    """The TorchRLModules inside an EnvRunner's or Learner's module, by module id."""
    modules = dict(module.items()) if isinstance(module, MultiRLModule) else {"default": module}
    # unwrapped(): a DDP-wrapped Learner module compiles the module inside.
    return {
        mid: m.unwrapped()  # type: ignore[operator]  # an RLModule too: mypy sees nn.Module only
        for mid, m in modules.items()
        if isinstance(m, torch.nn.Module)
    }


def _wrap(owner: Any, module: Any, methods: Iterable[str], spec: CompileSpec) -> None:
    calls = getattr(owner, "_runner_compiled", {})
    for mid, sub in _torch_modules(module).items():
        for method in methods:
            if f"{mid}.{method}" in calls:
                continue
            eager = getattr(sub, method)
            call = CompiledCall(eager, compile_function(spec, eager), f"{mid}.{method}")
            setattr(sub, method, call)
            calls[call.name] = call
    owner._runner_compiled = calls


def compile_env_runner(env_runner: Any, spec: CompileSpec, warm_up: bool) -> None:
    """Compile the module; with `warm_up`, compile now on a batch shaped like the real ones.

    Warming up one EnvRunner before the others fills the node's compile cache, so the
    others load their graphs from it instead of all compiling at once.
    """
    module = env_runner.module
    if module is None:
        return
    limit_compile_threads()
    _wrap(env_runner, module, ENV_RUNNER_METHODS, spec)
    if warm_up and not isinstance(module, MultiRLModule):
        obs = torch.as_tensor(env_runner.env.observation_space.sample())
        module.forward_exploration({Columns.OBS: obs.to(env_runner._device)}, t=0)


def compile_learner(learner: Any, spec: CompileSpec) -> None:
    """forward_train of every sub-module, or wrap RLlib's own compiled complete update."""
    limit_compile_threads()
    spec = spec.for_learners()
    if spec.learner_granularity == "complete_update":
        calls = getattr(learner, "_runner_compiled", {})
        if "complete_update" not in calls:
            compiled = learner._possibly_compiled_update
            calls["complete_update"] = CompiledCall(
                learner._uncompiled_update, compiled, "complete_update"
            )
            learner._possibly_compiled_update = calls["complete_update"]
        learner._runner_compiled = calls
    else:
        _wrap(learner, learner.module, LEARNER_METHODS, spec)


def plain_values(results: Any) -> list:
    """foreach_learner results as plain values (a local Learner returns a plain list)."""
    if isinstance(results, RemoteCallResults):
        return [r.get() for r in results]
    return list(results)


def _compile_group(group: Any, spec: CompileSpec) -> None:
    """The local EnvRunner, then one remote EnvRunner, then the rest at once (cache hits)."""
    remote = group.healthy_env_runner_ids()
    group.foreach_env_runner(
        functools.partial(compile_env_runner, spec=spec, warm_up=not remote),
        local_env_runner=True,
        remote_worker_ids=remote[:1] or None,
    )
    if len(remote) > 1:
        group.foreach_env_runner(
            functools.partial(compile_env_runner, spec=spec, warm_up=True),
            local_env_runner=False,
            remote_worker_ids=remote[1:],
        )


def apply(*, algorithm: Any, spec: CompileSpec, **_: Any) -> None:
    """on_algorithm_init: compile every EnvRunner's and Learner's module, in its process."""
    if spec.env_runners:
        for group in (algorithm.env_runner_group, algorithm.eval_env_runner_group):
            if group is not None:
                _compile_group(group, spec)
    if spec.learners:
        plain_values(algorithm.learner_group.foreach_learner(compile_learner, spec=spec))


def reapply(
    *, env_runner_group: Any, env_runner_indices: list[int], spec: CompileSpec, **_: Any
) -> None:
    """on_env_runners_recreated: a recreated EnvRunner gets a fresh, uncompiled module."""
    if spec.env_runners:
        env_runner_group.foreach_env_runner(
            functools.partial(compile_env_runner, spec=spec, warm_up=True),
            remote_worker_ids=env_runner_indices,
            local_env_runner=False,
        )


def add_to_config(config: AlgorithmConfig, spec: CompileSpec | None) -> None:
    """Compile through callbacks in every EnvRunner and Learner process, beside the user's
    own callbacks (algo.callbacks).

    A complete-update compile is RLlib's own (it works); the runner only wraps it to count.
    """
    if spec is None:
        return
    config.callbacks(
        on_algorithm_init=beside(
            config.callbacks_on_algorithm_init, functools.partial(apply, spec=spec)
        ),
        on_env_runners_recreated=beside(
            config.callbacks_on_env_runners_recreated, functools.partial(reapply, spec=spec)
        ),
    )
    if spec.learners and spec.learner_granularity == "complete_update":
        learners = spec.for_learners()
        config.framework(
            torch_compile_learner=True,
            torch_compile_learner_what_to_compile="complete_update",
            torch_compile_learner_dynamo_backend=learners.backend,
            torch_compile_learner_dynamo_mode=learners.mode or "default",
        )
