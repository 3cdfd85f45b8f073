#!/usr/bin/env bash
# Everything a machine with one NVIDIA GPU is for, in one command that ends
# well within ten minutes: build lltm's CPU library and its CUDA plugin in
# place (for this GPU's architecture only), run the CUDA tests, and time the
# sequence op at the GPU sizes against nn.LSTM (TF32 on and off) and the
# matrix products alone, with the persistent kernels and without.
#
#   bash benchmarks/gpu.sh             # results into $OUT, else benchmarks/data/
#   bash benchmarks/gpu.sh --dry-run   # what it would run (no GPU needed)
#
# Needs: python3 with a CUDA build of torch >= 2.11, nvcc (CUDA_HOME, else
# /usr/local/cuda) of torch's CUDA major, ninja and pytest. No network and
# no nox: nothing is installed; the plugin is put on PYTHONPATH from build/gpu/.
#
# Each stage has a deadline (`timeout`) so that the whole stays under ten
# minutes on a 16-core machine: builds about 1.5 min, tests about 3, bench
# about 3. A stage that fails is reported and the next one runs; the exit
# status is that of the first failure.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
DRY_RUN=0
case "${1:-}" in
  --dry-run) DRY_RUN=1 ;;
  "") ;;
  *) echo "usage: bash benchmarks/gpu.sh [--dry-run]" >&2; exit 2 ;;
esac
PYTHON=${PYTHON:-python3}
JOBS=${MAX_JOBS:-$(nproc 2>/dev/null || echo 4)}
DATA=${OUT:-$ROOT/benchmarks/data}
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export PATH="$CUDA_HOME/bin:$PATH"
SITE=$ROOT/build/gpu/site
STATUS=0

say() { printf '\n=== %s\n' "$*"; }
# run DEADLINE_S COMMAND...: prints it; runs it unless --dry-run.
run() {
  local deadline=$1
  shift
  printf '+'
  printf ' %q' "$@"
  printf '\n'
  if [[ $DRY_RUN == 1 ]]; then return 0; fi
  timeout --kill-after=10 "$deadline" "$@"
  local rc=$?
  if [[ $rc != 0 ]]; then
    echo "!!! exit status $rc (124: past its ${deadline} s deadline): $*"
    [[ $STATUS != 0 ]] || STATUS=$rc
  fi
  return $rc
}

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
mkdir -p "$DATA"
STAMP=$(date -u +%Y%m%dT%H%M%SZ)

say "build: the CPU library, then the CUDA plugin for sm_${ARCH/./} only"
run 300 env LLTM_VARIANT=cpu MAX_JOBS="$JOBS" "$PYTHON" setup.py -q build_ext --inplace
run 300 env LLTM_VARIANT=cuda TORCH_CUDA_ARCH_LIST="$ARCH" MAX_JOBS="$JOBS" \
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
run 60 "$PYTHON" -m lltm info

# The files that hold the cuda tests, named: the others may import what the
# machine lacks (hypothesis), and a collection error would stop the run.
say "tests: pytest -m 'cuda and not slow'"
run 240 "$PYTHON" -m pytest -m "cuda and not slow" -q -p no:cacheprovider \
  --junitxml="$DATA/gpu_tests_$STAMP.xml" \
  tests/test_cuda.py tests/test_cuda_devices.py tests/test_cuda_robustness.py

say "bench: sequences at T = 50, float32"
SIZES=16x32x128,8x32x256,64x256x512
IMPLS=lltm-sequence,lltm-sequence-per-step,lstm,lstm-notf32,gemm
# The tutorial's loss (output.sum() + h_n.sum() + c_n.sum()), one row each:
# the configuration users run first, in half the time of both losses.
BENCH=(--device cuda --seq-len 50 --impl "$IMPLS" --loss sum -r 5 -q)
SEQ=("${BENCH[@]}" --sizes "$SIZES" --json "$DATA/gpu_seq_$STAMP.json")
GRAD=("${BENCH[@]}" --sizes 16x32x128 --inputs-grad --json "$DATA/gpu_seq_grad_$STAMP.json")
if [[ $DRY_RUN == 1 ]]; then
  # The flags, as the bench takes them (with the lltm this Python imports).
  "$PYTHON" -c 'import shlex, sys; from lltm.bench import cli; [cli.parse(shlex.split(a)) for a in sys.argv[1:]]' \
    "${SEQ[*]@Q}" "${GRAD[*]@Q}" || STATUS=1
fi
run 150 "$PYTHON" -m lltm bench "${SEQ[@]}"
run 90 "$PYTHON" -m lltm bench "${GRAD[@]}"
if [[ $DRY_RUN == 0 ]]; then
  for file in "$DATA"/gpu_seq_"$STAMP".json "$DATA"/gpu_seq_grad_"$STAMP".json; do
    [[ -f $file ]] && "$PYTHON" benchmarks/render.py "$file" || true
  done
fi

say "done: results in $DATA (status $STATUS)"
exit "$STATUS"
