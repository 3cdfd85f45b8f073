// The persistent forward kernel: every step of sequence_forward's recurrence
// in one launch (the scheme: lltm_cuda_persistent.cuh). A step, in the
// functions below: load_step_inputs (of the next step, while this one runs),
// recurrent_matvec (h_prev W_h^T), cell_step (the pointwise math, the
// writes), exchange_h (the new h to every block of the group).
#pragma once

#include <cstdint>

#include "lltm_cuda_launch.cuh"
#include "lltm_cuda_math.cuh"
#include "lltm_cuda_persistent.cuh"
#include "lltm_cuda_persistent_plan.h"
#include "lltm_cuda_runtime.h"

namespace lltm::cuda::persistent {

template <typename T>
struct ForwardArgs {
  // (input rows, 3S): the input projection and bias of every step on entry;
  // on return the activated input and output gates and the candidate's
  // pre-activation, as the per-step path leaves them.
  T* gates;
  T* output;  // (input rows, S)
  T* cells;   // (input rows, S)
  T* h_n;     // (batch, S)
  T* c_n;     // (batch, S)
  const T* weights;
  int64_t weights_row_stride, weights_column_stride;
  const T* h0;  // dense (batch, S)
  const T* c0;  // dense (batch, S)
  int64_t batch_size, state_size, units_per_block, rows_per_group, pitch;
  int32_t dot_split;  // threads sharing one dot product of the matvec
  SharedLayout layout;
  bool reverse;
  Steps steps;
};

// A forward block's shared memory (the plan's SharedLayout).
template <typename T>
struct ForwardShared {
  T* weight_slice;  // (3U, pitch): the block's rows of W_h
  T* h_buffers;     // (buffers, R, pitch): the group's h of the previous step
  T* partial_sums;  // (dot_split, R, 3, U): the parts of the step's dot products
  T* running_cell;  // (R, U): the cell state of the block's pairs
  T* running_h;     // (R, U): and their h
};

template <typename T>
__device__ __forceinline__ ForwardShared<T> forward_shared(const SharedLayout& layout,
                                                           const BlockSlice& slice) {
  T* memory = reinterpret_cast<T*>(dynamic_shared_memory());
  ForwardShared<T> shared;
  shared.weight_slice = memory + layout.weights;
  shared.h_buffers = memory + layout.exchange;
  shared.partial_sums = memory + layout.scratch;
  shared.running_cell = memory + layout.state;
  shared.running_h = shared.running_cell + slice.rows_per_group * slice.units_per_block;
  return shared;
}

// Before the first step: every h buffer holds h0 of the group's rows (zero
// past them and past the state); each pair's running cell and h, c0 and h0.
template <typename T, typename Exchange>
__device__ __forceinline__ void load_initial_state(const ForwardArgs<T>& args,
                                                   const ForwardShared<T>& shared,
                                                   const BlockSlice& slice) {
  const int state_size = slice.state_size, units = slice.units_per_block;
  const int rows = slice.rows_per_group, pitch = slice.pitch;
  const int buffered = (Exchange::kCluster ? 2 : 1) * rows * pitch;
  for (int i = threadIdx.x; i < buffered; i += blockDim.x) {
    const int row = (i / pitch) % rows;
    const int column = i % pitch;  // a unit of the state
    shared.h_buffers[i] = row < slice.own_rows && column < state_size
                              ? args.h0[(slice.first_row + row) * state_size + column]
                              : T(0);
  }
  for (int pair = threadIdx.x; pair < rows * units; pair += blockDim.x) {
    const int row = pair / units;
    const int unit = pair - row * units;
    const bool present = row < slice.own_rows && unit < slice.own_units;
    const int64_t at = (slice.first_row + row) * state_size + slice.first_unit + unit;
    shared.running_cell[pair] = present ? args.c0[at] : T(0);
    shared.running_h[pair] = present ? args.h0[at] : T(0);
  }
}

// A thread's inputs of one step: for each of its pairs, the input
// projections of the input gate, output gate and candidate.
template <typename T>
struct ForwardStepInputs {
  T projection[kPersistentPairs][3];
};

// The inputs of the pairs the step updates (the others are not read).
template <typename T>
__device__ __forceinline__ void load_step_inputs(const ForwardArgs<T>& args,
                                                 const BlockSlice& slice, const ThreadPairs& pairs,
                                                 const Step& step, ForwardStepInputs<T>& inputs) {
  const int active = active_rows(step, slice);
  const int state_size = slice.state_size;
#pragma unroll
  for (int j = 0; j < kPersistentPairs; ++j) {
    if (!pair_is_active(pairs, j, active, slice)) continue;
    const int64_t input_row = step.first_input_row + slice.first_row + pairs.row[j];
    const T* gates = args.gates + input_row * 3 * state_size + slice.first_unit + pairs.unit[j];
    inputs.projection[j][0] = gates[0];
    inputs.projection[j][1] = gates[state_size];
    inputs.projection[j][2] = gates[2 * state_size];
  }
}

// h_prev W_h^T for the step's active rows, in parts: thread (part, unit,
// tile) sums the 16-byte chunks part, part + dot_split, ... of the state for
// kTileRows rows and the unit's three gates, into partial_sums (threads of
// consecutive units read rows of W_h an odd number of chunks apart: no bank
// conflict; those of one tile share the h rows).
template <typename T, int kTileRows>
__device__ __forceinline__ void recurrent_matvec(const ForwardShared<T>& shared, const T* h_prev,
                                                 const BlockSlice& slice, int active,
                                                 int dot_split) {
  constexpr int kChunk = 16 / sizeof(T);  // elements of a 16-byte chunk
  using Chunk = Pack<T, kChunk>;
  const int units = slice.units_per_block, rows = slice.rows_per_group, pitch = slice.pitch;
  const int chunks = (slice.state_size + kChunk - 1) / kChunk;
  const int row_tiles = (active + kTileRows - 1) / kTileRows;
  for (int item = threadIdx.x; item < dot_split * row_tiles * units; item += blockDim.x) {
    const int part = item % dot_split;
    const int tile_and_unit = item / dot_split;
    const int tile = tile_and_unit / units;
    const int unit = tile_and_unit - tile * units;
    if (unit >= slice.own_units) continue;
    // The unit's input-gate row of the slice; its output-gate and candidate
    // rows are U and 2U rows on.
    const T* w_row = shared.weight_slice + unit * pitch;
    int h_rows[kTileRows];  // offsets in h_prev (rows past R: its last, not used)
#pragma unroll
    for (int r = 0; r < kTileRows; ++r) {
      const int row = tile * kTileRows + r;
      h_rows[r] = (row < rows ? row : rows - 1) * pitch;
    }
    T sums[kTileRows][3] = {};  // (tile row, gate)
    for (int chunk = part; chunk < chunks; chunk += dot_split) {
      const Chunk w_input = load_pack<kChunk>(w_row + chunk * kChunk);
      const Chunk w_output = load_pack<kChunk>(w_row + units * pitch + chunk * kChunk);
      const Chunk w_candidate = load_pack<kChunk>(w_row + 2 * units * pitch + chunk * kChunk);
#pragma unroll
      for (int r = 0; r < kTileRows; ++r) {
        const Chunk h = load_pack<kChunk>(h_prev + h_rows[r] + chunk * kChunk);
#pragma unroll
        for (int v = 0; v < kChunk; ++v) {
          sums[r][0] += h.v[v] * w_input.v[v];
          sums[r][1] += h.v[v] * w_output.v[v];
          sums[r][2] += h.v[v] * w_candidate.v[v];
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kTileRows; ++r) {
      const int row = tile * kTileRows + r;
      if (row >= active) continue;
#pragma unroll
      for (int gate = 0; gate < 3; ++gate) {
        shared.partial_sums[((part * rows + row) * 3 + gate) * units + unit] = sums[r][gate];
      }
    }
  }
}

// The cell of each active pair of the thread: its pre-activations (the
// input projection plus the dot product's parts, added in part order), the
// activations, the new cell and h, written to gates, output and cells as the
// per-step path writes them and kept as the pair's running state; with
// `push_h` (cluster mode, but after the last step), the new h is also stored
// into `h_next` of every block of the cluster.
template <typename T, typename Exchange>
__device__ __forceinline__ void cell_step(const ForwardArgs<T>& args,
                                          const ForwardShared<T>& shared, const BlockSlice& slice,
                                          const ThreadPairs& pairs,
                                          const ForwardStepInputs<T>& inputs, const Step& step,
                                          int active, T* h_next, bool push_h) {
  const int state_size = slice.state_size, units = slice.units_per_block;
  const int rows = slice.rows_per_group;
#pragma unroll
  for (int j = 0; j < kPersistentPairs; ++j) {
    if (!pair_is_active(pairs, j, active, slice)) continue;
    const int row = pairs.row[j];
    const int unit = pairs.unit[j];
    const int pair = row * units + unit;
    T pre[3];  // input gate, output gate, candidate
#pragma unroll
    for (int gate = 0; gate < 3; ++gate) {
      T sum = 0;
      for (int part = 0; part < args.dot_split; ++part) {
        sum += shared.partial_sums[((part * rows + row) * 3 + gate) * units + unit];
      }
      pre[gate] = inputs.projection[j][gate] + sum;
    }
    T h_new, c_new;
    forward_element(pre[0], pre[1], pre[2], shared.running_cell[pair], h_new, c_new);
    const int64_t input_row = step.first_input_row + slice.first_row + row;
    const int64_t column = slice.first_unit + unit;
    T* gates = args.gates + input_row * 3 * state_size + column;
    gates[0] = pre[0];
    gates[state_size] = pre[1];
    gates[2 * state_size] = pre[2];
    args.output[input_row * state_size + column] = h_new;
    args.cells[input_row * state_size + column] = c_new;
    shared.running_cell[pair] = c_new;
    shared.running_h[pair] = h_new;
    if (push_h) {
      T* to = h_next + row * slice.pitch + column;
      for (unsigned block = 0; block < gridDim.x; ++block) *Exchange::peer(to, block) = h_new;
    }
  }
}

// The step's new h to every block of the group (not after the last step):
// the barrier, after which in cluster mode each block's next buffer holds
// it; in cooperative mode each block reads the step's h of the group's
// active rows back from `output` into its one buffer, and waits until all
// of it is there.
template <typename T, typename Exchange>
__device__ __forceinline__ void exchange_h(const ForwardArgs<T>& args,
                                           const ForwardShared<T>& shared, const BlockSlice& slice,
                                           const Step& step, int active) {
  Exchange::sync();
  if constexpr (!Exchange::kCluster) {
    constexpr int kChunk = 16 / sizeof(T);
    using Chunk = Pack<T, kChunk>;
    const int state_size = slice.state_size, pitch = slice.pitch;
    const T* from = args.output + (step.first_input_row + slice.first_row) * state_size;
    // 16-byte loads where every row of the step starts on a 16-byte boundary.
    const bool whole_chunks =
        state_size % kChunk == 0 && reinterpret_cast<uintptr_t>(args.output) % sizeof(Chunk) == 0;
    if (whole_chunks) {
      const int chunks_per_row = state_size / kChunk;
      for (int i = threadIdx.x; i < active * chunks_per_row; i += blockDim.x) {
        const int row = i / chunks_per_row;
        const int chunk = i - row * chunks_per_row;
        store_pack<kChunk>(
            shared.h_buffers + row * pitch + chunk * kChunk,
            load_pack_from_blocks<kChunk>(from + int64_t(row) * state_size + chunk * kChunk));
      }
    } else {
      for (int i = threadIdx.x; i < active * state_size; i += blockDim.x) {
        const int row = i / state_size;
        shared.h_buffers[row * pitch + (i - row * state_size)] = load_from_blocks(from + i);
      }
    }
    __syncthreads();
  }
}

// After the last step: each row's final state, that of the last step that
// updated it (else old_h, old_cell), into h_n and c_n.
template <typename T>
__device__ __forceinline__ void store_final_state(const ForwardArgs<T>& args,
                                                  const ForwardShared<T>& shared,
                                                  const BlockSlice& slice) {
  const int units = slice.units_per_block;
  for (int pair = threadIdx.x; pair < slice.rows_per_group * units; pair += blockDim.x) {
    const int row = pair / units;
    const int unit = pair - row * units;
    if (row >= slice.own_rows || unit >= slice.own_units) continue;
    const int64_t at = (slice.first_row + row) * slice.state_size + slice.first_unit + unit;
    args.h_n[at] = shared.running_h[pair];
    args.c_n[at] = shared.running_cell[pair];
  }
}

template <typename T, int kTileRows, typename Exchange>
LLTM_PERSISTENT_KERNEL sequence_forward_kernel(const LLTM_GRID_CONSTANT ForwardArgs<T> args) {
  const BlockSlice slice = block_slice(Exchange::rank(), args.batch_size, args.state_size,
                                       args.units_per_block, args.rows_per_group, args.pitch);
  const ForwardShared<T> shared = forward_shared<T>(args.layout, slice);
  load_weight_slice(shared.weight_slice, slice, args.weights, args.weights_row_stride,
                    args.weights_column_stride);
  load_initial_state<T, Exchange>(args, shared, slice);
  const ThreadPairs pairs = pairs_of_thread(slice);
  Exchange::start();

  const int64_t step_count = args.steps.step_count;
  const bool ascending = !args.reverse;
  const int h_buffer_size = slice.rows_per_group * slice.pitch;  // elements
  ForwardStepInputs<T> inputs{}, next_inputs{};
  Step step{};
  if (step_count > 0) {
    step = first_step(args.steps, ascending);
    load_step_inputs(args, slice, pairs, step, inputs);
  }
  for (int64_t k = 0; k < step_count; ++k) {  // k: the step's place in the walk
    const bool last = k + 1 == step_count;
    Step next = step;
    if (!last) {
      advance(next, args.steps, ascending);
      load_step_inputs(args, slice, pairs, next, next_inputs);
    }
    const int active = active_rows(step, slice);
    // Cluster mode: step k reads h buffer k mod 2 and pushes into the other.
    const T* h_prev = shared.h_buffers + (Exchange::kCluster ? int(k & 1) * h_buffer_size : 0);
    recurrent_matvec<T, kTileRows>(shared, h_prev, slice, active, args.dot_split);
    __syncthreads();
    T* h_next = shared.h_buffers + int((k + 1) & 1) * h_buffer_size;
    cell_step<T, Exchange>(args, shared, slice, pairs, inputs, step, active, h_next,
                           Exchange::kCluster && !last);
    if (!last) exchange_h<T, Exchange>(args, shared, slice, step, active);
    step = next;
    inputs = next_inputs;
  }
  store_final_state(args, shared, slice);
}

}  // namespace lltm::cuda::persistent
