// What the CPU kernels take from torch besides allocations: GEMMs (MKL or
// OpenBLAS behind torch's C shim) and column copies.
#pragma once

#include <torch/csrc/inductor/aoti_torch/generated/c_shim_cpu.h>
#include <torch/csrc/stable/tensor.h>

#include <algorithm>
#include <cstdint>
#include <optional>

#include "../lltm_errors.h"
#include "../lltm_tensor.h"

namespace lltm::cpu {

// out = beta * self + mat1 @ mat2 (self may alias out; beta = 0 ignores it).
inline void addmm_out(Tensor& out, const Tensor& self, const Tensor& mat1, const Tensor& mat2,
                      double beta) {
  LLTM_CHECK_TORCH(
      aoti_torch_cpu_addmm_out(out.get(), self.get(), mat1.get(), mat2.get(), beta, 1.0),
      "the matrix product (torch's addmm)");
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

// dst[:, first : first + src.cols] = src, any strides, any 2/4/8-byte dtype.
template <typename Word>
void copy_columns_as(const Tensor& dst, const Tensor& src, int64_t first) {
  const Matrix<Word> d = matrix_of<Word>(dst);
  const Matrix<const Word> s = matrix_of<const Word>(src);
  const int64_t rows = src.size(0), cols = src.size(1);
  for (int64_t r = 0; r < rows; ++r) {
    Word* __restrict out = d.row(r) + first * d.col_stride;
    const Word* __restrict in = s.row(r);
    if (s.col_stride == 1 && d.col_stride == 1) {
      std::copy(in, in + cols, out);
    } else {
      for (int64_t c = 0; c < cols; ++c) out[c * d.col_stride] = in[c * s.col_stride];
    }
  }
}

inline void copy_columns(const Tensor& dst, const Tensor& src, int64_t first) {
  switch (src.element_size()) {
    case 2:
      copy_columns_as<uint16_t>(dst, src, first);
      break;
    case 4:
      copy_columns_as<uint32_t>(dst, src, first);
      break;
    default:
      copy_columns_as<uint64_t>(dst, src, first);
      break;
  }
}

}  // namespace lltm::cpu
