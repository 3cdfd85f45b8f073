// The persistent kernels of the sequence op: one launch runs every step of
// the recurrence, forward or backward (the plan: lltm_cuda_persistent_plan.h;
// the launchers: lltm_cuda_persistent.cu).
//
// Block (b, g) of the grid (P, G) owns the state units [b U, (b + 1) U) of
// the batch rows [g R, (g + 1) R). It keeps in shared memory, for the whole
// launch, the rows of W_h of its units' input gate, output gate and candidate
// (3U rows of S), and the running state of its group's rows, as the CPU and
// the per-step path keep it: step t updates the first batch_sizes[t] rows;
// the others keep their state (for packed sequences run in reverse, rows
// that start later start from old_h, old_cell).
//
// Forward, a step: the pre-activations of the block's (row, unit) pairs,
// gates_t (the input projection, one GEMM before the launch) + h_prev W_h^T,
// each dot product split across `split` threads along S; the cell's
// pointwise math (lltm_cuda_math.cuh, as the per-step kernels) by the thread
// owning the pair, which writes gates, output and cells; then the new h of
// the pairs is exchanged with ONE barrier: in cluster mode each thread
// stores it into the h buffer of every block of its cluster (distributed
// shared memory, two buffers used in turn, so that no block writes the
// buffer another still reads), then the cluster barrier; in cooperative mode
// the grid barrier, after which every block reads the step's rows of
// `output` back into its one buffer.
//
// Backward, a step in the reverse of the forward's order: the gate
// gradients of the block's pairs from the carried gradients of h and c, the
// output gradient (read through its strides: it may be broadcast) and what
// the forward saved; they go to d_gates and stay in shared memory; the block
// multiplies them with its rows of W_h, which gives its share of the
// gradient of h_prev for EVERY unit, sent to the block owning each unit
// (cluster: its shared memory; cooperative: global memory, two buffers
// used in turn), ONE barrier, and each block sums the P shares of its units
// in block order: the carried gradient of h. The gradient of c carries
// within the block.
//
// Each thread owns at most kPersistentPairs (row, unit) pairs, the same ones
// every step, and loads their inputs of the next step (gates, cells, output
// gradient) while the current one runs, so that no step waits on global
// memory for them.
//
// No warp intrinsics, atomics or spin-waits: barriers only, which the host
// build's emulated GPU runs as they are.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "lltm_cuda_launch.cuh"
#include "lltm_cuda_math.cuh"
#include "lltm_cuda_persistent_plan.h"
#include "lltm_cuda_runtime.h"

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

// The steps of a call: runs of equal batch sizes, in step order (an
// unpacked sequence is one run of `steps` steps of the whole batch), carried
// in the launch's parameters.
struct Steps {
  int32_t sizes[kPersistentMaxRuns];
  int32_t counts[kPersistentMaxRuns];
  int32_t runs;
  int64_t steps;
  int64_t rows;  // of input: the sum of every step's size
};

// A step: its index t, its first row of input and its batch size.
struct Cursor {
  int64_t t, start;
  int32_t size, run, position;
};

// The first step of a walk over the steps in ascending or descending t
// (steps > 0).
__device__ __forceinline__ Cursor first_step(const Steps& s, bool ascending) {
  Cursor c;
  if (ascending) {
    c.t = 0;
    c.run = 0;
    c.position = 0;
    c.size = s.sizes[0];
    c.start = 0;
  } else {
    c.t = s.steps - 1;
    c.run = s.runs - 1;
    c.position = s.counts[c.run] - 1;
    c.size = s.sizes[c.run];
    c.start = s.rows - c.size;
  }
  return c;
}

// The step after c in the walk (there must be one).
__device__ __forceinline__ void advance(Cursor& c, const Steps& s, bool ascending) {
  if (ascending) {
    c.start += c.size;
    ++c.t;
    if (++c.position == s.counts[c.run]) {
      ++c.run;
      c.position = 0;
    }
    c.size = s.sizes[c.run];
  } else {
    --c.t;
    if (--c.position < 0) {
      --c.run;
      c.position = s.counts[c.run] - 1;
    }
    c.size = s.sizes[c.run];
    c.start -= c.size;
  }
}

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

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

// Rows of a group a step updates: the group's rows below the step's size.
__device__ __forceinline__ int active_rows(const Cursor& c, int64_t first_row, int rows) {
  return static_cast<int>(min64(rows, max64(0, int64_t(c.size) - first_row)));
}

// The two launch modes. Block b of a group is the cluster's block b, or the
// grid's (b, g).
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

// What both passes share: a block's place, and its slice of W_h. Sizes
// within a block are 32-bit (the plan keeps them far below: they index
// shared memory), offsets into global memory 64-bit.
struct Geometry {
  int state, units, rows, pitch;  // S, U, R (a group's), shared-memory pitch
  int first_unit, own_units;      // the block's units: [first_unit, + own_units)
  int64_t first_row;              // the group's batch rows: [first_row, + own_rows)
  int own_rows;
};

__device__ __forceinline__ Geometry geometry(unsigned block, int64_t batch, int64_t state,
                                             int64_t units, int64_t rows, int64_t pitch) {
  Geometry g;
  g.state = static_cast<int>(state);
  g.units = static_cast<int>(units);
  g.rows = static_cast<int>(rows);
  g.pitch = static_cast<int>(pitch);
  g.first_unit = static_cast<int>(block * units);
  g.own_units = static_cast<int>(min64(units, state - g.first_unit));
  g.first_row = int64_t(blockIdx.y) * rows;
  g.own_rows = static_cast<int>(min64(rows, batch - g.first_row));
  return g;
}

// The (row, unit) pairs of a thread: pair q = threadIdx.x + j blockDim.x of
// the block's R x U, for j < kPersistentPairs, the same every step (rows
// past R: none).
struct Pairs {
  int row[kPersistentPairs], unit[kPersistentPairs];
};

__device__ __forceinline__ Pairs pairs_of_thread(const Geometry& g) {
  Pairs p;
#pragma unroll
  for (int j = 0; j < kPersistentPairs; ++j) {
    const int q = threadIdx.x + j * blockDim.x;
    p.row[j] = q / g.units;
    p.unit[j] = q - p.row[j] * g.units;
  }
  return p;
}

// Row gate * U + u of `w` (`pitch` apart): row gate * S + first_unit + u of
// W_h = weights[:, :S] (strides in elements), zero past the state and for
// units the block does not have (the last block may have fewer), so that
// the products may read whole vectors.
template <typename T>
__device__ __forceinline__ void load_weights(T* w, const Geometry& g, const T* weights,
                                             int64_t row_stride, int64_t col_stride) {
  const int count = 3 * g.units * g.pitch;
  for (int i = threadIdx.x; i < count; i += blockDim.x) {
    const int row = i / g.pitch;
    const int k = i - row * g.pitch;
    const int gate = row / g.units;
    const int u = row - gate * g.units;
    w[i] = u < g.own_units && k < g.state
               ? weights[(int64_t(gate) * g.state + g.first_unit + u) * row_stride + k * col_stride]
               : T(0);
  }
}

// --- Forward ----------------------------------------------------------------------------

template <typename T>
struct ForwardArgs {
  // (rows, 3S): the input projection and bias of every step on entry; on
  // return the activated input and output gates and the candidate's
  // pre-activation, as the per-step path leaves them.
  T* gates;
  T* output;  // (rows, S)
  T* cells;   // (rows, S)
  T* h_n;     // (batch, S)
  T* c_n;     // (batch, S)
  const T* weights;
  int64_t weights_row_stride, weights_col_stride;
  const T* h0;  // dense (batch, S)
  const T* c0;  // dense (batch, S)
  int64_t batch, state, units, group_rows, pitch;
  int32_t split;
  SharedLayout layout;
  bool reverse;
  Steps steps;
};

// Inputs of a step for the thread's pairs: the three gates' input
// projections (of rows the step updates; the others are not read).
template <typename T>
__device__ __forceinline__ void load_forward_inputs(const ForwardArgs<T>& a, const Geometry& g,
                                                    const Pairs& p, const Cursor& c,
                                                    T (&in)[kPersistentPairs][3]) {
  const int active = active_rows(c, g.first_row, g.own_rows);
#pragma unroll
  for (int j = 0; j < kPersistentPairs; ++j) {
    if (p.row[j] < active && p.unit[j] < g.own_units) {
      const T* gates =
          a.gates + (c.start + g.first_row + p.row[j]) * 3 * g.state + g.first_unit + p.unit[j];
      in[j][0] = gates[0];
      in[j][1] = gates[g.state];
      in[j][2] = gates[2 * g.state];
    }
  }
}

template <typename T, int kRows, typename Exchange>
LLTM_PERSISTENT_KERNEL sequence_forward_kernel(const LLTM_GRID_CONSTANT ForwardArgs<T> a) {
  constexpr int kVec = 16 / sizeof(T);
  using Vec = Pack<T, kVec>;
  const Geometry g = geometry(Exchange::rank(), a.batch, a.state, a.units, a.group_rows, a.pitch);
  const int S = g.state, U = g.units, R = g.rows, pitch = g.pitch;
  const int pairs = R * U;
  const int chunks = (S + kVec - 1) / kVec;
  const int split = a.split;
  T* shared = reinterpret_cast<T*>(dynamic_shared_memory());
  T* w = shared + a.layout.weights;
  T* h_buffers = shared + a.layout.exchange;  // (buffers, R, pitch)
  T* partial = shared + a.layout.scratch;     // (split, R, 3, U)
  T* c_run = shared + a.layout.state;         // (R, U): the pairs' running cell
  T* h_run = c_run + pairs;                   // and h

  load_weights(w, g, a.weights, a.weights_row_stride, a.weights_col_stride);
  const int buffered = (Exchange::kCluster ? 2 : 1) * R * pitch;
  for (int i = threadIdx.x; i < buffered; i += blockDim.x) {
    const int row = (i / pitch) % R;
    const int k = i % pitch;
    h_buffers[i] = row < g.own_rows && k < S ? a.h0[(g.first_row + row) * S + k] : T(0);
  }
  const Pairs p = pairs_of_thread(g);
  for (int q = threadIdx.x; q < pairs; q += blockDim.x) {
    const int row = q / U;
    const int u = q - row * U;
    const bool mine = row < g.own_rows && u < g.own_units;
    const int64_t e = (g.first_row + row) * S + g.first_unit + u;
    c_run[q] = mine ? a.c0[e] : T(0);
    h_run[q] = mine ? a.h0[e] : T(0);
  }
  Exchange::start();

  const int64_t steps = a.steps.steps;
  const bool ascending = !a.reverse;
  const unsigned blocks = gridDim.x;
  T in[kPersistentPairs][3] = {};
  T in_next[kPersistentPairs][3] = {};
  Cursor cur{};
  if (steps > 0) {
    cur = first_step(a.steps, ascending);
    load_forward_inputs(a, g, p, cur, in);
  }
  for (int64_t k = 0; k < steps; ++k) {
    Cursor next = cur;
    if (k + 1 < steps) {
      advance(next, a.steps, ascending);
      load_forward_inputs(a, g, p, next, in_next);
    }
    const int active = active_rows(cur, g.first_row, g.own_rows);
    const T* h = h_buffers + (Exchange::kCluster ? int(k & 1) * R * pitch : 0);

    // h_prev W_h^T for the active pairs: thread (part, u, tile) sums the
    // 16-byte chunks part, part + split, ... of S, for kRows rows and three
    // gates (threads of consecutive units read rows of W_h an odd number of
    // chunks apart: no bank conflict; those of one tile share the h rows).
    const int row_tiles = (active + kRows - 1) / kRows;
    for (int item = threadIdx.x; item < split * row_tiles * U; item += blockDim.x) {
      const int part = item % split;
      const int rest = item / split;
      const int tile = rest / U;
      const int u = rest - tile * U;
      if (u >= g.own_units) continue;
      const T* w_row = w + u * pitch;
      int h_rows[kRows];  // offsets in h (rows past R: its last, not used)
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const int row = tile * kRows + r;
        h_rows[r] = (row < R ? row : R - 1) * pitch;
      }
      T acc[kRows][3] = {};
      for (int c = part; c < chunks; c += split) {
        const Vec wi = load_pack<kVec>(w_row + c * kVec);
        const Vec wo = load_pack<kVec>(w_row + U * pitch + c * kVec);
        const Vec wx = load_pack<kVec>(w_row + 2 * U * pitch + c * kVec);
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          const Vec hv = load_pack<kVec>(h + h_rows[r] + c * kVec);
#pragma unroll
          for (int v = 0; v < kVec; ++v) {
            acc[r][0] += hv.v[v] * wi.v[v];
            acc[r][1] += hv.v[v] * wo.v[v];
            acc[r][2] += hv.v[v] * wx.v[v];
          }
        }
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const int row = tile * kRows + r;
        if (row < active) {
#pragma unroll
          for (int gate = 0; gate < 3; ++gate) {
            partial[((part * R + row) * 3 + gate) * U + u] = acc[r][gate];
          }
        }
      }
    }
    __syncthreads();

    // The cell of each active pair, by the thread owning it.
    T* h_next = h_buffers + int((k + 1) & 1) * R * pitch;
#pragma unroll
    for (int j = 0; j < kPersistentPairs; ++j) {
      const int row = p.row[j];
      const int u = p.unit[j];
      if (row < active && u < g.own_units) {
        const int q = row * U + u;
        T pre[3];
#pragma unroll
        for (int gate = 0; gate < 3; ++gate) {
          T sum = 0;
          for (int part = 0; part < split; ++part) {
            sum += partial[((part * R + row) * 3 + gate) * U + u];
          }
          pre[gate] = in[j][gate] + sum;
        }
        T h_new, c_new;
        forward_element(pre[0], pre[1], pre[2], c_run[q], h_new, c_new);
        const int64_t at = cur.start + g.first_row + row;
        T* gates = a.gates + at * 3 * S + g.first_unit + u;
        gates[0] = pre[0];
        gates[S] = pre[1];
        gates[2 * S] = pre[2];
        a.output[at * S + g.first_unit + u] = h_new;
        a.cells[at * S + g.first_unit + u] = c_new;
        c_run[q] = c_new;
        h_run[q] = h_new;
        if (Exchange::kCluster && k + 1 < steps) {
          T* to = h_next + row * pitch + g.first_unit + u;
          for (unsigned b = 0; b < blocks; ++b) *Exchange::peer(to, b) = h_new;
        }
      }
    }

    if (k + 1 < steps) {
      Exchange::sync();
      if (!Exchange::kCluster) {
        // The step's h of the group's active rows, from `output`.
        const T* from = a.output + (cur.start + g.first_row) * S;
        if (S % kVec == 0 && reinterpret_cast<uintptr_t>(a.output) % sizeof(Vec) == 0) {
          const int per_row = S / kVec;
          for (int i = threadIdx.x; i < active * per_row; i += blockDim.x) {
            const int row = i / per_row;
            const int c = i - row * per_row;
            store_pack<kVec>(h_buffers + row * pitch + c * kVec,
                             load_pack_from_blocks<kVec>(from + int64_t(row) * S + c * kVec));
          }
        } else {
          for (int i = threadIdx.x; i < active * S; i += blockDim.x) {
            const int row = i / S;
            h_buffers[row * pitch + (i - row * S)] = load_from_blocks(from + i);
          }
        }
        __syncthreads();
      }
    }
    cur = next;
#pragma unroll
    for (int j = 0; j < kPersistentPairs; ++j) {
#pragma unroll
      for (int gate = 0; gate < 3; ++gate) in[j][gate] = in_next[j][gate];
    }
  }

  // Each row's last state: of the last step that updated it, else old_h, old_cell.
  for (int q = threadIdx.x; q < pairs; q += blockDim.x) {
    const int row = q / U;
    const int u = q - row * U;
    if (row < g.own_rows && u < g.own_units) {
      const int64_t e = (g.first_row + row) * S + g.first_unit + u;
      a.h_n[e] = h_run[q];
      a.c_n[e] = c_run[q];
    }
  }
}

// --- Backward ---------------------------------------------------------------------------

template <typename T>
struct BackwardArgs {
  // The output gradient (null: none) of row b of the step t starting at row
  // `start` of input is grad_output[start * go_start + t * go_step + b *
  // go_row + u * go_col]: (steps, batch, S) strides, or (rows, S) ones when
  // packed; a stride may be 0 (broadcast).
  const T* grad_output;
  int64_t go_start, go_step, go_row, go_col;
  const T* grad_h_n;  // dense (batch, S), or null: zero
  const T* grad_c_n;  // dense (batch, S), or null: zero
  const T* gates;     // dense (rows, 3S), as the forward left it
  const T* cells;     // dense (rows, S)
  T* d_gates;         // (rows, 3S)
  T* grad_h;          // (batch, S): the gradient of old_h; null: not wanted
  T* grad_c;          // (batch, S): the gradient of old_cell
  // Cooperative mode: the blocks' shares of the gradient of h, (2, P,
  // batch, S) in global memory; cluster mode: null (shared memory).
  T* shares;
  const T* weights;
  int64_t weights_row_stride, weights_col_stride;
  int64_t batch, state, units, group_rows, pitch;
  SharedLayout layout;
  bool reverse;
  Steps steps;
};

// Inputs of a step for the thread's pairs: the activated input and output
// gates, the candidate's pre-activation, the new cell, the output gradient.
template <typename T>
__device__ __forceinline__ void load_backward_inputs(const BackwardArgs<T>& a, const Geometry& g,
                                                     const Pairs& p, const Cursor& c,
                                                     T (&in)[kPersistentPairs][5]) {
  const int active = active_rows(c, g.first_row, g.own_rows);
#pragma unroll
  for (int j = 0; j < kPersistentPairs; ++j) {
    const int row = p.row[j];
    if (row < active && p.unit[j] < g.own_units) {
      const int64_t at = c.start + g.first_row + row;
      const int64_t unit = g.first_unit + p.unit[j];
      const T* gates = a.gates + at * 3 * g.state + unit;
      in[j][0] = gates[0];
      in[j][1] = gates[g.state];
      in[j][2] = gates[2 * g.state];
      in[j][3] = a.cells[at * g.state + unit];
      in[j][4] = a.grad_output == nullptr
                     ? T(0)
                     : a.grad_output[c.start * a.go_start + c.t * a.go_step +
                                     (g.first_row + row) * a.go_row + unit * a.go_col];
    }
  }
}

template <typename T, int kRows, typename Exchange>
LLTM_PERSISTENT_KERNEL sequence_backward_kernel(const LLTM_GRID_CONSTANT BackwardArgs<T> a) {
  constexpr int kVec = 16 / sizeof(T);
  using Vec = Pack<T, kVec>;
  const unsigned block = Exchange::rank();
  const Geometry g = geometry(block, a.batch, a.state, a.units, a.group_rows, a.pitch);
  const int S = g.state, U = g.units, R = g.rows, pitch = g.pitch;
  const int pairs = R * U;
  const int chunks = (S + kVec - 1) / kVec;
  const unsigned blocks = gridDim.x;
  T* shared = reinterpret_cast<T*>(dynamic_shared_memory());
  T* w = shared + a.layout.weights;
  T* received = shared + a.layout.exchange;  // cluster: (2, P, R, U)
  T* d_own = shared + a.layout.scratch;      // (R, 3U): the step's gate gradients
  T* carry_h = shared + a.layout.state;      // (R, U): the carried gradients
  T* carry_c = carry_h + pairs;

  load_weights(w, g, a.weights, a.weights_row_stride, a.weights_col_stride);
  for (int i = threadIdx.x; i < R * 3 * U; i += blockDim.x) d_own[i] = T(0);
  const Pairs p = pairs_of_thread(g);
  for (int q = threadIdx.x; q < pairs; q += blockDim.x) {
    const int row = q / U;
    const int u = q - row * U;
    const bool mine = row < g.own_rows && u < g.own_units;
    const int64_t e = (g.first_row + row) * S + g.first_unit + u;
    carry_h[q] = mine && a.grad_h_n != nullptr ? a.grad_h_n[e] : T(0);
    carry_c[q] = mine && a.grad_c_n != nullptr ? a.grad_c_n[e] : T(0);
  }
  Exchange::start();

  const int64_t steps = a.steps.steps;
  // The forward's steps, last first.
  const bool ascending = a.reverse;
  T in[kPersistentPairs][5] = {};
  T in_next[kPersistentPairs][5] = {};
  Cursor cur{};
  if (steps > 0) {
    cur = first_step(a.steps, ascending);
    load_backward_inputs(a, g, p, cur, in);
  }
  for (int64_t n = 0; n < steps; ++n) {
    const int64_t k = steps - 1 - n;  // the step's place in the forward's order
    Cursor next = cur;
    if (n + 1 < steps) {
      advance(next, a.steps, ascending);
      load_backward_inputs(a, g, p, next, in_next);
    }
    const int active = active_rows(cur, g.first_row, g.own_rows);

    // The gate gradients of the active pairs, by the thread owning each.
#pragma unroll
    for (int j = 0; j < kPersistentPairs; ++j) {
      const int row = p.row[j];
      const int u = p.unit[j];
      if (row < active && u < g.own_units) {
        const int q = row * U + u;
        T d_i, d_o, d_x, d_c;
        backward_math<T>(carry_h[q] + in[j][4], carry_c[q], in[j][3], in[j][0], in[j][1], in[j][2],
                         d_i, d_o, d_x, d_c);
        T* d = a.d_gates + (cur.start + g.first_row + row) * 3 * S + g.first_unit + u;
        d[0] = d_i;
        d[S] = d_o;
        d[2 * S] = d_x;
        T* own = d_own + row * 3 * U + u;
        own[0] = d_i;
        own[U] = d_o;
        own[2 * U] = d_x;
        carry_c[q] = d_c;
      }
    }
    // The first step's product only gives the gradient of old_h.
    if (k == 0 && a.grad_h == nullptr) break;
    __syncthreads();

    // The block's share of d_gates W_h for every unit and active row: thread
    // (chunk, tile) sums over the block's 3U rows of W_h for kRows rows and
    // a vector of units (threads of one tile read consecutive chunks of a
    // row of W_h and share the gradients), then sends each unit's share to
    // the block owning it.
    const int parity = int(k & 1);
    const int row_tiles = (active + kRows - 1) / kRows;
    for (int item = threadIdx.x; item < row_tiles * chunks; item += blockDim.x) {
      const int tile = item / chunks;
      const int c = item - tile * chunks;
      int d_rows[kRows];  // offsets in d_own (rows past R: its last, not used)
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const int row = tile * kRows + r;
        d_rows[r] = (row < R ? row : R - 1) * 3 * U;
      }
      T acc[kRows][kVec] = {};
      for (int j = 0; j < 3 * U; ++j) {  // rows of units the block lacks are zero
        const Vec wv = load_pack<kVec>(w + j * pitch + c * kVec);
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          const T d = d_own[d_rows[r] + j];
#pragma unroll
          for (int v = 0; v < kVec; ++v) acc[r][v] += d * wv.v[v];
        }
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const int row = tile * kRows + r;
        if (row >= active) continue;
#pragma unroll
        for (int v = 0; v < kVec; ++v) {
          const int unit = c * kVec + v;
          if (unit >= S) continue;
          const int owner = unit / U;
          if (Exchange::kCluster) {
            T* slot =
                received + ((parity * int(blocks) + int(block)) * R + row) * U + (unit - owner * U);
            *Exchange::peer(slot, static_cast<unsigned>(owner)) = acc[r][v];
          } else {
            a.shares[((int64_t(parity) * blocks + block) * a.batch + g.first_row + row) * S +
                     unit] = acc[r][v];
          }
        }
      }
    }
    Exchange::sync();

    // The carried gradient of h: the P shares of each active pair, in block order.
#pragma unroll
    for (int j = 0; j < kPersistentPairs; ++j) {
      const int row = p.row[j];
      const int u = p.unit[j];
      if (row < active && u < g.own_units) {
        T sum = 0;
        for (unsigned b = 0; b < blocks; ++b) {
          sum += Exchange::kCluster
                     ? received[((parity * int(blocks) + int(b)) * R + row) * U + u]
                     : load_from_blocks(
                           a.shares +
                           ((int64_t(parity) * blocks + b) * a.batch + g.first_row + row) * S +
                           g.first_unit + u);
        }
        carry_h[row * U + u] = sum;
      }
    }
    cur = next;
#pragma unroll
    for (int j = 0; j < kPersistentPairs; ++j) {
#pragma unroll
      for (int i = 0; i < 5; ++i) in[j][i] = in_next[j][i];
    }
  }

  // The gradients of old_h and old_cell: what the rows carry at the end.
  for (int q = threadIdx.x; q < pairs; q += blockDim.x) {
    const int row = q / U;
    const int u = q - row * U;
    if (row < g.own_rows && u < g.own_units) {
      const int64_t e = (g.first_row + row) * S + g.first_unit + u;
      if (a.grad_h != nullptr) a.grad_h[e] = carry_h[q];
      a.grad_c[e] = carry_c[q];
    }
  }
}

}  // namespace lltm::cuda::persistent
