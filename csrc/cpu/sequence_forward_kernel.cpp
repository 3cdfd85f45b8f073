// CPU implementation of lltm::sequence_forward. The same computation as
// csrc/cuda/lltm_cuda_sequence_forward.cu's, organised for a CPU core: gates =
// input @ W_x^T for all steps at once (one GEMM, straight into the saved
// `gates`), then step by step: gates_t += h_prev @ W_h^T and the cell's
// pointwise pass, which activates gates_t in place and writes output_t and
// cells_t. The bias joins the pre-activations in the GEMMs, as in the cell.
// In float and double the sequence's fused steps (fused_steps/) do both in
// one pass per step (sequence_common.h).
//
// lltm::sequence_inference is the same computation keeping nothing for a
// backward (Outputs below): no gates, and the cells only as each row's
// running cell, in c_n. The fused steps then hold each step's gates in
// registers only; the 16-bit path's GEMM writes a step's gates into one
// step's worth of scratch. The arithmetic is the training call's, so the
// outputs are the same bits. (The float path without fused kernels, MSVC's,
// keeps the projection GEMM over all steps and so the gates' buffer.)
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/Dispatch_v2.h>
#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>

#include <algorithm>
#include <optional>
#include <tuple>
#include <type_traits>
#include <vector>

#include "../lltm_sequence.h"
#include "../lltm_sequence_checks.h"
#include "../lltm_tensor.h"
#include "fused_steps/dispatch.h"
#include "pointwise/row_passes.h"
#include "sequence_common.h"
#include "torch_calls.h"

namespace lltm::cpu {
namespace {

// Where a call's results go. Training: every step's gates and cells, which
// the backward reads. Inference (running_cells): `cells` is c_n, each row's
// latest cell, updated in place step by step; `gates` is only scratch the
// path may need (the 16-bit step's GEMM output; the projection of the float
// path without fused kernels), and undefined where none is.
struct Outputs {
  Tensor output;
  Tensor gates;
  Tensor cells;
  bool running_cells;
};

// The forward of every step with the fused kernels (fused_steps/dispatch.h).
template <typename T>
void fused_forward_steps(const RecurrentKernels<T>& kernels, const SequenceSizes& n,
                         const Schedule& schedule, const Tensor& input_rows, const Tensor& weights,
                         const std::optional<Tensor>& bias, const Tensor& old_h,
                         const Tensor& old_cell, const Outputs& out) {
  const int64_t S = n.state;
  const ForwardPanels<T> panels(
      static_cast<const T*>(weights.data_ptr()), weights.stride(0), weights.stride(1),
      bias.has_value() ? static_cast<const T*>(bias->data_ptr()) : nullptr,
      bias.has_value() ? bias->stride(0) : 0, S, n.features, kernels.lanes);
  const RunOrder order(schedule);
  const ForwardSteps<T> steps{order.view(),
                              S,
                              n.features,
                              static_cast<const T*>(input_rows.data_ptr()),
                              input_rows.stride(0),
                              static_cast<const T*>(old_h.data_ptr()),
                              old_h.stride(0),
                              static_cast<const T*>(old_cell.data_ptr()),
                              old_cell.stride(0),
                              old_cell.stride(1),
                              out.running_cells ? nullptr : static_cast<T*>(out.gates.data_ptr()),
                              static_cast<T*>(out.output.data_ptr()),
                              static_cast<T*>(out.cells.data_ptr()),
                              out.running_cells,
                              &panels};
  const RowBlocks blocks =
      split_rows(n.batch, n.rows * (S + n.features) * 3 * S, kernels.block_rows);
  blocks.run(n.batch,
             [&](int64_t, int64_t first, int64_t last) { kernels.forward(steps, first, last); });
}

// Whether sequence_forward_steps runs the fused steps for this element type.
template <typename scalar_t>
bool runs_fused_steps() {
  if constexpr (kHasFusedSteps<scalar_t>) return recurrent_kernels<scalar_t>() != nullptr;
  return false;
}

// `input_rows` is the input as (rows, features) with contiguous rows; `old_h`
// has contiguous rows; `old_cell` any strides.
template <typename scalar_t>
void sequence_forward_steps(const SequenceSizes& n, const Schedule& schedule,
                            const Tensor& input_rows, const Tensor& weights,
                            const std::optional<Tensor>& bias, const Tensor& old_h,
                            const Tensor& old_cell, const Outputs& outputs) {
  if constexpr (kHasFusedSteps<scalar_t>) {
    if (const RecurrentKernels<scalar_t>* kernels = recurrent_kernels<scalar_t>()) {
      fused_forward_steps<scalar_t>(*kernels, n, schedule, input_rows, weights, bias, old_h,
                                    old_cell, outputs);
      return;
    }
  }
  using T = acc_t<scalar_t>;
  const int64_t S = n.state;
  Tensor gates = outputs.gates;  // a handle: the GEMMs write through it
  const bool running = outputs.running_cells;
  scalar_t* out = static_cast<scalar_t*>(outputs.output.data_ptr());
  scalar_t* g = static_cast<scalar_t*>(gates.data_ptr());
  scalar_t* c1 = static_cast<scalar_t*>(outputs.cells.data_ptr());
  const Matrix<const scalar_t> h_init = matrix_of<const scalar_t>(old_h);  // contiguous rows
  const Matrix<const scalar_t> c_init = matrix_of<const scalar_t>(old_cell);
  const scalar_t* input_data = static_cast<const scalar_t*>(input_rows.data_ptr());
  const int64_t input_row_stride = input_rows.stride(0);
  // Row r's state before the k-th step: that of the step run before when it
  // had the row, else the initial one.
  auto h_prev = [&](int64_t k, int64_t r) -> const scalar_t* {
    if (r < schedule.previous_size(k)) return out + (schedule.previous_start(k) + r) * S;
    return h_init.row(r);
  };
  // Row r's cell in the step whose first row is `start` (running cells:
  // row r of c_n in every step).
  auto cell_row = [&](int64_t start, int64_t r) { return c1 + ((running ? 0 : start) + r) * S; };
  auto c_prev = [&](int64_t k, int64_t r) -> RowRef<const scalar_t> {
    if (r < schedule.previous_size(k)) return {cell_row(schedule.previous_start(k), r), 1};
    return {c_init.row(r), c_init.col_stride};
  };
  // torch's GEMM. In 16-bit, each step as the cell does it: [h_prev, x_t]
  // and one GEMM with the bias, so that the pre-activations are rounded once
  // and step t is exactly lltm::forward on step t. In float and double, one
  // GEMM for every step's projection and bias, and per step one more that
  // adds h_prev @ W_h^T.
  constexpr bool kOneGemmPerStep = !std::is_same_v<scalar_t, T>;
  // The first row of the k-th step's gates: in 16-bit inference the step's
  // gates are the scratch's first rows.
  const bool step_scratch = kOneGemmPerStep && running;
  auto gates_start = [&](int64_t start) { return step_scratch ? 0 : start; };
  // The pointwise pass of rows [first, end) of the k-th step. (With running
  // cells, forward_row reads each element of c_prev before writing it.)
  auto pointwise = [&](ForwardBuffers<T>& buf, int64_t k, int64_t first, int64_t end) {
    const int64_t start = schedule.starts[schedule.step(k)];
    for (int64_t r = first; r < end; ++r) {
      const int64_t row = start + r;
      forward_row(buf, g + (gates_start(start) + r) * 3 * S, c_prev(k, r), out + row * S,
                  cell_row(start, r), S);
    }
  };

  const Tensor w_h_transposed = transposed(column_block(weights, 0, S, false));
  std::optional<Tensor> step_input;  // [h_prev, x_t] of a whole step
  if (kOneGemmPerStep) {
    step_input = new_matrix(input_rows, n.batch, S + n.features);
  } else if (n.rows > 0 && S > 0) {
    linear_out(gates, bias, input_rows, transposed(column_block(weights, S, n.features, false)));
  }
  for (int64_t k = 0; k < schedule.steps(); ++k) {
    const int64_t t = schedule.step(k);
    const int64_t size = schedule.sizes[t];
    const int64_t start = schedule.starts[t];
    const int64_t previous = schedule.previous_size(k);
    const int64_t previous_start = schedule.previous_start(k);
    if (size > 0 && kOneGemmPerStep) {
      scalar_t* in = static_cast<scalar_t*>(step_input->data_ptr());
      for (int64_t r = 0; r < size; ++r) {
        std::copy(h_prev(k, r), h_prev(k, r) + S, in + r * (S + n.features));
        const scalar_t* input_row = input_data + (start + r) * input_row_stride;
        std::copy(input_row, input_row + n.features, in + r * (S + n.features) + S);
      }
      Tensor step_gates = reshaped_view(gates, size, 3 * S, 3 * S, 1, gates_start(start) * 3 * S);
      linear_out(step_gates, bias,
                 reshaped_view(*step_input, size, S + n.features, S + n.features, 1),
                 transposed(weights));
    } else if (size > 0) {
      // The previous rows in contiguous blocks: the previous step's, then
      // (going in reverse over packed sequences) rows joining now.
      const int64_t carried = std::min(size, previous);
      if (carried > 0) {
        Tensor first_rows = reshaped_view(gates, carried, 3 * S, 3 * S, 1, start * 3 * S);
        addmm_out(first_rows, first_rows,
                  reshaped_view(outputs.output, carried, S, S, 1, previous_start * S),
                  w_h_transposed, 1.0);
      }
      if (size > carried) {
        Tensor joining =
            reshaped_view(gates, size - carried, 3 * S, 3 * S, 1, (start + carried) * 3 * S);
        const Tensor h_rows = reshaped_view(old_h, size - carried, S, old_h.stride(0),
                                            old_h.stride(1), carried * old_h.stride(0));
        addmm_out(joining, joining, h_rows, w_h_transposed, 1.0);
      }
    }
    auto rows = [&](int64_t first, int64_t end) {
      ForwardBuffers<T> buf;
      pointwise(buf, k, first, end);
    };
    if (worth_parallel(size * S)) {
      const int64_t grain = std::max<int64_t>(1, kMinParallelElements / std::max<int64_t>(S, 1));
      torch::stable::parallel_for(0, size, grain, rows);
    } else {
      rows(0, size);
    }
  }
}

// Each sequence's state after its last step (the initial one if it had none).
// `steps_data` holds every step's rows; running, it is final_state itself,
// whose rows that ran hold their last state already.
template <typename scalar_t>
void gather_final_state(const SequenceSizes& n, const Schedule& schedule, const Tensor& steps_data,
                        const Tensor& initial, Tensor& final_state, bool running) {
  const int64_t S = n.state;
  std::vector<int64_t> last_row(n.batch, -1);
  for (int64_t k = 0; k < schedule.steps(); ++k) {
    const int64_t t = schedule.step(k);
    for (int64_t r = 0; r < schedule.sizes[t]; ++r) last_row[r] = schedule.starts[t] + r;
  }
  const scalar_t* from = static_cast<const scalar_t*>(steps_data.data_ptr());
  const Matrix<const scalar_t> init = matrix_of<const scalar_t>(initial);
  scalar_t* to = static_cast<scalar_t*>(final_state.data_ptr());
  for (int64_t r = 0; r < n.batch; ++r) {
    if (last_row[r] < 0) {
      for (int64_t j = 0; j < S; ++j) to[r * S + j] = init.row(r)[j * init.col_stride];
    } else if (!running) {
      std::copy(from + last_row[r] * S, from + (last_row[r] + 1) * S, to + r * S);
    }
  }
}

// Both operators: sequence_forward keeps every step's gates and cells for
// the backward; sequence_inference (keep_for_backward false) neither, its
// cells running in c_n.
struct SequenceResults {
  Tensor output, h_n, c_n, gates, cells;
};

SequenceResults run_sequence(const Tensor& input, const Tensor& weights,
                             const std::optional<Tensor>& bias, const Tensor& old_h,
                             const Tensor& old_cell, const std::optional<Tensor>& batch_sizes,
                             bool reverse, bool keep_for_backward) {
  const SequenceSizes n = check_sequence_args(input, weights, bias, old_h, old_cell, batch_sizes);
  selected_isa();  // a bad LLTM_CPU_ISA raises here, outside any parallel region
  const Schedule schedule(sequence_batch_sizes(batch_sizes, n), reverse);
  const auto dtype = input.scalar_type();
  SequenceResults results;
  results.output = new_sequence_tensor(input, n, n.state);
  results.h_n = new_matrix(input, n.batch, n.state);
  results.c_n = new_matrix(input, n.batch, n.state);
  Outputs outputs{as_rows(results.output, n), Tensor(), Tensor(), !keep_for_backward};
  if (keep_for_backward) {
    results.gates = new_sequence_tensor(input, n, 3 * n.state);
    results.cells = new_sequence_tensor(input, n, n.state);
    outputs.gates = as_rows(results.gates, n);
    outputs.cells = as_rows(results.cells, n);
  } else {
    // Scratch for the gates where the path needs some (Outputs).
    bool fused = false;
    THO_DISPATCH_V2(dtype, "lltm_sequence_inference_cpu",
                    AT_WRAP([&] { fused = runs_fused_steps<scalar_t>(); }), AT_FLOATING_TYPES,
                    torch::headeronly::ScalarType::Half, torch::headeronly::ScalarType::BFloat16);
    const bool sixteen_bit = is_16_bit(input);
    const int64_t gate_rows = fused ? 0 : (sixteen_bit ? n.batch : n.rows);
    outputs.gates = new_matrix(input, gate_rows, 3 * n.state);
    outputs.cells = results.c_n;
  }
  // The GEMMs read the input and h0 as whole rows; c0 is read in place.
  Tensor input_rows = as_rows(input, n);
  if (input_rows.stride(1) != 1) input_rows = dense(input_rows);
  const Tensor dense_old_h = dense(old_h);
  THO_DISPATCH_V2(dtype, "lltm_sequence_forward_cpu", AT_WRAP([&] {
                    sequence_forward_steps<scalar_t>(n, schedule, input_rows, weights, bias,
                                                     dense_old_h, old_cell, outputs);
                    gather_final_state<scalar_t>(n, schedule, outputs.output, old_h, results.h_n,
                                                 false);
                    gather_final_state<scalar_t>(n, schedule, outputs.cells, old_cell, results.c_n,
                                                 outputs.running_cells);
                  }),
                  AT_FLOATING_TYPES, torch::headeronly::ScalarType::Half,
                  torch::headeronly::ScalarType::BFloat16);
  return results;
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> sequence_forward(
    Tensor input, Tensor weights, std::optional<Tensor> bias, Tensor old_h, Tensor old_cell,
    std::optional<Tensor> batch_sizes, bool reverse, bool /*allow_tf32: the CPU has no TF32*/) {
  SequenceResults r = run_sequence(input, weights, bias, old_h, old_cell, batch_sizes, reverse,
                                   /*keep_for_backward=*/true);
  return {r.output, r.h_n, r.c_n, r.gates, r.cells};
}

std::tuple<Tensor, Tensor, Tensor> sequence_inference(Tensor input, Tensor weights,
                                                      std::optional<Tensor> bias, Tensor old_h,
                                                      Tensor old_cell,
                                                      std::optional<Tensor> batch_sizes,
                                                      bool reverse, bool /*allow_tf32*/) {
  SequenceResults r = run_sequence(input, weights, bias, old_h, old_cell, batch_sizes, reverse,
                                   /*keep_for_backward=*/false);
  return {r.output, r.h_n, r.c_n};
}

}  // namespace
}  // namespace lltm::cpu

STABLE_TORCH_LIBRARY_IMPL(lltm, CPU, m) {
  m.impl("sequence_forward", TORCH_BOX(&lltm::cpu::sequence_forward));
  m.impl("sequence_inference", TORCH_BOX(&lltm::cpu::sequence_inference));
}
