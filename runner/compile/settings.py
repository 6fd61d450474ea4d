"""torch.compile settings: what is valid, checked once, and the spec every process gets.

`onnxrt` (removed from torch in 2.9) and `ipex` (from the optional extra) are provided
by the runner rather than by torch, so they are accepted by name here. Nothing here
compiles: `apply` does, from the `CompileSpec` this module makes.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from dataclasses import dataclass, replace

import torch

from runner.errors import ConfigError, did_you_mean
from runner.settings.schema import CompileConfig, ScalingConfig

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
RUNNER_BACKENDS = ("onnxrt", "ipex")
INFERENCE_ONLY = ("onnxrt",)
# Backends that take torch.compile's `mode`; the others are given none.
MODE_BACKENDS = ("inductor", "ipex")


@dataclass(frozen=True)
class CompileSpec:
    """The compile settings every process needs (picklable, sent with the callbacks)."""

    backend: str
    mode: str | None
    dynamic: bool | None
    env_runners: bool
    learners: bool
    learner_granularity: str
    # compile=auto may choose another preset for the Learners than for the EnvRunners.
    learner_backend: str | None = None
    learner_mode: str | None = None

    @property
    def preset(self) -> str:
        own = f"{self.backend}/{self.mode or 'default'}"
        if self.learner_backend is None or not self.env_runners:
            return own if self.learner_backend is None else self.for_learners().preset
        theirs = self.for_learners().preset
        return own if theirs == own else f"{own} on EnvRunners, {theirs} on Learners"

    def for_learners(self) -> CompileSpec:
        """The spec a Learner compiles with."""
        if self.learner_backend is None:
            return self
        return replace(
            self, backend=self.learner_backend, mode=self.learner_mode, learner_backend=None
        )


def available_backends() -> list[str]:
    """Backend names this torch knows, plus the runner's own."""
    import torch._dynamo

    names = set(torch._dynamo.list_backends(exclude_tags=())) | set(RUNNER_BACKENDS)
    return sorted(n for n in names if "TESTING" not in n and "minifier" not in n)


def resolve(compile_cfg: CompileConfig) -> tuple[CompileSpec | None, list[str]]:
    """Check the settings once: raise ConfigError if invalid; else the spec (None when
    compile is off) and warnings for settings that will be ignored."""
    backend, mode = compile_cfg.backend, compile_cfg.mode
    if backend is None:
        return None, []
    spec = CompileSpec(
        backend=backend,
        mode=mode,
        dynamic=compile_cfg.dynamic,
        env_runners=compile_cfg.env_runners,
        learners=compile_cfg.learners,
        learner_granularity=compile_cfg.learner_granularity.value,
    )
    backends = available_backends()
    if backend not in backends:
        raise ConfigError(
            f"unknown compile.backend '{backend}'{did_you_mean(backend, backends)}; "
            f"torch {torch.__version__} has: {', '.join(backends)}"
        )
    if mode is not None and mode not in MODES:
        raise ConfigError(
            f"unknown compile.mode '{mode}'{did_you_mean(mode, MODES)}; use one of: "
            f"{', '.join(MODES)}"
        )
    if compile_cfg.learners and backend in INFERENCE_ONLY:
        raise ConfigError(
            f"compile.backend={backend} runs inference only and cannot compile a Learner; "
            "set compile.learners=false"
        )
    warnings = []
    if mode not in (None, "default") and backend not in MODE_BACKENDS:
        warnings.append(f"compile.mode={mode} is ignored by backend {backend}")
    if not (compile_cfg.env_runners or compile_cfg.learners):
        warnings.append(f"compile.backend={backend} is set but applies to no component")
        return None, warnings
    return spec, warnings


def uses_cuda_graphs(spec: CompileSpec) -> bool:
    """The cudagraphs backend, or inductor's reduce-overhead and max-autotune modes (both
    turn CUDA graphs on)."""
    return spec.backend == "cudagraphs" or (
        spec.backend == "inductor" and spec.mode in ("reduce-overhead", "max-autotune")
    )


def module_device(scaling: ScalingConfig, kind: str) -> str:
    """Where RLlib puts a component kind's modules ("env_runners" or "learners"): on a GPU
    if its actors get one. The local EnvRunner (num_env_runners=0) is given no GPU by
    RLlib, whatever num_gpus_per_env_runner says; a local Learner does get one."""
    if kind == "env_runners":
        on_gpu = scaling.num_env_runners > 0 and scaling.num_gpus_per_env_runner > 0
    else:
        on_gpu = (scaling.num_gpus_per_learner or 0) > 0  # null: not yet laid out, none
    return "cuda" if on_gpu else "cpu"


EVALUATION_RUNNERS = "evaluation EnvRunners"


def compiled_parts(
    spec: CompileSpec | None, scaling: ScalingConfig, evaluation_runners: int = 0
) -> dict[str, str]:
    """The compiled parts of a training run, each with the device its modules sit on. The
    compile callbacks run in every EnvRunner, the `evaluation_runners` remote evaluation
    EnvRunners too, which take the training EnvRunners' GPUs (a local one takes none)."""
    if spec is None:
        return {}
    parts = {}
    if spec.env_runners:
        local = scaling.num_env_runners == 0
        name = "local EnvRunner (scaling.num_env_runners=0)" if local else "EnvRunners"
        parts[name] = module_device(scaling, "env_runners")
        if evaluation_runners:
            on_gpu = scaling.num_gpus_per_env_runner > 0
            parts[EVALUATION_RUNNERS] = "cuda" if on_gpu else "cpu"
    if spec.learners:
        parts["Learners"] = module_device(scaling, "learners")
    return parts


# Inductor's modes without CUDA graphs, for Learners that cannot use them.
_WITHOUT_CUDA_GRAPHS = {"reduce-overhead": "default", "max-autotune": "max-autotune-no-cudagraphs"}


def without_ddp_cuda_graphs(
    spec: CompileSpec | None, scaling: ScalingConfig
) -> tuple[CompileSpec | None, list[str]]:
    """Two or more GPU Learners train under DDP, where CUDA graph trees are not supported
    (pytorch/pytorch#113809; crashes in #128218, replays in #89546): their Learners
    compile without CUDA graphs (inductor's nearest mode; the cudagraphs backend not at
    all), the EnvRunners keep the preset, and one warning says so."""
    ddp = scaling.num_learners is not None and scaling.num_learners >= 2
    if spec is None or not spec.learners or not ddp or not scaling.num_gpus_per_learner:
        return spec, []
    learners = spec.for_learners()
    if not uses_cuda_graphs(learners):
        return spec, []
    preset = f"{learners.backend}/{learners.mode or 'default'}"
    if learners.backend == "inductor" and learners.mode in _WITHOUT_CUDA_GRAPHS:
        mode = _WITHOUT_CUDA_GRAPHS[learners.mode]
        fallback: CompileSpec | None = replace(spec, learner_backend="inductor", learner_mode=mode)
        instead = f"inductor/{mode}"
    else:
        fallback = replace(spec, learners=False) if spec.env_runners else None
        instead = "eager"
    return fallback, [
        f"compile {preset} on {scaling.num_learners} GPU Learners: DDP does not support CUDA "
        "graph trees (pytorch/pytorch#113809), so the Learners compile with "
        f"{instead} instead; the EnvRunners keep {preset}"
    ]


def _run(names: list[str]) -> str:
    """'the EnvRunners and Learners run', 'the benchmarked module runs'."""
    singular = len(names) == 1 and not names[0].split(" (")[0].endswith("s")
    return f"the {' and '.join(names)} {'runs' if singular else 'run'}"


# One table: what a backend (or a backend with a mode) does on a device beyond simply
# running there. "refuse": it cannot; "idle": it runs as another preset would (what it
# adds needs another device: compile=auto skips it); "warn": it runs, part of it unused.
# A backend with no entry runs on both devices; (backend, None) holds for every mode.
REFUSE, IDLE, WARN = "refuse", "idle", "warn"
PLACEMENT: dict[tuple[str, str | None, str], tuple[str, str]] = {
    ("onnxrt", None, "cuda"): (REFUSE, "onnxrt runs on onnxruntime's CPU provider only"),
    ("cudagraphs", None, "cpu"): (IDLE, "CUDA graphs need a CUDA device"),
    ("inductor", "reduce-overhead", "cpu"): (IDLE, "CUDA graphs need a CUDA device"),
    ("inductor", "max-autotune", "cpu"): (WARN, "its CUDA graphs need a CUDA device"),
}


def placement(backend: str, mode: str | None, kind: str, device: str) -> tuple[str, str] | None:
    """What the table says of `backend`/`mode` compiling a component kind's modules
    ("env_runners" or "learners") on `device`; None where it simply runs."""
    if backend in INFERENCE_ONLY and kind == "learners":
        return REFUSE, f"{backend} runs inference only (no backward for a Learner)"
    return PLACEMENT.get((backend, mode, device)) or PLACEMENT.get((backend, None, device))


def check_placement(spec: CompileSpec | None, parts: dict[str, str], algo: str) -> list[str]:
    """Compile settings against where the compiled modules sit (`parts`: name -> device),
    by the PLACEMENT table: a refusal is a ConfigError; a preset whose CUDA graphs go
    unused, and CUDA graphs on DQN's exploration, warn."""
    if spec is None:
        return []
    verdicts = {}
    for name, device in parts.items():
        own = spec.for_learners() if name == "Learners" else spec
        kind = "learners" if name == "Learners" else "env_runners"
        verdicts[name] = placement(own.backend, own.mode, kind, device)
    refused = [name for name, v in verdicts.items() if v and v[0] == REFUSE]
    if refused:
        on = "on a GPU" if parts[refused[0]] == "cuda" else "here"
        if refused == [EVALUATION_RUNNERS]:
            on += " (they take scaling.num_gpus_per_env_runner; eval.num_env_runners=0 "
            on += "evaluates in the driver, on the CPU)"
        raise ConfigError(
            f"compile.backend={spec.backend} runs on onnxruntime's CPU provider, but "
            f"{_run(refused)} {on} (every input and weight would be copied "
            "to the CPU on each call); keep onnxrt to CPU modules, or pick another backend, "
            "e.g. compile=inductor_default"
        )
    warnings = []
    if algo == "DQN" and spec.env_runners and spec.dynamic is False:
        import torch._dynamo

        warnings.append(
            "compile.dynamic=false: DQN passes forward_exploration its timestep as an int, "
            "which static shapes specialize on, so each new timestep recompiles until "
            f"dynamo's recompile limit ({torch._dynamo.config.recompile_limit}) leaves the "
            "EnvRunners' exploration to eager code (their recompiles in summary.json show "
            "it); keep compile.dynamic=null"
        )
    unused = [name for name, v in verdicts.items() if v and v[0] in (IDLE, WARN)]
    if unused:
        warnings.append(
            f"compile {spec.backend}/{spec.mode or 'default'}: {_run(unused)} on the CPU, "
            "where no CUDA graphs are used (torch skips them for CPU tensors)"
        )
    on_cuda = [name for name, device in parts.items() if device == "cuda"]
    if (
        uses_cuda_graphs(spec)
        and algo == "DQN"
        and {"EnvRunners", EVALUATION_RUNNERS} & set(on_cuda)
    ):
        warnings.append(
            f"compile {spec.backend}/{spec.mode or 'default'}: DQN's forward_exploration "
            "writes its epsilon into a CPU tensor's storage on every call (Tensor.data = ...), "
            "so torch skips CUDA graphs for it (an input storage mutation, a CPU input) and "
            "the GPU EnvRunners run their compiled kernels without them; summary.json counts "
            "the skips and their reasons"
        )
    return warnings


def ipex_problem() -> str | None:
    """Why the ipex backend cannot load here, or None.

    Versions are checked before any import: IPEX 2.8.0 beside another torch raises
    AttributeError on import, not ImportError.
    """
    fix = "install the extra: pip install -e '.[ipex]' (torch 2.8.0 + IPEX 2.8.0)"
    if importlib.util.find_spec("intel_extension_for_pytorch") is None:
        return (
            f"compile.backend=ipex needs intel-extension-for-pytorch, which is not installed; {fix}"
        )
    ipex_version = importlib.metadata.version("intel-extension-for-pytorch")
    torch_minor = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    ipex_minor = ".".join(ipex_version.split("+")[0].split(".")[:2])
    if torch_minor != ipex_minor:
        return (
            f"compile.backend=ipex: intel-extension-for-pytorch {ipex_version} needs torch "
            f"{ipex_minor}.*, but torch {torch.__version__} is installed; {fix}"
        )
    return None


def missing_packages(spec: CompileSpec | None) -> list[str]:
    """Packages the chosen backend needs and this environment lacks, as preflight problems."""
    if spec is not None and spec.backend == "ipex":
        problem = ipex_problem()
        return [problem] if problem else []
    return []
