// The CUDA runtime emulated on the host, for the test-only host build of
// csrc/cuda (tests/cuda_host.py). Each translation unit of that build
// includes this header first and then the csrc/cuda source it compiles
// (lltm_cuda.cpp, ...): csrc/cuda/lltm_cuda_runtime.h sees the emulation in
// place of <cuda_runtime.h> and <cooperative_groups.h>, and nothing under
// csrc/cuda includes anything of csrc/cuda_host.
//
// What runs a GPU's way here:
//   * the language (lltm_cuda_host_language.h): CUDA's built-in variables as
//     thread-locals, __global__/__device__ defined away, no __shared__;
//   * plain launches (LLTM_LAUNCH; lltm_cuda_host_launch.h): every block and
//     thread of the grid in turn, each to its end, as fast as a loop, after
//     the checks the GPU makes (at most 1024 threads a block, grid.y and
//     grid.z at most 65535, ...: a bad configuration is the launch error the
//     GPU gives), on torch's current stream; a barrier or shared memory in
//     them is a fault;
//   * cudaLaunchKernelEx (lltm_cuda_host_launch.h, _launch.cpp): the checks a
//     GPU makes of shared memory, clusters and cooperative grids, each
//     returning the GPU's error; kernel attributes; the occupancy calculator;
//     then every thread a fiber (lltm_cuda_host_fibers.h, _fibers.cpp) with
//     the block's shared memory arena, block, cluster and grid barriers
//     (__syncthreads and cooperative_groups; lltm_cuda_host_groups.h), run
//     in the schedule's order between barriers (forward, reverse or seeded
//     random, so that a race shows); a barrier that can never complete is a
//     fault that names it, never a hang;
//   * LLTM_CHECK_ALIGNED: every vector (Pack) load and store is aligned, as
//     the GPU requires (where it would fault, this throws);
//   * the emulated GPU (lltm_cuda_host_gpu.h): an H100's attributes and
//     limits, each settable from Python (csrc/cuda_host/emulation.cpp),
//     devices, their primary contexts, injectable errors, the current
//     stream, and aoti_torch_cuda_addmm_out mapped to torch's CPU shim;
//   * the runtime's error codes and messages (lltm_cuda_host_errors.h).
// CPU tensors have device index -1: the emulated device they run on.
#pragma once

#ifndef LLTM_CUDA_HOST
#error "csrc/cuda_host belongs to the host build (LLTM_CUDA_HOST, tests/cuda_host.py)"
#endif

// csrc/cuda/lltm_cuda_runtime.h checks that the emulation came first.
#define LLTM_CUDA_HOST_EMULATION 1

#include "lltm_cuda_host_errors.h"
#include "lltm_cuda_host_fibers.h"
#include "lltm_cuda_host_gpu.h"
#include "lltm_cuda_host_groups.h"
#include "lltm_cuda_host_language.h"
#include "lltm_cuda_host_launch.h"
