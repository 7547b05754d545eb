#!/bin/bash
# The house run, started while b99's run 1 was still validating (the deadline): they overlap.
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
PY=/work/main/.venv/bin/python
L=/tmp/house-meas
cd /tmp/house-head
echo "start house 1 $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg) (b99 1 still running)" >> $L/log
PYTHONPATH=/tmp/house-head nice -n 5 /usr/bin/time -v -o $L/time-house-1.txt $PY -c 'import sys; from cbo.cli import main; sys.argv[0]="cbo"; sys.exit(main())' prune smollm2-135m --remove 8 --top 10 --validate 10 -q --out $L/out-house-1 > $L/stdout-house-1.txt 2>&1
echo "end house 1 rc=$? $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $L/log
