// CPU implementation of lltm::sequence_backward and lltm::sequence_gate_grads
// (the backward's loop through time alone). The same computation as
// csrc/cuda/lltm_cuda_sequence_backward.cu's, organised for a CPU core: step by
// step, last first, the cell's pointwise backward into d_gates_t and the
// gradient of c_prev, then the gradient of h_prev = d_gates_t @ W_h. After
// the loop, over all steps at once: grad_weights = d_gates^T @ [h_prev, input]
// (one GEMM), grad_input = d_gates @ W_x (one GEMM); grad_bias is summed along
// the way. In float and double the sequence's fused steps (fused_steps/) run
// the loop (sequence_common.h).
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

// What the steps of the unfused backward need, made once per call.
template <typename scalar_t, typename T = acc_t<scalar_t>>
struct BackwardWorkspace {
  BackwardBuffers<T> buf;
  std::vector<T> grad_h;            // one row: the gradient reaching h_t
  std::vector<scalar_t> grad_cell;  // one row: the gradient of c_prev
  std::vector<T> bias_partial;      // d_gates summed over up to kFoldRows rows
  std::vector<double> bias_total;   // ... and over every step
  int64_t rows_in_partial = 0;      // rows in bias_partial not yet in bias_total

  explicit BackwardWorkspace(int64_t state)
      : grad_h(state), grad_cell(state), bias_partial(3 * state), bias_total(3 * state) {}

  void fold() {
    for (size_t j = 0; j < bias_partial.size(); ++j) bias_total[j] += bias_partial[j];
    std::fill(bias_partial.begin(), bias_partial.end(), T(0));
    rows_in_partial = 0;
  }
};

// Backpropagation through time with the fused kernels (fused_steps/dispatch.h).
template <typename T>
void fused_backward_steps(const RecurrentKernels<T>& kernels, const SequenceSizes& n,
                          const Schedule& schedule, const std::optional<Tensor>& grad_output,
                          const Tensor& gates, const Tensor& cells, const Tensor& weights,
                          Tensor& d_gates, Tensor& grad_h, Tensor& grad_cell, T* grad_bias,
                          bool want_old_h) {
  const int64_t S = n.state;
  const BackwardPanels<T> panels(static_cast<const T*>(weights.data_ptr()), weights.stride(0),
                                 weights.stride(1), S, kernels.lanes);
  const RunOrder order(schedule);
  BackwardSteps<T> steps{order.view(),
                         S,
                         grad_output.has_value(),
                         {},
                         sequence_rows<const T>(gates, n),
                         sequence_rows<const T>(cells, n),
                         static_cast<T*>(d_gates.data_ptr()),
                         static_cast<T*>(grad_h.data_ptr()),
                         static_cast<T*>(grad_cell.data_ptr()),
                         &panels,
                         want_old_h};
  if (grad_output.has_value()) steps.grad_output = sequence_rows<const T>(*grad_output, n);
  const RowBlocks blocks = split_rows(n.batch, n.rows * 3 * S * S, kernels.block_rows);
  // grad_bias: each block's column sums in double, added up at the end.
  std::vector<double> sums(grad_bias != nullptr ? blocks.count * 3 * S : 0, 0.0);
  blocks.run(n.batch, [&](int64_t block, int64_t first, int64_t last) {
    kernels.backward(steps, first, last, sums.empty() ? nullptr : sums.data() + block * 3 * S);
  });
  if (grad_bias != nullptr) {
    for (int64_t j = 0; j < 3 * S; ++j) {
      double total = 0;
      for (int64_t b = 0; b < blocks.count; ++b) total += sums[b * 3 * S + j];
      grad_bias[j] = static_cast<T>(total);
    }
  }
}

template <typename scalar_t>
void sequence_backward_steps(const SequenceSizes& n, const Schedule& schedule,
                             const std::optional<Tensor>& grad_output, const Tensor& gates,
                             const Tensor& cells, const Tensor& weights, Tensor& d_gates,
                             Tensor& grad_h, Tensor& grad_cell, scalar_t* grad_bias,
                             bool want_old_h) {
  if constexpr (kHasFusedSteps<scalar_t>) {
    if (const RecurrentKernels<scalar_t>* kernels = recurrent_kernels<scalar_t>()) {
      fused_backward_steps<scalar_t>(*kernels, n, schedule, grad_output, gates, cells, weights,
                                     d_gates, grad_h, grad_cell, grad_bias, want_old_h);
      return;
    }
  }
  using T = acc_t<scalar_t>;
  const int64_t S = n.state;
  const SequenceRows<const scalar_t> g = sequence_rows<const scalar_t>(gates, n);
  const SequenceRows<const scalar_t> c1 = sequence_rows<const scalar_t>(cells, n);
  std::optional<SequenceRows<const scalar_t>> dy;
  if (grad_output.has_value()) dy = sequence_rows<const scalar_t>(*grad_output, n);
  scalar_t* dg = static_cast<scalar_t*>(d_gates.data_ptr());  // contiguous (rows, 3S)
  scalar_t* dh = static_cast<scalar_t*>(grad_h.data_ptr());   // contiguous (batch, S)
  scalar_t* dc = static_cast<scalar_t*>(grad_cell.data_ptr());
  const Tensor w_h_view = column_block(weights, 0, S, false);
  BackwardWorkspace<scalar_t> ws(S);

  // d_gates of rows [first, end) of step t and the gradient of c_prev (into
  // grad_cell); their d_gates also join the workspace's grad_bias sums.
  auto pointwise = [&](int64_t start, int64_t first, int64_t end) {
    T* bias = ws.bias_partial.data();
    for (int64_t r = first; r < end; ++r) {
      const int64_t row = start + r;
      // The gradient reaching h_t: through output_t and through h_t's use by
      // the step after (in grad_h).
      for (int64_t j = 0; j < S; j += kSpanColumns) {
        const int64_t len = std::min(kSpanColumns, S - j);
        T* sum = ws.grad_h.data() + j;
        const T* carried = load_span(dh + r * S + j, 1, len, ws.buf.grad_h);
        std::copy(carried, carried + len, sum);
        if (dy.has_value()) {
          const RowRef<const scalar_t> y = dy->row(row);
          const T* direct = load_span(y.at(j), y.stride, len, ws.buf.grad_cell);
          for (int64_t q = 0; q < len; ++q) sum[q] += direct[q];
        }
      }
      for (int64_t j = 0; j < S; j += kSpanColumns) {
        backward_span(ws.buf, RowRef<const T>{ws.grad_h.data(), 1},
                      RowRef<const scalar_t>{dc + r * S, 1}, c1.row(row), g.row(row),
                      dg + row * 3 * S, ws.grad_cell.data(), bias + j, bias + S + j,
                      bias + 2 * S + j, S, j, std::min(kSpanColumns, S - j));
      }
      std::copy(ws.grad_cell.begin(), ws.grad_cell.end(), dc + r * S);
      if (++ws.rows_in_partial == kFoldRows) ws.fold();
    }
  };

  for (int64_t k = schedule.steps() - 1; k >= 0; --k) {
    const int64_t t = schedule.step(k);
    const int64_t size = schedule.sizes[t];
    const int64_t start = schedule.starts[t];
    pointwise(start, 0, size);
    if (size > 0 && (k > 0 || want_old_h)) {
      Tensor dh_rows = reshaped_view(grad_h, size, S, S, 1, 0);
      addmm_out(dh_rows, dh_rows, reshaped_view(d_gates, size, 3 * S, 3 * S, 1, start * 3 * S),
                w_h_view, 0.0);
    }
  }
  if (grad_bias != nullptr) {
    ws.fold();
    for (int64_t j = 0; j < 3 * S; ++j) grad_bias[j] = static_cast<scalar_t>(ws.bias_total[j]);
  }
}

template <typename Element>
void copy_row(RowRef<const Element> from, int64_t count, Element* to) {
  if (from.stride == 1) {
    std::copy(from.data, from.data + count, to);
  } else {
    for (int64_t j = 0; j < count; ++j) to[j] = *from.at(j);
  }
}

// [h_prev, input] of every row: the left factor of grad_weights.
template <typename scalar_t>
void previous_state_and_input(const SequenceSizes& n, const Schedule& schedule,
                              const Tensor& output, const Tensor& old_h, const Tensor& input,
                              Tensor& h_prev_and_input) {
  const int64_t S = n.state, F = n.features;
  const SequenceRows<const scalar_t> y = sequence_rows<const scalar_t>(output, n);
  const SequenceRows<const scalar_t> in = sequence_rows<const scalar_t>(input, n);
  const Matrix<const scalar_t> h0 = matrix_of<const scalar_t>(old_h);
  scalar_t* out = static_cast<scalar_t*>(h_prev_and_input.data_ptr());
  for (int64_t k = 0; k < schedule.steps(); ++k) {
    const int64_t t = schedule.step(k);
    const int64_t previous = k == 0 ? 0 : schedule.sizes[schedule.step(k - 1)];
    const int64_t previous_start = k == 0 ? 0 : schedule.starts[schedule.step(k - 1)];
    for (int64_t r = 0; r < schedule.sizes[t]; ++r) {
      scalar_t* row = out + (schedule.starts[t] + r) * (S + F);
      const RowRef<const scalar_t> h = r < previous
                                           ? y.row(previous_start + r)
                                           : RowRef<const scalar_t>{h0.row(r), h0.col_stride};
      copy_row(h, S, row);
      copy_row(in.row(schedule.starts[t] + r), F, row + S);
    }
  }
}

// Backpropagation through time: every step's d_gates (in the layout of
// `gates`, and as (rows, 3S)), and the gradients of old_h and old_cell (the
// running gradients of the state after the first step); grad_bias too when
// it is given.
struct ThroughTime {
  Tensor d_gates, d_gate_rows, grad_h, grad_cell;
};

ThroughTime backward_through_time(const SequenceSizes& n, const Schedule& schedule,
                                  const std::optional<Tensor>& grad_output,
                                  const std::optional<Tensor>& grad_h_n,
                                  const std::optional<Tensor>& grad_c_n, const Tensor& gates,
                                  const Tensor& cells, const Tensor& input, const Tensor& weights,
                                  std::optional<Tensor>& grad_bias, bool want_old_h) {
  const int64_t S = n.state;
  // The running gradients of the state, which end as those of old_h, old_cell.
  const Tensor d_gates = new_sequence_tensor(input, n, 3 * S);
  ThroughTime result{d_gates, as_rows(d_gates, n), new_matrix(input, n.batch, S),
                     new_matrix(input, n.batch, S)};
  THO_DISPATCH_V2(input.scalar_type(), "lltm_sequence_backward_cpu", AT_WRAP([&] {
                    for (auto [from, to] :
                         {std::pair{&grad_h_n, &result.grad_h}, {&grad_c_n, &result.grad_cell}}) {
                      scalar_t* d = static_cast<scalar_t*>(to->data_ptr());
                      if (!from->has_value()) {
                        std::fill(d, d + n.batch * S, scalar_t(0));
                      } else if (n.batch * S > 0) {
                        copy_columns(*to, **from, 0);
                      }
                    }
                    sequence_backward_steps<scalar_t>(
                        n, schedule, grad_output, gates, cells, weights, result.d_gate_rows,
                        result.grad_h, result.grad_cell,
                        grad_bias ? static_cast<scalar_t*>(grad_bias->data_ptr()) : nullptr,
                        want_old_h);
                  }),
                  AT_FLOATING_TYPES, torch::headeronly::ScalarType::Half,
                  torch::headeronly::ScalarType::BFloat16);
  return result;
}

using Grads = std::tuple<std::optional<Tensor>, std::optional<Tensor>, std::optional<Tensor>,
                         std::optional<Tensor>, std::optional<Tensor>>;

Grads sequence_backward(std::optional<Tensor> grad_output, std::optional<Tensor> grad_h_n,
                        std::optional<Tensor> grad_c_n, Tensor output, Tensor gates, Tensor cells,
                        Tensor input, Tensor weights, Tensor old_h,
                        std::optional<Tensor> batch_sizes, bool reverse,
                        std::vector<bool> output_mask, bool /*allow_tf32: the CPU has no TF32*/) {
  const SequenceSizes n = check_sequence_backward_args(
      grad_output, grad_h_n, grad_c_n, output, gates, cells, input, weights, old_h, batch_sizes);
  const GradMask want = check_output_mask(output_mask);
  selected_isa();  // a bad LLTM_CPU_ISA raises here, outside any parallel region
  const Schedule schedule(sequence_batch_sizes(batch_sizes, n), reverse);
  const int64_t S = n.state;
  std::optional<Tensor> grad_bias;
  if (want.bias) grad_bias = new_vector(weights, 3 * S);
  ThroughTime through_time =
      backward_through_time(n, schedule, grad_output, grad_h_n, grad_c_n, gates, cells, input,
                            weights, grad_bias, want.old_h);
  const Tensor& d_gates = through_time.d_gate_rows;

  std::optional<Tensor> grad_input, grad_weights;
  if (want.weights) {
    grad_weights = new_matrix(weights, 3 * S, S + n.features);
    Tensor h_prev_and_input = new_matrix(input, n.rows, S + n.features);
    THO_DISPATCH_V2(input.scalar_type(), "lltm_sequence_grad_weights_cpu", AT_WRAP([&] {
                      previous_state_and_input<scalar_t>(n, schedule, output, old_h, input,
                                                         h_prev_and_input);
                    }),
                    AT_FLOATING_TYPES, torch::headeronly::ScalarType::Half,
                    torch::headeronly::ScalarType::BFloat16);
    addmm_out(*grad_weights, *grad_weights, transposed(d_gates), h_prev_and_input, 0.0);
  }
  if (want.input) {
    grad_input = new_sequence_tensor(input, n, n.features);
    Tensor rows = as_rows(*grad_input, n);
    addmm_out(rows, rows, d_gates, column_block(weights, S, n.features, false), 0.0);
  }
  return {grad_input, grad_weights, grad_bias,
          want.old_h ? std::optional<Tensor>(through_time.grad_h) : std::nullopt,
          want.old_cell ? std::optional<Tensor>(through_time.grad_cell) : std::nullopt};
}

std::tuple<Tensor, Tensor, Tensor> sequence_gate_grads(std::optional<Tensor> grad_output,
                                                       std::optional<Tensor> grad_h_n,
                                                       std::optional<Tensor> grad_c_n,
                                                       Tensor output, Tensor gates, Tensor cells,
                                                       Tensor input, Tensor weights, Tensor old_h,
                                                       std::optional<Tensor> batch_sizes,
                                                       bool reverse, bool /*allow_tf32*/) {
  const SequenceSizes n = check_sequence_backward_args(
      grad_output, grad_h_n, grad_c_n, output, gates, cells, input, weights, old_h, batch_sizes);
  selected_isa();
  const Schedule schedule(sequence_batch_sizes(batch_sizes, n), reverse);
  std::optional<Tensor> no_bias;
  ThroughTime through_time =
      backward_through_time(n, schedule, grad_output, grad_h_n, grad_c_n, gates, cells, input,
                            weights, no_bias, /*want_old_h=*/true);
  return {through_time.d_gates, through_time.grad_h, through_time.grad_cell};
}

}  // namespace
}  // namespace lltm::cpu

STABLE_TORCH_LIBRARY_IMPL(lltm, CPU, m) {
  m.impl("sequence_backward", TORCH_BOX(&lltm::cpu::sequence_backward));
  m.impl("sequence_gate_grads", TORCH_BOX(&lltm::cpu::sequence_gate_grads));
}
