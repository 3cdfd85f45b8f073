// The persistent forward kernel: every step of sequence_forward's recurrence
// in one launch (the scheme: lltm_cuda_persistent.cuh). A step, in the
// functions below: load_step_inputs (of the next step, while this one runs),
// recurrent_matvec (h_prev W_h^T; in 16 bits on sm_80 and later
// recurrent_matvec_tensor_cores), cell_step (the pointwise math, the
// writes), exchange_h (the new h to every block of the group).
//
// The h the blocks exchange is in the math type, float32 for 16-bit dtypes:
// the matvec then reads the h the cells computed, as the float32 kernel
// does, where an h rounded to 16 bits would put a rounding error into every
// step's recurrent input, which the later steps carry on
// (tests/test_cuda_persistent_16_bit.py measures the result against
// float64 and nn.LSTM). It
// costs no barrier: in cluster mode the float32 h is pushed into the peers'
// shared memory as the 16-bit one would be, and in cooperative mode the
// cells write a float32 copy of it (h_exchange) next to `output` before the
// same grid barrier; only the bytes double.
#pragma once

#include <cstdint>

#include "lltm_cuda_launch.cuh"
#include "lltm_cuda_math.cuh"
#include "lltm_cuda_persistent.cuh"
#include "lltm_cuda_persistent_plan.h"
#include "lltm_cuda_runtime.h"
#include "lltm_cuda_tensor_cores.cuh"

namespace lltm::cuda::persistent {

template <typename T>
struct ForwardArgs {
  using Math = acc_t<T>;
  // (input rows, 3S): on return the activated input and output gates and
  // the candidate's pre-activation, as the per-step path leaves them; on
  // entry, in float32 and float64, the input projection and bias of every
  // step.
  T* gates;
  // 16-bit: the input projection and bias of every step in float32, (input
  // rows, 3S) (see persistent_sequence_forward); else null.
  const Math* projection;
  T* output;  // (input rows, S)
  T* cells;   // (input rows, S)
  T* h_n;     // (batch, S)
  T* c_n;     // (batch, S)
  const T* weights;
  int64_t weights_row_stride, weights_column_stride;
  const T* h0;  // dense (batch, S)
  const T* c0;  // dense (batch, S)
  // Cooperative mode, 16-bit: the step's h in float32, (2, batch, S), two
  // steps' used in turn (a block may write the next step's while another
  // still reads this step's); else null: blocks read h from `output`, which
  // holds it exactly.
  Math* h_exchange;
  int64_t batch_size, state_size, units_per_block, rows_per_group, pitch;
  int32_t dot_split;  // threads sharing one dot product of the matvec
  SharedLayout layout;
  bool reverse;
  Steps steps;
};

// A forward block's shared memory (the plan's SharedLayout): W_h in T, the
// rest in the math type M.
template <typename T>
struct ForwardShared {
  using M = acc_t<T>;
  T* weight_slice;  // (3U, pitch): the block's rows of W_h
  M* h_buffers;     // (buffers, R, pitch): the group's h of the previous step
  M* partial_sums;  // (dot_split, R, 3, U): the parts of the step's dot products
  M* running_cell;  // (R, U): the cell state of the block's pairs
  M* running_h;     // (R, U): and their h
};

template <typename T>
__device__ __forceinline__ ForwardShared<T> forward_shared(const SharedLayout& layout,
                                                           const BlockSlice& slice) {
  using M = acc_t<T>;
  unsigned char* memory = dynamic_shared_memory();
  ForwardShared<T> shared;
  shared.weight_slice = reinterpret_cast<T*>(memory + layout.weights);
  shared.h_buffers = reinterpret_cast<M*>(memory + layout.exchange);
  shared.partial_sums = reinterpret_cast<M*>(memory + layout.scratch);
  shared.running_cell = reinterpret_cast<M*>(memory + layout.state);
  shared.running_h = shared.running_cell + slice.rows_per_group * slice.units_per_block;
  return shared;
}

// Before the first step: every h buffer holds h0 of the group's rows (zero
// past them and past the state); each pair's running cell and h, c0 and h0.
template <typename T, typename Exchange>
__device__ __forceinline__ void load_initial_state(const ForwardArgs<T>& args,
                                                   const ForwardShared<T>& shared,
                                                   const BlockSlice& slice) {
  using M = acc_t<T>;
  const int state_size = slice.state_size, units = slice.units_per_block;
  const int rows = slice.rows_per_group, pitch = slice.pitch;
  const int buffered = (Exchange::kCluster ? 2 : 1) * rows * pitch;
  for (int i = threadIdx.x; i < buffered; i += blockDim.x) {
    const int row = (i / pitch) % rows;
    const int column = i % pitch;  // a unit of the state
    shared.h_buffers[i] = row < slice.own_rows && column < state_size
                              ? M(args.h0[(slice.first_row + row) * state_size + column])
                              : M(0);
  }
  for (int pair = threadIdx.x; pair < rows * units; pair += blockDim.x) {
    const int row = pair / units;
    const int unit = pair - row * units;
    const bool present = row < slice.own_rows && unit < slice.own_units;
    const int64_t at = (slice.first_row + row) * state_size + slice.first_unit + unit;
    shared.running_cell[pair] = present ? M(args.c0[at]) : M(0);
    shared.running_h[pair] = present ? M(args.h0[at]) : M(0);
  }
}

// A thread's inputs of one step, in the math type M: for each of its pairs,
// the input projections of the input gate, output gate and candidate.
template <typename M>
struct ForwardStepInputs {
  M projection[kPersistentPairs][3];
};

// The inputs of the pairs the step updates (the others are not read).
template <typename T>
__device__ __forceinline__ void load_step_inputs(const ForwardArgs<T>& args,
                                                 const BlockSlice& slice, const ThreadPairs& pairs,
                                                 const Step& step,
                                                 ForwardStepInputs<acc_t<T>>& inputs) {
  const int active = active_rows(step, slice);
  const int state_size = slice.state_size;
#pragma unroll
  for (int j = 0; j < kPersistentPairs; ++j) {
    if (!pair_is_active(pairs, j, active, slice)) continue;
    const int64_t input_row = step.first_input_row + slice.first_row + pairs.row[j];
    const int64_t at = input_row * 3 * state_size + slice.first_unit + pairs.unit[j];
    if constexpr (kWidened<T>) {
      const acc_t<T>* projection = args.projection + at;
      inputs.projection[j][0] = projection[0];
      inputs.projection[j][1] = projection[state_size];
      inputs.projection[j][2] = projection[2 * state_size];
    } else {
      const T* gates = args.gates + at;
      inputs.projection[j][0] = gates[0];
      inputs.projection[j][1] = gates[state_size];
      inputs.projection[j][2] = gates[2 * state_size];
    }
  }
}

// h_prev W_h^T for the step's active rows, in parts: thread (part, unit,
// tile) sums the 16-byte chunks part, part + dot_split, ... of the state for
// kTileRows rows and the unit's three gates, into partial_sums (threads of
// consecutive units read rows of W_h an odd number of chunks apart: no bank
// conflict; those of one tile share the h rows).
template <typename T, int kTileRows>
__device__ __forceinline__ void recurrent_matvec(const ForwardShared<T>& shared,
                                                 const acc_t<T>* h_prev, const BlockSlice& slice,
                                                 int active, int dot_split) {
  using M = acc_t<T>;
  constexpr int kChunk = 16 / sizeof(T);  // elements of a 16-byte chunk of W_h
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
    M sums[kTileRows][3] = {};  // (tile row, gate)
    for (int chunk = part; chunk < chunks; chunk += dot_split) {
      const Chunk w_input = load_pack<kChunk>(w_row + chunk * kChunk);
      const Chunk w_output = load_pack<kChunk>(w_row + units * pitch + chunk * kChunk);
      const Chunk w_candidate = load_pack<kChunk>(w_row + 2 * units * pitch + chunk * kChunk);
#pragma unroll
      for (int r = 0; r < kTileRows; ++r) {
        M h[kChunk];
        load_math_elements(h_prev + h_rows[r] + chunk * kChunk, h);
#pragma unroll
        for (int v = 0; v < kChunk; ++v) {
          sums[r][0] += h[v] * M(w_input.v[v]);
          sums[r][1] += h[v] * M(w_output.v[v]);
          sums[r][2] += h[v] * M(w_candidate.v[v]);
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

// The same partial sums on the tensor cores (lltm_cuda_tensor_cores.cuh):
// the slice's 3U rows of W_h times h_prev (the step's active rows), the
// state split `dot_split` ways along the instructions' steps. Plans of
// kTensorCoreTileRows, 16-bit dtypes only.
template <typename T>
__device__ __forceinline__ void recurrent_matvec_tensor_cores(const ForwardShared<T>& shared,
                                                              const float* h_prev,
                                                              const BlockSlice& slice, int active,
                                                              int dot_split) {
  const int gate_rows = 3 * slice.units_per_block;
  const int rows = slice.rows_per_group;
  float* partial_sums = shared.partial_sums;
  tensor_core_product<T>(shared.weight_slice, /*m_stride=*/slice.pitch, /*k_stride=*/1, h_prev,
                         slice.pitch, gate_rows, active, slice.state_size, dot_split,
                         [&](int part, int gate_row, int row, float value) {
                           partial_sums[(part * rows + row) * gate_rows + gate_row] = value;
                         });
}

// The cell of each active pair of the thread: its pre-activations (the
// input projection plus the dot product's parts, added in part order), the
// activations, the new cell and h, written to gates, output and cells as the
// per-step path writes them (rounded to T) and kept as the pair's running
// state (not rounded); the new h also goes to the exchange, but after the
// last step (h_next null): in cluster mode into `h_next` of every block of
// the cluster, in cooperative mode into `h_next` in global memory where
// h_exchange is used (16-bit).
template <typename T, typename Exchange>
__device__ __forceinline__ void cell_step(const ForwardArgs<T>& args,
                                          const ForwardShared<T>& shared, const BlockSlice& slice,
                                          const ThreadPairs& pairs,
                                          const ForwardStepInputs<acc_t<T>>& inputs,
                                          const Step& step, int active, acc_t<T>* h_next) {
  using M = acc_t<T>;
  const int state_size = slice.state_size, units = slice.units_per_block;
  const int rows = slice.rows_per_group;
#pragma unroll
  for (int j = 0; j < kPersistentPairs; ++j) {
    if (!pair_is_active(pairs, j, active, slice)) continue;
    const int row = pairs.row[j];
    const int unit = pairs.unit[j];
    const int pair = row * units + unit;
    M pre[3];  // input gate, output gate, candidate
#pragma unroll
    for (int gate = 0; gate < 3; ++gate) {
      M sum = 0;
      for (int part = 0; part < args.dot_split; ++part) {
        sum += shared.partial_sums[((part * rows + row) * 3 + gate) * units + unit];
      }
      pre[gate] = inputs.projection[j][gate] + sum;
    }
    M h_new, c_new;
    forward_element(pre[0], pre[1], pre[2], shared.running_cell[pair], h_new, c_new);
    const int64_t input_row = step.first_input_row + slice.first_row + row;
    const int64_t column = slice.first_unit + unit;
    T* gates = args.gates + input_row * 3 * state_size + column;
    gates[0] = T(pre[0]);
    gates[state_size] = T(pre[1]);
    gates[2 * state_size] = T(pre[2]);
    args.output[input_row * state_size + column] = T(h_new);
    args.cells[input_row * state_size + column] = T(c_new);
    shared.running_cell[pair] = c_new;
    shared.running_h[pair] = h_new;
    if (h_next == nullptr) continue;
    if constexpr (Exchange::kCluster) {
      M* to = h_next + row * slice.pitch + column;
      for (unsigned block = 0; block < gridDim.x; ++block) *Exchange::peer(to, block) = h_new;
    } else {
      h_next[(slice.first_row + row) * state_size + column] = h_new;
    }
  }
}

// The step's new h to every block of the group (not after the last step):
// the barrier, after which in cluster mode each block's next buffer holds
// it; in cooperative mode each block reads the step's h of the group's
// active rows back into its one buffer, from `output` (16-bit: from
// `h_sent`, where the cells wrote it in float32), and waits until all of it
// is there.
template <typename T, typename Exchange>
__device__ __forceinline__ void exchange_h(const ForwardArgs<T>& args,
                                           const ForwardShared<T>& shared, const BlockSlice& slice,
                                           const Step& step, int active, const acc_t<T>* h_sent) {
  using M = acc_t<T>;
  Exchange::sync();
  if constexpr (!Exchange::kCluster) {
    constexpr int kChunk = 16 / sizeof(M);
    using Chunk = Pack<M, kChunk>;
    const int state_size = slice.state_size, pitch = slice.pitch;
    const M* sent;     // rows of the whole batch
    int64_t sent_row;  // of the group's first
    if constexpr (kWidened<T>) {
      sent = h_sent;
      sent_row = slice.first_row;
    } else {
      sent = args.output;
      sent_row = step.first_input_row + slice.first_row;
    }
    const M* from = sent + sent_row * state_size;
    // 16-byte loads where every row starts on a 16-byte boundary.
    const bool whole_chunks =
        state_size % kChunk == 0 && reinterpret_cast<uintptr_t>(sent) % sizeof(Chunk) == 0;
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
    args.h_n[at] = T(shared.running_h[pair]);
    args.c_n[at] = T(shared.running_cell[pair]);
  }
}

template <typename T, int kTileRows, typename Exchange>
LLTM_PERSISTENT_KERNEL sequence_forward_kernel(const LLTM_GRID_CONSTANT ForwardArgs<T> args) {
  const BlockSlice slice = block_slice(Exchange::rank(), args.batch_size, args.state_size,
                                       args.units_per_block, args.rows_per_group, args.pitch);
  const ForwardShared<T> shared = forward_shared<T>(args.layout, slice);
  constexpr bool kTensorCores = kTileRows == kTensorCoreTileRows;
  const unsigned* non_finite_weights =
      load_weight_slice_flagged<kTensorCores>(shared.weight_slice, slice, args.layout, args.weights,
                                              args.weights_row_stride, args.weights_column_stride);
  load_initial_state<T, Exchange>(args, shared, slice);
  const ThreadPairs pairs = pairs_of_thread(slice);
  Exchange::start();
  // Block-uniform: every warp of the block takes the same product.
  const bool tensor_cores = kTensorCores && *non_finite_weights == 0;

  const int64_t step_count = args.steps.step_count;
  const bool ascending = !args.reverse;
  const int h_buffer_size = slice.rows_per_group * slice.pitch;  // elements
  using M = acc_t<T>;
  ForwardStepInputs<M> inputs{}, next_inputs{};
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
    const M* h_prev = shared.h_buffers + (Exchange::kCluster ? int(k & 1) * h_buffer_size : 0);
    if constexpr (kTensorCores) {
      if (tensor_cores) {
        recurrent_matvec_tensor_cores<T>(shared, h_prev, slice, active, args.dot_split);
      } else {
        recurrent_matvec<T, 1>(shared, h_prev, slice, active, args.dot_split);
      }
    } else {
      recurrent_matvec<T, kTileRows>(shared, h_prev, slice, active, args.dot_split);
    }
    __syncthreads();
    // Where the step's h goes for the next step: none after the last, nor
    // in cooperative mode where `output` holds it exactly.
    M* h_next = nullptr;
    if (!last && Exchange::kCluster) {
      h_next = shared.h_buffers + int((k + 1) & 1) * h_buffer_size;
    } else if (!last && kWidened<T>) {
      h_next = args.h_exchange + int(k & 1) * args.batch_size * args.state_size;
    }
    cell_step<T, Exchange>(args, shared, slice, pairs, inputs, step, active, h_next);
    if (!last) exchange_h<T, Exchange>(args, shared, slice, step, active, h_next);
    step = next;
    inputs = next_inputs;
  }
  store_final_state(args, shared, slice);
}

}  // namespace lltm::cuda::persistent
