"""Compile seconds and forward_exploration speed of the runner's PPO modules, per backend.

For each env (the default PPO RLModule the runner builds for it) and each backend available
in this torch: the module is compiled exactly as the runner compiles EnvRunner modules
(runner.compiled.CompileSpec); one real observation is repeated to each batch size, as in
RLlib's published method. After a burn-in, eager and compiled calls alternate one by one,
so both see the same machine; figures are medians per call.

    python benchmarks/compile_forward.py --envs cartpole breakout --iterations 300
"""

from __future__ import annotations

import argparse
import copy
import csv
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import torch
import torch._dynamo
from hydra import compose, initialize_config_dir
from ray.rllib.core.columns import Columns

from runner import CONFIG_DIR
from runner.compile import available_backends
from runner.compiled import CompileSpec, load_backend
from runner.compose import build_algorithm_config
from runner.schema import register_configs

DEFAULT_BACKENDS = ("eager", "aot_eager", "inductor", "onnxrt", "ipex")


def build(env_option: str) -> tuple[torch.nn.Module, torch.Tensor]:
    """The runner's PPO module for env=<option> and one real observation."""
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"env={env_option}"])
    config = build_algorithm_config(cfg)
    env = config.env(dict(config.env_config)) if callable(config.env) else gym.make(config.env)
    obs, _ = env.reset(seed=0)
    module = config.get_rl_module_spec(env=env, inference_only=True).build().eval()
    env.close()
    return module, torch.as_tensor(obs)


def usable(backend: str) -> bool:
    try:
        load_backend(backend)
    except ImportError:
        return False
    return backend in available_backends()


def measure(module, obs, backend, mode, batch_sizes, iterations, burn_in, cache) -> list[dict]:
    """One backend on one module; `cache` is the inductor cache dir (None: a fresh one)."""
    torch._dynamo.reset()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache or tempfile.mkdtemp(prefix="inductor-")
    compiled_module = copy.deepcopy(module)
    spec = CompileSpec(backend, mode, None, True, False, "forward_train")
    compiled_module._forward_exploration = spec.compile(compiled_module._forward_exploration)
    rows = []
    for batch_size in batch_sizes:
        batch = {Columns.OBS: obs.unsqueeze(0).repeat(batch_size, *[1] * obs.dim())}
        with torch.no_grad():
            start = time.perf_counter()
            compiled_module.forward_exploration(batch)
            first_call = time.perf_counter() - start
            for _ in range(burn_in):
                module.forward_exploration(batch)
                compiled_module.forward_exploration(batch)
            eager, compiled = [], []
            for _ in range(iterations):
                start = time.perf_counter()
                module.forward_exploration(batch)
                eager.append(time.perf_counter() - start)
                start = time.perf_counter()
                compiled_module.forward_exploration(batch)
                compiled.append(time.perf_counter() - start)
        eager_tp, compiled_tp = 1 / statistics.median(eager), 1 / statistics.median(compiled)
        rows.append(
            {
                "backend": backend,
                "mode": mode,
                "batch_size": batch_size,
                "first_call_seconds": first_call,
                "eager_calls_per_s": eager_tp,
                "compiled_calls_per_s": compiled_tp,
                "speedup": compiled_tp / eager_tp - 1,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=["cartpole", "breakout"])
    parser.add_argument("--backends", nargs="+", default=list(DEFAULT_BACKENDS))
    parser.add_argument("--mode", default="default")
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 4, 16])
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--burn-in", type=int, default=30)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (Ray gives a 1-CPU actor 1)"
    )
    parser.add_argument(
        "--cache-dir",
        help="inductor cache to use (default: a fresh one per backend: cold compile seconds)",
    )
    parser.add_argument("--csv", type=Path, help="also write the rows here")
    args = parser.parse_args()

    register_configs()
    torch.set_num_threads(args.threads)
    backends = [b for b in args.backends if usable(b)]
    skipped = sorted(set(args.backends) - set(backends))
    rows = []
    for env_option in args.envs:
        module, obs = build(env_option)
        for backend in backends:
            for row in measure(
                module,
                obs,
                backend,
                args.mode,
                args.batch_sizes,
                args.iterations,
                args.burn_in,
                args.cache_dir,
            ):
                rows.append({"env": env_option, **row})
                print(
                    f"{env_option:<9} {backend:<10} batch {row['batch_size']:>3}  "
                    f"first call {row['first_call_seconds']:7.2f} s  "
                    f"eager {row['eager_calls_per_s']:9.1f}/s  "
                    f"compiled {row['compiled_calls_per_s']:9.1f}/s  "
                    f"speedup {row['speedup']:+7.1%}",
                    flush=True,
                )
    print(
        f"torch {torch.__version__}, {args.iterations} alternated calls each after "
        f"{args.burn_in} burn-in, {args.threads} thread(s), "
        f"{'given' if args.cache_dir else 'cold'} inductor cache; "
        f"not available here: {', '.join(skipped) or 'none'}",
        file=sys.stderr,
    )
    if args.csv:
        with args.csv.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
