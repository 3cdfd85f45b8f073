#!/usr/bin/env bash
# Installs the parts of the CUDA toolkit that lltm's CUDA kernels need into a
# manylinux_2_28 (AlmaLinux 8) container: the before-all step of
# tools/cibuildwheel-cuda.toml. LLTM_CUDA_VERSION (12.8, 13.0, ...) picks
# the release; the toolkit ends up in /usr/local/cuda.
#
# Built against the LibTorch stable ABI, the kernels include torch's
# headeronly/ and stable/ headers and the C shims only, so the build needs:
#   cuda-nvcc           the compiler (with its crt/ headers)
#   cuda-cudart-devel   cuda_runtime.h and libcudart.so to link against
#   cuda-cccl           Thrust/CUB/libcu++: torch/headeronly/util/complex.h
#                       includes <thrust/complex.h> when compiled by nvcc
# and none of the cuBLAS/cuSPARSE/cuSOLVER development packages that the ATen
# CUDA headers (ATen/cuda/CUDAContext.h) would pull in.
set -euo pipefail

version="${LLTM_CUDA_VERSION:?set LLTM_CUDA_VERSION to the CUDA release, e.g. 13.0}"
suffix="${version/./-}"

dnf install -y dnf-plugins-core
dnf config-manager --add-repo \
  https://developer.download.nvidia.com/compute/cuda/repos/rhel8/x86_64/cuda-rhel8.repo
dnf install -y --setopt=install_weak_deps=False \
  "cuda-nvcc-${suffix}" \
  "cuda-cudart-devel-${suffix}" \
  "cuda-cccl-${suffix}"
dnf clean all

ln -sfn "/usr/local/cuda-${version}" /usr/local/cuda
/usr/local/cuda/bin/nvcc --version
