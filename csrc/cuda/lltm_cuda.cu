// CUDA implementation of lltm::forward and lltm::backward, with the structure
// of csrc/cpu/cell_kernel.cpp's:
//   forward:  gates = b + [old_h, input] @ W^T   (one GEMM through torch,
//             written straight into the `gates` output: one rounding of the
//             pre-activations, as in the reference, also for 16-bit types)
//             then one fused pointwise kernel that activates the input and
//             output gates in place and writes new_h, new_cell.
//   backward: one fused pointwise kernel producing d_gates and grad_old_cell,
//             then the GEMMs for grad_weights, grad_old_h and grad_input, and
//             a torch sum for grad_bias (the CPU folds that sum into its
//             pointwise pass; here a column reduction across thread blocks
//             would cost more than the separate, bandwidth-bound sum). For
//             16-bit types that sum is over d_gates in float32, before they
//             are rounded for the GEMMs, as on the CPU.
// Everything runs on the tensors' device and on torch's current stream there.
// 16-bit inputs are computed in float32, float64 in double.
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/Dispatch_v2.h>
#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>

#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "../lltm_checks.h"
#include "../lltm_tensor.h"
#include "lltm_cuda_device.h"
#include "lltm_cuda_launch.cuh"
#include "lltm_cuda_pointwise.cuh"
#include "lltm_cuda_runtime.h"
#include "lltm_cuda_torch_ops.cuh"

namespace lltm::cuda {
namespace {

using torch::stable::Tensor;

// [old_h, input] as one (batch, state + features) matrix, copied on the
// current stream by torch: one GEMM instead of two in each direction.
Tensor concat_h_x(const Tensor& old_h, const Tensor& input, const Sizes& n) {
  Tensor x = new_matrix(input, n.batch, n.state + n.features);
  Tensor x_h = column_block(x, 0, n.state, false);
  Tensor x_x = column_block(x, n.state, n.features, false);
  copy_into(x_h, old_h);
  copy_into(x_x, input);
  return x;
}

std::tuple<Tensor, Tensor, Tensor> forward(Tensor input, Tensor weights, std::optional<Tensor> bias,
                                           Tensor old_h, Tensor old_cell) {
  const Sizes n = check_forward_args(input, weights, bias, old_h, old_cell);
  // Allocations, GEMMs and kernels all go to the tensors' device.
  const DeviceGuard guard(input.get_device_index());
  Tensor gates = new_matrix(input, n.batch, 3 * n.state);
  // gates = bias + [old_h, input] @ W^T (no bias: None): the
  // pre-activations rounded once, as F.linear rounds them; the pointwise
  // kernel then activates them.
  linear_out(gates, bias, concat_h_x(old_h, input, n), transposed(weights));

  // The pointwise kernel reads rows densely.
  const Tensor old_cell_c = dense(old_cell);
  Tensor new_h = new_matrix(input, n.batch, n.state);
  Tensor new_cell = new_matrix(input, n.batch, n.state);
  THO_DISPATCH_V2(input.scalar_type(), "lltm_forward_cuda", AT_WRAP([&] {
                    forward_pointwise<scalar_t>(gates, old_cell_c, new_h, new_cell, n.batch,
                                                n.state);
                  }),
                  AT_FLOATING_TYPES, torch::headeronly::ScalarType::Half,
                  torch::headeronly::ScalarType::BFloat16);
  return {new_h, new_cell, gates};
}

using Grads = std::tuple<std::optional<Tensor>, std::optional<Tensor>, std::optional<Tensor>,
                         std::optional<Tensor>, std::optional<Tensor>>;

Grads backward(Tensor grad_h, Tensor grad_cell, Tensor new_cell, Tensor gates, Tensor input,
               Tensor old_h, Tensor weights, std::vector<bool> output_mask) {
  const Sizes n = check_backward_args(grad_h, grad_cell, new_cell, gates, input, old_h, weights);
  const GradMask want = check_output_mask(output_mask);
  const DeviceGuard guard(input.get_device_index());
  const Tensor grad_h_c = dense(grad_h);
  const Tensor grad_cell_c = dense(grad_cell);
  const Tensor new_cell_c = dense(new_cell);
  const Tensor gates_c = dense(gates);

  Tensor d_gates = new_matrix(input, n.batch, 3 * n.state);
  // 16-bit: d_gates in float32 as well, for grad_bias (see store_d_gates).
  std::optional<Tensor> d_gates_math;
  if (want.bias && is_16_bit(input)) d_gates_math = new_float_matrix(input, n.batch, 3 * n.state);
  Tensor grad_old_cell = new_matrix(input, n.batch, n.state);
  THO_DISPATCH_V2(input.scalar_type(), "lltm_backward_cuda", AT_WRAP([&] {
                    backward_pointwise<scalar_t>(grad_h_c, grad_cell_c, new_cell_c, gates_c,
                                                 d_gates, d_gates_math ? &*d_gates_math : nullptr,
                                                 grad_old_cell, n.batch, n.state);
                  }),
                  AT_FLOATING_TYPES, torch::headeronly::ScalarType::Half,
                  torch::headeronly::ScalarType::BFloat16);

  // grad_weights = d_gates^T @ [old_h, input], as two GEMMs into its column
  // blocks: no copy of [old_h, input] (the CPU makes one, cheaper there than
  // a second GEMM call; here it would be two more kernel launches).
  std::optional<Tensor> grad_weights, grad_bias, grad_old_h, grad_input;
  if (want.weights) {
    grad_weights = new_matrix(weights, 3 * n.state, n.state + n.features);
    Tensor w_h = column_block(*grad_weights, 0, n.state, false);
    Tensor w_x = column_block(*grad_weights, n.state, n.features, false);
    addmm_out(w_h, w_h, transposed(d_gates), old_h, 0.0);
    addmm_out(w_x, w_x, transposed(d_gates), input, 0.0);
  }
  if (want.bias) {
    grad_bias =
        d_gates_math ? rounded_like(column_sums(*d_gates_math), input) : column_sums(d_gates);
  }
  // grad_[old_h, input] = d_gates @ W, block by block, straight into the
  // outputs, each only when wanted.
  if (want.old_h) {
    grad_old_h = new_matrix(input, n.batch, n.state);
    addmm_out(*grad_old_h, *grad_old_h, d_gates, column_block(weights, 0, n.state, false), 0.0);
  }
  if (want.input) {
    grad_input = new_matrix(input, n.batch, n.features);
    addmm_out(*grad_input, *grad_input, d_gates, column_block(weights, n.state, n.features, false),
              0.0);
  }
  return {grad_input, grad_weights, grad_bias, grad_old_h,
          want.old_cell ? std::optional<Tensor>(grad_old_cell) : std::nullopt};
}

// Errors with which a GPU refuses the kernels' code for as long as the
// process lives: no code for its architecture, PTX its driver cannot compile.
// Any other error of the probe may pass (no memory for the context, a
// device busy in exclusive-process mode).
bool is_kernel_image_error(cudaError_t error) {
  return error == cudaErrorNoKernelImageForDevice || error == cudaErrorInvalidKernelImage ||
         error == cudaErrorInvalidPtx || error == cudaErrorUnsupportedPtxVersion;
}

// "sm_XY", or why the compute capability could not be read.
std::string architecture(int device) {
  int major = 0, minor = 0;
  cudaError_t error = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (error == cudaSuccess) {
    error = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  }
  if (error != cudaSuccess) {
    return std::string("compute capability unknown: ") + cudaGetErrorString(error);
  }
  return "sm_" + std::to_string(major) + std::to_string(minor);
}

}  // namespace

std::string kernel_image_problem(int device) {
  // On a thread of its own, so that the caller's current device and its
  // contexts stay as they are: selecting `device` and then the caller's again
  // would create a primary context on the caller's device (CUDA >= 12
  // creates one in cudaSetDevice), half a gigabyte of GPU 0 in a process that
  // works on another GPU. Loading the code creates `device`'s own context, as
  // its first use would anyway. A thread's error state ends with it.
  cudaError_t error = cudaSuccess;
  std::string where;
  std::thread([&] {
    error = cudaSetDevice(device);
    if (error != cudaSuccess) {
      where = "cannot select the device";
      return;
    }
    // Loads the module's code for this device: fails where there is neither
    // code for its architecture nor PTX the driver can compile for it.
    cudaFuncAttributes attributes;
    error = cudaFuncGetAttributes(&attributes,
                                  reinterpret_cast<const void*>(&forward_kernel<float, 1>));
    if (is_kernel_image_error(error)) where = "no code for this GPU (" + architecture(device) + ")";
  }).join();
  if (error == cudaSuccess) return "";
  if (error == cudaErrorInvalidDevice || is_kernel_image_error(error)) {
    return where + ": " + cudaGetErrorString(error);
  }
  throw std::runtime_error("lltm: cannot tell whether its CUDA kernels run on cuda:" +
                           std::to_string(device) + ": " + cudaGetErrorString(error));
}

}  // namespace lltm::cuda

LLTM_CUDA_KERNELS(m) {
  m.impl("forward", TORCH_BOX(&lltm::cuda::forward));
  m.impl("backward", TORCH_BOX(&lltm::cuda::backward));
}
