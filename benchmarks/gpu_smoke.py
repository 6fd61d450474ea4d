"""The first run on a GPU machine: each GPU code path once, in under ten minutes, one table.

    python benchmarks/gpu_smoke.py              # on a GPU machine, with a CUDA build of torch
    python benchmarks/gpu_smoke.py --dry-run    # anywhere: plans every step, starts nothing

Each step is one `python -m runner ...` with a run dir of its own under --out (a dry run
plans them all in this process, through runner.api):

1. main: the main job with hardware=gpu (PPO on CartPole, a local GPU Learner);
2. compiled: compile=inductor_ro with a local GPU Learner and one GPU EnvRunner;
3. dqn: the same for DQN, whose exploration writes its epsilon into a tensor's storage:
   does torch record CUDA graphs for it, or skip them?
4. bench: the A100 headline reproduction's inference bench, on whatever GPU is there;
5. learners2: scaling.num_learners=2, one GPU each, only where two GPUs exist.

The table says, per step, how it ended, where each component ran (its GPU), what compiled
(frames, recompiles, CUDA graphs recorded and skipped, and why) and the figures; it is
also written to smoke.md and, with every detail, smoke.json. A dry run plans each step
(`dry_run=true`) and shows the plan and what the preflight would refuse on this machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import torch
from rich.console import Console
from rich.table import Table

from runner import api
from runner.errors import RunnerError
from runner.machine import driver_cuda

# Half a GPU each: a local Learner and a GPU EnvRunner fit on one GPU.
SHARED_GPU = [
    "hardware=gpu",
    "scaling.num_env_runners=1",
    "scaling.num_gpus_per_env_runner=0.5",
    "scaling.num_gpus_per_learner=0.5",
]
COLUMNS = ("step", "ended", "seconds", "ran on", "compiled", "figures")


@dataclass(frozen=True)
class Step:
    name: str
    overrides: tuple[str, ...]
    timeout: float  # seconds; the five together stay under ten minutes
    gpus: int = 1  # GPUs this step needs on a real run


STEPS = (
    Step("main", ("hardware=gpu",), 150),
    Step("compiled", (*SHARED_GPU, "compile=inductor_ro", "stop.iterations=5"), 120),
    Step("dqn", ("algo=dqn", *SHARED_GPU, "compile=inductor_ro", "stop.iterations=5"), 90),
    Step("bench", ("experiment=headline_a100_21n", "hardware=gpu"), 120),
    Step("learners2", ("hardware=gpu", "scaling.num_learners=2", "stop.iterations=3"), 90, 2),
)


def stop_at(proc: subprocess.Popen, timeout: float) -> int | None:
    """The run's exit code; past `timeout`, None, the run stopped as a user would stop it:
    SIGTERM (the iteration in flight may finish within the runner's shutdown grace), then
    a second SIGTERM, which aborts at once and kills the Ray it started."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        for grace in (40, 20):
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=grace)
                return None
            except subprocess.TimeoutExpired:
                continue
        proc.kill()
        proc.wait()
        return None


def plan_step(overrides: list[str], sink: TextIO) -> int:
    """A dry run of the step in this process (runner.api: one import for every step), its
    output to `sink`; the exit code the CLI would give."""
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        try:
            api.run(overrides)
        except RunnerError as ex:
            print(f"error: {ex}")
            return getattr(ex, "exit_code", 2)
    return 0


def run_step(step: Step, out: Path, dry_run: bool) -> dict[str, Any]:
    """The step's CLI run (a dry run: planned in this process), its output in
    <step>.log; what it wrote, read back."""
    run_dir = out / step.name
    args = [*step.overrides, f"hydra.run.dir={run_dir}"]
    start = time.perf_counter()
    log = out / f"{step.name}.log"
    with log.open("w") as sink:
        if dry_run:
            code: int | None = plan_step([*args, "dry_run=true"], sink)
        else:
            command = [sys.executable, "-m", "runner", *args]
            proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
            code = stop_at(proc, step.timeout)
    output = log.read_text()
    lines = output.strip().splitlines()
    record = {
        "step": step.name,
        "command": "python -m runner " + " ".join(step.overrides),
        "exit": code,
        "seconds": time.perf_counter() - start,
        "error": next((line for line in reversed(lines) if line.startswith("error:")), None),
    }
    for name in ("plan.json", "summary.json", "bench.json"):
        if (run_dir / name).exists():
            record[name.removesuffix(".json")] = json.loads((run_dir / name).read_text())
    return record


def _ended(record: dict[str, Any]) -> str:
    if record["exit"] is None:
        return "timed out" + (f", {record['summary']['status']}" if "summary" in record else "")
    if "summary" in record:
        return f"{record['summary']['status']} (exit {record['exit']})"
    return f"exit {record['exit']}" + (f": {record['error']}" if record["error"] else "")


def _ran_on(record: dict[str, Any]) -> str:
    if "bench" in record:
        bench = record["bench"]
        return f"bench: {bench['device']} {bench.get('device_name') or ''}".strip()
    summary = record.get("summary")
    if summary is None:
        plan = record.get("plan", {})
        total = plan.get("total", {})
        return f"plan: {total.get('cpus', 0):g} CPUs, {total.get('gpus', 0):g} GPUs" if plan else ""
    return "; ".join(
        f"{c['component']} {c['device']}" + (f" {c['device_name']}" if c["device_name"] else "")
        for c in summary["compile"]["components"]
    )


def _compiled(record: dict[str, Any]) -> str:
    if "bench" in record:
        rows = record["bench"]["rows"]
        return "; ".join(
            f"b{r['batch_size']}: {r['frames']} frames, {r['recompiles']} recompiles, CUDA graphs "
            f"{r['cudagraph_recordings']} recorded / {r['cudagraph_skips']} skipped"
            for r in rows
        )
    if "summary" in record:
        section = record["summary"]["compile"]
        if not section["requested"]:
            return "compile off"
        used = [c for c in section["components"] if c["calls"]]
        reasons = sorted({r for c in used for r in c["cudagraph_skip_reasons"]})
        return (
            f"took effect on {sum(c['took_effect'] for c in used)}/{len(used)}; "
            f"{sum(c['frames'] for c in used)} frames, "
            f"{sum(c['recompiles'] for c in used)} recompiles; CUDA graphs "
            f"{sum(c['cudagraph_recordings'] for c in used)} recorded / "
            f"{sum(c['cudagraph_skips'] for c in used)} skipped"
            + (f" ({'; '.join(reasons)})" if reasons else "")
        )
    preflight = record.get("plan", {}).get("preflight")
    if preflight is None:
        return ""
    verdict = "ok" if preflight["ok"] else f"would fail: {'; '.join(preflight['problems'])}"
    warned = "".join(f"; warning: {w}" for w in preflight["warnings"])
    return f"preflight {verdict}{warned}"


def _figures(record: dict[str, Any]) -> str:
    if "bench" in record:
        return "; ".join(
            f"b{r['batch_size']} {r['eager_calls_per_s']:,.0f} -> {r['compiled_calls_per_s']:,.0f}"
            f" calls/s ({r['speedup']:+.1%})"
            for r in record["bench"]["rows"]
        )
    summary = record.get("summary")
    if summary is None:
        return ""
    ret, rate = summary.get("final_episode_return_mean"), summary.get("env_steps_per_s")
    return (
        f"return {'-' if ret is None else f'{ret:.1f}'}, "
        f"{'-' if rate is None else f'{rate:,.0f}'} env steps/s, {summary['iterations']} iterations"
    )


def rows(records: list[dict[str, Any]]) -> list[dict[str, str]]:
    """One table row per step; a step skipped for want of GPUs says only that."""
    table = []
    for r in records:
        if "skipped" in r:
            table.append(
                dict.fromkeys(COLUMNS, "")
                | {"step": r["step"], "ended": f"skipped: {r['skipped']}"}
            )
            continue
        table.append(
            {
                "step": r["step"],
                "ended": _ended(r),
                "seconds": f"{r['seconds']:.0f}",
                "ran on": _ran_on(r),
                "compiled": _compiled(r),
                "figures": _figures(r),
            }
        )
    return table


def markdown(table: list[dict[str, str]], machine: str) -> str:
    lines = [machine, "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row[c].replace("|", "/") for c in COLUMNS) + " |" for row in table]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="plan every step, start nothing")
    parser.add_argument("--out", type=Path, default=Path("outputs/gpu_smoke"))
    args = parser.parse_args(argv)
    cuda = driver_cuda()
    gpus = len(cuda.get("driver_gpus", []))
    if not args.dry_run and gpus == 0:
        print(
            f"error: gpu_smoke: torch {torch.__version__} sees no CUDA GPU here; run it on a "
            "GPU machine with a CUDA build of torch, or add --dry-run to plan the steps",
            file=sys.stderr,
        )
        return 2
    if args.out.exists() and any(args.out.iterdir()):
        print(f"error: gpu_smoke: '{args.out}' is not empty; pass a new --out", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    devices = ", ".join(
        f"cuda:{i} {name} (sm_{cap.replace('.', '')})"
        for i, (name, cap) in enumerate(
            zip(cuda.get("driver_gpus", []), cuda.get("driver_capabilities", []), strict=True)
        )
    )
    machine = (
        f"torch {torch.__version__} (CUDA {torch.version.cuda}, kernels for "
        f"{' '.join(cuda.get('torch_cuda_archs', [])) or 'no GPU'}); GPUs: {devices or 'none'}"
        + ("; dry run: every step planned, none started" if args.dry_run else "")
    )
    console = Console(width=200)
    console.print(machine)
    records = []
    for step in STEPS:
        if not args.dry_run and gpus < step.gpus:
            records.append({"step": step.name, "skipped": f"needs {step.gpus} GPUs, {gpus} here"})
            continue
        console.print(f"== {step.name}: python -m runner {' '.join(step.overrides)}")
        records.append(run_step(step, args.out, args.dry_run))
    table = rows(records)
    shown = Table(title="GPU smoke run", title_justify="left", show_lines=True)
    for column in COLUMNS:
        shown.add_column(column, overflow="fold")
    for row in table:
        shown.add_row(*(row[c] for c in COLUMNS))
    console.print(shown)
    (args.out / "smoke.md").write_text(markdown(table, machine))
    (args.out / "smoke.json").write_text(
        json.dumps({"machine": machine, **cuda, "steps": records}, indent=2, default=str)
    )
    console.print(f"written: {args.out}/smoke.md, {args.out}/smoke.json")
    return 1 if any("exit" in r and r["exit"] != 0 for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
