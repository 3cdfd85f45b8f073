// The persistent backward kernel: backpropagation through every step of the
// recurrence in one launch, serving sequence_backward and
// sequence_gate_grads (the scheme: lltm_cuda_persistent.cuh). A step, in the
// functions below, the forward's steps last first: load_step_inputs (of the
// next step, while this one runs), gate_gradients (the pointwise math, the
// writes), send_h_gradient_shares (the matvec with W_h, each unit's share
// sent to the block owning it; in 16 bits, and float32 in TF32, on sm_80
// and later send_h_gradient_shares_tensor_cores), then the barrier and
// sum_h_gradient_shares (the carried gradient of h).
//
// 16-bit dtypes: the inputs are widened to float32, in which the gradients
// are carried, the gate gradients kept for the matvec and the shares sent;
// d_gates, grad_h and grad_c are rounded as they are written, and grad_bias
// is summed from the gate gradients before they are rounded (bias_sums), as
// on the per-step path.
#pragma once

#include <cstdint>

#include "lltm_cuda_launch.cuh"
#include "lltm_cuda_math.cuh"
#include "lltm_cuda_persistent.cuh"
#include "lltm_cuda_persistent_plan.h"
#include "lltm_cuda_runtime.h"
#include "lltm_cuda_tensor_cores.cuh"

namespace lltm::cuda::persistent {

// Where the output gradient of a step's batch row and unit is:
// grad_output[first_input_row * by_input_row + time * by_time + row * by_row
// + unit * by_unit], of (steps, batch, S) strides, or (input rows, S) ones
// when packed; a stride may be 0 (broadcast).
struct GradOutputStrides {
  int64_t by_input_row, by_time, by_row, by_unit;
};

// Where the gradient of h_n (or c_n) of a batch row and unit is:
// grad[row * by_row + unit * by_unit]; a stride may be 0 (broadcast, as the
// gradient of h_n.sum() is), so that no copy makes it dense.
struct StateGradStrides {
  int64_t by_row, by_unit;
};

template <typename T>
struct BackwardArgs {
  using Math = acc_t<T>;
  const T* grad_output;  // null: none
  GradOutputStrides grad_output_strides;
  const T* grad_h_n;  // (batch, S) at grad_h_n_strides, or null: zero
  const T* grad_c_n;  // (batch, S) at grad_c_n_strides, or null: zero
  StateGradStrides grad_h_n_strides, grad_c_n_strides;
  const T* gates;  // dense (input rows, 3S), as the forward left it
  const T* cells;  // dense (input rows, S)
  T* d_gates;      // (input rows, 3S)
  T* grad_h;       // (batch, S): the gradient of old_h; null: not wanted
  T* grad_c;       // (batch, S): the gradient of old_cell
  // Cooperative mode: the blocks' shares of the gradient of h, (2, P,
  // batch, S) in global memory; cluster mode: null (shared memory).
  Math* shares;
  // 16-bit, when grad_bias is wanted: (batch, 3S), each batch row's gate
  // gradients summed over the steps in float32; else null.
  Math* bias_sums;
  const T* weights;
  int64_t weights_row_stride, weights_column_stride;
  int64_t batch_size, state_size, units_per_block, rows_per_group, pitch;
  // The batch rows this launch runs, [rows_begin, rows_end): the plan's
  // wave (persistent_plan.h); its groups split them.
  int64_t rows_begin, rows_end;
  // float32: the products on the TF32 tensor cores (the plan's tf32; the
  // kernel of tile height 1, kTf32Switch); else false.
  bool tf32;
  SharedLayout layout;
  bool reverse;
  Steps steps;
};

// A backward block's shared memory (the plan's SharedLayout): W_h in T, the
// rest in the math type M.
template <typename T>
struct BackwardShared {
  using M = acc_t<T>;
  T* weight_slice;     // (3U, pitch): the block's rows of W_h
  M* received_shares;  // cluster mode: (2, P, R, U), the shares the blocks sent this block
  M* gate_grads;       // (R, 3U): the step's gate gradients of the block's pairs
  M* carried_h;        // (R, U): the gradients of h and c the pairs carry to the step before
  M* carried_c;        // (R, U)
};

template <typename T>
__device__ __forceinline__ BackwardShared<T> backward_shared(const SharedLayout& layout,
                                                             const BlockSlice& slice) {
  using M = acc_t<T>;
  unsigned char* memory = dynamic_shared_memory();
  BackwardShared<T> shared;
  shared.weight_slice = reinterpret_cast<T*>(memory + layout.weights);
  shared.received_shares = reinterpret_cast<M*>(memory + layout.exchange);
  shared.gate_grads = reinterpret_cast<M*>(memory + layout.scratch);
  shared.carried_h = reinterpret_cast<M*>(memory + layout.state);
  shared.carried_c = shared.carried_h + slice.rows_per_group * slice.units_per_block;
  return shared;
}

// Before the last step: the gate gradients zero (the matvec reads those of
// rows a step does not update), each pair's carried gradients those of h_n
// and c_n.
template <typename T>
__device__ __forceinline__ void load_final_gradients(const BackwardArgs<T>& args,
                                                     const BackwardShared<T>& shared,
                                                     const BlockSlice& slice) {
  using M = acc_t<T>;
  const int units = slice.units_per_block, rows = slice.rows_per_group;
  for (int i = threadIdx.x; i < rows * 3 * units; i += blockDim.x) shared.gate_grads[i] = M(0);
  for (int pair = threadIdx.x; pair < rows * units; pair += blockDim.x) {
    const int row = pair / units;
    const int unit = pair - row * units;
    const bool present = row < slice.own_rows && unit < slice.own_units;
    const int64_t r = slice.first_row + row, u = slice.first_unit + unit;
    const StateGradStrides& h = args.grad_h_n_strides;
    const StateGradStrides& c = args.grad_c_n_strides;
    shared.carried_h[pair] =
        present && args.grad_h_n != nullptr ? M(args.grad_h_n[r * h.by_row + u * h.by_unit]) : M(0);
    shared.carried_c[pair] =
        present && args.grad_c_n != nullptr ? M(args.grad_c_n[r * c.by_row + u * c.by_unit]) : M(0);
  }
}

// A thread's inputs of one step, in the math type M, for each of its
// pairs: what the forward saved (the activated input and output gates, the
// candidate's pre-activation, the new cell) and the output gradient.
template <typename M>
struct BackwardStepInputs {
  M input_gate[kPersistentPairs], output_gate[kPersistentPairs], candidate[kPersistentPairs];
  M new_cell[kPersistentPairs], grad_output[kPersistentPairs];
};

// The inputs of the pairs the step updates (the others are not read).
template <typename T>
__device__ __forceinline__ void load_step_inputs(const BackwardArgs<T>& args,
                                                 const BlockSlice& slice, const ThreadPairs& pairs,
                                                 const Step& step,
                                                 BackwardStepInputs<acc_t<T>>& inputs) {
  using M = acc_t<T>;
  const int active = active_rows(step, slice);
  const int state_size = slice.state_size;
  const GradOutputStrides& strides = args.grad_output_strides;
#pragma unroll
  for (int j = 0; j < kPersistentPairs; ++j) {
    if (!pair_is_active(pairs, j, active, slice)) continue;
    const int64_t batch_row = slice.first_row + pairs.row[j];
    const int64_t input_row = step.first_input_row + batch_row;
    const int64_t column = slice.first_unit + pairs.unit[j];
    const T* gates = args.gates + input_row * 3 * state_size + column;
    inputs.input_gate[j] = gates[0];
    inputs.output_gate[j] = gates[state_size];
    inputs.candidate[j] = gates[2 * state_size];
    inputs.new_cell[j] = args.cells[input_row * state_size + column];
    inputs.grad_output[j] =
        args.grad_output == nullptr
            ? M(0)
            : M(args.grad_output[step.first_input_row * strides.by_input_row +
                                 step.time * strides.by_time + batch_row * strides.by_row +
                                 column * strides.by_unit]);
  }
}

// The gate gradients of each active pair of the thread, from the gradients
// it carries and the step's inputs: written to d_gates (rounded to T), kept
// in gate_grads for the matvec and, for 16-bit dtypes, added to the pair's
// `bias_sums` (registers); the gradient of c carried on.
template <typename T>
__device__ __forceinline__ void gate_gradients(const BackwardArgs<T>& args,
                                               const BackwardShared<T>& shared,
                                               const BlockSlice& slice, const ThreadPairs& pairs,
                                               const BackwardStepInputs<acc_t<T>>& inputs,
                                               const Step& step, int active,
                                               acc_t<T> (&bias_sums)[kPersistentPairs][3]) {
  using M = acc_t<T>;
  const int state_size = slice.state_size, units = slice.units_per_block;
#pragma unroll
  for (int j = 0; j < kPersistentPairs; ++j) {
    if (!pair_is_active(pairs, j, active, slice)) continue;
    const int row = pairs.row[j];
    const int unit = pairs.unit[j];
    const int pair = row * units + unit;
    M d_input, d_output, d_candidate, d_cell;
    backward_math<M>(shared.carried_h[pair] + inputs.grad_output[j], shared.carried_c[pair],
                     inputs.new_cell[j], inputs.input_gate[j], inputs.output_gate[j],
                     inputs.candidate[j], d_input, d_output, d_candidate, d_cell);
    const int64_t input_row = step.first_input_row + slice.first_row + row;
    T* d_gates = args.d_gates + input_row * 3 * state_size + slice.first_unit + unit;
    d_gates[0] = T(d_input);
    d_gates[state_size] = T(d_output);
    d_gates[2 * state_size] = T(d_candidate);
    if constexpr (kWidened<T>) {
      bias_sums[j][0] += d_input;
      bias_sums[j][1] += d_output;
      bias_sums[j][2] += d_candidate;
    }
    M* own = shared.gate_grads + row * 3 * units + unit;
    own[0] = d_input;
    own[units] = d_output;
    own[2 * units] = d_candidate;
    shared.carried_c[pair] = d_cell;
  }
}

// Where block `sender`'s share of the gradient of h at (row, unit) goes, in
// the buffers of step parity `parity`: cluster mode, the owner's
// received_shares, (2, P, R, U), `unit` the owner's; cooperative mode,
// `shares` in global memory, (2, P, batch, S), `row` and `unit` the batch's
// and the state's.
__device__ __forceinline__ int received_share_offset(int parity, unsigned blocks, unsigned sender,
                                                     const BlockSlice& slice, int row, int unit) {
  return ((parity * int(blocks) + int(sender)) * slice.rows_per_group + row) *
             slice.units_per_block +
         unit;
}

__device__ __forceinline__ int64_t global_share_offset(int parity, unsigned blocks, unsigned sender,
                                                       int64_t batch_size, int64_t batch_row,
                                                       int state_size, int unit) {
  return ((int64_t(parity) * blocks + sender) * batch_size + batch_row) * state_size + unit;
}

// Block `block`'s share of the gradient of h at (row of the group, unit of
// the state), to the block owning the unit.
template <typename T, typename Exchange>
__device__ __forceinline__ void send_share(const BackwardArgs<T>& args,
                                           const BackwardShared<T>& shared, const BlockSlice& slice,
                                           unsigned block, int parity, int row, int unit,
                                           acc_t<T> share) {
  const int owner = unit / slice.units_per_block;
  if constexpr (Exchange::kCluster) {
    acc_t<T>* slot =
        shared.received_shares + received_share_offset(parity, gridDim.x, block, slice, row,
                                                       unit - owner * slice.units_per_block);
    *Exchange::peer(slot, static_cast<unsigned>(owner)) = share;
  } else {
    args.shares[global_share_offset(parity, gridDim.x, block, args.batch_size,
                                    slice.first_row + row, slice.state_size, unit)] = share;
  }
}

// The block's share of gate_grads W_h for every unit of the state and active
// row: thread (chunk, tile) sums over the slice's 3U rows for kTileRows rows
// and a 16-byte chunk of units (threads of one tile read consecutive chunks
// of a row of the slice and share the gradients), then sends each unit's
// share to the block owning it.
template <typename T, int kTileRows, typename Exchange>
__device__ __forceinline__ void send_h_gradient_shares(const BackwardArgs<T>& args,
                                                       const BackwardShared<T>& shared,
                                                       const BlockSlice& slice, unsigned block,
                                                       int active, int parity) {
  using M = acc_t<T>;
  constexpr int kChunk = 16 / sizeof(T);  // elements of a 16-byte chunk of W_h
  using Chunk = Pack<T, kChunk>;
  const int state_size = slice.state_size, units = slice.units_per_block;
  const int rows = slice.rows_per_group, pitch = slice.pitch;
  const int chunks = (state_size + kChunk - 1) / kChunk;
  const int row_tiles = (active + kTileRows - 1) / kTileRows;
  for (int item = threadIdx.x; item < row_tiles * chunks; item += blockDim.x) {
    const int tile = item / chunks;
    const int chunk = item - tile * chunks;
    int grad_rows[kTileRows];  // offsets in gate_grads (rows past R: its last, not used)
#pragma unroll
    for (int r = 0; r < kTileRows; ++r) {
      const int row = tile * kTileRows + r;
      grad_rows[r] = (row < rows ? row : rows - 1) * 3 * units;
    }
    M sums[kTileRows][kChunk] = {};        // (tile row, unit of the chunk)
    for (int j = 0; j < 3 * units; ++j) {  // rows of units the block lacks are zero
      const Chunk w = load_pack<kChunk>(shared.weight_slice + j * pitch + chunk * kChunk);
#pragma unroll
      for (int r = 0; r < kTileRows; ++r) {
        const M d = shared.gate_grads[grad_rows[r] + j];
#pragma unroll
        for (int v = 0; v < kChunk; ++v) sums[r][v] += d * M(w.v[v]);
      }
    }
#pragma unroll
    for (int r = 0; r < kTileRows; ++r) {
      const int row = tile * kTileRows + r;
      if (row >= active) continue;
#pragma unroll
      for (int v = 0; v < kChunk; ++v) {
        const int unit = chunk * kChunk + v;  // of the state
        if (unit < state_size) {
          send_share<T, Exchange>(args, shared, slice, block, parity, row, unit, sums[r][v]);
        }
      }
    }
  }
}

// The same shares on the tensor cores (lltm_cuda_tensor_cores.cuh): W_h's
// slice transposed (every unit of the state by the slice's 3U rows) times
// the step's gate gradients of the active rows. Plans of
// kTensorCoreTileRows: 16-bit dtypes, and float32 in TF32.
template <typename T, typename Exchange>
__device__ __forceinline__ void send_h_gradient_shares_tensor_cores(const BackwardArgs<T>& args,
                                                                    const BackwardShared<T>& shared,
                                                                    const BlockSlice& slice,
                                                                    unsigned block, int active,
                                                                    int parity) {
  const int gate_rows = 3 * slice.units_per_block;  // the product's inner dimension
  const float* gate_grads = shared.gate_grads;
  tensor_core_product<T>(
      shared.weight_slice, /*m_stride=*/1, /*k_stride=*/slice.pitch,
      [&](int row, int gate_row) { return gate_grads[row * gate_rows + gate_row]; },
      slice.state_size, active, gate_rows,
      /*split=*/1,
      [&](int, int unit, int row, float share) {
        send_share<T, Exchange>(args, shared, slice, block, parity, row, unit, share);
      });
}

// After the barrier: the carried gradient of h of each active pair of the
// thread, the sum of the blocks' shares in block order.
template <typename T, typename Exchange>
__device__ __forceinline__ void sum_h_gradient_shares(const BackwardArgs<T>& args,
                                                      const BackwardShared<T>& shared,
                                                      const BlockSlice& slice,
                                                      const ThreadPairs& pairs, int active,
                                                      int parity) {
  const unsigned blocks = gridDim.x;
#pragma unroll
  for (int j = 0; j < kPersistentPairs; ++j) {
    if (!pair_is_active(pairs, j, active, slice)) continue;
    const int row = pairs.row[j];
    const int unit = pairs.unit[j];
    acc_t<T> sum = 0;
    for (unsigned sender = 0; sender < blocks; ++sender) {
      if constexpr (Exchange::kCluster) {
        sum +=
            shared.received_shares[received_share_offset(parity, blocks, sender, slice, row, unit)];
      } else {
        sum += load_from_blocks(args.shares +
                                global_share_offset(parity, blocks, sender, args.batch_size,
                                                    slice.first_row + row, slice.state_size,
                                                    slice.first_unit + unit));
      }
    }
    shared.carried_h[row * slice.units_per_block + unit] = sum;
  }
}

// After the first step: the gradients of old_h (when wanted) and old_cell,
// what the pairs carry; and each pair's bias_sums, where wanted.
template <typename T>
__device__ __forceinline__ void store_initial_gradients(
    const BackwardArgs<T>& args, const BackwardShared<T>& shared, const BlockSlice& slice,
    const ThreadPairs& pairs, const acc_t<T> (&bias_sums)[kPersistentPairs][3]) {
  const int units = slice.units_per_block;
  for (int pair = threadIdx.x; pair < slice.rows_per_group * units; pair += blockDim.x) {
    const int row = pair / units;
    const int unit = pair - row * units;
    if (row >= slice.own_rows || unit >= slice.own_units) continue;
    const int64_t at = (slice.first_row + row) * slice.state_size + slice.first_unit + unit;
    if (args.grad_h != nullptr) args.grad_h[at] = T(shared.carried_h[pair]);
    args.grad_c[at] = T(shared.carried_c[pair]);
  }
  if constexpr (kWidened<T>) {
    if (args.bias_sums == nullptr) return;
    const int state_size = slice.state_size;
#pragma unroll
    for (int j = 0; j < kPersistentPairs; ++j) {
      if (pairs.row[j] >= slice.own_rows || pairs.unit[j] >= slice.own_units) continue;
      acc_t<T>* sums = args.bias_sums + (slice.first_row + pairs.row[j]) * 3 * state_size +
                       slice.first_unit + pairs.unit[j];
#pragma unroll
      for (int gate = 0; gate < 3; ++gate) sums[gate * state_size] = bias_sums[j][gate];
    }
  }
}

template <typename T, int kTileRows, typename Exchange>
__device__ __forceinline__ void run_backward(const BackwardArgs<T>& args) {
  const unsigned block = Exchange::rank();
  const BlockSlice slice = block_slice(block, args.rows_begin, args.rows_end, args.state_size,
                                       args.units_per_block, args.rows_per_group, args.pitch);
  const BackwardShared<T> shared = backward_shared<T>(args.layout, slice);
  constexpr bool kTensorCores = kTileRows == kTensorCoreTileRows;
  const unsigned* non_finite_weights =
      load_weight_slice_flagged<kTensorCores>(shared.weight_slice, slice, args.layout, args.weights,
                                              args.weights_row_stride, args.weights_column_stride);
  load_final_gradients(args, shared, slice);
  const ThreadPairs pairs = pairs_of_thread(slice);
  Exchange::start();
  // Block-uniform: every warp of the block takes the same product.
  const bool tensor_cores =
      kTensorCores ? *non_finite_weights == 0 : kTf32Switch<T, kTileRows> && args.tf32;

  const int64_t step_count = args.steps.step_count;
  const bool ascending = args.reverse;  // the forward's steps, last first
  using M = acc_t<T>;
  BackwardStepInputs<M> inputs{}, next_inputs{};
  M bias_sums[kPersistentPairs][3] = {};  // 16-bit: the pairs' gate gradients, summed
  Step step{};
  if (step_count > 0) {
    step = first_step(args.steps, ascending);
    load_step_inputs(args, slice, pairs, step, inputs);
  }
  for (int64_t n = 0; n < step_count; ++n) {
    const int64_t k = step_count - 1 - n;  // the step's place in the forward's walk
    Step next = step;
    if (n + 1 < step_count) {
      advance(next, args.steps, ascending);
      load_step_inputs(args, slice, pairs, next, next_inputs);
    }
    const int active = active_rows(step, slice);
    gate_gradients(args, shared, slice, pairs, inputs, step, active, bias_sums);
    // The first step's matvec only gives the gradient of old_h.
    if (k == 0 && args.grad_h == nullptr) break;
    __syncthreads();
    // Two buffers of shares, used in turn: a block may send the next step's
    // while another still sums this step's.
    const int parity = int(k & 1);
    if constexpr (kTensorCores || kTf32Switch<T, kTileRows>) {
      if (tensor_cores) {
        send_h_gradient_shares_tensor_cores<T, Exchange>(args, shared, slice, block, active,
                                                         parity);
      } else {
        send_h_gradient_shares<T, 1, Exchange>(args, shared, slice, block, active, parity);
      }
    } else {
      send_h_gradient_shares<T, kTileRows, Exchange>(args, shared, slice, block, active, parity);
    }
    Exchange::sync();
    sum_h_gradient_shares<T, Exchange>(args, shared, slice, pairs, active, parity);
    step = next;
    inputs = next_inputs;
  }
  store_initial_gradients(args, shared, slice, pairs, bias_sums);
}

template <typename T, int kTileRows, typename Exchange>
LLTM_PERSISTENT_KERNEL sequence_backward_kernel(const LLTM_GRID_CONSTANT BackwardArgs<T> args) {
  if constexpr (kKernelLaunchable<T, kTileRows>) {
    run_backward<T, kTileRows, Exchange>(args);
  } else {
    __trap();
  }
}

}  // namespace lltm::cuda::persistent
