#!/usr/bin/env bash
# The search grid at the benchmark's own settings (128-token windows, a 32-window calibration pool, 32 validation
# and 64 test windows, EvoPress's fast setting λ = 16 with stages 1 -> 16 windows, 3 incumbents per method on the
# test curve); one core per point, staged across sessions: every step resumes from its checkpoints and skips
# finished work. Usage: search_grid_full.sh [POINT ...] (default: every point); STEP=a or STEP=b runs one half of
# a point (a: EvoPress, then refine and random, whose budget is 0.25 x EvoPress's FPE; b: SLEB, BlockPruner and
# the default), so that two cores can share a point. Output: benchmarks/out/search-full (not committed).
# Run from anywhere: the script moves to the repository root of its own checkout. PY= picks the interpreter.
set -e
cd "$(dirname "$0")/../.."  # the repository root
F="--offspring 16 --curve-points 3 --threads 1 --no-progress --out benchmarks/out/search-full"
PY=${PY:-.venv/bin/python}
for P in ${@:-layer-15-s0 layer-12-s0 layer-8-s0 layer-15-s1 layer-15-s2 sublayer-8-s0}; do
  if [ "${STEP:-a}" = a ]; then
    echo "=== $P evopress $(date)"; $PY -m benchmarks.search --points $P $F --methods evopress
    echo "=== $P refine+random $(date)"; $PY -m benchmarks.search --points $P $F --methods refine,random
  fi
  if [ "${STEP:-b}" = b ]; then
    echo "=== $P sleb,blockpruner,singles $(date)"; $PY -m benchmarks.search --points $P $F --methods sleb,blockpruner,singles
  fi
done
$PY -m benchmarks.search --report --out benchmarks/out/search-full
echo "=== done $(date)"
