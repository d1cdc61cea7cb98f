#!/usr/bin/env bash
# A developer's tool: one session on a rented GPU machine, in as few calls as
# possible.  It builds the extension, then runs the steps named, in order; a
# failing step is reported and the next one runs.  Logs and packed results land
# in $OUT (default /tmp/mla_lab_out); results/ and chapters/ are updated in place.
#
#   bash scripts/gpu_session.sh quick                      # mla-lab bench --quick
#   bash scripts/gpu_session.sh test bench extra layouts profile chapters
#
# What waits for the next H200 session (the H100 session of 2026-12-05 ran gputest, bench_part3 and chapters
# 00-12; see results/runs/2026-12-05-h100/README.md):
#   bash scripts/gpu_session.sh bench_part3 peers chapters flashmla_compat experiments check
#
# On a lent machine whose calls end after 10 minutes and re-send the working tree, run it from a copy in
# the background, so that a later call neither kills it nor overwrites the chapters it writes:
#   mkdir -p /tmp/gs && cp -a . /tmp/w && cd /tmp/w && (OUT=/tmp/gs setsid nohup bash scripts/gpu_session.sh STEPS > /tmp/gs/log 2>&1 &)
# then collect /tmp/gs and /tmp/w/chapters, /tmp/w/results from later calls.
#
# Steps:
#   quick     mla-lab bench --quick (about a minute; writes nothing)
#   test      the whole pytest suite (tests/ only), -x
#   gputest   tests/test_gpu.py only
#   experiments  tests/test_experiments.py whole: the experiments' SASS and, on sm_90, each experiment beside its
#             stage (right answers where it keeps them), after compiling every experiment side by side
#   bench_part3  mla-lab bench on the article grid, Triton, tensor_core and the four Hopper stages (the README's ladder)
#   peers     mla-lab bench --peers on Part III's grid and the Hopper stages (FlashMLA must import)
#   verify    mla-lab verify --quick, every stage
#   bench     mla-lab bench, the article's grid, every stage; if the newest stage fails a quick
#             check, every stage but it (the bench stops at the first wrong answer)
#   extra     beyond the article's grid: 8 streams, drafts of 16, 64 heads (the later chapters read these)
#   layouts   contiguous pages, and 64-token pages
#   profile   Nsight Compute on one call (PROFILE="stage B T H prefix [profile-target options]", default
#             "tensor_core 1 9 64 16384"; PROFILE_KERNEL, a regex of the kernel to profile, default the
#             stage's name; PROFILE_NAME, the report's name in place of the stage's), report in
#             results/profiles/.  Stage 11's tensor-copy kernel, for example:
#               PROFILE="tensor_copy 8 9 8 65536 --page-size 64" PROFILE_KERNEL=tensor_copy_kernel \
#               bash scripts/gpu_session.sh profile
#             The loaders alone (an experiment: `mla-lab experiments` lists them):
#               PROFILE="tensor_copy 8 9 64 16384 --page-size 64 --build tma_no_math" PROFILE_KERNEL=tma_no_math_kernel \
#               PROFILE_NAME=loader-tma-no_math bash scripts/gpu_session.sh profile
#             The report also holds the warps' stall samples by reason (smsp__pcsamp_warps_issue_stalled_*)
#             and the L2 side: the sectors the SMs asked for, and the L2 request coalescer's two read counters.
#             FlashMLA on the same workload: PROFILE="hopper 8 9 64 16384 --page-size 64 --peer flashmla"
#             PROFILE_KERNEL=flash_fwd_splitkv_mla PROFILE_NAME=flashmla
#   flashmla_compat  tests/test_flash_mla_gpu.py: mla_lab.flash_mla against the reference on every stage this GPU
#             runs, against FlashMLA on 32 shapes (put FlashMLA on PYTHONPATH as docs/benchmark.md's "Peers" says, else
#             those are skipped and listed), CUDA-graph replays, host overhead; log and JUnit XML in $OUT
#   check     mla-lab check, full, on the stages in CHECK_STAGES (default the Hopper stages, "wgmma tensor_copy
#             seesaw hopper"; "all" for every stage):
#             sanitizer, fuzz, soak, concurrency, bad inputs, extreme values; recorded in results/check/
#   execute   mla-lab chapters execute (stores the outputs, stamps each chapter's provenance)
#   nbval     the chapters against their stored outputs
#   chapters  execute, then nbval
#
# Environment: PY (python, default python3), OUT, PROFILE, MLA_LAB_COMMIT (the commit being measured,
# recorded with the results where the tree has no .git), and a .wheels/ folder of extra wheels, if present,
# installed first without network.
set -uo pipefail
OUT=${OUT:-/tmp/mla_lab_out}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PY:-python3}
MLA="$PY -m mla_lab.cli"
if [ -d .wheels ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .wheels/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
start=$(date +%s)
step() { echo; echo "=== $1 ($(( $(date +%s) - start )) s in)"; }
# FlashMLA, the peer: a checkout of its own repository at .peers/FlashMLA (never committed; its commit in
# .peers/FlashMLA/COMMIT, its CUTLASS headers at csrc/cutlass/include) is built beside ours, bf16 only
bg=()
if [ -f .peers/FlashMLA/setup.py ]; then
  # CUDA 13 keeps libcu++ under include/cccl; CUTLASS needs it in the host compiler's pass too, hence CPATH
  (cd .peers/FlashMLA && FLASH_MLA_DISABLE_FP16=1 NVCC_THREADS=2 MAX_JOBS=3 \
      CPATH="${CUDA_HOME:-/usr/local/cuda}/include/cccl" $PY setup.py build_ext --inplace \
      > "$OUT/flashmla_build.log" 2>&1; echo "FlashMLA build exit $?" >> "$OUT/flashmla_build.log") &
  bg+=($!)
  export PYTHONPATH="$PYTHONPATH:$PWD/.peers/FlashMLA" MLA_LAB_FLASHMLA_COMMIT=$(cat .peers/FlashMLA/COMMIT)
fi
step build
$MLA build 2>&1 | tail -n 3
# the experiments compile on the CPU while the GPU tests run (settle: wait for them and FlashMLA)
$PY -c "from mla_lab.book import experiments; print(experiments.prebuild(), 'experiment modules built')" \
    > "$OUT/prebuild.log" 2>&1 &
bg+=($!)
settle() { [ ${#bg[@]} -gt 0 ] && { wait "${bg[@]}"; bg=(); tail -n 2 "$OUT"/flashmla_build.log "$OUT"/prebuild.log 2>/dev/null; }; }
steps=()
for s in "$@"; do
  if [ "$s" = chapters ]; then steps+=(execute nbval); else steps+=("$s"); fi
done
for s in "${steps[@]}"; do
  [ "$s" = gputest ] || settle  # a step that times or builds waits for the background builds
  case "$s" in
    quick)
      step quick
      $MLA bench --quick 2>&1 | tee "$OUT/bench_quick.log" | grep -v '^\[' ;;
    test)
      step test
      $PY -m pytest tests -q -p no:cacheprovider -x --maxfail=20 -o addopts="" 2>&1 | tail -n 60 | tee "$OUT/pytest.log" ;;
    gputest)
      step gputest
      $PY -m pytest tests/test_gpu.py -q -p no:cacheprovider --maxfail=20 -o addopts="" 2>&1 | tail -n 60 | tee "$OUT/pytest_gpu.log" ;;
    experiments)
      step experiments
      $PY -m pytest tests/test_experiments.py -q -p no:cacheprovider --maxfail=20 -o addopts="" 2>&1 | tail -n 40 \
          | tee "$OUT/experiments.log" ;;
    peers)
      step peers
      $MLA bench --peers --stages triton tensor_core wgmma tensor_copy seesaw hopper --streams 1 8 --q-len 9 16 \
          --heads 8 64 --prefix 1024 4096 16384 65536 --page-size 64 2>&1 | tee "$OUT/bench_peers.log" | grep -v '^\[' ;;
    flashmla_compat)
      step flashmla_compat
      $PY -m pytest tests/test_flash_mla_gpu.py -q -p no:cacheprovider -rs -s -o addopts="" \
          --junitxml "$OUT/flashmla_compat.xml" 2>&1 | tail -n 80 | tee "$OUT/flashmla_compat.log" ;;
    verify)
      step verify
      $MLA verify --quick 2>&1 | tee "$OUT/verify.log" ;;
    bench)
      step bench
      newest=$($PY -c "from mla_lab.core.stages import STAGES; print(STAGES[-1].id)")
      STAGES=""
      if ! $MLA verify --stages "$newest" --quick > "$OUT/verify_$newest.log" 2>&1; then
        echo "$newest failed its check: benchmarking the other stages"; tail -n 12 "$OUT/verify_$newest.log"
        STAGES="--stages $($PY -c "from mla_lab.core.stages import STAGES; print(' '.join(s.id for s in STAGES[:-1]))")"
      fi
      $MLA bench $STAGES 2>&1 | tee "$OUT/bench.log" | grep -v '^\[' ;;
    bench_part3)
      step bench_part3
      $MLA bench --stages triton tensor_core wgmma tensor_copy seesaw hopper 2>&1 | tee "$OUT/bench_part3.log" | grep -v '^\[' ;;
    extra)
      step extra
      $MLA bench --stages triton shared_rows tensor_core --streams 1 8 --q-len 9 16 --heads 8 64 \
          --prefix 16384 65536 --rep-ms 50 2>&1 | tee "$OUT/bench_extra.log" | grep -v '^\[' | tail -n 40 ;;
    layouts)
      step layouts
      for layout in "--contiguous" "--page-size 64 --contiguous"; do
        $MLA bench --stages triton float4 shared_rows tensor_core --heads 8 --prefix 4096 65536 $layout 2>&1 \
            | tee -a "$OUT/bench_layouts.log" | grep -v '^\[' | tail -n 8
      done ;;
    check)
      step check
      gpu=$($PY -c "import torch; from mla_lab.measure.results import gpu_slug; print(gpu_slug(torch.cuda.get_device_name(0)))")
      chosen=${CHECK_STAGES:-wgmma tensor_copy seesaw hopper}
      # a run of a few stages is recorded beside the full one (docs/trust.md reads both)
      stages_arg="--stages $chosen --out results/check/$gpu-${chosen// /-}.json"
      [ "$chosen" = all ] && stages_arg=""
      $MLA check $stages_arg 2>&1 | tail -n 60 | tee "$OUT/check.log"
      cp results/check/*.json "$OUT/" 2>/dev/null ;;
    execute)
      step execute
      $MLA chapters execute 2>&1 | grep -v "WARNING \| Kernel is running" | tail -n 30 | tee "$OUT/chapters.log"
      tar czf "$OUT/chapters.tgz" chapters/*.ipynb ;;
    nbval)
      step nbval
      $PY -m pytest --nbval --nbval-current-env --nbval-sanitize-with chapters/nbval_sanitize.cfg chapters -q \
          -p no:cacheprovider -o addopts="" 2>&1 | tail -n 30 | tee "$OUT/nbval.log" ;;
    profile)
      step profile
      read -r pstage pB pT pH pprefix pextra <<< "${PROFILE:-tensor_core 1 9 64 16384}"
      gpu=$($PY -c "import torch; from mla_lab.measure.results import gpu_slug; print(gpu_slug(torch.cuda.get_device_name(0)))")
      report="results/profiles/$gpu-${PROFILE_NAME:-$pstage}-B$pB-T$pT-H$pH-$pprefix.txt"
      mkdir -p results/profiles
      # the L2 side: sectors the SMs asked L2 for, those that hit, and the L2 request coalescer's (LRC's) read
      # sectors and those it counts as coalesced (on the H200 nearly all, in every kernel measured: they tell no
      # two kernels apart)
      L2_METRICS=lts__t_sectors_srcunit_tex.sum,lts__t_sectors_srcunit_tex_lookup_hit.sum,lrc__lrc2xbar_sectors_op_read.sum
      L2_METRICS=$L2_METRICS,lrc__lrc2xbar_sectors_op_read_coalescing_achieved.sum
      # the first two calls warm up; the third is the one measured
      # --clock-control none: the GPU's clocks as the timings saw them (ncu would lock them lower)
      ncu --clock-control none --target-processes all -k "regex:${PROFILE_KERNEL:-$pstage}" --launch-skip 2 --launch-count 1 \
          --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
          --section SchedulerStats --section WarpStateStats --section Occupancy \
          --metrics "regex:^smsp__pcsamp_warps_issue_stalled_[a-z_]+$,$L2_METRICS" \
          $MLA profile-target "$pstage" "$pB" "$pT" "$pH" "$pprefix" --calls 3 $pextra 2>&1 | grep -v '^==PROF==' > "$report"
      grep -E "Duration|Issue Slots Busy|L1/TEX Cache Throughput|L2 Cache Throughput|Achieved Active Warps|lts__t_sectors_srcunit_tex.sum" "$report" ;;
    *) echo "unknown step $s (the steps are listed at the top of scripts/gpu_session.sh)" ;;
  esac
done
step pack
tar czf "$OUT/results.tgz" results chapters/*.ipynb README.md docs 2>/dev/null
ls -la "$OUT"
