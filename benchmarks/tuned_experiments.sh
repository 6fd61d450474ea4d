#!/usr/bin/env bash
# The verification table: every tuned experiment that fits one CPU machine, and the main
# job, each swept over seeds into $OUT/<name>, then the report over them:
#   bash benchmarks/tuned_experiments.sh
#   ONLY="tuned_dqn_cartpole" SEEDS=0,1,2,3,4 bash benchmarks/tuned_experiments.sh
#   DOC=docs/tuned.md bash benchmarks/tuned_experiments.sh   # also refresh that page (its
#   rows for the experiments run; with ONLY, the others stay)
# EXTRA="key=value ..." is added to every job (a quick try: EXTRA="stop.iterations=1").
# Running it again skips the seeds that finished (a sweep re-run). tuned_appo_pong needs a
# GPU machine and is left out. RLlib's CI runs its tuned examples on 7 or 8 logical CPUs
# (rllib/BUILD.bazel: --num-cpus=7; "single (CPU) = 8 CPUs"): ray.num_cpus=$NUM_CPUS lets
# their actors share the cores of a smaller machine the same way.
set -uo pipefail
out=${OUT:-outputs/tuned}
seeds=${SEEDS:-0,1,2,3,4}
cpus=${NUM_CPUS:-8}
py=${PYTHON:-python}
names="main_job tuned_ppo_cartpole tuned_ppo_pendulum tuned_dqn_cartpole tuned_sac_pendulum tuned_ppo_tictactoe
tuned_appo_cartpole tuned_impala_cartpole tuned_ppo_multi_agent_cartpole tuned_ppo_acrobot
tuned_ppo_simple_spread tuned_ppo_lunarlander tuned_ppo_mountaincar tuned_dqn_acrobot
tuned_dqn_mountaincar tuned_dqn_lunarlander"
for name in $names; do
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then
    continue
  fi
  echo "== $name"
  if [ "$name" = main_job ]; then
    # The main job as a user runs it, with its own stop (450, 90 s) as the check.
    set -- check.threshold=450 check.source=conf/config.yaml
  else
    set -- "experiment=$name" "ray.num_cpus=$cpus"
  fi
  # A seed that misses the check fails its job (exit 1), as RLlib's --as-test does: go on.
  # shellcheck disable=SC2086  # EXTRA is a list of overrides
  $py -m runner -m "$@" "seed=$seeds" ${EXTRA:-} "hydra.sweep.dir=$out/$name" ||
    echo "$name: a seed missed its check or failed; see $out/$name/summary.md"
done
$py -m runner.report "$out" --out "$out/report" ${DOC:+--doc "$DOC"}
