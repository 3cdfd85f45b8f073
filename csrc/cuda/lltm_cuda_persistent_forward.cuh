// The persistent forward kernel: every step of sequence_forward's recurrence
// in one launch (the scheme: lltm_cuda_persistent.cuh). A step, in the
// functions below: load_step_inputs (of the next step, while this one runs),
// recurrent_matvec (h_prev W_h^T; in 16 bits, and float32 in TF32, on sm_80
// and later recurrent_matvec_tensor_cores), cell_step (the pointwise math,
// the writes), exchange_h (the new h to every block of the group).
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
//
// Plans that read h from global memory (SequencePlan::h_from_global,
// cooperative only) keep no copy of h in shared memory: every dtype's cells
// write h in the math type to h_exchange, and the products read the group's
// rows there, at L2. Both of its buffers start as h0, so that a row a packed
// sequence's step updates for the first time (in reverse order) reads h0;
// its rows are padded with zeros to whole 32-byte vectors, so that the
// CUDA cores' products read whole 16-byte vectors, as from shared memory.
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
  // the candidate's pre-activation, as the per-step path leaves them; null
  // where nothing will differentiate the call (sequence_inference): not
  // written.
  T* gates;
  // The input projection and bias of every step, (input rows, 3S), in the
  // math type (see persistent_sequence_forward): in float32 and float64 the
  // memory of `gates` where that is given (each element is read before its
  // thread writes the gate over it), in 16 bits a float32 tensor of its own.
  const Math* projection;
  T* output;  // (input rows, S)
  T* cells;   // (input rows, S); null, not written, where `gates` is
  T* h_n;     // (batch, S)
  T* c_n;     // (batch, S)
  const T* weights;
  int64_t weights_row_stride, weights_column_stride;
  const T* h0;  // dense (batch, S)
  const T* c0;  // dense (batch, S)
  // Cooperative mode, 16-bit or h_from_global: the step's h in the math
  // type, (2, batch, h_exchange_pitch), two steps' used in turn (a block may
  // write the next step's while another still reads this step's); else
  // null: blocks read h from `output`, which holds it exactly.
  Math* h_exchange;
  // Elements between its rows: S, or with h_from_global S rounded up to 8
  // (the padding zero).
  int64_t h_exchange_pitch;
  // The products read h in h_exchange rather than in shared memory (the
  // plan's h_from_global).
  bool h_from_global;
  int64_t batch_size, state_size, units_per_block, rows_per_group, pitch;
  // The batch rows this launch runs, [rows_begin, rows_end): the plan's
  // wave (persistent_plan.h); its groups split them.
  int64_t rows_begin, rows_end;
  int32_t dot_split;  // threads sharing one dot product of the matvec
  // float32: the products on the TF32 tensor cores (the plan's tf32; the
  // kernel of tile height 1, kTf32Switch); else false.
  bool tf32;
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
// past them and past the state), or where h is read from global memory,
// both of h_exchange's buffers hold h0 of the block's pairs; each pair's
// running cell and h, c0 and h0.
template <typename T, typename Exchange>
__device__ __forceinline__ void load_initial_state(const ForwardArgs<T>& args,
                                                   const ForwardShared<T>& shared,
                                                   const BlockSlice& slice) {
  using M = acc_t<T>;
  const int state_size = slice.state_size, units = slice.units_per_block;
  const int rows = slice.rows_per_group, pitch = slice.pitch;
  const int buffered = args.h_from_global ? 0 : (Exchange::kCluster ? 2 : 1) * rows * pitch;
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
    if (args.h_from_global && present) {
      const int64_t h_at =
          (slice.first_row + row) * args.h_exchange_pitch + slice.first_unit + unit;
      args.h_exchange[h_at] = M(args.h0[at]);
      args.h_exchange[args.batch_size * args.h_exchange_pitch + h_at] = M(args.h0[at]);
    }
  }
  // The padding past the state: by the block that owns the state's end.
  const int padding = static_cast<int>(args.h_exchange_pitch) - state_size;
  if (args.h_from_global && slice.first_unit + slice.own_units == state_size) {
    for (int i = threadIdx.x; i < slice.own_rows * padding; i += blockDim.x) {
      const int row = i / padding;
      const int64_t h_at =
          (slice.first_row + row) * args.h_exchange_pitch + state_size + i % padding;
      args.h_exchange[h_at] = M(0);
      args.h_exchange[args.batch_size * args.h_exchange_pitch + h_at] = M(0);
    }
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
    const acc_t<T>* projection = args.projection + at;
    inputs.projection[j][0] = projection[0];
    inputs.projection[j][1] = projection[state_size];
    inputs.projection[j][2] = projection[2 * state_size];
  }
}

// h_prev W_h^T for the step's active rows, in parts: thread (part, unit,
// tile) sums the 16-byte chunks part, part + dot_split, ... of the state for
// kTileRows rows and the unit's three gates, into partial_sums (threads of
// consecutive units read rows of W_h an odd number of chunks apart: no bank
// conflict; those of one tile share the h rows). h_prev's rows are
// `h_stride` apart, zero past the state: in shared memory (`pitch`), or
// with kFromGlobal in global memory (h_exchange's, read at L2; no row past
// the active ones read).
template <typename T, int kTileRows, bool kFromGlobal = false>
__device__ __forceinline__ void recurrent_matvec(const ForwardShared<T>& shared,
                                                 const acc_t<T>* h_prev, int64_t h_stride,
                                                 const BlockSlice& slice, int active,
                                                 int dot_split) {
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
    // Offsets in h_prev (rows past the active ones: the last active row's, not
    // used); within a group's rows, which a block's shared memory or its
    // pairs bound, far below 2^31.
    int h_rows[kTileRows];
#pragma unroll
    for (int r = 0; r < kTileRows; ++r) {
      const int row = tile * kTileRows + r;
      h_rows[r] = (row < active ? row : active - 1) * static_cast<int>(h_stride);
    }
    // Rows a pass over the chunks sums at once: the tile's, but two at a
    // time of float64 read in global memory (four rows' sums and loads in
    // flight would not fit in the registers).
    constexpr int kPassRows = kFromGlobal && sizeof(M) == 8 && kTileRows > 2 ? 2 : kTileRows;
#pragma unroll
    for (int first = 0; first < kTileRows; first += kPassRows) {
      M sums[kPassRows][3] = {};  // (row of the pass, gate)
      for (int chunk = part; chunk < chunks; chunk += dot_split) {
        const Chunk w_input = load_pack<kChunk>(w_row + chunk * kChunk);
        const Chunk w_output = load_pack<kChunk>(w_row + units * pitch + chunk * kChunk);
        const Chunk w_candidate = load_pack<kChunk>(w_row + 2 * units * pitch + chunk * kChunk);
#pragma unroll
        for (int r = 0; r < kPassRows; ++r) {
          M h[kChunk];
          load_math_elements<kChunk, kFromGlobal>(h_prev + h_rows[first + r] + chunk * kChunk, h);
#pragma unroll
          for (int v = 0; v < kChunk; ++v) {
            sums[r][0] += h[v] * M(w_input.v[v]);
            sums[r][1] += h[v] * M(w_output.v[v]);
            sums[r][2] += h[v] * M(w_candidate.v[v]);
          }
        }
      }
#pragma unroll
      for (int r = 0; r < kPassRows; ++r) {
        const int row = tile * kTileRows + first + r;
        if (row >= active) continue;
#pragma unroll
        for (int gate = 0; gate < 3; ++gate) {
          shared.partial_sums[((part * rows + row) * 3 + gate) * units + unit] = sums[r][gate];
        }
      }
    }
  }
}

// The same partial sums on the tensor cores (lltm_cuda_tensor_cores.cuh):
// the slice's 3U rows of W_h times h_prev (the step's active rows, as
// recurrent_matvec reads them), the state split `dot_split` ways along the
// instructions' steps. Plans of kTensorCoreTileRows: 16-bit dtypes, and
// float32 in TF32.
template <typename T, bool kFromGlobal = false>
__device__ __forceinline__ void recurrent_matvec_tensor_cores(const ForwardShared<T>& shared,
                                                              const float* h_prev, int64_t h_stride,
                                                              const BlockSlice& slice, int active,
                                                              int dot_split) {
  const int gate_rows = 3 * slice.units_per_block;
  const int rows = slice.rows_per_group;
  float* partial_sums = shared.partial_sums;
  const auto h_at = [&](int row, int unit) {
    const float* at = h_prev + row * h_stride + unit;
    if constexpr (kFromGlobal) {
      return load_from_blocks(at);
    } else {
      return *at;
    }
  };
  tensor_core_product<T>(shared.weight_slice, /*m_stride=*/slice.pitch, /*k_stride=*/1, h_at,
                         gate_rows, active, slice.state_size, dot_split,
                         [&](int part, int gate_row, int row, float value) {
                           partial_sums[(part * rows + row) * gate_rows + gate_row] = value;
                         });
}

// The step's partial sums: on the tensor cores where the plan takes them
// (`tensor_cores`: in 16 bits kTileRows, where the block's slice of W_h is
// finite; float32 in TF32), else on the CUDA cores.
template <typename T, int kTileRows, bool kFromGlobal>
__device__ __forceinline__ void recurrent_products(const ForwardShared<T>& shared,
                                                   const acc_t<T>* h_prev, int64_t h_stride,
                                                   const BlockSlice& slice, int active,
                                                   int dot_split, bool tensor_cores) {
  if constexpr (kTf32Switch<T, kTileRows>) {
    if (tensor_cores) {
      recurrent_matvec_tensor_cores<T, kFromGlobal>(shared, h_prev, h_stride, slice, active,
                                                    dot_split);
    } else {
      recurrent_matvec<T, 1, kFromGlobal>(shared, h_prev, h_stride, slice, active, dot_split);
    }
  } else if constexpr (kTileRows == kTensorCoreTileRows) {
    if (tensor_cores) {
      recurrent_matvec_tensor_cores<T, kFromGlobal>(shared, h_prev, h_stride, slice, active,
                                                    dot_split);
    } else {
      recurrent_matvec<T, 1, kFromGlobal>(shared, h_prev, h_stride, slice, active, dot_split);
    }
  } else {
    recurrent_matvec<T, kTileRows, kFromGlobal>(shared, h_prev, h_stride, slice, active, dot_split);
  }
}

// The cell of each active pair of the thread: its pre-activations (the
// input projection plus the dot product's parts, added in part order), the
// activations, the new cell and h, written to gates, output and cells as the
// per-step path writes them (rounded to T; gates and cells only where given,
// the output always) and kept as the pair's running state (not rounded):
// nothing else reads gates and cells, so the state and the output are the
// same bits either way. The new h also goes to the exchange, but after the
// last step (h_next null): in cluster mode into `h_next` of every block of
// the cluster, in cooperative mode into `h_next` in global memory where
// h_exchange is used (16-bit, h_from_global).
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
    if (args.gates != nullptr) {  // the same for every thread: no divergence
      T* gates = args.gates + input_row * 3 * state_size + column;
      gates[0] = T(pre[0]);
      gates[state_size] = T(pre[1]);
      gates[2 * state_size] = T(pre[2]);
      args.cells[input_row * state_size + column] = T(c_new);
    }
    args.output[input_row * state_size + column] = T(h_new);
    shared.running_cell[pair] = c_new;
    shared.running_h[pair] = h_new;
    if (h_next == nullptr) continue;
    if constexpr (Exchange::kCluster) {
      M* to = h_next + row * slice.pitch + column;
      for (unsigned block = 0; block < gridDim.x; ++block) *Exchange::peer(to, block) = h_new;
    } else {
      h_next[(slice.first_row + row) * args.h_exchange_pitch + column] = h_new;
    }
  }
}

// The step's new h to every block of the group (not after the last step):
// the barrier, after which in cluster mode each block's next buffer holds
// it; in cooperative mode each block reads the step's h of the group's
// active rows back into its one buffer, from `output` (16-bit: from
// `h_sent`, where the cells wrote it in float32), and waits until all of it
// is there; where h is read from global memory, `h_sent` holds it for the
// products already.
template <typename T, typename Exchange>
__device__ __forceinline__ void exchange_h(const ForwardArgs<T>& args,
                                           const ForwardShared<T>& shared, const BlockSlice& slice,
                                           const Step& step, int active, const acc_t<T>* h_sent) {
  using M = acc_t<T>;
  Exchange::sync();
  if constexpr (!Exchange::kCluster) {
    if (args.h_from_global) return;
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
__device__ __forceinline__ void run_forward(const ForwardArgs<T>& args) {
  const BlockSlice slice =
      block_slice(Exchange::rank(), args.rows_begin, args.rows_end, args.state_size,
                  args.units_per_block, args.rows_per_group, args.pitch);
  const ForwardShared<T> shared = forward_shared<T>(args.layout, slice);
  constexpr bool kTensorCores = kTileRows == kTensorCoreTileRows;
  const unsigned* non_finite_weights =
      load_weight_slice_flagged<kTensorCores>(shared.weight_slice, slice, args.layout, args.weights,
                                              args.weights_row_stride, args.weights_column_stride);
  load_initial_state<T, Exchange>(args, shared, slice);
  const ThreadPairs pairs = pairs_of_thread(slice);
  // h0 in h_exchange is every block's: the grid barrier.
  const bool h_from_global = !Exchange::kCluster && args.h_from_global;
  if (h_from_global) {
    Exchange::sync();
  } else {
    Exchange::start();
  }
  // Block-uniform: every warp of the block takes the same product.
  const bool tensor_cores =
      kTensorCores ? *non_finite_weights == 0 : kTf32Switch<T, kTileRows> && args.tf32;

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
    if constexpr (Exchange::kCluster) {
      // Step k reads h buffer k mod 2 and pushes into the other.
      recurrent_products<T, kTileRows, false>(shared, shared.h_buffers + int(k & 1) * h_buffer_size,
                                              slice.pitch, slice, active, args.dot_split,
                                              tensor_cores);
    } else if (h_from_global) {
      // Step k reads h_exchange's buffer (k + 1) mod 2 (h0, or step k - 1's h).
      const int64_t pitch = args.h_exchange_pitch;
      const M* h_prev =
          args.h_exchange + int((k + 1) & 1) * args.batch_size * pitch + slice.first_row * pitch;
      recurrent_products<T, kTileRows, true>(shared, h_prev, pitch, slice, active, args.dot_split,
                                             tensor_cores);
    } else {
      recurrent_products<T, kTileRows, false>(shared, shared.h_buffers, slice.pitch, slice, active,
                                              args.dot_split, tensor_cores);
    }
    __syncthreads();
    // Where the step's h goes for the next step: none after the last, nor
    // in cooperative mode where `output` holds it exactly.
    M* h_next = nullptr;
    if (!last && Exchange::kCluster) {
      h_next = shared.h_buffers + int((k + 1) & 1) * h_buffer_size;
    } else if (!last && (kWidened<T> || h_from_global)) {
      h_next = args.h_exchange + int(k & 1) * args.batch_size * args.h_exchange_pitch;
    }
    cell_step<T, Exchange>(args, shared, slice, pairs, inputs, step, active, h_next);
    if (!last) exchange_h<T, Exchange>(args, shared, slice, step, active, h_next);
    step = next;
    inputs = next_inputs;
  }
  store_final_state(args, shared, slice);
}

template <typename T, int kTileRows, typename Exchange>
LLTM_PERSISTENT_KERNEL sequence_forward_kernel(const LLTM_GRID_CONSTANT ForwardArgs<T> args) {
  if constexpr (kKernelLaunchable<T, kTileRows>) {
    run_forward<T, kTileRows, Exchange>(args);
  } else {
    __trap();
  }
}

}  // namespace lltm::cuda::persistent
