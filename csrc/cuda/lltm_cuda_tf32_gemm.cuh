// float32 GEMMs on the TF32 tensor cores with float32's accuracy, through
// cuBLAS (torch's addmm), for the products of the sequence ops that go to
// cuBLAS where the call allows TF32: the input projection of every step
// (lltm_cuda_sequence_forward.cu), the gradient of the input
// (lltm_cuda_sequence_backward.cu) and, on the per-step path at the sizes
// lltm's own kernel leaves to cuBLAS, the recurrent products
// (lltm_cuda_recurrent.cuh).
//
// Under torch's TF32 setting, which allow_tf32 follows, cuBLAS takes each
// float32 operand to TF32 (10 bits of significand), one term, as cuDNN does
// for nn.LSTM. For LLTM that is too little: the cell has no forget gate, so
// every step's rounding stays in its cell state (lltm_cuda_tensor_cores.cuh
// says what it did at 50 steps). So each operand is split into two TF32
// terms, x = high + low, by one pointwise kernel, and a @ b is taken as
// three of cuBLAS's TF32 GEMMs, a.low @ b.high + a.high @ b.low +
// a.high @ b.high, the smaller terms first: "3xTF32", the persistent
// kernels' own product, at three GEMMs instead of one. The weight gradient
// keeps cuBLAS's one term, as nn.LSTM's does: it is summed over every row of
// every step, and nothing in the recurrence reads it
// (lltm_cuda_sequence_weights.cuh).
//
// Non-finite values: for an inf or NaN the high term is zero and the low
// term holds the value itself, so that a.low @ b.high carries a's and
// a.high @ b.low b's, each times the other's (finite) value. One case
// differs from float32's product: an infinite element of a and one of b
// that meet in a term give NaN where float32 gives an infinity.
#pragma once

#include <torch/csrc/stable/tensor.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <type_traits>

#include "../lltm_tensor.h"
#include "lltm_cuda_launch.cuh"
#include "lltm_cuda_runtime.h"
#include "lltm_cuda_torch_ops.cuh"

namespace lltm::cuda {

using torch::stable::Tensor;

// A float32 matrix's two TF32 terms, each (rows, cols) with adjacent
// columns, views of one allocation.
struct Tf32Terms {
  Tensor high, low;

  Tf32Terms rows(int64_t first, int64_t count) const;
  Tf32Terms transposed() const { return {lltm::transposed(high), lltm::transposed(low)}; }
};

// high = m rounded to TF32 and low = (m - high) rounded to TF32 where high
// is finite; high = 0 and low = m where it is not. m (rows, cols) is read
// through its strides; high and low are written row by row. (A template:
// a kernel defined in a header, once in the library whichever files use it.)
template <typename T>
__global__ void split_tf32_kernel(const T* __restrict__ m, int64_t rows, int64_t cols,
                                  int64_t row_stride, int64_t column_stride, T* high, T* low,
                                  int64_t terms_row_stride) {
  static_assert(std::is_same_v<T, float>, "TF32 terms of float32");
  for_each_pack<1>(rows, cols, [&](int64_t r, int64_t j) {
    const float x = m[r * row_stride + j * column_stride];
    const float h = round_to_tf32(x);
    const bool finite = finite_value(h);
    high[r * terms_row_stride + j] = finite ? h : 0.0f;
    low[r * terms_row_stride + j] = finite ? round_to_tf32(x - h) : x;
  });
}

inline Tf32Terms Tf32Terms::rows(int64_t first, int64_t count) const {
  const int64_t cols = high.size(1), stride = high.stride(0);
  return {reshaped_view(high, count, cols, stride, 1, first * stride),
          reshaped_view(low, count, cols, stride, 1, first * stride)};
}

// Room for the terms of a (rows, cols) float32 matrix: one allocation.
inline Tf32Terms new_tf32_terms(const Tensor& like, int64_t rows, int64_t cols) {
  const Tensor both = new_float_matrix(like, 2 * rows, cols);
  return {reshaped_view(both, rows, cols, cols, 1),
          reshaped_view(both, rows, cols, cols, 1, rows * cols)};
}

// Splits m (rows, cols) into `into` (terms of at least its rows and cols).
inline void split_tf32_into(const Tf32Terms& into, const Tensor& m) {
  const int64_t rows = m.size(0), cols = m.size(1);
  if (rows == 0 || cols == 0) return;
  const int32_t device = m.get_device_index();
  const RowTiling t = row_tiling(rows, cols, device);
  const cudaError_t error = LLTM_LAUNCH(t.grid, t.block, current_stream(device),
                                        split_tf32_kernel<float>)(
      m.const_data_ptr<float>(), rows, cols, m.stride(0), m.stride(1),
      into.high.mutable_data_ptr<float>(), into.low.mutable_data_ptr<float>(), into.high.stride(0));
  check_launch("lltm split_tf32_kernel", error);
}

// m's terms, read in m's memory order: a transposed view (W^T of a W whose
// rows are adjacent) is split as the matrix it shows, and its terms are the
// transposed views of that one's, which cuBLAS reads as they are.
inline Tf32Terms split_tf32(const Tensor& m) {
  if (m.size(0) > 1 && m.size(1) > 1 && m.stride(0) == 1 && m.stride(1) != 1) {
    return split_tf32(lltm::transposed(m)).transposed();
  }
  Tf32Terms terms = new_tf32_terms(m, m.size(0), m.size(1));
  split_tf32_into(terms, m);
  return terms;
}

// Rows of the left operand split at a time: at most about 2**21 elements a
// term (8 MiB), however long the sequence.
constexpr int64_t kTf32SplitElements = int64_t(1) << 21;

// Products a @ b in three TF32 terms with one right operand b (inner, cols),
// split once; each call splits its left operand a (rows, inner) into a
// workspace allocated once, up to `max_rows` rows at a time.
class Tf32Product {
 public:
  Tf32Product(const Tensor& b, int64_t max_rows)
      : b_(split_tf32(b)),
        chunk_(std::max<int64_t>(
            1, std::min(max_rows, kTf32SplitElements / std::max<int64_t>(1, b.size(0))))),
        a_(new_tf32_terms(b, chunk_, b.size(0))) {}

  // out = beta * out + a @ b (beta 0: out is not read).
  void run(Tensor& out, const Tensor& a, double beta) const { run_(out, a, nullptr, beta); }
  // out = bias + a @ b, the bias broadcast over the rows.
  void run_linear(Tensor& out, const Tensor& a, const std::optional<Tensor>& bias) const {
    run_(out, a, bias ? &*bias : nullptr, 0.0);
  }

 private:
  void run_(Tensor& out, const Tensor& a, const Tensor* bias, double beta) const {
    const int64_t rows = a.size(0), inner = a.size(1), cols = out.size(1);
    for (int64_t first = 0; first < rows; first += chunk_) {
      const int64_t count = std::min(chunk_, rows - first);
      const Tf32Terms part = a_.rows(0, count);
      split_tf32_into(
          part, reshaped_view(a, count, inner, a.stride(0), a.stride(1), first * a.stride(0)));
      Tensor o =
          reshaped_view(out, count, cols, out.stride(0), out.stride(1), first * out.stride(0));
      if (bias != nullptr) {
        addmm_out(o, *bias, part.low, b_.high, 1.0);
      } else {
        addmm_out(o, o, part.low, b_.high, beta);
      }
      addmm_out(o, o, part.high, b_.low, 1.0);
      addmm_out(o, o, part.high, b_.high, 1.0);
    }
  }

  Tf32Terms b_;
  int64_t chunk_;
  Tf32Terms a_;
};

}  // namespace lltm::cuda
