// What the CUDA kernels take from torch besides allocations: GEMMs (cuBLAS
// behind torch's C shim), on torch's current stream. (In the host build,
// lltm_cuda_runtime.h maps the CUDA GEMM to torch's CPU one.)
#pragma once

#include <torch/csrc/inductor/aoti_torch/generated/c_shim_cuda.h>
#include <torch/csrc/stable/tensor.h>

#include <optional>

#include "../lltm_errors.h"
#include "lltm_cuda_runtime.h"

namespace lltm::cuda {

using torch::stable::Tensor;

// out = beta * self + mat1 @ mat2 (self may alias out), on the current stream.
inline void addmm_out(Tensor& out, const Tensor& self, const Tensor& mat1, const Tensor& mat2,
                      double beta) {
  LLTM_CHECK_TORCH(
      aoti_torch_cuda_addmm_out(out.get(), self.get(), mat1.get(), mat2.get(), beta, 1.0),
      "the matrix product (torch's addmm, cuBLAS)");
}

// out = bias + mat1 @ mat2 (bias broadcast over the rows), or mat1 @ mat2
// without a bias: the pre-activations, rounded once either way.
inline void linear_out(Tensor& out, const std::optional<Tensor>& bias, const Tensor& mat1,
                       const Tensor& mat2) {
  if (bias.has_value()) {
    addmm_out(out, *bias, mat1, mat2, 1.0);
  } else {
    addmm_out(out, out, mat1, mat2, 0.0);
  }
}

}  // namespace lltm::cuda
