// Kernels with barriers and shared memory, run on the host
// (fibers.cpp): each CUDA thread of a cudaLaunchKernelEx
// launch is a fiber, a stack of its own that the launching thread switches
// to and from, so that a thread can stop at a barrier and let the others of
// its warp, block, cluster or grid reach it.
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

// kWarp: the lanes of one warp (32 threads of the block in linear order),
// the rendezvous of a warp-collective instruction (warp_exchange below).
enum class BarrierKind : int { kBlock = 0, kCluster = 1, kGrid = 2, kWarp = 3 };

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

// A warp-collective instruction's exchange: every lane of the current
// thread's warp passes `bytes` (at most kWarpExchangeBytes) and, once every
// lane has arrived (a warp barrier), gets back all of them (`lanes`: lane
// l's at l * bytes), its own lane and the exchange's `scratch` (kWarpScratchBytes shared
// by its lanes, for a result computed once for all of them: its first byte
// is 0 when the first lane resumes). Both stay valid until the lane's next
// call. Faults outside a cudaLaunchKernelEx launch and in a warp of fewer
// than 32 threads (a block whose size is not a multiple of 32): the
// collectives lltm emulates (mma.sync) need every lane.
constexpr std::size_t kWarpExchangeBytes = 64;
constexpr std::size_t kWarpScratchBytes = 2048;
struct WarpExchange {
  const unsigned char* lanes;
  unsigned char* scratch;
  unsigned lane;  // the calling thread's
};
WarpExchange warp_exchange(const void* mine, std::size_t bytes, const char* what);

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
// BarrierKind; 0: none), so that a test can show a kernel needs them. A
// warp collective's own rendezvous is not a barrier the kernel wrote: it
// is never dropped.
void drop_barriers(unsigned kinds);

// How one fiber switches to another: the emulation's own x86-64 code (the
// default there, unless the process runs with shadow stacks), or
// swapcontext, which saves and restores the signal mask with a system call
// each time. Returns false where `assembly` is asked for and unavailable.
bool use_assembly_switch(bool assembly);

}  // namespace lltm::cuda_host
