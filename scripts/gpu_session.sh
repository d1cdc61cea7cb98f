#!/usr/bin/env bash
# One lease of a GPU machine, as few calls as possible: build, check, time, and
# (optionally) execute the chapters.  Everything worth keeping lands in $OUT.
#
#   bash scripts/gpu_session.sh test bench extra chapters
#
# Steps run in the order given; a failing step is reported and the next runs.
set -uo pipefail
OUT=${OUT:-/tmp/mla_lab_out}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PY:-python3}
if [ -d .wheels ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .wheels/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
start=$(date +%s)
step() { echo; echo "=== $1 ($(( $(date +%s) - start )) s in)"; }
step build
$PY -m mla_lab.cli build 2>&1 | tail -n 3
for s in "$@"; do
  case "$s" in
    test)
      step test
      $PY -m pytest tests -q -p no:cacheprovider -x --maxfail=20 -o addopts="" 2>&1 | tail -n 60 | tee "$OUT/pytest.log" ;;
    gputest)
      step gputest
      $PY -m pytest tests/test_gpu.py -q -p no:cacheprovider --maxfail=20 -o addopts="" 2>&1 | tail -n 60 | tee "$OUT/pytest_gpu.log" ;;
    bench)
      step bench
      $PY -m mla_lab.cli bench 2>&1 | tee "$OUT/bench.log" | grep -v '^\[' ;;
    extra)
      step extra
      $PY -m mla_lab.cli bench --streams 1 8 --q-len 9 16 --heads 8 64 --prefix 16384 65536 2>&1 | tee "$OUT/bench_extra.log" | grep -v '^\[' | tail -n 40
      $PY -m mla_lab.cli bench --page-size 64 --heads 8 --prefix 4096 65536 2>&1 | tee "$OUT/bench_page64.log" | grep -v '^\[' | tail -n 20 ;;
    chapters)
      step chapters
      $PY -m mla_lab.cli chapters execute 2>&1 | tail -n 30 | tee "$OUT/chapters.log"
      $PY -m pytest --nbval --nbval-current-env --nbval-sanitize-with chapters/nbval_sanitize.cfg chapters -q -p no:cacheprovider -o addopts="" 2>&1 | tail -n 30 | tee "$OUT/nbval.log" ;;
    *) echo "unknown step $s" ;;
  esac
done
step pack
tar czf "$OUT/results.tgz" results chapters/*.ipynb 2>/dev/null
ls -la "$OUT"
