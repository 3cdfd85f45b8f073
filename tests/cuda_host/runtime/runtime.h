// The CUDA runtime emulated on the host, for the test-only host build of
// csrc/cuda (tests/cuda_host/__init__.py). Each translation unit of that build
// includes this header first and then the csrc/cuda source it compiles
// (lltm_cuda.cpp, ...): csrc/cuda/lltm_cuda_runtime.h sees the emulation in
// place of <cuda_runtime.h> and <cooperative_groups.h>, and nothing under
// csrc/cuda includes anything of tests/cuda_host.
//
// What runs a GPU's way here:
//   * the language (language.h): CUDA's built-in variables as
//     thread-locals, __global__/__device__ defined away, no __shared__;
//   * plain launches (LLTM_LAUNCH; launch.h): every block and
//     thread of the grid in turn, each to its end, as fast as a loop, after
//     the checks the GPU makes (at most 1024 threads a block, grid.y and
//     grid.z at most 65535, ...: a bad configuration is the launch error the
//     GPU gives), on torch's current stream; a barrier or shared memory in
//     them is a fault;
//   * cudaLaunchKernelEx (launch.h, launch.cpp): the checks a
//     GPU makes of shared memory, clusters and cooperative grids, each
//     returning the GPU's error; kernel attributes; the occupancy calculator;
//     then every thread a fiber (fibers.h, fibers.cpp) with
//     the block's shared memory arena, block, cluster and grid barriers
//     (__syncthreads and cooperative_groups; groups.h), run
//     in the schedule's order between barriers (forward, reverse or seeded
//     random, so that a race shows); a barrier that can never complete is a
//     fault that names it, never a hang;
//   * the tensor cores' mma.sync m16n8k16 in bf16 and fp16 (tensor_cores.h),
//     each lane with the fragments the PTX ISA lays out, exchanged at a warp
//     rendezvous (fibers.h): a lane missing or a fragment misplaced shows;
//   * LLTM_CHECK_ALIGNED: every vector (Pack) load and store is aligned, as
//     the GPU requires (where it would fault, this throws);
//   * the emulated GPU (gpu.h): an H100's attributes and
//     limits, each settable from Python (emulation/module.cpp),
//     devices, their primary contexts, injectable errors, the current
//     stream, whether it is being captured, and CUDA events, which read a
//     clock advanced by the costs a test sets per call (calls.h);
//   * torch's C shim as the CUDA sources call it (calls.h): the CUDA GEMM
//     mapped to torch's CPU one, and every launch, allocation, view, GEMM
//     and dispatcher call counted by name, for tests that count a call's
//     device operations;
//   * the runtime's error codes and messages (errors.h).
// CPU tensors have device index -1: the emulated device they run on.
#pragma once

#ifndef LLTM_CUDA_HOST
#error "tests/cuda_host belongs to the host build (LLTM_CUDA_HOST, tests/cuda_host/__init__.py)"
#endif

// csrc/cuda/lltm_cuda_runtime.h checks that the emulation came first.
#define LLTM_CUDA_HOST_EMULATION 1

#include "calls.h"
#include "errors.h"
#include "fibers.h"
#include "gpu.h"
#include "groups.h"
#include "language.h"
#include "launch.h"
#include "tensor_cores.h"
