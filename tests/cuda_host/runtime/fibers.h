// Kernels with barriers and shared memory, run on the host
// (fibers.cpp): each CUDA thread of a cudaLaunchKernelEx
// launch is a fiber, a stack of its own that the launching thread switches
// to and from, so that a thread can stop at a barrier and let the others of
// its block, cluster or grid reach it.
//
// A launch runs in units whose threads may wait for one another: a
// cooperative launch is one unit (its grid barrier covers every thread), a
// cluster launch a unit per cluster, any other launch a unit per block.
// Within a unit the fibers run in rounds: every fiber that can run runs until
// it reaches a barrier or returns, in the schedule's order (forward, reverse
// or seeded random); a barrier that all the threads it covers have reached
// lets them run in the next round. A round in which nothing can run while
// threads still wait is a barrier that can never complete (threads exited
// before it, or wait at different barriers): a fault that names it, never a
// hang. Each block has an arena of shared memory (the launch's dynamic
// shared memory bytes, filled with 0xff bytes at the start, as if garbage,
// and again when the block exits, so that a read of memory nobody wrote, or
// of a cluster peer that is gone, gives a wrong answer; built with ASan, each
// arena is followed by bytes it reports any access to).
#pragma once

#include <cstddef>
#include <cstdint>

#include "language.h"

namespace lltm::cuda_host {

enum class BarrierKind : int { kBlock = 0, kCluster = 1, kGrid = 2 };

// A kernel with its arguments bound: invoke(context) runs it as the current
// thread (threadIdx, blockIdx) of the launch.
struct KernelCall {
  void (*invoke)(const void* context);
  const void* context;
  const void* kernel;  // the __global__ function, to name it in faults
};

// A launch the checks of cudaLaunchKernelEx accepted.
struct FiberLaunch {
  dim3 grid;
  dim3 block;
  dim3 cluster;  // (1, 1, 1) for a launch without clusters
  std::size_t shared_bytes;
  bool cooperative;
};

// Runs every thread of the launch to its end; throws (a fault, or what a
// kernel threw) after unwinding every thread that was still waiting.
void run_fibers(const FiberLaunch& launch, const KernelCall& call);

// Waits at the barrier of the current thread's block, cluster or grid.
// Faults outside a cudaLaunchKernelEx launch, for a grid barrier outside a
// cooperative launch, and for a cluster on compute capability below 9.0.
void barrier(BarrierKind kind);

// The current block's arena; faults outside a cudaLaunchKernelEx launch.
unsigned char* shared_memory();

// `address`, in the current block's arena, in the arena of block `rank` of
// its cluster (distributed shared memory).
unsigned char* cluster_shared_memory(const void* address, unsigned rank);

// The current launch's cluster dimensions, (1, 1, 1) without clusters.
dim3 cluster_dims();

// The order fibers run in within a round.
enum class Order : int { kForward = 0, kReverse = 1, kRandom = 2 };

// From the next launch on: `order`; a random order draws from `seed` and the
// number of launches since this call, so a failing schedule reproduces.
void set_schedule(Order order, uint64_t seed);

// Barriers of these kinds return at once from now on (a bit per
// BarrierKind; 0: none), so that a test can show a kernel needs them.
void drop_barriers(unsigned kinds);

// How one fiber switches to another: the emulation's own x86-64 code (the
// default there, unless the process runs with shadow stacks), or
// swapcontext, which saves and restores the signal mask with a system call
// each time. Returns false where `assembly` is asked for and unavailable.
bool use_assembly_switch(bool assembly);

}  // namespace lltm::cuda_host
