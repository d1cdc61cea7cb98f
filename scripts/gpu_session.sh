#!/usr/bin/env bash
# One lease of a GPU machine, as few calls as possible: build, check, time, and
# (optionally) execute the chapters.  Everything worth keeping lands in $OUT.
#
#   bash scripts/gpu_session.sh test bench extra layouts profile chapters
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
# `chapters` is shorthand for `execute nbval`.
steps=()
for s in "$@"; do
  if [ "$s" = chapters ]; then steps+=(execute nbval); else steps+=("$s"); fi
done
for s in "${steps[@]}"; do
  case "$s" in
    test)
      step test
      $PY -m pytest tests -q -p no:cacheprovider -x --maxfail=20 -o addopts="" 2>&1 | tail -n 60 | tee "$OUT/pytest.log" ;;
    gputest)
      step gputest
      $PY -m pytest tests/test_gpu.py -q -p no:cacheprovider --maxfail=20 -o addopts="" 2>&1 | tail -n 60 | tee "$OUT/pytest_gpu.log" ;;
    bench)
      step bench
      # The bench stops at the first wrong answer; if the newest stage fails a quick
      # check, measure the others rather than nothing.
      STAGES=""
      if ! $PY -m mla_lab.cli verify --stages tensor_core --quick > "$OUT/verify_tensor_core.log" 2>&1; then
        echo "tensor_core failed its check: benchmarking the other stages"; tail -n 12 "$OUT/verify_tensor_core.log"
        STAGES="--stages triton naive flash_ht8 kv_split per_head warp_per_key float4 shared_rows"
      fi
      $PY -m mla_lab.cli bench $STAGES 2>&1 | tee "$OUT/bench.log" | grep -v '^\[' ;;
    extra)
      step extra
      # Beyond the article's grid: 8 streams, drafts of 16, 64 heads (chapter 09 reads these).
      $PY -m mla_lab.cli bench --stages triton shared_rows tensor_core --streams 1 8 --q-len 9 16 --heads 8 64 \
          --prefix 16384 65536 --rep-ms 50 2>&1 | tee "$OUT/bench_extra.log" | grep -v '^\[' | tail -n 40 ;;
    layouts)
      step layouts
      for layout in "--contiguous" "--page-size 64 --contiguous"; do
        $PY -m mla_lab.cli bench --stages triton float4 shared_rows tensor_core --heads 8 --prefix 4096 65536 $layout 2>&1 | tee -a "$OUT/bench_layouts.log" | grep -v '^\[' | tail -n 8
      done ;;
    execute)
      step execute
      $PY -m mla_lab.cli chapters execute 2>&1 | grep -v "WARNING \| Kernel is running" | tail -n 30 | tee "$OUT/chapters.log"
      tar czf "$OUT/chapters.tgz" chapters/*.ipynb ;;
    nbval)
      step nbval
      $PY -m pytest --nbval --nbval-current-env --nbval-sanitize-with chapters/nbval_sanitize.cfg chapters -q -p no:cacheprovider -o addopts="" 2>&1 | tail -n 30 | tee "$OUT/nbval.log" ;;
    profile)
      step profile
      # Nsight Compute on the tensor-core stage at 64 heads: where its time goes (chapter 09).
      mkdir -p results/profiles
      ncu --target-processes all -k regex:tensor_core --launch-skip 2 --launch-count 1 \
          --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
          --section SchedulerStats --section WarpStateStats --section Occupancy \
          $PY scripts/probe_one_call.py tensor_core 1 9 64 16384 2>&1 | grep -v '^==PROF==' \
          > results/profiles/h200-tensor_core-B1-T9-H64-16384.txt
      grep -E "Duration|Issue Slots Busy|L1/TEX Cache Throughput|L2 Cache Throughput|Achieved Active Warps" \
          results/profiles/h200-tensor_core-B1-T9-H64-16384.txt ;;
    *) echo "unknown step $s" ;;
  esac
done
step pack
tar czf "$OUT/results.tgz" results chapters/*.ipynb README.md 2>/dev/null
ls -la "$OUT"
