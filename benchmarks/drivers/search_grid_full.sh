#!/usr/bin/env bash
# The search grid at the pipeline's own sizes (128-token windows, a 32-window calibration pool, 32 validation and
# 64 test windows), one point after another, staged across sessions: every step resumes from its checkpoints and
# skips finished work. For each point GRAN-M-sSEED:
#   1. benchmarks.search: EvoPress at its fast setting (λ = 16, stages 1 -> 16 windows, its default generation
#      count), then SLEB and the grid's singles (layer points) or BlockPruner (sublayer points);
#   2. benchmarks.final_choice at the same splits: the validated route, the race alone, refine + the race (the
#      default: 300 FPE, 96 windows) and one-at-a-time, with step 1's sets measured beside on the test windows of
#      Persuasion and of the second domain.
# Usage: search_grid_full.sh [POINT ...] (default: every point). STEP=search or STEP=choice runs one step only, so
# that two cores can share the grid. EXTRA="refine,random" adds the grid's own refine (0.25 x EvoPress's FPE) and
# random search to step 1. Output: benchmarks/out/search-full and benchmarks/out/final_choice-POINT (not
# committed); `python -m benchmarks.final_choice_summary benchmarks/out/final_choice-*/final_choice.json` tables
# them. Run from anywhere: the script moves to the repository root of its own checkout. PY= picks the interpreter.
set -e
cd "$(dirname "$0")/../.."  # the repository root
OUT=benchmarks/out/search-full
F="--offspring 16 --curve-points 3 --threads 1 --no-progress --out $OUT"
PY=${PY:-.venv/bin/python}
for P in ${@:-layer-15-s0 layer-12-s0 layer-8-s0 layer-15-s1 layer-15-s2 sublayer-8-s0}; do
  IFS=- read -r GRAN M S <<< "$P"
  if [ "$GRAN" = layer ]; then OTHERS=sleb,singles; else OTHERS=blockpruner; fi
  if [ "${STEP:-search}" = search ]; then
    echo "=== $P evopress,$OTHERS${EXTRA:+,$EXTRA} $(date)"
    $PY -m benchmarks.search --points "$P" $F --methods "evopress,$OTHERS${EXTRA:+,$EXTRA}"
  fi
  if [ "${STEP:-choice}" = choice ]; then
    echo "=== $P final_choice $(date)"
    $PY -m benchmarks.final_choice --remove "$M" --seeds "${S#s}" --granularity "$GRAN" --refine 300 --threads 1 \
      --no-progress --reference "$OUT/$P/point.json" --out "benchmarks/out/final_choice-$P"
  fi
done
$PY -m benchmarks.search --report --out "$OUT"
echo "=== done $(date)"
