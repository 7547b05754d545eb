#!/bin/bash
# Sequential peak-memory / wall-time measurement of cbo prune at b99cbe3 and on wt-house.
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
PY=/work/main/.venv/bin/python
L=/tmp/house-meas
run() { # tag tree round
  tag=$1; tree=$2; r=$3
  rm -rf /tmp/house-meas/out-$tag-$r
  cd $tree
  echo "start $tag $r $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $L/log
  PYTHONPATH=$tree nice -n 5 /usr/bin/time -v -o $L/time-$tag-$r.txt $PY -c "import sys; from cbo.cli import main; sys.argv[0]=\"cbo\"; sys.exit(main())" prune smollm2-135m --remove 8 --top 10 --validate 10 -q --out $L/out-$tag-$r > $L/stdout-$tag-$r.txt 2>&1
  echo "end $tag $r rc=$? $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $L/log
}
run b99 /tmp/house-b99 1
run house /tmp/house-head 1
run b99 /tmp/house-b99 2
run house /tmp/house-head 2
echo done >> $L/log
