#!/usr/bin/env bash
# the search grid (BENCHMARKS.md, Search that pays) at the reduced settings of the first point (one core); each step resumes and skips finished work
cd "$(dirname "$0")/../../../.."  # the repository root
F="--seq-len 64 --calibration 4 --validation 8 --test 16 --offspring 16 --stage-windows 1,4 --sleb-windows 1 --blockpruner-windows 1 --curve-points 2 --bootstrap 2000 --threads 1 --no-progress"
PY=.venv/bin/python
# the first point's refine and random ran at a fixed 240 FPE; rerun them at the grid's rule (0.25 x EvoPress)
D=benchmarks/out/search/layer-15-s0
if [ ! -d $D/budget240 ]; then mkdir -p $D/budget240 && mv $D/refine.json $D/refine-*.ckpt.json $D/refine-qubo.cboq $D/random.json $D/random-*.ckpt.json $D/budget240/ 2>/dev/null; fi
for P in layer-15-s0 layer-12-s0 layer-8-s0 layer-15-s1 layer-15-s2 sublayer-8-s0; do
  echo "=== $P baselines $(date)"
  $PY -m benchmarks.search --points $P $F --methods evopress,sleb,blockpruner,singles
  echo "=== $P refine+random $(date)"
  $PY -m benchmarks.search --points $P $F --methods refine,random
done
$PY -m benchmarks.search --report
echo "=== grid done $(date)"
