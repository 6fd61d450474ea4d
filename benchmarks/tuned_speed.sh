#!/usr/bin/env bash
# How long a tuned preset's budget takes here: each experiment trains for $SECS seconds
# (its check off), then this prints its env steps per second and the hours its check's
# env-step budget would take at that rate. With no names, the two PPO presets whose budgets
# docs/tuned.md shows (MountainCar's verified on fewer seeds):
#   bash benchmarks/tuned_speed.sh
#   SECS=120 bash benchmarks/tuned_speed.sh tuned_ppo_mountaincar
set -uo pipefail
out=${OUT:-outputs/tuned_speed}
secs=${SECS:-45}
py=${PYTHON:-python}
if [ $# -eq 0 ]; then
  set -- tuned_ppo_mountaincar tuned_ppo_lunarlander
fi
mkdir -p "$out"
for name in "$@"; do
  dir="$out/$name"
  rm -rf "$dir"  # this script's own measurement of the same preset, from an earlier run
  $py -m runner "experiment=$name" check.enabled=false stop.iterations=null \
    "stop.seconds=$secs" checkpoint.at_end=false "hydra.run.dir=$dir" >"$dir.log" 2>&1 ||
    { echo "$name: failed, see $dir.log"; continue; }
  $py - "$dir" "$name" <<'PY'
import json, sys
from pathlib import Path

from omegaconf import OmegaConf

run, name = Path(sys.argv[1]), sys.argv[2]
summary = json.loads((run / "summary.json").read_text())
budget = OmegaConf.load(run / ".hydra" / "config.yaml").check.env_steps
rate = summary["env_steps"] / summary["train_seconds"]
print(
    f"{name}: {summary['env_steps']:,.0f} env steps in {summary['train_seconds']:.0f} s, "
    f"{rate:,.0f} env steps/s; its budget of {budget:,} env steps: {budget / rate / 3600:.1f} h"
)
PY
done
