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
from runner.schema import CompileConfig, ScalingConfig

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
RUNNER_BACKENDS = ("onnxrt", "ipex")
AUTO = "auto"  # compile=auto: a preset per component kind, measured before the run
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
    if backend == AUTO:  # decided per component kind at run time (runner/compile/auto.py)
        ignored = [f"compile.mode={mode} is ignored by compile=auto"] if mode else []
        return replace(spec, mode=None), ignored
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
    if backend in INFERENCE_ONLY and compile_cfg.learners:
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


def compiled_on_cpu(spec: CompileSpec | None, scaling: ScalingConfig) -> list[str]:
    """The compiled parts of a training run (EnvRunners, Learners) whose modules sit on the CPU."""
    if spec is None:
        return []
    parts = (
        ("EnvRunners", spec.env_runners, scaling.num_gpus_per_env_runner),
        ("Learners", spec.learners, scaling.num_gpus_per_learner),
    )
    return [name for name, wanted, gpus in parts if wanted and gpus == 0]


def cuda_graph_warning(spec: CompileSpec | None, on_cpu: list[str]) -> str | None:
    """CUDA graphs asked for on compiled modules that run on the CPU: allowed, but say so.

    `on_cpu` names the compiled parts that run on the CPU (each task knows where its are).
    """
    if spec is None or not on_cpu:
        return None
    if spec.backend != "cudagraphs" and spec.mode != "reduce-overhead":
        return None
    return (
        f"compile {spec.backend}/{spec.mode}: the {' and '.join(on_cpu)} run on the CPU, "
        "where no CUDA graphs are used (torch skips them for CPU tensors)"
    )


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
