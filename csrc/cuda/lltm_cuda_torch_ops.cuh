// What the CUDA kernels take from torch besides allocations: GEMMs (cuBLAS
// behind torch's C shim), on torch's current stream. (In the host build,
// lltm_cuda_runtime.h maps the CUDA GEMM to torch's CPU one.)
#pragma once

#include <torch/csrc/inductor/aoti_torch/generated/c_shim_cuda.h>
#include <torch/csrc/stable/tensor.h>

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

}  // namespace lltm::cuda
