"""Compile seconds and forward_exploration speed of the runner's PPO modules, per backend.

The inference benchmark task (`python -m runner task=inference_bench compile=...`, see
runner/tasks/inference_bench.py) for several envs and every backend available in this torch, in one
process and one table. Each backend gets a cold inductor cache.

    python benchmarks/compile_forward.py --envs cartpole breakout --iterations 300
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from runner import CONFIG_DIR
from runner.api import register_configs
from runner.compile.apply import load_backend
from runner.compile.settings import CompileSpec, available_backends
from runner.job.app import prepare
from runner.results.files import write_csv
from runner.settings.schema import typed
from runner.tasks.inference_bench import build_module, measure

DEFAULT_BACKENDS = ("eager", "aot_eager", "inductor", "onnxrt", "ipex")


def usable(backend: str) -> bool:
    try:
        load_backend(backend)
    except ImportError:
        return False
    return backend in available_backends()


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
    parser.add_argument("--csv", type=Path, help="also write the rows here")
    args = parser.parse_args()

    register_configs()
    torch.set_num_threads(args.threads)
    backends = [b for b in args.backends if usable(b)]
    skipped = sorted(set(args.backends) - set(backends))
    rows = []
    for env_option in args.envs:
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
            cfg = compose(config_name="config", overrides=[f"env={env_option}"])
        module, obs = build_module(prepare(typed(cfg)).config)
        for backend in backends:
            spec = CompileSpec(backend, args.mode, None, True, False, "forward_train")
            for row in measure(module, obs, spec, args.batch_sizes, args.iterations, args.burn_in):
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
        f"{args.burn_in} burn-in, {args.threads} thread(s), cold inductor cache per backend; "
        f"not available here: {', '.join(skipped) or 'none'}",
        file=sys.stderr,
    )
    if args.csv:
        write_csv(args.csv, rows)


if __name__ == "__main__":
    main()
