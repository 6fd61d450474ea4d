#!/usr/bin/env bash
# Runs every CPU inference reproduction as published (the appendix's CPU tables and the CPU
# headline), each into its own run dir under $OUT, then the report over them:
#   bash benchmarks/cpu_reproductions.sh                       # non-ipex rows
#   IPEX_PYTHON=.venv-ipex/bin/python bash benchmarks/cpu_reproductions.sh   # ipex rows too
# ONLY="name ..." runs just those; EXTRA="scale=local" (or any overrides) is added to each
# run; DOC=docs/reproductions.md refreshes that page's tables.
set -euo pipefail
out=${OUT:-outputs/reproductions}
py=${PYTHON:-python}
for name in $($py -m runner.published | awk '/^(inference_cpu_|headline_cpu_)/ {print $1}'); do
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then
    continue
  fi
  run_py=$py
  if $py -c "import sys; from runner import published; sys.exit(published.experiments()['$name'][1]['reproduction']['backend'] != 'ipex')"; then
    if [ -z "${IPEX_PYTHON:-}" ]; then
      echo "skip $name: set IPEX_PYTHON to the ipex environment's python"
      continue
    fi
    run_py=$IPEX_PYTHON
  fi
  echo "== $name"
  $run_py -m runner "experiment=$name" ${EXTRA:-} "hydra.run.dir=$out/$name/$(date +%Y%m%d-%H%M%S)"
done
$py -m runner.report "$out" --out "$out/report" ${DOC:+--doc "$DOC"}
