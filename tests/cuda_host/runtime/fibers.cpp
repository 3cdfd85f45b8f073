// The fibers of fibers.h: stacks, the context switch, rounds,
// barriers (warp collectives' among them), shared memory and the faults of
// a barrier that cannot complete.
#include <cxxabi.h>
#include <dlfcn.h>
#include <sys/mman.h>
#include <ucontext.h>

#include "runtime.h"

#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#if defined(__SANITIZE_ADDRESS__)
#define LLTM_CUDA_HOST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LLTM_CUDA_HOST_ASAN 1
#endif
#endif
#ifndef LLTM_CUDA_HOST_ASAN
#define LLTM_CUDA_HOST_ASAN 0
#endif
#if LLTM_CUDA_HOST_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

namespace lltm::cuda_host {
namespace {

// --- Settings -----------------------------------------------------------------------------

std::atomic<int> schedule_order{static_cast<int>(Order::kForward)};
std::atomic<uint64_t> schedule_seed{0};
// Launches since set_schedule: the random order of each launch draws from it.
std::atomic<uint64_t> schedule_launches{0};
std::atomic<unsigned> dropped_barriers{0};

// --- The context switch -------------------------------------------------------------------
//
// A fiber's context is its stack pointer: lltm_fiber_switch pushes the
// registers the System V ABI has a function preserve (rbx, rbp, r12-r15) on
// the current stack, saves the stack pointer, loads the other one and pops
// the other context's registers. The SSE and x87 control words, which the
// ABI has preserved too, stay as the launching thread has them: every fiber
// runs on it, and no kernel changes them. A new fiber's stack is laid out as
// if it had switched away just before lltm_fiber_entry, which
// calls fiber_main(rbx). Fourteen instructions, where swapcontext makes a
// system call (the signal mask) at every switch: a thread's barrier costs a
// tenth of what it costs with swapcontext, and the rest of that cost is the
// cache misses of resuming each fiber's frames.

#if defined(__x86_64__) && defined(__linux__)
#define LLTM_CUDA_HOST_ASSEMBLY_SWITCH 1
extern "C" void lltm_fiber_switch(void** save_sp, void* load_sp);
extern "C" void lltm_fiber_entry();
asm(R"(
    .pushsection .text
    .p2align 4
    .globl lltm_fiber_switch
    .hidden lltm_fiber_switch
    .type lltm_fiber_switch, @function
lltm_fiber_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size lltm_fiber_switch, .-lltm_fiber_switch

    .p2align 4
    .globl lltm_fiber_entry
    .hidden lltm_fiber_entry
    .type lltm_fiber_entry, @function
lltm_fiber_entry:
    movq %rbx, %rdi
    callq *%r12
    ud2
    .size lltm_fiber_entry, .-lltm_fiber_entry
    .popsection
)");

// Whether the process runs with shadow stacks (the kernel's x86 user shadow
// stack, which glibc may enable): a return to another stack would fault, so
// fibers use swapcontext, which glibc makes shadow-stack aware.
bool shadow_stack_enabled() {
  constexpr int kArchShstkStatus = 0x5005;
  unsigned long features = 0;
  if (syscall(SYS_arch_prctl, kArchShstkStatus, &features) != 0) return false;
  return (features & 1) != 0;  // ARCH_SHSTK_SHSTK
}

std::atomic<bool> assembly_switch{!shadow_stack_enabled()};
#else
#define LLTM_CUDA_HOST_ASSEMBLY_SWITCH 0
std::atomic<bool> assembly_switch{false};
#endif

struct Context {
  void* sp = nullptr;        // the assembly switch's saved stack pointer
  ucontext_t* uc = nullptr;  // or swapcontext's saved context
};

void jump(Context& from, const Context& to, bool assembly) {
#if LLTM_CUDA_HOST_ASSEMBLY_SWITCH
  if (assembly) {
    lltm_fiber_switch(&from.sp, to.sp);
    return;
  }
#else
  (void)assembly;
#endif
  if (swapcontext(from.uc, to.uc) != 0) fault("swapcontext failed");
}

// --- AddressSanitizer ------------------------------------------------------------------------
//
// Under ASan (nox -s sanitize) every switch is announced to it: it keeps the
// bounds of the stack in use, which it needs to unwind an exception thrown on
// a fiber's stack (a fault, a cancelled thread) and to keep the shadow of a
// stack the next fibers reuse clean. Each block's shared memory is followed
// by a poisoned gap, so that a kernel that indexes past its dynamic shared
// memory is reported where it does, rather than reading its neighbour's.
// Without ASan these are nothing.

#if LLTM_CUDA_HOST_ASAN
constexpr std::size_t kSharedRedzone = 64;
#else
constexpr std::size_t kSharedRedzone = 0;
#endif

// Before a switch to the stack [bottom, bottom + size); `fake_stack` keeps
// the current stack's ASan state until it is resumed (null: it never is).
void start_switch(void** fake_stack, const void* bottom, std::size_t size) {
#if LLTM_CUDA_HOST_ASAN
  __sanitizer_start_switch_fiber(fake_stack, bottom, size);
#else
  (void)fake_stack, (void)bottom, (void)size;
#endif
}

// On the stack switched to; `bottom` and `size` (if not null) receive the
// bounds of the stack switched from.
void finish_switch(void* fake_stack, const void** bottom, std::size_t* size) {
#if LLTM_CUDA_HOST_ASAN
  __sanitizer_finish_switch_fiber(fake_stack, bottom, size);
#else
  (void)fake_stack, (void)bottom, (void)size;
#endif
}

void mark_unusable(const void* begin, std::size_t bytes) {
#if LLTM_CUDA_HOST_ASAN
  ASAN_POISON_MEMORY_REGION(begin, bytes);
#else
  (void)begin, (void)bytes;
#endif
}

void mark_usable(const void* begin, std::size_t bytes) {
#if LLTM_CUDA_HOST_ASAN
  ASAN_UNPOISON_MEMORY_REGION(begin, bytes);
#else
  (void)begin, (void)bytes;
#endif
}

// --- Stacks ---------------------------------------------------------------------------------
//
// 256 KiB of address space each, mapped 64 at a time without reserving
// memory: only the pages a thread touches (a few KiB for a kernel) cost
// memory, kept for the next launches. No guard pages (two mappings a stack
// would run into the kernel's limit on mappings at a hundred thousand
// threads): a canary at the bottom of each stack, checked when a thread
// first stops and when it ends, turns an overflow into an abort with a
// message rather than another thread's stack silently overwritten.

constexpr std::size_t kStackBytes = 256 * 1024;
// Stacks a power of two apart would put every fiber's top frames (what a
// switch touches) in the same few cache sets, and each switch would miss the
// cache: 17 lines more spread 64 stacks' tops over the sets.
constexpr std::size_t kStackStride = kStackBytes + 17 * 64;
constexpr std::size_t kSlabStacks = 64;
constexpr std::size_t kKeptSlabs = 16;
constexpr uint64_t kCanary = 0x6c6c746d2d737461;  // "lltm-sta"
constexpr int kCanaryWords = 8;

class StackPool {
 public:
  StackPool() = default;
  StackPool(const StackPool&) = delete;
  StackPool& operator=(const StackPool&) = delete;
  ~StackPool() {
    for (unsigned char* slab : slabs_) munmap(slab, kStackStride * kSlabStacks);
  }

  unsigned char* acquire() {
    if (free_.empty()) grow();
    unsigned char* stack = free_.back();
    free_.pop_back();
    auto* words = reinterpret_cast<uint64_t*>(stack);
    for (int i = 0; i < kCanaryWords; ++i) words[i] = kCanary;
    return stack;
  }

  void release(unsigned char* stack) {
    // What ASan knows of the frames left on it (a fiber never returns from
    // its first frame) goes with them.
    mark_usable(stack, kStackBytes);
    free_.push_back(stack);
  }

  static bool intact(const unsigned char* stack) {
    const auto* words = reinterpret_cast<const uint64_t*>(stack);
    for (int i = 0; i < kCanaryWords; ++i) {
      if (words[i] != kCanary) return false;
    }
    return true;
  }

  // After a launch, when every stack is free: gives back what a large
  // launch mapped past kKeptSlabs.
  void trim() {
    if (slabs_.size() <= kKeptSlabs || free_.size() != slabs_.size() * kSlabStacks) return;
    for (std::size_t s = kKeptSlabs; s < slabs_.size(); ++s) {
      munmap(slabs_[s], kStackStride * kSlabStacks);
    }
    slabs_.resize(kKeptSlabs);
    free_.clear();
    for (unsigned char* slab : slabs_) add_free(slab);
  }

 private:
  void grow() {
    void* slab = mmap(nullptr, kStackStride * kSlabStacks, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (slab == MAP_FAILED) fault("no memory for the stacks of a launch's threads");
    slabs_.push_back(static_cast<unsigned char*>(slab));
    add_free(slabs_.back());
  }

  void add_free(unsigned char* slab) {
    // Pushed from the top, so that fibers take them from the bottom up.
    for (std::size_t i = kSlabStacks; i-- > 0;) free_.push_back(slab + i * kStackStride);
  }

  std::vector<unsigned char*> slabs_;
  std::vector<unsigned char*> free_;
};

// --- A unit of a launch -----------------------------------------------------------------------

enum class State : uint8_t { kNew, kRunning, kWaiting, kDone };

struct Fiber {
  Context context;
  unsigned char* stack = nullptr;
  uint3 thread{0, 0, 0};
  uint32_t block = 0;  // index into Unit::blocks
  State state = State::kNew;
  BarrierKind waiting = BarrierKind::kBlock;
  bool cancelled = false;
  void* fake_stack = nullptr;  // ASan's, while it waits
  uint32_t exchanges = 0;      // warp_exchange calls so far: which buffer the next uses
};

struct Barrier {
  uint32_t participants = 0;
  std::vector<uint32_t> waiters;  // fibers, in the order they arrived
};

// A warp's rendezvous for its collectives, with two exchange buffers used
// in turn: a lane can reach its next-but-one exchange only after every lane
// has arrived at the next one, so after each has read this one's. Allocated
// at a warp's first collective.
struct Warp {
  Barrier barrier;
  // 2 x (32 lanes x kWarpExchangeBytes, then kWarpScratchBytes)
  std::unique_ptr<unsigned char[]> buffers;
};

struct Block {
  uint3 index{0, 0, 0};
  unsigned char* arena = nullptr;
  uint32_t cluster = 0;  // index into Unit::clusters
  uint32_t live = 0;     // threads not yet returned
  Barrier barrier;
  std::vector<Warp> warps;
};

struct Cluster {
  std::vector<uint32_t> blocks;  // by rank
  Barrier barrier;
};

// The fibers that may wait for one another, and the state of their rounds.
struct Unit {
  const FiberLaunch* launch = nullptr;
  const KernelCall* call = nullptr;
  bool assembly = true;
  unsigned dropped = 0;
  Order order = Order::kForward;
  std::mt19937_64 random;

  std::vector<Fiber> fibers;
  std::vector<Block> blocks;
  std::vector<Cluster> clusters;
  Barrier grid;
  std::vector<unsigned char> shared;  // the blocks' arenas, each 16-byte aligned

  std::vector<uint32_t> ready, next;  // this round's fibers, and the next round's
  Context scheduler;
  ucontext_t scheduler_context;
  // The launching thread's stack, as ASan gives it to the first fiber.
  void* scheduler_fake_stack = nullptr;
  const void* scheduler_bottom = nullptr;
  std::size_t scheduler_size = 0;
  std::size_t done = 0;
  std::exception_ptr error;
};

// What the launching thread runs now (one thread-local: each access to one
// costs a call in a shared library).
struct Current {
  Unit* unit = nullptr;
  Fiber* fiber = nullptr;
};
thread_local Current current;

StackPool& stack_pool() {
  static thread_local StackPool pool;
  return pool;
}

// Thrown at a barrier into a fiber that must end (another thread faulted):
// unwinds its frames; caught by fiber_main only.
struct Cancelled {};

void poison(unsigned char* arena, std::size_t bytes) { std::memset(arena, 0xff, bytes); }

[[noreturn]] void fiber_main(Fiber* fiber) {
  Unit& unit = *current.unit;
  finish_switch(nullptr, &unit.scheduler_bottom, &unit.scheduler_size);
  try {
    unit.call->invoke(unit.call->context);
  } catch (const Cancelled&) {
    // Unwound on purpose.
  } catch (...) {
    if (!unit.error) unit.error = std::current_exception();
  }
  fiber->state = State::kDone;
  start_switch(nullptr, unit.scheduler_bottom, unit.scheduler_size);
  jump(fiber->context, unit.scheduler, unit.assembly);
  std::abort();  // a finished fiber is never resumed
}

void ucontext_entry(unsigned high, unsigned low) {
  fiber_main(reinterpret_cast<Fiber*>((uint64_t(high) << 32) | low));
}

void prepare(const Unit& unit, Fiber& fiber) {
  fiber.stack = stack_pool().acquire();
  unsigned char* top = fiber.stack + kStackBytes;
  if (!unit.assembly) {
    // swapcontext's saved context lives at the top of the fiber's stack.
    constexpr std::size_t kContextBytes = (sizeof(ucontext_t) + 63) / 64 * 64;
    auto& context = *reinterpret_cast<ucontext_t*>(top - kContextBytes);
    fiber.context.uc = &context;
    if (getcontext(&context) != 0) fault("getcontext failed");
    context.uc_stack.ss_sp = fiber.stack;
    context.uc_stack.ss_size = kStackBytes - kContextBytes;
    context.uc_link = nullptr;
    const auto address = reinterpret_cast<uint64_t>(&fiber);
    makecontext(&context, reinterpret_cast<void (*)()>(&ucontext_entry), 2,
                static_cast<unsigned>(address >> 32), static_cast<unsigned>(address));
    return;
  }
#if LLTM_CUDA_HOST_ASSEMBLY_SWITCH
  // The frame lltm_fiber_switch pops (see above), under two words of
  // padding: the entry's `call` then finds the stack 16-byte aligned.
  auto* frame = reinterpret_cast<uint64_t*>(top) - 9;
  frame[0] = 0;                                              // r15
  frame[1] = 0;                                              // r14
  frame[2] = 0;                                              // r13
  frame[3] = reinterpret_cast<uint64_t>(&fiber_main);        // r12
  frame[4] = reinterpret_cast<uint64_t>(&fiber);             // rbx
  frame[5] = 0;                                              // rbp
  frame[6] = reinterpret_cast<uint64_t>(&lltm_fiber_entry);  // return address
  frame[7] = 0;
  frame[8] = 0;
  fiber.context.sp = frame;
#else
  (void)top;
#endif
}

const char* barrier_name(BarrierKind kind) {
  switch (kind) {
    case BarrierKind::kBlock:
      return "__syncthreads() (or this_thread_block().sync())";
    case BarrierKind::kCluster:
      return "cg::this_cluster().sync()";
    case BarrierKind::kGrid:
      return "cg::this_grid().sync()";
    case BarrierKind::kWarp:
      return "a warp-collective instruction (mma.sync)";
  }
  return "a barrier";
}

std::string coordinates(const uint3& v) {
  return "(" + std::to_string(v.x) + "," + std::to_string(v.y) + "," + std::to_string(v.z) + ")";
}

// The kernel's name where the library exports it, for faults.
std::string kernel_name(const void* kernel) {
  Dl_info info{};
  if (dladdr(kernel, &info) != 0 && info.dli_sname != nullptr && info.dli_saddr == kernel) {
    int status = 0;
    std::unique_ptr<char, decltype(&std::free)> demangled(
        abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status), &std::free);
    return status == 0 && demangled ? demangled.get() : info.dli_sname;
  }
  return "a kernel";
}

// The warp of a fiber: its thread's linear index in the block over 32.
uint32_t linear_thread(const FiberLaunch& launch, const uint3& t) {
  return (t.z * launch.block.y + t.y) * launch.block.x + t.x;
}
uint32_t warp_of(const FiberLaunch& launch, const Fiber& fiber) {
  return linear_thread(launch, fiber.thread) / 32;
}

// Why the unit cannot go on: the barrier that the first waiting fiber waits
// at, and what the other threads it covers do instead.
std::string describe_stall(const Unit& unit) {
  const auto first = std::find_if(unit.fibers.begin(), unit.fibers.end(),
                                  [](const Fiber& f) { return f.state == State::kWaiting; });
  if (first == unit.fibers.end()) return "a launch stopped with threads neither waiting nor done";
  const Fiber& waiter = *first;
  const BarrierKind kind = waiter.waiting;
  const Block& block = unit.blocks[waiter.block];
  auto covered = [&](const Fiber& f) {
    switch (kind) {
      case BarrierKind::kBlock:
        return f.block == waiter.block;
      case BarrierKind::kCluster:
        return unit.blocks[f.block].cluster == block.cluster;
      case BarrierKind::kGrid:
        return true;
      case BarrierKind::kWarp:
        return f.block == waiter.block && warp_of(*unit.launch, f) == warp_of(*unit.launch, waiter);
    }
    return false;
  };
  std::size_t total = 0, here = 0, exited = 0, elsewhere[4] = {0, 0, 0, 0};
  const Fiber* first_exited = nullptr;
  for (const Fiber& f : unit.fibers) {
    if (!covered(f)) continue;
    ++total;
    if (f.state == State::kDone) {
      ++exited;
      if (first_exited == nullptr) first_exited = &f;
    } else if (f.state == State::kWaiting && f.waiting == kind) {
      ++here;
    } else if (f.state == State::kWaiting) {
      ++elsewhere[static_cast<int>(f.waiting)];
    }
  }
  std::ostringstream s;
  s << "in " << kernel_name(unit.call->kernel) << ", " << barrier_name(kind) << " in ";
  switch (kind) {
    case BarrierKind::kBlock:
      s << "block " << coordinates(block.index);
      break;
    case BarrierKind::kCluster:
      s << "the cluster of block " << coordinates(block.index);
      break;
    case BarrierKind::kGrid:
      s << "the grid";
      break;
    case BarrierKind::kWarp:
      s << "warp " << warp_of(*unit.launch, waiter) << " of block " << coordinates(block.index);
      break;
  }
  s << " can never complete: it waits for all " << total << " threads; " << here << " wait there";
  if (exited > 0) {
    s << ", " << exited << " returned without reaching it (thread "
      << coordinates(first_exited->thread) << " of block "
      << coordinates(unit.blocks[first_exited->block].index) << " first)";
  }
  for (int k = 0; k < 4; ++k) {
    if (elsewhere[k] > 0) {
      s << ", " << elsewhere[k] << " wait at " << barrier_name(static_cast<BarrierKind>(k));
    }
  }
  s << " (on a GPU: a hang, or undefined behaviour)";
  return s.str();
}

void order_round(Unit& unit, std::vector<uint32_t>& fibers) {
  switch (unit.order) {
    case Order::kForward:
      if (!std::is_sorted(fibers.begin(), fibers.end())) std::sort(fibers.begin(), fibers.end());
      break;
    case Order::kReverse:
      if (!std::is_sorted(fibers.begin(), fibers.end(), std::greater<>())) {
        std::sort(fibers.begin(), fibers.end(), std::greater<>());
      }
      break;
    case Order::kRandom:
      std::shuffle(fibers.begin(), fibers.end(), unit.random);
      break;
  }
}

void finished(Unit& unit, Fiber& fiber) {
  stack_pool().release(fiber.stack);
  fiber.stack = nullptr;
  ++unit.done;
  Block& block = unit.blocks[fiber.block];
  // What is left of a block is garbage to its cluster's peers.
  if (--block.live == 0) poison(block.arena, unit.launch->shared_bytes);
}

// Runs fiber `index` until it waits or returns.
void resume(Unit& unit, uint32_t index) {
  Fiber& fiber = unit.fibers[index];
  const bool first = fiber.state == State::kNew;
  if (first) prepare(unit, fiber);
  fiber.state = State::kRunning;
  threadIdx = fiber.thread;
  blockIdx = unit.blocks[fiber.block].index;
  current.fiber = &fiber;
  start_switch(&unit.scheduler_fake_stack, fiber.stack, kStackBytes);
  jump(unit.scheduler, fiber.context, unit.assembly);
  finish_switch(unit.scheduler_fake_stack, nullptr, nullptr);
  current.fiber = nullptr;
  // A kernel's frames are largest from its start (local arrays): checked
  // then, and at its end, not at every switch (another cache miss each).
  if ((first || fiber.state == State::kDone) && !StackPool::intact(fiber.stack)) {
    // Its neighbour's memory is overwritten: no unwinding is safe now.
    std::fprintf(stderr,
                 "lltm host emulation of CUDA: a thread of %s overflowed its %zu KiB stack\n",
                 kernel_name(unit.call->kernel).c_str(), kStackBytes / 1024);
    std::abort();
  }
  if (fiber.state == State::kDone) finished(unit, fiber);
}

// Ends every fiber that has not: those waiting unwind from their barrier.
void cancel(Unit& unit) {
  for (uint32_t i = 0; i < unit.fibers.size(); ++i) {
    Fiber& fiber = unit.fibers[i];
    if (fiber.state == State::kNew) {
      fiber.state = State::kDone;
    } else if (fiber.state == State::kWaiting) {
      fiber.cancelled = true;
      resume(unit, i);
    }
  }
}

void run_rounds(Unit& unit) {
  try {
    order_round(unit, unit.ready);
    while (!unit.ready.empty()) {
      for (const uint32_t index : unit.ready) {
        resume(unit, index);
        if (unit.error) std::rethrow_exception(unit.error);
      }
      unit.ready.clear();
      std::swap(unit.ready, unit.next);
      order_round(unit, unit.ready);
    }
    if (unit.done != unit.fibers.size()) fault(describe_stall(unit));
  } catch (...) {
    // No thread may stay on its stack: those waiting unwind, then the
    // launch ends with the error.
    cancel(unit);
    throw;
  }
}

uint32_t block_threads(const FiberLaunch& launch) {
  return launch.block.x * launch.block.y * launch.block.z;
}

// Lays out a unit of the given blocks (and their clusters), and its fibers.
void build_unit(Unit& unit, const std::vector<uint3>& blocks) {
  const FiberLaunch& launch = *unit.launch;
  const uint32_t threads = block_threads(launch);
  const dim3 c = launch.cluster;
  const std::size_t arena = (launch.shared_bytes + 15) / 16 * 16 + kSharedRedzone;
  // The last unit's gaps were marked unusable: the bytes are written anew.
  mark_usable(unit.shared.data(), unit.shared.capacity());
  unit.shared.assign(arena * blocks.size() + 16, 0xff);
  auto* base = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<std::uintptr_t>(unit.shared.data()) + 15) / 16 * 16);
  for (std::size_t b = 0; b < blocks.size(); ++b) {
    unsigned char* end = base + arena * b + launch.shared_bytes;
    mark_unusable(end, base + arena * (b + 1) - end);
  }

  unit.blocks.resize(blocks.size());
  unit.clusters.clear();
  unit.fibers.clear();
  unit.fibers.resize(std::size_t(threads) * blocks.size());
  unit.ready.reserve(unit.fibers.size());
  unit.next.reserve(unit.fibers.size());
  unit.done = 0;
  unit.error = nullptr;
  unit.ready.clear();
  unit.next.clear();
  unit.grid.participants = static_cast<uint32_t>(unit.fibers.size());
  unit.grid.waiters.clear();

  // Clusters in the order their first block comes; a block's rank is its
  // position in its cluster, x fastest.
  std::unordered_map<uint64_t, uint32_t> cluster_of;  // cluster id -> index
  const dim3 g = launch.grid;
  for (uint32_t b = 0; b < blocks.size(); ++b) {
    const uint3 i = blocks[b];
    const uint64_t id = (uint64_t(i.z / c.z) * (g.y / c.y) + i.y / c.y) * (g.x / c.x) + i.x / c.x;
    const auto [found, added] =
        cluster_of.try_emplace(id, static_cast<uint32_t>(unit.clusters.size()));
    if (added) {
      unit.clusters.emplace_back();
      unit.clusters.back().blocks.assign(std::size_t(c.x) * c.y * c.z, UINT32_MAX);
    }
    Cluster& cluster = unit.clusters[found->second];
    const uint32_t rank = (i.z % c.z * c.y + i.y % c.y) * c.x + i.x % c.x;
    cluster.blocks[rank] = b;

    Block& block = unit.blocks[b];
    block.index = i;
    block.arena = base + arena * b;
    block.cluster = found->second;
    block.live = threads;
    block.barrier.participants = threads;
    block.barrier.waiters.clear();
    block.warps.resize((threads + 31) / 32);
    for (uint32_t w = 0; w < block.warps.size(); ++w) {
      block.warps[w].barrier.participants = std::min<uint32_t>(32, threads - 32 * w);
      block.warps[w].barrier.waiters.clear();
    }

    uint32_t t = b * threads;
    for (unsigned z = 0; z < launch.block.z; ++z)
      for (unsigned y = 0; y < launch.block.y; ++y)
        for (unsigned x = 0; x < launch.block.x; ++x, ++t) {
          Fiber& fiber = unit.fibers[t];
          fiber.thread = {x, y, z};
          fiber.block = b;
          unit.ready.push_back(t);
        }
  }
  for (Cluster& cluster : unit.clusters) {
    cluster.barrier.participants = static_cast<uint32_t>(cluster.blocks.size()) * threads;
    cluster.barrier.waiters.clear();
  }
}

// Restores the launching thread's state however a launch ends.
class Running {
 public:
  explicit Running(Unit& unit) : previous_(current.unit) { current.unit = &unit; }
  ~Running() {
    current.unit = previous_;
    current.fiber = nullptr;
    stack_pool().trim();
  }
  Running(const Running&) = delete;
  Running& operator=(const Running&) = delete;

 private:
  Unit* previous_;
};

Unit& unit_of_fiber(const char* what) {
  if (current.unit == nullptr || current.fiber == nullptr) {
    fault(std::string(what) +
          " in a plain launch (LLTM_LAUNCH runs each thread to its end, one after "
          "another): kernels with barriers or shared memory are launched with "
          "cudaLaunchKernelEx");
  }
  return *current.unit;
}

void check_clusters(const Unit& unit, const char* what) {
  if (gpu().capability_major.load() < 9) {
    fault("in " + kernel_name(unit.call->kernel) + ", " + what +
          " on a GPU of compute capability " + std::to_string(gpu().capability_major.load()) + "." +
          std::to_string(gpu().capability_minor.load()) + ": clusters need 9.0");
  }
}

}  // namespace

void run_fibers(const FiberLaunch& launch, const KernelCall& call) {
  if (current.unit != nullptr) fault("a kernel launched from inside a kernel");
  Unit unit;
  unit.launch = &launch;
  unit.call = &call;
  unit.assembly = assembly_switch.load();
  unit.dropped = dropped_barriers.load();
  unit.order = static_cast<Order>(schedule_order.load());
  unit.random.seed(schedule_seed.load() * 0x9e3779b97f4a7c15ull + schedule_launches.fetch_add(1));
  if (!unit.assembly) getcontext(&unit.scheduler_context);
  unit.scheduler.uc = &unit.scheduler_context;
  const Running running(unit);

  // The units, in the schedule's order too: blocks of a launch without grid
  // barriers may run in any order on a GPU.
  const dim3 g = launch.grid, c = launch.cluster;
  std::vector<std::vector<uint3>> units;
  auto blocks_of = [&](unsigned x0, unsigned y0, unsigned z0, dim3 size) {
    std::vector<uint3> blocks;
    for (unsigned z = z0; z < z0 + size.z; ++z)
      for (unsigned y = y0; y < y0 + size.y; ++y)
        for (unsigned x = x0; x < x0 + size.x; ++x) blocks.push_back({x, y, z});
    return blocks;
  };
  if (launch.cooperative) {
    units.push_back(blocks_of(0, 0, 0, g));
  } else {
    for (unsigned z = 0; z < g.z; z += c.z)
      for (unsigned y = 0; y < g.y; y += c.y)
        for (unsigned x = 0; x < g.x; x += c.x) units.push_back(blocks_of(x, y, z, c));
  }
  std::vector<uint32_t> order(units.size());
  for (uint32_t u = 0; u < order.size(); ++u) order[u] = u;
  order_round(unit, order);
  for (const uint32_t u : order) {
    build_unit(unit, units[u]);
    run_rounds(unit);
  }
}

namespace {

// The current fiber waits at barrier `b` of kind `kind` until every thread
// it covers has arrived.
void wait_at(Unit& unit, Fiber& fiber, Barrier& b, BarrierKind kind) {
  if (fiber.cancelled) throw Cancelled{};
  const auto index = static_cast<uint32_t>(&fiber - unit.fibers.data());
  fiber.state = State::kWaiting;
  fiber.waiting = kind;
  b.waiters.push_back(index);
  if (b.waiters.size() == b.participants) {
    unit.next.insert(unit.next.end(), b.waiters.begin(), b.waiters.end());
    b.waiters.clear();
  }
  start_switch(&fiber.fake_stack, unit.scheduler_bottom, unit.scheduler_size);
  jump(fiber.context, unit.scheduler, unit.assembly);
  finish_switch(fiber.fake_stack, nullptr, nullptr);
  // Resumed: in the next round, or to end.
  if (fiber.cancelled) throw Cancelled{};
}

}  // namespace

void barrier(BarrierKind kind) {
  Unit& unit = unit_of_fiber(barrier_name(kind));
  if (kind == BarrierKind::kGrid && !unit.launch->cooperative) {
    fault("in " + kernel_name(unit.call->kernel) +
          ", cg::this_grid().sync() in a launch without cudaLaunchAttributeCooperative: "
          "only a cooperative launch has all its blocks on the GPU at once");
  }
  if (kind == BarrierKind::kCluster) check_clusters(unit, "cg::this_cluster().sync()");
  // A warp's rendezvous is warp_exchange's alone (it never drops).
  if (kind == BarrierKind::kWarp) fault("a warp rendezvous outside warp_exchange");
  if (unit.dropped & (1u << static_cast<int>(kind))) return;

  Fiber& fiber = *current.fiber;
  Block& block = unit.blocks[fiber.block];
  wait_at(unit, fiber,
          kind == BarrierKind::kBlock     ? block.barrier
          : kind == BarrierKind::kCluster ? unit.clusters[block.cluster].barrier
                                          : unit.grid,
          kind);
}

WarpExchange warp_exchange(const void* mine, std::size_t bytes, const char* what) {
  Unit& unit = unit_of_fiber(what);
  if (bytes > kWarpExchangeBytes) fault(std::string(what) + ": an exchange larger than emulated");
  Fiber& fiber = *current.fiber;
  const FiberLaunch& launch = *unit.launch;
  const uint32_t thread = linear_thread(launch, fiber.thread);
  Warp& warp = unit.blocks[fiber.block].warps[thread / 32];
  if (warp.barrier.participants != 32) {
    fault("in " + kernel_name(unit.call->kernel) + ", " + what + " in a warp of " +
          std::to_string(warp.barrier.participants) + " threads (a block of " +
          std::to_string(block_threads(launch)) +
          "): the instruction needs all 32 lanes (on a GPU: undefined behaviour)");
  }
  constexpr std::size_t kBuffer = 32 * kWarpExchangeBytes + kWarpScratchBytes;
  if (!warp.buffers) warp.buffers = std::make_unique<unsigned char[]>(2 * kBuffer);
  unsigned char* buffer = warp.buffers.get() + (fiber.exchanges++ & 1) * kBuffer;
  unsigned char* scratch = buffer + 32 * kWarpExchangeBytes;
  const unsigned lane = thread % 32;
  std::memcpy(buffer + lane * bytes, mine, bytes);
  // Every lane arrives before any resumes, and none still reads this
  // buffer's last exchange (see Warp): the flag is down for the first.
  scratch[0] = 0;
  wait_at(unit, fiber, warp.barrier, BarrierKind::kWarp);
  return {buffer, scratch, lane};
}

unsigned char* shared_memory() {
  Unit& unit = unit_of_fiber("lltm::cuda::dynamic_shared_memory()");
  return unit.blocks[current.fiber->block].arena;
}

unsigned char* cluster_shared_memory(const void* address, unsigned rank) {
  Unit& unit = unit_of_fiber("cg::this_cluster().map_shared_rank()");
  check_clusters(unit, "cg::this_cluster().map_shared_rank()");
  const Block& block = unit.blocks[current.fiber->block];
  const Cluster& cluster = unit.clusters[block.cluster];
  const auto* p = static_cast<const unsigned char*>(address);
  const std::size_t bytes = unit.launch->shared_bytes;
  if (p < block.arena || p >= block.arena + bytes) {
    fault("in " + kernel_name(unit.call->kernel) +
          ", cg::this_cluster().map_shared_rank() of an address outside the block's " +
          std::to_string(bytes) + " bytes of shared memory");
  }
  if (rank >= cluster.blocks.size()) {
    fault("in " + kernel_name(unit.call->kernel) +
          ", cg::this_cluster().map_shared_rank() to rank " + std::to_string(rank) +
          " of a cluster of " + std::to_string(cluster.blocks.size()) + " blocks");
  }
  return unit.blocks[cluster.blocks[rank]].arena + (p - block.arena);
}

dim3 cluster_dims() {
  return current.unit != nullptr ? current.unit->launch->cluster : dim3(1, 1, 1);
}

void set_schedule(Order order, uint64_t seed) {
  schedule_order = static_cast<int>(order);
  schedule_seed = seed;
  schedule_launches = 0;
}

void drop_barriers(unsigned kinds) { dropped_barriers = kinds; }

bool use_assembly_switch(bool assembly) {
#if LLTM_CUDA_HOST_ASSEMBLY_SWITCH
  if (assembly && shadow_stack_enabled()) return false;
  assembly_switch = assembly;
  return true;
#else
  return !assembly;
#endif
}

}  // namespace lltm::cuda_host
