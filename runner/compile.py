"""torch.compile settings: what is valid, before anything starts.

`onnxrt` (removed from torch in 2.9) and `ipex` (from the optional extra) are provided
by the runner rather than by torch, so they are accepted by name here.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util

import torch
from omegaconf import DictConfig

from runner.compiled import MODE_BACKENDS, CompileSpec
from runner.errors import ConfigError, did_you_mean

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
RUNNER_BACKENDS = ("onnxrt", "ipex")
INFERENCE_ONLY = ("onnxrt",)


def available_backends() -> list[str]:
    """Backend names this torch knows, plus the runner's own."""
    import torch._dynamo

    names = set(torch._dynamo.list_backends(exclude_tags=())) | set(RUNNER_BACKENDS)
    return sorted(n for n in names if "TESTING" not in n and "minifier" not in n)


def is_enabled(compile_cfg: DictConfig) -> bool:
    return compile_cfg.backend is not None and (compile_cfg.env_runners or compile_cfg.learners)


def spec(compile_cfg: DictConfig) -> CompileSpec | None:
    """The picklable settings the EnvRunners and Learners compile with; None when off."""
    if not is_enabled(compile_cfg):
        return None
    return CompileSpec(
        backend=compile_cfg.backend,
        mode=compile_cfg.mode,
        dynamic=compile_cfg.dynamic,
        env_runners=compile_cfg.env_runners,
        learners=compile_cfg.learners,
        learner_granularity=compile_cfg.learner_granularity.value,
    )


def validate(compile_cfg: DictConfig) -> list[str]:
    """Raise ConfigError on an invalid combination; return warnings for ignored settings."""
    backend, mode = compile_cfg.backend, compile_cfg.mode
    if backend is None:
        return []
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
    return warnings


def cuda_graph_warning(compile_cfg: DictConfig, scaling: DictConfig) -> str | None:
    """CUDA graphs asked for on modules that run on the CPU: allowed, but say so."""
    if not is_enabled(compile_cfg):
        return None
    if compile_cfg.backend != "cudagraphs" and compile_cfg.mode != "reduce-overhead":
        return None
    on_cpu = [
        name
        for name, wanted, gpus in (
            ("EnvRunners", compile_cfg.env_runners, scaling.num_gpus_per_env_runner),
            ("Learners", compile_cfg.learners, scaling.num_gpus_per_learner),
        )
        if wanted and gpus == 0
    ]
    if not on_cpu:
        return None
    return (
        f"compile {compile_cfg.backend}/{compile_cfg.mode}: the {' and '.join(on_cpu)} run on "
        "the CPU, where no CUDA graphs are used (torch skips them for CPU tensors)"
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
