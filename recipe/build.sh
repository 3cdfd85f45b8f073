#!/usr/bin/env bash
# Build script of recipe.yaml (Linux, macOS). setup.py builds one variant per
# call, chosen by LLTM_VARIANT; the CUDA flavour installs both into $PREFIX.
set -euxo pipefail

export MAX_JOBS="${CPU_COUNT:-2}"

# lltm: the Python package and the CPU kernels (lltm/lib/lltm_cpu).
LLTM_VARIANT=cpu "${PYTHON}" -m pip install . --no-deps --no-build-isolation -vv

if [[ "${LLTM_CUDA}" == "1" ]]; then
  # lltm_cuda<major>: the CUDA kernels, for TORCH_CUDA_ARCH_LIST (recipe.yaml).
  # A fresh build directory keeps the CPU build's files out of this one.
  rm -rf build
  export CUDA_HOME="${CUDA_HOME:-${BUILD_PREFIX}}"
  LLTM_VARIANT=cuda "${PYTHON}" -m pip install . --no-deps --no-build-isolation -vv
fi
