// CUDA implementation of lltm::forward and lltm::backward, mirroring
// csrc/cpu/lltm_cpu.cpp function for function:
//   forward:  gates = [old_h, input] @ W^T   (one GEMM through torch, written
//             straight into the `gates` output: one rounding of the
//             pre-activations, as in the reference, also for 16-bit types)
//             then one fused pointwise kernel that adds the bias, activates
//             the gates in place and writes new_h, new_cell.
//   backward: one fused pointwise kernel producing d_gates and grad_old_cell,
//             then the GEMMs for grad_weights, grad_old_h and grad_input, and
//             a torch sum for grad_bias (the CPU folds that sum into its
//             pointwise pass; here a column reduction across thread blocks
//             would cost more than the separate, bandwidth-bound sum).
// Everything runs on the tensors' device and on torch's current stream there.
// 16-bit inputs are computed in float32, float64 in double.
#include <cuda_runtime.h>
#include <torch/csrc/inductor/aoti_torch/generated/c_shim_cuda.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/Dispatch_v2.h>
#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>

#include <optional>
#include <tuple>
#include <vector>

#include "../lltm_checks.h"
#include "../lltm_tensor.h"
#include "lltm_cuda_launch.cuh"
#include "lltm_cuda_math.cuh"

namespace lltm::cuda {
namespace {

using torch::stable::Tensor;

// out = beta * self + mat1 @ mat2 (self may alias out), on the current stream.
void addmm_out(Tensor& out, const Tensor& self, const Tensor& mat1,
               const Tensor& mat2, double beta) {
  TORCH_ERROR_CODE_CHECK(
      aoti_torch_cuda_addmm_out(out.get(), self.get(), mat1.get(), mat2.get(), beta, 1.0));
}

// [old_h, input] as one (batch, state + features) matrix, copied on the
// current stream by torch: one GEMM instead of two in each direction.
Tensor concat_h_x(const Tensor& old_h, const Tensor& input, const Sizes& n) {
  Tensor x = new_matrix(input, n.batch, n.state + n.features);
  Tensor x_h = column_block(x, 0, n.state, false);
  Tensor x_x = column_block(x, n.state, n.features, false);
  torch::stable::copy_(x_h, old_h);
  torch::stable::copy_(x_x, input);
  return x;
}

// Row r of gates starts at r * 3 * state; its three gate blocks are `state`
// apart. Every other matrix has rows of `state` elements.
template <typename scalar_t, int kVec>
__global__ void forward_kernel(scalar_t* __restrict__ gates,
                               const scalar_t* __restrict__ bias,
                               const scalar_t* __restrict__ old_cell,
                               scalar_t* __restrict__ new_h,
                               scalar_t* __restrict__ new_cell, int64_t batch,
                               int64_t state) {
  using P = Pack<scalar_t, kVec>;
  const int64_t row_stride = int64_t(gridDim.y) * blockDim.y;
  const int64_t col_stride = int64_t(gridDim.x) * blockDim.x * kVec;
  for (int64_t row = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; row < batch; row += row_stride) {
    scalar_t* g = gates + row * 3 * state;
    const int64_t offset = row * state;
    for (int64_t j = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * kVec; j < state; j += col_stride) {
      P i = load_pack<kVec>(g + j);
      P o = load_pack<kVec>(g + state + j);
      P c = load_pack<kVec>(g + 2 * state + j);
      const P b_i = load_pack<kVec>(bias + j);
      const P b_o = load_pack<kVec>(bias + state + j);
      const P b_g = load_pack<kVec>(bias + 2 * state + j);
      const P c0 = load_pack<kVec>(old_cell + offset + j);
      P h1, c1;
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        forward_element(i.v[k], o.v[k], c.v[k], b_i.v[k], b_o.v[k], b_g.v[k],
                        c0.v[k], h1.v[k], c1.v[k]);
      }
      store_pack<kVec>(g + j, i);
      store_pack<kVec>(g + state + j, o);
      store_pack<kVec>(g + 2 * state + j, c);
      store_pack<kVec>(new_h + offset + j, h1);
      store_pack<kVec>(new_cell + offset + j, c1);
    }
  }
}

template <typename scalar_t, int kVec>
__global__ void backward_kernel(const scalar_t* __restrict__ grad_h,
                                const scalar_t* __restrict__ grad_cell,
                                const scalar_t* __restrict__ new_cell,
                                const scalar_t* __restrict__ gates,
                                scalar_t* __restrict__ d_gates,
                                scalar_t* __restrict__ grad_old_cell,
                                int64_t batch, int64_t state) {
  using P = Pack<scalar_t, kVec>;
  const int64_t row_stride = int64_t(gridDim.y) * blockDim.y;
  const int64_t col_stride = int64_t(gridDim.x) * blockDim.x * kVec;
  for (int64_t row = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; row < batch; row += row_stride) {
    const scalar_t* g = gates + row * 3 * state;
    scalar_t* dg = d_gates + row * 3 * state;
    const int64_t offset = row * state;
    for (int64_t j = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * kVec; j < state; j += col_stride) {
      const P dh = load_pack<kVec>(grad_h + offset + j);
      const P dc = load_pack<kVec>(grad_cell + offset + j);
      const P c1 = load_pack<kVec>(new_cell + offset + j);
      const P i = load_pack<kVec>(g + j);
      const P o = load_pack<kVec>(g + state + j);
      const P c = load_pack<kVec>(g + 2 * state + j);
      P d_i, d_o, d_c, dc0;
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        backward_element(dh.v[k], dc.v[k], c1.v[k], i.v[k], o.v[k], c.v[k],
                         d_i.v[k], d_o.v[k], d_c.v[k], dc0.v[k]);
      }
      store_pack<kVec>(dg + j, d_i);
      store_pack<kVec>(dg + state + j, d_o);
      store_pack<kVec>(dg + 2 * state + j, d_c);
      store_pack<kVec>(grad_old_cell + offset + j, dc0);
    }
  }
}

// Launch helpers: a launch written inside a THO_DISPATCH_V2 body breaks the
// macro, so each dtype's launch lives in these templates.
template <typename scalar_t>
void forward_pointwise(Tensor& gates, const Tensor& bias, const Tensor& old_cell,
                       Tensor& new_h, Tensor& new_cell, int64_t batch,
                       int64_t state) {
  if (batch == 0 || state == 0) return;
  scalar_t* g = gates.mutable_data_ptr<scalar_t>();
  const scalar_t* b = bias.const_data_ptr<scalar_t>();
  const scalar_t* c0 = old_cell.const_data_ptr<scalar_t>();
  scalar_t* h1 = new_h.mutable_data_ptr<scalar_t>();
  scalar_t* c1 = new_cell.mutable_data_ptr<scalar_t>();
  const int32_t device = gates.get_device_index();
  const cudaStream_t stream = current_stream(device);
  constexpr int kVec = kWidePack<scalar_t>;
  if (rows_fit_wide_packs<scalar_t>(state, {g, b, c0, h1, c1})) {
    const RowTiling t = row_tiling(batch, state / kVec, device);
    forward_kernel<scalar_t, kVec><<<t.grid, t.block, 0, stream>>>(g, b, c0, h1, c1, batch, state);
  } else {
    const RowTiling t = row_tiling(batch, state, device);
    forward_kernel<scalar_t, 1><<<t.grid, t.block, 0, stream>>>(g, b, c0, h1, c1, batch, state);
  }
  check_launch("lltm forward_kernel");
}

template <typename scalar_t>
void backward_pointwise(const Tensor& grad_h, const Tensor& grad_cell,
                        const Tensor& new_cell, const Tensor& gates,
                        Tensor& d_gates, Tensor& grad_old_cell, int64_t batch,
                        int64_t state) {
  if (batch == 0 || state == 0) return;
  const scalar_t* dh = grad_h.const_data_ptr<scalar_t>();
  const scalar_t* dc = grad_cell.const_data_ptr<scalar_t>();
  const scalar_t* c1 = new_cell.const_data_ptr<scalar_t>();
  const scalar_t* g = gates.const_data_ptr<scalar_t>();
  scalar_t* dg = d_gates.mutable_data_ptr<scalar_t>();
  scalar_t* dc0 = grad_old_cell.mutable_data_ptr<scalar_t>();
  const int32_t device = gates.get_device_index();
  const cudaStream_t stream = current_stream(device);
  constexpr int kVec = kWidePack<scalar_t>;
  if (rows_fit_wide_packs<scalar_t>(state, {dh, dc, c1, g, dg, dc0})) {
    const RowTiling t = row_tiling(batch, state / kVec, device);
    backward_kernel<scalar_t, kVec><<<t.grid, t.block, 0, stream>>>(dh, dc, c1, g, dg, dc0, batch, state);
  } else {
    const RowTiling t = row_tiling(batch, state, device);
    backward_kernel<scalar_t, 1><<<t.grid, t.block, 0, stream>>>(dh, dc, c1, g, dg, dc0, batch, state);
  }
  check_launch("lltm backward_kernel");
}

std::tuple<Tensor, Tensor, Tensor> forward(Tensor input, Tensor weights,
                                           Tensor bias, Tensor old_h,
                                           Tensor old_cell) {
  const Sizes n = check_forward_args(input, weights, bias, old_h, old_cell);
  // Allocations, GEMMs and kernels all go to the tensors' device.
  const torch::stable::accelerator::DeviceGuard guard(input.get_device_index());
  Tensor gates = new_matrix(input, n.batch, 3 * n.state);
  // The GEMM writes the pre-activations (bias not yet added) into `gates`,
  // which the pointwise kernel then overwrites with the activations.
  addmm_out(gates, gates, concat_h_x(old_h, input, n), transposed(weights), /*beta=*/0.0);

  // The pointwise kernel reads rows densely; these are no-ops when contiguous.
  const Tensor bias_c = torch::stable::contiguous(bias);
  const Tensor old_cell_c = torch::stable::contiguous(old_cell);
  Tensor new_h = new_matrix(input, n.batch, n.state);
  Tensor new_cell = new_matrix(input, n.batch, n.state);
  THO_DISPATCH_V2(input.scalar_type(), "lltm_forward_cuda", AT_WRAP([&] {
    forward_pointwise<scalar_t>(gates, bias_c, old_cell_c, new_h, new_cell, n.batch, n.state);
  }), AT_FLOATING_TYPES, torch::headeronly::ScalarType::Half, torch::headeronly::ScalarType::BFloat16);
  return {new_h, new_cell, gates};
}

using Grads = std::tuple<std::optional<Tensor>, std::optional<Tensor>, std::optional<Tensor>,
                         std::optional<Tensor>, std::optional<Tensor>>;

Grads backward(Tensor grad_h, Tensor grad_cell, Tensor new_cell, Tensor gates,
               Tensor input, Tensor old_h, Tensor weights,
               std::vector<bool> output_mask) {
  const Sizes n = check_backward_args(grad_h, grad_cell, new_cell, gates, input, old_h, weights);
  const GradMask want = check_output_mask(output_mask);
  const torch::stable::accelerator::DeviceGuard guard(input.get_device_index());
  const Tensor grad_h_c = torch::stable::contiguous(grad_h);
  const Tensor grad_cell_c = torch::stable::contiguous(grad_cell);
  const Tensor new_cell_c = torch::stable::contiguous(new_cell);
  const Tensor gates_c = torch::stable::contiguous(gates);

  Tensor d_gates = new_matrix(input, n.batch, 3 * n.state);
  Tensor grad_old_cell = new_matrix(input, n.batch, n.state);
  THO_DISPATCH_V2(input.scalar_type(), "lltm_backward_cuda", AT_WRAP([&] {
    backward_pointwise<scalar_t>(grad_h_c, grad_cell_c, new_cell_c, gates_c, d_gates, grad_old_cell, n.batch, n.state);
  }), AT_FLOATING_TYPES, torch::headeronly::ScalarType::Half, torch::headeronly::ScalarType::BFloat16);

  // grad_weights = d_gates^T @ [old_h, input].
  std::optional<Tensor> grad_weights, grad_bias, grad_old_h, grad_input;
  if (want.weights) {
    grad_weights = new_matrix(weights, 3 * n.state, n.state + n.features);
    addmm_out(*grad_weights, *grad_weights, transposed(d_gates), concat_h_x(old_h, input, n), 0.0);
  }
  if (want.bias) {
    const int64_t batch_dim[] = {0};
    grad_bias = torch::stable::sum(d_gates, torch::headeronly::IntHeaderOnlyArrayRef(batch_dim, 1));
  }
  // grad_[old_h, input] = d_gates @ W, block by block, straight into the
  // outputs, each only when wanted.
  if (want.old_h) {
    grad_old_h = new_matrix(input, n.batch, n.state);
    addmm_out(*grad_old_h, *grad_old_h, d_gates, column_block(weights, 0, n.state, false), 0.0);
  }
  if (want.input) {
    grad_input = new_matrix(input, n.batch, n.features);
    addmm_out(*grad_input, *grad_input, d_gates, column_block(weights, n.state, n.features, false), 0.0);
  }
  return {grad_input, grad_weights, grad_bias, grad_old_h,
          want.old_cell ? std::optional<Tensor>(grad_old_cell) : std::nullopt};
}

}  // namespace
}  // namespace lltm::cuda

STABLE_TORCH_LIBRARY_IMPL(lltm, CUDA, m) {
  m.impl("forward", TORCH_BOX(&lltm::cuda::forward));
  m.impl("backward", TORCH_BOX(&lltm::cuda::backward));
}
