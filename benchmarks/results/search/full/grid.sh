#!/usr/bin/env bash
# the search grid at the benchmark's own settings (128-token windows, a 32-window calibration pool, 32 validation
# and 64 test windows, EvoPress's fast setting λ = 16 with stages 1 -> 16 windows); one core per point, staged
# across sessions: every step resumes from its checkpoints and skips finished work
cd "$(dirname "$0")/../../../.."  # the repository root
F="--offspring 16 --threads 1 --no-progress --out benchmarks/results/search/full/run"
PY=.venv/bin/python
for P in "${@:-layer-15-s0 layer-12-s0 layer-8-s0 layer-15-s1 layer-15-s2 sublayer-8-s0}"; do
  for P1 in $P; do
    echo "=== $P1 baselines $(date)"
    $PY -m benchmarks.search --points $P1 $F --methods evopress,sleb,blockpruner,singles
    echo "=== $P1 refine+random $(date)"
    $PY -m benchmarks.search --points $P1 $F --methods refine,random
  done
done
$PY -m benchmarks.search --report --out benchmarks/results/search/full/run
echo "=== grid done $(date)"
