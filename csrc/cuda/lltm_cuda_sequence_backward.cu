// CUDA implementation of lltm::sequence_backward and
// lltm::sequence_gate_grads (the CPU's compute the same, organised for a
// core: csrc/cpu/sequence_backward_kernel.cpp): every step's gate gradients and the gradients of
// old_h and old_cell in one persistent launch where the plan allows
// (lltm_cuda_persistent.cuh), else step by step, last first, one fused
// kernel for d_gates_t and the gradient of c_prev (in place), then the
// gradient of h_prev = d_gates_t @ W_h (lltm_cuda_recurrent.cuh;
// sequence_gate_grads is this alone). After the recurrence, as many device
// operations whatever the length: grad_weights = d_gates^T @ [h_prev, input]
// from views of output, old_h and input (lltm_cuda_sequence_weights.cuh),
// grad_input = d_gates @ W_x (one GEMM) and grad_bias = a column sum of
// d_gates (16-bit: each step's d_gates summed in float32 before they are
// rounded, as on the CPU). See lltm_cuda_sequence.cuh.
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/Dispatch_v2.h>
#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>

#include <algorithm>
#include <optional>
#include <tuple>
#include <vector>

#include "../lltm_sequence.h"
#include "../lltm_sequence_checks.h"
#include "../lltm_tensor.h"
#include "lltm_cuda_launch.cuh"
#include "lltm_cuda_persistent.h"
#include "lltm_cuda_persistent_measuring.h"
#include "lltm_cuda_pointwise.cuh"
#include "lltm_cuda_recurrent.cuh"
#include "lltm_cuda_runtime.h"
#include "lltm_cuda_sequence.cuh"
#include "lltm_cuda_sequence_weights.cuh"
#include "lltm_cuda_tf32_gemm.cuh"
#include "lltm_cuda_torch_ops.cuh"

namespace lltm::cuda {
namespace {

// d_gates of `rows` rows of one step and the gradient of c_prev, in place in
// grad_cell. The gradient reaching h_t is grad_h (through h_t's use by the
// step after) plus grad_output (through output_t; may be null).
// d_gates_math: see store_d_gates (null: not wanted).
template <typename scalar_t>
__global__ void sequence_backward_kernel(const scalar_t* __restrict__ grad_h,
                                         const scalar_t* __restrict__ grad_output,
                                         scalar_t* grad_cell, const scalar_t* __restrict__ new_cell,
                                         const scalar_t* __restrict__ gates,
                                         scalar_t* __restrict__ d_gates,
                                         acc_t<scalar_t>* __restrict__ d_gates_math, int64_t rows,
                                         int64_t state) {
  using T = acc_t<scalar_t>;
  for_each_pack<1>(rows, state, [&](int64_t r, int64_t j) {
    const scalar_t* g = gates + r * 3 * state;
    const int64_t e = r * state + j;
    T dh = T(grad_h[e]);
    if (grad_output != nullptr) dh += T(grad_output[e]);
    Pack<T, 1> d[3];
    T d_c;
    backward_math<T>(dh, T(grad_cell[e]), T(new_cell[e]), T(g[j]), T(g[state + j]),
                     T(g[2 * state + j]), d[0].v[0], d[1].v[0], d[2].v[0], d_c);
    store_d_gates<scalar_t, 1>(d_gates, d_gates_math, r * 3 * state + j, state, d);
    grad_cell[e] = d_c;
  });
}

template <typename scalar_t>
void sequence_backward_pointwise(const Tensor& grad_h, const std::optional<Tensor>& grad_output,
                                 Tensor& grad_cell, const Tensor& new_cell, const Tensor& gates,
                                 Tensor& d_gates, std::optional<Tensor>& d_gates_math, int64_t rows,
                                 int64_t state) {
  if (rows == 0 || state == 0) return;
  const int32_t device = gates.get_device_index();
  const RowTiling t = row_tiling(rows, state, device);
  const cudaError_t error =
      LLTM_LAUNCH(t.grid, t.block, current_stream(device), sequence_backward_kernel<scalar_t>)(
          grad_h.const_data_ptr<scalar_t>(),
          grad_output ? grad_output->const_data_ptr<scalar_t>() : nullptr,
          grad_cell.mutable_data_ptr<scalar_t>(), new_cell.const_data_ptr<scalar_t>(),
          gates.const_data_ptr<scalar_t>(), d_gates.mutable_data_ptr<scalar_t>(),
          d_gates_math ? d_gates_math->mutable_data_ptr<acc_t<scalar_t>>() : nullptr, rows, state);
  check_launch("lltm sequence_backward_kernel", error);
}

// Backpropagation through time: every step's d_gates (in the layout of
// `gates`, and as (rows, 3S)), the gradients of old_h and old_cell (the
// running gradients of the state after the first step run) and, when
// wanted, grad_bias. Without want_old_h the first step's product with W_h,
// which only gives grad_old_h, is skipped. `allow_tf32`: the products with
// W_h in TF32, three terms, where tf32_products says so.
struct ThroughTime {
  Tensor d_gates, d_gate_rows, grad_h, grad_c;
  std::optional<Tensor> grad_bias;
};

ThroughTime backward_through_time(const SequenceSizes& n, const Schedule& schedule,
                                  const std::optional<Tensor>& grad_output,
                                  const std::optional<Tensor>& grad_h_n,
                                  const std::optional<Tensor>& grad_c_n, const Tensor& gates,
                                  const Tensor& cells, const Tensor& input, const Tensor& weights,
                                  bool want_bias, bool want_old_h, bool allow_tf32) {
  const int64_t S = n.state;
  const bool tf32 = tf32_products(allow_tf32, input);
  const Tensor gates_rows = as_rows(dense(gates), n, 3 * S);
  const Tensor cells_rows = as_rows(dense(cells), n, S);
  Tensor d_gates = new_sequence_tensor(input, n, 3 * S);
  ThroughTime result{d_gates, as_rows(d_gates, n, 3 * S), new_matrix(input, n.batch, S),
                     new_matrix(input, n.batch, S), std::nullopt};
  // The persistent kernel reads grad_output through its strides (a
  // broadcast one, from output.sum(), is never expanded). 16-bit: grad_bias
  // from its float32 sums, rounded once.
  std::optional<Tensor> persistent_bias_sums;
  if (persistent_sequence_backward(n, schedule, grad_output, grad_h_n, grad_c_n, gates_rows,
                                   cells_rows, weights, d_gates,
                                   want_old_h ? &result.grad_h : nullptr, result.grad_c,
                                   want_bias ? &persistent_bias_sums : nullptr, tf32)) {
    if (want_bias) {
      result.grad_bias = persistent_bias_sums
                             ? rounded_like(column_sums(*persistent_bias_sums), input)
                             : column_sums(result.d_gate_rows);
    }
    return result;
  }
  std::optional<Tensor> grad_output_rows;
  if (grad_output.has_value()) {
    grad_output_rows = as_rows(dense(*grad_output), n, S);
  }
  // The running gradients of the state, which end as those of old_h, old_cell.
  for (auto [from, to] : {std::pair{&grad_h_n, &result.grad_h}, {&grad_c_n, &result.grad_c}}) {
    if (from->has_value()) {
      copy_into(*to, **from);
    } else {
      fill_zeros(*to);
    }
  }
  RecurrentProduct recurrent_product(column_block(weights, 0, S, false), n.batch, tf32);
  // 16-bit: each step's d_gates in float32 as well (a step's worth, reused),
  // added up for grad_bias by a product with a row of ones: bias_sums +=
  // ones[:size] @ d_gates_math[:size], in float32.
  std::optional<Tensor> d_gates_math, bias_sums, ones;
  if (want_bias && is_16_bit(input) && n.rows > 0) {
    d_gates_math = new_float_matrix(input, n.batch, 3 * S);
    bias_sums = new_float_matrix(input, 1, 3 * S);
    fill_zeros(*bias_sums);
    ones = new_float_matrix(input, 1, n.batch);
    fill_ones(*ones);
  }

  for (int64_t k = schedule.steps() - 1; k >= 0; --k) {
    const int64_t t = schedule.step(k);
    const int64_t size = schedule.sizes[t];
    const int64_t start = schedule.starts[t];
    if (size == 0) continue;
    Tensor dg = row_block(result.d_gate_rows, start, size);
    Tensor dh = row_block(result.grad_h, 0, size);
    Tensor dc = row_block(result.grad_c, 0, size);
    std::optional<Tensor> dy;
    if (grad_output_rows) dy = row_block(*grad_output_rows, start, size);
    THO_DISPATCH_V2(input.scalar_type(), "lltm_sequence_backward_cuda", AT_WRAP([&] {
                      sequence_backward_pointwise<scalar_t>(
                          dh, dy, dc, row_block(cells_rows, start, size),
                          row_block(gates_rows, start, size), dg, d_gates_math, size, S);
                    }),
                    AT_FLOATING_TYPES, torch::headeronly::ScalarType::Half,
                    torch::headeronly::ScalarType::BFloat16);
    if (d_gates_math && S > 0) {
      addmm_out(*bias_sums, *bias_sums, column_block(*ones, 0, size, false),
                row_block(*d_gates_math, 0, size), 1.0);
    }
    if (k > 0 || want_old_h) recurrent_product(dh, dg, /*accumulate=*/false);
  }
  if (want_bias) {
    result.grad_bias =
        bias_sums ? rounded_like(as_vector(*bias_sums), input) : column_sums(result.d_gate_rows);
  }
  return result;
}

// backward_through_time under the plan measured for such a call where
// torch.backends.cudnn.benchmark is set (lltm_cuda_persistent_measuring.h):
// each run allocates its own gradients, so the candidates' runs leave
// nothing behind in what the call returns.
ThroughTime measured_through_time(const SequenceSizes& n, const Schedule& schedule,
                                  const std::optional<Tensor>& grad_output,
                                  const std::optional<Tensor>& grad_h_n,
                                  const std::optional<Tensor>& grad_c_n, const Tensor& gates,
                                  const Tensor& cells, const Tensor& input, const Tensor& weights,
                                  bool want_bias, bool want_old_h, bool allow_tf32) {
  const auto run = [&] {
    return backward_through_time(n, schedule, grad_output, grad_h_n, grad_c_n, gates, cells, input,
                                 weights, want_bias, want_old_h, allow_tf32);
  };
  if (!measuring()) return run();
  return with_measured_plan(
      measured_call(MeasuredPass::kBackward, input, n, schedule, tf32_products(allow_tf32, input)),
      run);
}

using Grads = std::tuple<std::optional<Tensor>, std::optional<Tensor>, std::optional<Tensor>,
                         std::optional<Tensor>, std::optional<Tensor>>;

Grads sequence_backward(std::optional<Tensor> grad_output, std::optional<Tensor> grad_h_n,
                        std::optional<Tensor> grad_c_n, Tensor output, Tensor gates, Tensor cells,
                        Tensor input, Tensor weights, Tensor old_h,
                        std::optional<Tensor> batch_sizes, bool reverse,
                        std::vector<bool> output_mask, bool allow_tf32) {
  const SequenceSizes n = check_sequence_backward_args(
      grad_output, grad_h_n, grad_c_n, output, gates, cells, input, weights, old_h, batch_sizes);
  const GradMask want = check_output_mask(output_mask);
  const Schedule schedule(sequence_batch_sizes(batch_sizes, n), reverse);
  const DeviceGuard guard(input.get_device_index());
  const int64_t S = n.state;
  ThroughTime through_time =
      measured_through_time(n, schedule, grad_output, grad_h_n, grad_c_n, gates, cells, input,
                            weights, want.bias, want.old_h, allow_tf32);
  const Tensor& d_gates = through_time.d_gate_rows;

  std::optional<Tensor> grad_input, grad_weights;
  if (want.weights) {
    grad_weights = new_matrix(weights, 3 * S, S + n.features);
    sequence_weights_grad(*grad_weights, d_gates, n, schedule, output, input, old_h);
  }
  if (want.input) {
    grad_input = new_sequence_tensor(input, n, n.features);
    Tensor rows = as_rows(*grad_input, n, n.features);
    const Tensor w_x = column_block(weights, S, n.features, false);
    // In TF32, three terms (lltm_cuda_tf32_gemm.cuh), as the forward's
    // input projection: the gradient of the input is no less accurate than
    // float32's either.
    if (tf32_products(allow_tf32, input)) {
      Tf32Product(w_x, n.rows).run(rows, d_gates, 0.0);
    } else {
      addmm_out(rows, rows, d_gates, w_x, 0.0);
    }
  }
  return {grad_input, grad_weights, through_time.grad_bias,
          want.old_h ? std::optional<Tensor>(through_time.grad_h) : std::nullopt,
          want.old_cell ? std::optional<Tensor>(through_time.grad_c) : std::nullopt};
}

std::tuple<Tensor, Tensor, Tensor> sequence_gate_grads(std::optional<Tensor> grad_output,
                                                       std::optional<Tensor> grad_h_n,
                                                       std::optional<Tensor> grad_c_n,
                                                       Tensor output, Tensor gates, Tensor cells,
                                                       Tensor input, Tensor weights, Tensor old_h,
                                                       std::optional<Tensor> batch_sizes,
                                                       bool reverse, bool allow_tf32) {
  const SequenceSizes n = check_sequence_backward_args(
      grad_output, grad_h_n, grad_c_n, output, gates, cells, input, weights, old_h, batch_sizes);
  const Schedule schedule(sequence_batch_sizes(batch_sizes, n), reverse);
  const DeviceGuard guard(input.get_device_index());
  ThroughTime through_time =
      measured_through_time(n, schedule, grad_output, grad_h_n, grad_c_n, gates, cells, input,
                            weights, /*want_bias=*/false, /*want_old_h=*/true, allow_tf32);
  return {through_time.d_gates, through_time.grad_h, through_time.grad_c};
}

}  // namespace
}  // namespace lltm::cuda

LLTM_CUDA_KERNELS(m) {
  m.impl("sequence_backward", TORCH_BOX(&lltm::cuda::sequence_backward));
  m.impl("sequence_gate_grads", TORCH_BOX(&lltm::cuda::sequence_gate_grads));
}
