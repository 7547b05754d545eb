#!/usr/bin/env bash
# The search grid (BENCHMARKS.md, "Search that pays") at the reduced settings of its first point (one core).
# Every step resumes and skips finished work; results, checkpoints and caches go to benchmarks/out/search.
# Run from anywhere: the script moves to the repository root of its own checkout. PY= picks the interpreter.
set -e
cd "$(dirname "$0")/../.."  # the repository root
F="--seq-len 64 --calibration 4 --validation 8 --test 16 --offspring 16 --stage-windows 1,4 --sleb-windows 1 --blockpruner-windows 1 --curve-points 2 --bootstrap 2000 --threads 1 --no-progress"
PY=${PY:-.venv/bin/python}
for P in ${@:-layer-15-s0 layer-12-s0 layer-8-s0 layer-15-s1 layer-15-s2 sublayer-8-s0}; do
  echo "=== $P baselines $(date)"
  $PY -m benchmarks.search --points $P $F --methods evopress,sleb,blockpruner,singles
  echo "=== $P refine+random $(date)"
  $PY -m benchmarks.search --points $P $F --methods refine,random
done
$PY -m benchmarks.search --report
echo "=== grid done $(date)"
