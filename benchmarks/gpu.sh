#!/usr/bin/env bash
# Everything a machine with one NVIDIA GPU is for, in one command that ends
# within about 520 s: build lltm's CPU library and its CUDA plugin in place
# (for this GPU's architecture only), run the CUDA tests (among them the
# probes of what the host build's emulated GPU assumes: fp16 subnormals into
# the tensor cores, the tensor-core products within the emulation's bounds,
# every forced plan under CUDA graph capture) and the bad-argument tests, time
# the sequence op at the GPU sizes against nn.LSTM in float32 (TF32 on and
# off, with the persistent kernels and without, the matrix products alone)
# and under bf16 and fp16 autocast, calibrate the persistent kernels' rule
# (benchmarks/gpu_calibrate.py: every plan LLTM_CUDA_PLAN can force, timed at
# every point of the map in float32, float32 under the "high" matmul
# precision, bf16 and fp16 autocast; lltm under both float32 precisions
# beside nn.LSTM with TF32 to match; a training step captured in a CUDA
# graph, lltm's and nn.LSTM's), and sweep a grid of sizes in float32 (nn.LSTM
# with TF32 on and off) and under bf16 and fp16 autocast into the speed-up
# map.
#
#   bash benchmarks/gpu.sh             # results into $OUT, else benchmarks/data/
#   bash benchmarks/gpu.sh --dry-run   # what it would run (no GPU needed)
#   bash benchmarks/gpu.sh --cpu-build # its first step alone: the CPU library (no GPU needed)
#
# Needs: python3 with a CUDA build of torch >= 2.11, nvcc (CUDA_HOME, else
# /usr/local/cuda) of torch's CUDA major, ninja and pytest (pytest-xdist for
# the crash-proof test run, matplotlib for the map). No network and no nox:
# nothing is installed; the plugin is put on PYTHONPATH from build/gpu/.
#
# Time: the whole run has BUDGET_S seconds (500: with the last stage's grace
# period and the tables' renders, it ends within about 520 s, well inside the
# 600 s a GPU machine gives one command); each stage has a deadline of its
# own and never more than what is left of the budget, so a stage that hangs
# costs its deadline and the later ones still run. Expected on 16 cores: builds about
# 90 s, tests 60-120 s, the bench rows about 60 s, the calibration at most
# 90 s (it starts nothing new past 60 s and keeps what it measured), each
# sweep about 60 s, the float32 one up to a third more. The last whole run,
# on an H200 before the fp16 sweep, the TF32-off rows and the calibration,
# took 299 s; with them about 440 s are expected (not yet measured): where
# the budget runs short, the fp16 sweep, last, is the one cut. A stage that
# fails is reported and the next one runs; the exit status is that of the
# first failure.
#
# What comes back (under $OUT, seven files): the tests' JUnit XML, the
# float32 rows and the bf16 and fp16 autocast rows as the bench's JSON, the
# calibration as gpu_calibrate.py's JSON (its three sections in one file),
# the three sweeps together in one JSON file (speedup_map.py's --json
# format, {"reports": [the bench's JSON of each]}), and the map as a PNG
# (benchmarks/speedup_map.py redraws it from that file). A GPU machine
# returns eight files at most, the run's output among them: join, don't add.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
DRY_RUN=0
CPU_BUILD_ONLY=0
case "${1:-}" in
  --dry-run) DRY_RUN=1 ;;
  --cpu-build) CPU_BUILD_ONLY=1 ;;
  "") ;;
  *) echo "usage: bash benchmarks/gpu.sh [--dry-run | --cpu-build]" >&2; exit 2 ;;
esac
PYTHON=${PYTHON:-python3}
JOBS=${MAX_JOBS:-$(nproc 2>/dev/null || echo 4)}
DATA=${OUT:-$ROOT/benchmarks/data}
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export PATH="$CUDA_HOME/bin:$PATH"
SITE=$ROOT/build/gpu/site
STATUS=0
BUDGET_S=500
CPU_BUILD_S=90
if [[ $CPU_BUILD_ONLY == 1 ]]; then
  # No GPU's time at stake: the build alone, as long as a small machine needs.
  BUDGET_S=1800
  CPU_BUILD_S=900
fi
START=$SECONDS

say() { printf '\n=== %s\n' "$*"; }
fail() { [[ $STATUS != 0 ]] || STATUS=$1; }
# run DEADLINE_S COMMAND...: prints it; runs it (unless --dry-run) for at most
# DEADLINE_S seconds, and never past the budget.
run() {
  local deadline=$1
  shift
  local left=$((BUDGET_S - (SECONDS - START)))
  ((deadline <= left)) || deadline=$left
  printf '+'
  printf ' %q' "$@"
  printf '\n'
  if [[ $DRY_RUN == 1 ]]; then return 0; fi
  if ((deadline < 5)); then
    echo "!!! not run: the run's ${BUDGET_S} s are spent"
    fail 124
    return 124
  fi
  timeout --kill-after=5 "$deadline" "$@"
  local rc=$?
  if [[ $rc != 0 ]]; then
    echo "!!! exit status $rc (124: past its ${deadline} s deadline): $*"
    fail $rc
  fi
  return $rc
}

# build_cpu_library: the CPU library in place. setup.py stops when the
# library it linked does not share torch's C++ runtime
# (tools/setup_helpers/cxx_runtime.py); a compiler that still cannot build a
# sound library must not cost the GPU's few minutes: then it builds again
# with the system's own GCC, for this build and the plugin's, and says so.
build_cpu_library() {
  local log=$ROOT/build/gpu/build_cpu.log status=$STATUS
  mkdir -p "$ROOT/build/gpu"
  run "$CPU_BUILD_S" env LLTM_VARIANT=cpu MAX_JOBS="$JOBS" "$PYTHON" setup.py -q build_ext \
    --inplace >"$log" 2>&1
  cat "$log"
  if [[ $DRY_RUN == 1 ]] || ! grep -q "lltm: the library just built" "$log"; then
    return
  fi
  if [[ ! -x /usr/bin/gcc || ! -x /usr/bin/g++ ]]; then
    echo "!!! no system compiler (/usr/bin/gcc, /usr/bin/g++) to build with instead"
    return
  fi
  echo "!!! ${CXX:-c++} cannot build a sound lltm here (above): building with the" \
    "system's own compiler instead, CC=/usr/bin/gcc CXX=/usr/bin/g++"
  export CC=/usr/bin/gcc CXX=/usr/bin/g++
  STATUS=$status
  run "$CPU_BUILD_S" env LLTM_VARIANT=cpu MAX_JOBS="$JOBS" "$PYTHON" setup.py -q build_ext \
    --inplace
}

# join_sweeps FILE SWEEP...: the sweeps that wrote their file, as one
# {"reports": [...]} (the bench's JSON of each, in order) into FILE; a shell
# join, so that a budget spent before the map still brings the sweeps back.
join_sweeps() {
  local out=$1 sep="" file
  shift
  printf '+ join_sweeps'
  printf ' %q' "$out" "$@"
  printf '\n'
  if [[ $DRY_RUN == 1 ]]; then return 0; fi
  {
    printf '{"reports": ['
    for file in "$@"; do
      if [[ -s $file ]]; then
        printf '%s' "$sep"
        cat "$file"
        sep=","
      fi
    done
    printf ']}\n'
  } >"$out"
}

if [[ $CPU_BUILD_ONLY == 1 ]]; then
  say "build: the CPU library"
  build_cpu_library
  exit "$STATUS"
fi

# The GPU's compute capability ("9.0") and torch's CUDA major; --dry-run on
# a machine without a GPU shows an H100's.
if [[ $DRY_RUN == 1 ]]; then
  ARCH=${LLTM_GPU_ARCH:-9.0}
  MAJOR=13
else
  ARCH=$("$PYTHON" -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())') || {
    echo "no CUDA device visible to torch" >&2
    exit 1
  }
  MAJOR=$("$PYTHON" -c 'import torch; print(torch.version.cuda.split(".")[0])')
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || true
fi
mkdir -p "$DATA" "$ROOT/build/gpu"
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
say "budget: ${BUDGET_S} s in all, on $JOBS cores"

say "build: the CPU library, then the CUDA plugin for sm_${ARCH/./} only"
build_cpu_library
run 180 env LLTM_VARIANT=cuda TORCH_CUDA_ARCH_LIST="$ARCH" MAX_JOBS="$JOBS" \
  "$PYTHON" setup.py -q build_ext --inplace
# The in-place plugin (src/lltm_cuda/lib/lltm_cuda.so) as the package
# lltm_cuda<major> that lltm imports.
printf '+ package src/lltm_cuda as %s\n' "$SITE/lltm_cuda$MAJOR"
if [[ $DRY_RUN == 0 ]]; then
  rm -rf "$SITE" && mkdir -p "$SITE/lltm_cuda$MAJOR/lib"
  cp src/lltm_cuda/*.py "$SITE/lltm_cuda$MAJOR/"
  cp src/lltm_cuda/lib/lltm_cuda.so "$SITE/lltm_cuda$MAJOR/lib/"
fi
export PYTHONPATH="$ROOT/src:$SITE${PYTHONPATH:+:$PYTHONPATH}"
run 30 "$PYTHON" -m lltm info

# The CUDA tests and the bad-argument tests (CPU tensors: a build that
# crashes on a bad argument shows there first), the files named: the others
# may import what the machine lacks (hypothesis), and a collection error
# would stop the run. Under pytest-xdist a test that kills its worker (a
# segfault) is reported by name as a failure and the worker is replaced: a
# crash costs one test, where in one process (or one process a file) it ends
# every test after it. Without pytest-xdist, one process a file.
say "tests: the CUDA tests and tests/test_errors.py (not slow), crash-proof"
TEST_FILES=(tests/test_cuda.py tests/test_cuda_devices.py tests/test_cuda_robustness.py
  tests/test_cuda_device_numerics.py tests/test_errors.py)
PYTEST=("$PYTHON" -m pytest -m "not slow" -q -p no:cacheprovider)
if [[ $DRY_RUN == 1 ]] || "$PYTHON" -c 'import xdist' 2>/dev/null; then
  run 150 "${PYTEST[@]}" -n 8 --max-worker-restart=200 \
    --junitxml="$DATA/gpu_tests_$STAMP.xml" "${TEST_FILES[@]}"
else
  echo "!!! pytest-xdist is missing: one process a file (a crash ends the rest of its file)"
  for file in "${TEST_FILES[@]}"; do
    run 60 "${PYTEST[@]}" "$file"
  done
fi

# The bench: the tutorial's loss (output.sum() + h_n.sum() + c_n.sum()), the
# configuration users run first, one row each.
BENCH=(--device cuda --seq-len 50 --loss sum -q)
SIZES=16x32x128,8x32x256,64x256x512,256x256x256
# At the four sizes, each phase's host time too (--host-time): where a step's
# host time is near its time, the GPU waits on the host.
FP32=("${BENCH[@]}" --sizes "$SIZES" -r 5 --host-time
  --impl "lltm-sequence,lltm-sequence-per-step,lstm,lstm-notf32,gemm"
  --json "$DATA/gpu_seq_$STAMP.json")
# Mixed precision as GPU users train: the model and the loss under
# torch.autocast("cuda", dtype), nn.LSTM under the same autocast.
BF16=("${BENCH[@]}" --sizes "$SIZES" -r 5 --host-time --impl "lltm-sequence,lstm" --autocast bf16
  --json "$DATA/gpu_autocast_bf16_$STAMP.json")
FP16=("${BENCH[@]}" --sizes "$SIZES" -r 5 --host-time --impl "lltm-sequence,lstm" --autocast fp16
  --json "$DATA/gpu_autocast_fp16_$STAMP.json")
# The sweep: batch 1 to 256, state 64 to 1024, features half the state; lltm
# against nn.LSTM in float32 (TF32 on, torch's default, and off: exact float32
# products, as lltm's) and under bf16 and fp16 autocast, with the path each
# point took, into the speed-up map.
GRID=""
for batch in 1 4 16 64 256; do
  for state in 64 128 256 512 1024; do
    GRID+="${batch}x$((state / 2))x$state,"
  done
done
GRID=${GRID%,}
SWEEP=("${BENCH[@]}" --sizes "$GRID" -r 3 --block-seconds 0.01)
# Each sweep into build/gpu/, then the three into one file of $DATA.
SWEEPS=("$ROOT/build/gpu/gpu_sweep_float32_$STAMP.json" "$ROOT/build/gpu/gpu_sweep_bf16_$STAMP.json"
  "$ROOT/build/gpu/gpu_sweep_fp16_$STAMP.json")
SWEEP32=("${SWEEP[@]}" --impl "lltm-sequence,lstm,lstm-notf32" --json "${SWEEPS[0]}")
SWEEP_BF16=("${SWEEP[@]}" --impl "lltm-sequence,lstm" --autocast bf16 --json "${SWEEPS[1]}")
SWEEP_FP16=("${SWEEP[@]}" --impl "lltm-sequence,lstm" --autocast fp16 --json "${SWEEPS[2]}")
# The calibration into build/gpu/ (it rewrites its file after every
# measurement), then into $DATA: a run cut short still brings back what it
# measured, and no half-written file.
CALIBRATION=$ROOT/build/gpu/gpu_calibration_$STAMP.json
# Five timed calls a plan and phase: about 15 s of the GPU's time for the
# plans of the whole map in four precisions (an estimate from the last run's
# sweeps and per-step rows), well inside the 60 s after which it starts
# nothing new.
CALIBRATE=(--deadline-s 60 --repeats 5 --json "$CALIBRATION")
if [[ $DRY_RUN == 1 ]]; then
  # The flags, as the bench takes them (with the lltm this Python imports).
  "$PYTHON" -c 'import shlex, sys; from lltm.bench import cli; [cli.parse(shlex.split(a)) for a in sys.argv[1:]]' \
    "${FP32[*]@Q}" "${BF16[*]@Q}" "${FP16[*]@Q}" "${SWEEP32[*]@Q}" "${SWEEP_BF16[*]@Q}" \
    "${SWEEP_FP16[*]@Q}" || fail 1
  "$PYTHON" -c 'import sys; sys.path[0] = "benchmarks"; import gpu_calibrate; gpu_calibrate.parse(sys.argv[1:])' \
    "${CALIBRATE[@]}" || fail 1
fi

say "bench: sequences at T = 50, float32, then bf16 and fp16 autocast"
run 60 "$PYTHON" -m lltm bench "${FP32[@]}"
run 40 "$PYTHON" -m lltm bench "${BF16[@]}"
run 40 "$PYTHON" -m lltm bench "${FP16[@]}"
say "calibration: every plan at every point of the map; float32 precisions; captured steps"
run 90 "$PYTHON" benchmarks/gpu_calibrate.py "${CALIBRATE[@]}"
printf '+ cp %q %q\n' "$CALIBRATION" "$DATA/${CALIBRATION##*/}"
if [[ $DRY_RUN == 0 && -s $CALIBRATION ]]; then cp "$CALIBRATION" "$DATA/"; fi
say "sweep: the speed-up map, float32, then bf16 and fp16 autocast"
run 100 "$PYTHON" -m lltm bench "${SWEEP32[@]}"
run 75 "$PYTHON" -m lltm bench "${SWEEP_BF16[@]}"
run 75 "$PYTHON" -m lltm bench "${SWEEP_FP16[@]}"
join_sweeps "$DATA/gpu_sweeps_$STAMP.json" "${SWEEPS[@]}"
run 30 "$PYTHON" benchmarks/speedup_map.py --png "$DATA/gpu_speedup_map_$STAMP.png" --markdown \
  "$DATA/gpu_sweeps_$STAMP.json"
if [[ $DRY_RUN == 0 ]]; then
  for file in "$DATA"/gpu_seq_"$STAMP".json "$DATA"/gpu_autocast_*_"$STAMP".json; do
    [[ -f $file ]] && "$PYTHON" benchmarks/render.py "$file" || true
  done
fi

say "done in $((SECONDS - START)) s: results in $DATA (status $STATUS)"
exit "$STATUS"
