// CPU implementation of lltm::forward and lltm::backward.
//
// Structure, mirrored by csrc/cuda/lltm_cuda.cu function for function:
//   forward:  gates = old_h @ W_h^T + input @ W_x^T   (two GEMMs, one buffer:
//             the [old_h, input] concatenation is never materialised)
//             then one fused pointwise pass that adds the bias, activates the
//             gates in place and writes new_h and new_cell.
//   backward: one fused pointwise pass producing d_gates and grad_old_cell,
//             then the GEMMs for grad_weights, grad_old_h and grad_input.
// 16-bit inputs are computed in float32; GEMMs go through torch.
#include <torch/csrc/inductor/aoti_torch/generated/c_shim_cpu.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/Dispatch_v2.h>
#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>

#include <tuple>

#include "../lltm_checks.h"
#include "lltm_cpu_math.h"

namespace lltm::cpu {
namespace {

using torch::stable::Tensor;

// out = beta * self + mat1 @ mat2 (self may alias out).
void addmm_out(Tensor& out, const Tensor& self, const Tensor& mat1,
               const Tensor& mat2, double beta) {
  TORCH_ERROR_CODE_CHECK(
      aoti_torch_cpu_addmm_out(out.get(), self.get(), mat1.get(), mat2.get(), beta, 1.0));
}

// Rows handed to one thread at a time: enough work to amortise the task.
int64_t grain_rows(int64_t state_size) {
  const int64_t target_elements = 1 << 14;
  const int64_t per_row = state_size > 0 ? 3 * state_size : 1;
  return target_elements / per_row + 1;
}

template <typename scalar_t>
void forward_pointwise(Tensor& gates, const Tensor& bias, const Tensor& old_cell,
                       Tensor& new_h, Tensor& new_cell, int64_t batch,
                       int64_t state) {
  scalar_t* g = gates.mutable_data_ptr<scalar_t>();
  const scalar_t* b = bias.const_data_ptr<scalar_t>();
  const scalar_t* c0 = old_cell.const_data_ptr<scalar_t>();
  scalar_t* h1 = new_h.mutable_data_ptr<scalar_t>();
  scalar_t* c1 = new_cell.mutable_data_ptr<scalar_t>();
  torch::stable::parallel_for(0, batch, grain_rows(state), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      forward_row<scalar_t>(g + row * 3 * state, b, c0 + row * state,
                            h1 + row * state, c1 + row * state, state);
    }
  });
}

template <typename scalar_t>
void backward_pointwise(const Tensor& grad_h, const Tensor& grad_cell,
                        const Tensor& new_cell, const Tensor& gates,
                        Tensor& d_gates, Tensor& grad_old_cell, int64_t batch,
                        int64_t state) {
  const scalar_t* dh = grad_h.const_data_ptr<scalar_t>();
  const scalar_t* dc = grad_cell.const_data_ptr<scalar_t>();
  const scalar_t* c1 = new_cell.const_data_ptr<scalar_t>();
  const scalar_t* g = gates.const_data_ptr<scalar_t>();
  scalar_t* dg = d_gates.mutable_data_ptr<scalar_t>();
  scalar_t* dc0 = grad_old_cell.mutable_data_ptr<scalar_t>();
  torch::stable::parallel_for(0, batch, grain_rows(state), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      backward_row<scalar_t>(dh + row * state, dc + row * state,
                             c1 + row * state, g + row * 3 * state,
                             dg + row * 3 * state, dc0 + row * state, state);
    }
  });
}

std::tuple<Tensor, Tensor, Tensor> forward(Tensor input, Tensor weights,
                                           Tensor bias, Tensor old_h,
                                           Tensor old_cell) {
  const Sizes n = check_forward_args(input, weights, bias, old_h, old_cell);
  // Columns [0, S) of the weights multiply old_h, columns [S, S + F) input.
  const Tensor w_h_t = torch::stable::transpose(torch::stable::narrow(weights, 1, 0, n.state), 0, 1);
  const Tensor w_x_t = torch::stable::transpose(torch::stable::narrow(weights, 1, n.state, n.features), 0, 1);

  Tensor gates = torch::stable::new_empty(input, {n.batch, 3 * n.state});
  addmm_out(gates, gates, old_h, w_h_t, /*beta=*/0.0);
  addmm_out(gates, gates, input, w_x_t, /*beta=*/1.0);

  // The pointwise pass reads rows densely; these are no-ops when contiguous.
  const Tensor bias_c = torch::stable::contiguous(bias);
  const Tensor old_cell_c = torch::stable::contiguous(old_cell);
  Tensor new_h = torch::stable::new_empty(input, {n.batch, n.state});
  Tensor new_cell = torch::stable::new_empty(input, {n.batch, n.state});
  THO_DISPATCH_V2(input.scalar_type(), "lltm_forward_cpu", AT_WRAP([&] {
    forward_pointwise<scalar_t>(gates, bias_c, old_cell_c, new_h, new_cell, n.batch, n.state);
  }), AT_FLOATING_TYPES, torch::headeronly::ScalarType::Half, torch::headeronly::ScalarType::BFloat16);
  return {new_h, new_cell, gates};
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> backward(
    Tensor grad_h, Tensor grad_cell, Tensor new_cell, Tensor gates,
    Tensor input, Tensor old_h, Tensor weights) {
  const Sizes n = check_backward_args(grad_h, grad_cell, new_cell, gates, input, old_h, weights);
  const Tensor grad_h_c = torch::stable::contiguous(grad_h);
  const Tensor grad_cell_c = torch::stable::contiguous(grad_cell);
  const Tensor new_cell_c = torch::stable::contiguous(new_cell);
  const Tensor gates_c = torch::stable::contiguous(gates);

  Tensor d_gates = torch::stable::new_empty(input, {n.batch, 3 * n.state});
  Tensor grad_old_cell = torch::stable::new_empty(input, {n.batch, n.state});
  THO_DISPATCH_V2(input.scalar_type(), "lltm_backward_cpu", AT_WRAP([&] {
    backward_pointwise<scalar_t>(grad_h_c, grad_cell_c, new_cell_c, gates_c, d_gates, grad_old_cell, n.batch, n.state);
  }), AT_FLOATING_TYPES, torch::headeronly::ScalarType::Half, torch::headeronly::ScalarType::BFloat16);

  const Tensor d_gates_t = torch::stable::transpose(d_gates, 0, 1);
  // grad_weights = d_gates^T @ [old_h, input], written block by block.
  Tensor grad_weights = torch::stable::new_empty(weights, {3 * n.state, n.state + n.features});
  Tensor grad_w_h = torch::stable::narrow(grad_weights, 1, 0, n.state);
  Tensor grad_w_x = torch::stable::narrow(grad_weights, 1, n.state, n.features);
  addmm_out(grad_w_h, grad_w_h, d_gates_t, old_h, /*beta=*/0.0);
  addmm_out(grad_w_x, grad_w_x, d_gates_t, input, /*beta=*/0.0);
  const int64_t batch_dim[] = {0};
  Tensor grad_bias = torch::stable::sum(d_gates, torch::headeronly::IntHeaderOnlyArrayRef(batch_dim, 1));

  // grad_[old_h, input] = d_gates @ W, again block by block.
  Tensor grad_old_h = torch::stable::new_empty(input, {n.batch, n.state});
  Tensor grad_input = torch::stable::new_empty(input, {n.batch, n.features});
  addmm_out(grad_old_h, grad_old_h, d_gates, torch::stable::narrow(weights, 1, 0, n.state), 0.0);
  addmm_out(grad_input, grad_input, d_gates, torch::stable::narrow(weights, 1, n.state, n.features), 0.0);
  return {grad_input, grad_weights, grad_bias, grad_old_h, grad_old_cell};
}

}  // namespace
}  // namespace lltm::cpu

STABLE_TORCH_LIBRARY_IMPL(lltm, CPU, m) {
  m.impl("forward", TORCH_BOX(&lltm::cpu::forward));
  m.impl("backward", TORCH_BOX(&lltm::cpu::backward));
}
