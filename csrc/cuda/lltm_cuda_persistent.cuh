// The persistent kernels of the sequence op: one launch runs every step of
// the recurrence, forward (lltm_cuda_persistent_forward.cuh) or backward
// (lltm_cuda_persistent_backward.cuh); the plan that sizes them:
// lltm_cuda_persistent_plan.h; the launchers: lltm_cuda_persistent_launch.cuh,
// lltm_cuda_persistent_{forward,backward}_entry.cu. This file holds what
// both passes share.
//
// The grid is (blocks_per_group, groups). Block (b, g) owns the state units
// [b units_per_block, (b + 1) units_per_block) of the batch rows
// [g rows_per_group, (g + 1) rows_per_group). It keeps in shared memory, for
// the whole launch, its slice of W_h: the rows of its units' input gate,
// output gate and candidate (3 units_per_block rows of state_size), and the
// running state of its group's rows, as the CPU and the per-step path keep
// it: step t updates the first batch_sizes[t] rows; the others keep their
// state (for packed sequences run in reverse, rows that start later start
// from old_h, old_cell).
//
// Forward, a step: (1) load the next step's inputs, the gates' input
// projections (one GEMM before the launch); (2) the matvec h_prev W_h^T of
// the block's (row, unit) pairs, each dot product split across `dot_split`
// threads along the state (16-bit dtypes from sm_80 on: on the tensor
// cores, a warp per 16 x 8 tile, lltm_cuda_tensor_cores.cuh; float32 too,
// in TF32, where the call allows it); (3) the cell's pointwise step
// (lltm_cuda_math.cuh, as the per-step kernels), by the thread owning the
// pair, which writes gates, output and cells (sequence_inference: output
// alone); (4) the exchange of the new h
// between the group's blocks with ONE barrier: in cluster mode each thread
// stores it into the h buffer of every block of its cluster (distributed
// shared memory, two buffers used in turn, so that no block writes the
// buffer another still reads), then the cluster barrier; in cooperative mode
// the grid barrier, after which every block reads the step's rows of
// `output` (16-bit: a float32 copy) back into its one buffer. Dtypes: below.
//
// Backward, a step in the reverse of the forward's order: (1) load the next
// step's inputs (what the forward saved, the output gradient read through
// its strides: it may be broadcast); (2) the gate gradients of the block's
// pairs from the carried gradients of h and c, written to d_gates and kept
// in shared memory; (3) the matvec of those with the block's rows of W_h,
// which gives its share of the gradient of h_prev for EVERY unit, sent to
// the block owning each unit (cluster: its shared memory; cooperative:
// global memory, two buffers used in turn); (4) ONE barrier, and each block
// sums the blocks_per_group shares of its units in block order: the carried
// gradient of h. The gradient of c carries within the block.
//
// Each thread owns at most kPersistentPairs (row, unit) pairs, the same ones
// every step, and loads their inputs of the next step while the current one
// runs, so that no step waits on global memory for them.
//
// No atomics, spin-waits or warp shuffles: barriers, and in 16 bits (and
// float32 in TF32) the tensor cores' mma.sync (a warp-collective
// instruction), which the host build's emulated GPU runs as they are.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "lltm_cuda_launch.cuh"
#include "lltm_cuda_math.cuh"
#include "lltm_cuda_persistent_plan.h"
#include "lltm_cuda_runtime.h"
#include "lltm_cuda_tensor_cores.cuh"

#if defined(__CUDACC__)
// 128 registers a thread at most; the parameters read in place (their
// schedule is indexed by step).
#define LLTM_PERSISTENT_KERNEL \
  __global__ void __launch_bounds__(::lltm::cuda::kPersistentMaxThreads, 1)
#define LLTM_GRID_CONSTANT __grid_constant__
#else
#define LLTM_PERSISTENT_KERNEL __global__ void
#define LLTM_GRID_CONSTANT
#endif

namespace lltm::cuda::persistent {

// Whether the plan can launch the kernel of T and tile height kTileRows on
// the GPUs the device code is compiled for: from compute capability 8.0 on,
// 16-bit dtypes take the tensor cores' tile (kTensorCoreTileRows) and never
// the CUDA cores' (tensor_core_products); below it, never the tensor cores'.
// Kernels it cannot launch are compiled as a stop: no code to build, and
// none to hold within the registers of those it launches.
template <typename T, int kTileRows>
inline constexpr bool kKernelLaunchable =
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    sizeof(T) != 2 || kTileRows == kTensorCoreTileRows;
#elif defined(__CUDA_ARCH__)
    kTileRows != kTensorCoreTileRows;
#else
    true;
#endif

// Whether the kernel of T and tile height kTileRows carries float32's
// product on the TF32 tensor cores, which the plan switches on at run time
// (its tf32; the kernels' `tf32`): the float32 kernel of tile height 1, where
// the device code is for sm_80 and later. A switch rather than a kernel of
// its own: one kernel less to compile and to keep within the registers, and
// the tensor-core plan's blocks need nothing that kernel lacks.
template <typename T, int kTileRows>
inline constexpr bool kTf32Switch =
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    false;
#else
    std::is_same_v<T, float> && kTileRows == 1;
#endif

}  // namespace lltm::cuda::persistent

namespace lltm::cuda::persistent {

// --- Dtypes -----------------------------------------------------------------------------

// A kernel of dtype T keeps W_h in T and computes in acc_t<T>, its math type,
// in which it also keeps the running state, the partial sums and the values
// blocks exchange: T itself for float32 and float64, float32 for float16 and
// bfloat16 (as cuDNN does), which are rounded only where written to global
// memory.
template <typename T>
constexpr bool kWidened = sizeof(T) < sizeof(acc_t<T>);

// --- The steps of a call ------------------------------------------------------------------

// The steps of a call as runs of equal batch sizes, in step order (an
// unpacked sequence is one run of `step_count` steps of the whole batch),
// carried in the launch's parameters.
struct Steps {
  int32_t run_batch_sizes[kPersistentMaxRuns];  // the batch size of each run's steps
  int32_t run_lengths[kPersistentMaxRuns];      // the steps of each run
  int32_t run_count;
  int64_t step_count;
  int64_t input_rows;  // rows of the input: the sum of every step's batch size
};

// One step of a walk over the steps.
struct Step {
  int64_t time;             // t
  int64_t first_input_row;  // the step's rows of the input start here
  int32_t batch_size;       // rows the step updates: the first batch_size rows
  int32_t run, position_in_run;
};

// The first step of a walk over the steps in ascending or descending t
// (step_count > 0).
__device__ __forceinline__ Step first_step(const Steps& steps, bool ascending) {
  Step step;
  if (ascending) {
    step.time = 0;
    step.run = 0;
    step.position_in_run = 0;
    step.batch_size = steps.run_batch_sizes[0];
    step.first_input_row = 0;
  } else {
    step.time = steps.step_count - 1;
    step.run = steps.run_count - 1;
    step.position_in_run = steps.run_lengths[step.run] - 1;
    step.batch_size = steps.run_batch_sizes[step.run];
    step.first_input_row = steps.input_rows - step.batch_size;
  }
  return step;
}

// The step after `step` in the walk (there must be one).
__device__ __forceinline__ void advance(Step& step, const Steps& steps, bool ascending) {
  if (ascending) {
    step.first_input_row += step.batch_size;
    ++step.time;
    if (++step.position_in_run == steps.run_lengths[step.run]) {
      ++step.run;
      step.position_in_run = 0;
    }
    step.batch_size = steps.run_batch_sizes[step.run];
  } else {
    --step.time;
    if (--step.position_in_run < 0) {
      --step.run;
      step.position_in_run = steps.run_lengths[step.run] - 1;
    }
    step.batch_size = steps.run_batch_sizes[step.run];
    step.first_input_row -= step.batch_size;
  }
}

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

// --- Memory other blocks wrote ------------------------------------------------------------

// Global memory that other blocks of the launch wrote during it (cooperative
// mode: the step's h in `output`, the shares of the gradient of h), read at
// L2 (ld.global.cg): a multiprocessor's L1 is not coherent with the others'
// writes, and the shares' addresses come back every other step. Each value
// is read once, so bypassing L1 costs nothing.
template <typename T>
__device__ __forceinline__ T load_from_blocks(const T* p) {
#if defined(__CUDA_ARCH__)
  return __ldcg(p);
#else
  return *p;
#endif
}

template <int kVec, typename T>
__device__ __forceinline__ Pack<T, kVec> load_pack_from_blocks(const T* p) {
#if defined(__CUDA_ARCH__)
  static_assert(sizeof(T) * kVec == 16, "16-byte vectors");
  using Vector = std::conditional_t<std::is_same_v<T, double>, double2, float4>;
  const Vector v = __ldcg(reinterpret_cast<const Vector*>(p));
  Pack<T, kVec> pack;
  static_assert(sizeof(pack) == sizeof(v));
  memcpy(&pack, &v, sizeof v);
  return pack;
#else
  return load_pack<kVec>(p);
#endif
}

// kCount elements of the math type M, 16 bytes a load (float32: the 8
// elements a 16-byte chunk of 16-bit W_h spans take two): from shared
// memory, or with kFromBlocks from global memory other blocks wrote, read as
// above.
template <int kCount, bool kFromBlocks = false, typename M>
__device__ __forceinline__ void load_math_elements(const M* from, M (&to)[kCount]) {
  constexpr int kPerLoad = 16 / sizeof(M);
  static_assert(kCount % kPerLoad == 0, "whole 16-byte loads");
#pragma unroll
  for (int load = 0; load < kCount / kPerLoad; ++load) {
    Pack<M, kPerLoad> pack;
    if constexpr (kFromBlocks) {
      pack = load_pack_from_blocks<kPerLoad>(from + load * kPerLoad);
    } else {
      pack = load_pack<kPerLoad>(from + load * kPerLoad);
    }
#pragma unroll
    for (int i = 0; i < kPerLoad; ++i) to[load * kPerLoad + i] = pack.v[i];
  }
}

// --- The two launch modes -----------------------------------------------------------------

// Block b of a group is the grid's block (b, g), or the cluster's block b.
struct GridExchange {
  static constexpr bool kCluster = false;
  __device__ static unsigned rank() { return blockIdx.x; }
  // Before the first step: the block's own shared memory is ready.
  __device__ static void start() { __syncthreads(); }
  __device__ static void sync() { cg::this_grid().sync(); }
  template <typename T>
  __device__ static T* peer(T* local, unsigned) {
    return local;
  }
};

// Thread-block clusters exist from sm_90 on; the launcher never picks this
// mode below, and the code compiled for older GPUs stops at once.
struct ClusterExchange {
  static constexpr bool kCluster = true;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  __device__ static unsigned rank() {
    __trap();
    return 0;
  }
  __device__ static void start() { __trap(); }
  __device__ static void sync() { __trap(); }
  template <typename T>
  __device__ static T* peer(T* local, unsigned) {
    __trap();
    return local;
  }
#else
  __device__ static unsigned rank() { return cg::this_cluster().block_rank(); }
  // Before the first step, and before any block writes into another's
  // shared memory: every block of the cluster has filled its own (and is
  // running, as distributed shared memory requires).
  __device__ static void start() { cg::this_cluster().sync(); }
  __device__ static void sync() { cg::this_cluster().sync(); }
  // `local`, an address in this block's shared memory, in block `rank`'s.
  template <typename T>
  __device__ static T* peer(T* local, unsigned rank) {
    return cg::this_cluster().map_shared_rank(local, rank);
  }
#endif
};

// --- A block's slice of the problem -------------------------------------------------------

// What both passes share: a block's units and rows. Sizes within a block are
// 32-bit (the plan keeps them far below: they index shared memory), offsets
// into global memory 64-bit.
struct BlockSlice {
  int state_size;       // S: units of the state, columns of h
  int units_per_block;  // U: units of every block but maybe the group's last
  int rows_per_group;   // R: batch rows of every group but maybe the last
  int pitch;            // elements between rows of W_h (and of h) in shared memory
  int first_unit;       // the block's units: [first_unit, first_unit + own_units)
  int own_units;
  int64_t first_row;  // the group's batch rows: [first_row, first_row + own_rows)
  int own_rows;
};

// Block `block` of group blockIdx.y, of a launch over the batch rows
// [rows_begin, rows_end).
__device__ __forceinline__ BlockSlice block_slice(unsigned block, int64_t rows_begin,
                                                  int64_t rows_end, int64_t state_size,
                                                  int64_t units_per_block, int64_t rows_per_group,
                                                  int64_t pitch) {
  BlockSlice slice;
  slice.state_size = static_cast<int>(state_size);
  slice.units_per_block = static_cast<int>(units_per_block);
  slice.rows_per_group = static_cast<int>(rows_per_group);
  slice.pitch = static_cast<int>(pitch);
  slice.first_unit = static_cast<int>(block * units_per_block);
  slice.own_units = static_cast<int>(min64(units_per_block, state_size - slice.first_unit));
  slice.first_row = rows_begin + int64_t(blockIdx.y) * rows_per_group;
  slice.own_rows = static_cast<int>(min64(rows_per_group, rows_end - slice.first_row));
  return slice;
}

// Rows of the group that a step updates: the group's rows below the step's
// batch size.
__device__ __forceinline__ int active_rows(const Step& step, const BlockSlice& slice) {
  return static_cast<int>(
      min64(slice.own_rows, max64(0, int64_t(step.batch_size) - slice.first_row)));
}

// The (row, unit) pairs of a thread, the same every step: pair
// threadIdx.x + j blockDim.x of the block's rows_per_group x units_per_block,
// for j < kPersistentPairs (rows past rows_per_group: none).
struct ThreadPairs {
  int row[kPersistentPairs];   // of the group
  int unit[kPersistentPairs];  // of the block
};

__device__ __forceinline__ ThreadPairs pairs_of_thread(const BlockSlice& slice) {
  ThreadPairs pairs;
#pragma unroll
  for (int j = 0; j < kPersistentPairs; ++j) {
    const int pair = threadIdx.x + j * blockDim.x;
    pairs.row[j] = pair / slice.units_per_block;
    pairs.unit[j] = pair - pairs.row[j] * slice.units_per_block;
  }
  return pairs;
}

// Whether pair j of the thread is one the step updates.
__device__ __forceinline__ bool pair_is_active(const ThreadPairs& pairs, int j, int active,
                                               const BlockSlice& slice) {
  return pairs.row[j] < active && pairs.unit[j] < slice.own_units;
}

// The block's slice of W_h = weights[:, :S] (strides in elements) into
// shared memory, row gate * U + u (`pitch` apart) holding row
// gate * S + first_unit + u of W_h: zero past the state and for units the
// block does not have (the group's last block may have fewer), so that the
// matvecs may read whole vectors. (In TF32 the slice stays exact float32:
// the tensor-core product splits it into its two TF32 terms as it reads it,
// lltm_cuda_tensor_cores.cuh.)
template <typename T>
__device__ __forceinline__ void load_weight_slice(T* weight_slice, const BlockSlice& slice,
                                                  const T* weights, int64_t row_stride,
                                                  int64_t column_stride) {
  const int count = 3 * slice.units_per_block * slice.pitch;
  for (int i = threadIdx.x; i < count; i += blockDim.x) {
    const int row = i / slice.pitch;           // gate * U + unit
    const int column = i - row * slice.pitch;  // of W_h: a unit of h
    const int gate = row / slice.units_per_block;
    const int unit = row - gate * slice.units_per_block;
    const bool present = unit < slice.own_units && column < slice.state_size;
    weight_slice[i] =
        present
            ? weights[(int64_t(gate) * slice.state_size + slice.first_unit + unit) * row_stride +
                      column * column_stride]
            : T(0);
  }
}

// load_weight_slice, and for the 16-bit tensor-core kernels (kTensorCores) a
// word of the block's shared memory, returned, that is raised where the slice
// holds a non-finite value; read it after the block's next barrier. Such a
// block takes the CUDA cores' product (a low term of zero times an
// infinite weight would give NaN where the product is infinite:
// lltm_cuda_tensor_cores.cuh). The word is zeroed, then a barrier, before
// the slice is loaded; each thread checks the elements it loaded itself
// (no barrier between). Other kernels: null.
template <bool kTensorCores, typename T>
__device__ __forceinline__ const unsigned* load_weight_slice_flagged(
    T* weight_slice, const BlockSlice& slice, const SharedLayout& layout, const T* weights,
    int64_t row_stride, int64_t column_stride) {
  unsigned* flag = nullptr;
  if constexpr (kTensorCores) {
    flag = reinterpret_cast<unsigned*>(dynamic_shared_memory() + layout.flags);
    if (threadIdx.x == 0) *flag = 0;
    __syncthreads();
  }
  load_weight_slice(weight_slice, slice, weights, row_stride, column_stride);
  if constexpr (kTensorCores) {
    const int count = 3 * slice.units_per_block * slice.pitch;
    bool finite = true;
    for (int i = threadIdx.x; i < count; i += blockDim.x) {
      finite = finite && finite_value(float(weight_slice[i]));
    }
    if (!finite) *flag = 1;
  }
  return flag;
}

}  // namespace lltm::cuda::persistent
