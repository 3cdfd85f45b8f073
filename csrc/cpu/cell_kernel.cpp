// CPU implementation of lltm::forward and lltm::backward.
//
// Structure, shared with csrc/cuda/lltm_cuda.cu:
//   forward:  gates = b + [old_h, input] @ W^T   (one GEMM, written straight
//             into the `gates` output), then one fused pointwise pass that
//             activates the input and output gates in place (the candidate's
//             pre-activation stays, for backward) and writes new_h, new_cell.
//   backward: one fused pointwise pass producing d_gates, grad_old_cell and
//             grad_bias, then the GEMMs for grad_weights, grad_old_h and
//             grad_input, each only when wanted.
// 16-bit inputs are computed in float32. GEMMs go through torch (MKL or
// OpenBLAS behind the C shim): a hand-written AVX-512 kernel for the forward's
// shape (dot products, no packing) matched MKL but did not beat it, and a
// packed kernel (the sequence's fused steps, fused_steps/) pays off only where
// the packing is reused, over a sequence. The pointwise passes are pointwise/'s:
// the math vectorized for each instruction set (scalar_math.h, span_kernels.h)
// and its glue to tensors (row_passes.h).
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

#include "../lltm_checks.h"
#include "../lltm_tensor.h"
#include "pointwise/row_passes.h"
#include "torch_calls.h"

namespace lltm::cpu {
namespace {

// [old_h, input] as one (batch, state + features) matrix, so that the forward
// and grad_weights are one GEMM each. At the tutorial's size two GEMMs into one
// buffer (old_h @ W_h^T, then += input @ W_x^T) took 40 us, one GEMM on this
// 10 KB copy 29 us; at large sizes the copy is under 1% of the GEMM.
Tensor concat_h_x(const Tensor& old_h, const Tensor& input, const Sizes& n) {
  Tensor x = new_matrix(input, n.batch, n.state + n.features);
  copy_columns(x, old_h, 0);
  copy_columns(x, input, n.state);
  return x;
}

template <typename scalar_t>
void forward_pointwise(Tensor& gates, const Tensor& old_cell, Tensor& new_h, Tensor& new_cell,
                       int64_t batch, int64_t state) {
  using T = acc_t<scalar_t>;
  const Matrix<scalar_t> g = matrix_of<scalar_t>(gates);  // contiguous: made here
  const Matrix<const scalar_t> c0 = matrix_of<const scalar_t>(old_cell);
  scalar_t* h1 = static_cast<scalar_t*>(new_h.data_ptr());
  scalar_t* c1 = static_cast<scalar_t*>(new_cell.data_ptr());
  auto rows = [&](int64_t begin, int64_t end) {
    ForwardBuffers<T> buf;
    for (int64_t r = begin; r < end; ++r) {
      forward_row(buf, g.row(r), RowRef<const scalar_t>{c0.row(r), c0.col_stride}, h1 + r * state,
                  c1 + r * state, state);
    }
  };
  if (worth_parallel(batch * state)) {
    const int64_t grain = std::max<int64_t>(1, kMinParallelElements / std::max<int64_t>(state, 1));
    torch::stable::parallel_for(0, batch, grain, rows);
  } else {
    rows(0, batch);
  }
}

// grad_bias may be null (not wanted): its sums are then dropped.
template <typename scalar_t>
void backward_pointwise(const Tensor& grad_h, const Tensor& grad_cell, const Tensor& new_cell,
                        const Tensor& gates, Tensor& d_gates, Tensor& grad_old_cell,
                        Tensor* grad_bias, int64_t batch, int64_t state) {
  using T = acc_t<scalar_t>;
  // grad_h and grad_cell are often broadcasts (strides 0) from a .sum().
  const Matrix<const scalar_t> dh = matrix_of<const scalar_t>(grad_h);
  const Matrix<const scalar_t> dc = matrix_of<const scalar_t>(grad_cell);
  const Matrix<const scalar_t> c1 = matrix_of<const scalar_t>(new_cell);
  const Matrix<const scalar_t> g = matrix_of<const scalar_t>(gates);
  scalar_t* dg = static_cast<scalar_t*>(d_gates.data_ptr());
  scalar_t* dc0 = static_cast<scalar_t*>(grad_old_cell.data_ptr());
  scalar_t* db = grad_bias ? static_cast<scalar_t*>(grad_bias->data_ptr()) : nullptr;

  // Work is split by columns: a column's bias gradient, summed over the
  // rows, then belongs to one task and needs no reduction across threads.
  auto spans = [&](int64_t span_begin, int64_t span_end) {
    BackwardBuffers<T> buf;
    // grad_bias: the kernel adds up to kFoldRows rows in T, those partial
    // sums are then added in double, so the error does not grow with the
    // batch and the hot loop stays in T.
    T part_i[kSpanColumns], part_o[kSpanColumns], part_g[kSpanColumns];
    double sum_i[kSpanColumns], sum_o[kSpanColumns], sum_g[kSpanColumns];
    for (int64_t span = span_begin; span < span_end; ++span) {
      const int64_t j = span * kSpanColumns;
      const int64_t len = std::min(kSpanColumns, state - j);
      std::fill(sum_i, sum_i + len, 0.0);
      std::fill(sum_o, sum_o + len, 0.0);
      std::fill(sum_g, sum_g + len, 0.0);
      for (int64_t r0 = 0; r0 < batch; r0 += kFoldRows) {
        std::fill(part_i, part_i + len, T(0));
        std::fill(part_o, part_o + len, T(0));
        std::fill(part_g, part_g + len, T(0));
        for (int64_t r = r0; r < std::min(batch, r0 + kFoldRows); ++r) {
          backward_span(buf, RowRef<const scalar_t>{dh.row(r), dh.col_stride},
                        RowRef<const scalar_t>{dc.row(r), dc.col_stride},
                        RowRef<const scalar_t>{c1.row(r), c1.col_stride},
                        RowRef<const scalar_t>{g.row(r), g.col_stride}, dg + r * 3 * state,
                        dc0 + r * state, part_i, part_o, part_g, state, j, len);
        }
        for (int64_t k = 0; k < len; ++k) {
          sum_i[k] += part_i[k];
          sum_o[k] += part_o[k];
          sum_g[k] += part_g[k];
        }
      }
      for (int64_t k = 0; db != nullptr && k < len; ++k) {
        db[j + k] = static_cast<scalar_t>(sum_i[k]);
        db[state + j + k] = static_cast<scalar_t>(sum_o[k]);
        db[2 * state + j + k] = static_cast<scalar_t>(sum_g[k]);
      }
    }
  };
  const int64_t num_spans = (state + kSpanColumns - 1) / kSpanColumns;
  if (worth_parallel(batch * state)) {
    torch::stable::parallel_for(0, num_spans, 1, spans);
  } else {
    spans(0, num_spans);
  }
}

std::tuple<Tensor, Tensor, Tensor> forward(Tensor input, Tensor weights, std::optional<Tensor> bias,
                                           Tensor old_h, Tensor old_cell) {
  const Sizes n = check_forward_args(input, weights, bias, old_h, old_cell);
  selected_isa();  // a bad LLTM_CPU_ISA raises here, outside any parallel region
  Tensor gates = new_matrix(input, n.batch, 3 * n.state);
  Tensor new_h = new_matrix(input, n.batch, n.state);
  Tensor new_cell = new_matrix(input, n.batch, n.state);
  const Tensor x = concat_h_x(old_h, input, n);
  // gates = bias + [old_h, input] @ W^T: the pre-activations rounded once, as
  // F.linear rounds them (in 16-bit a product beyond the range that the bias
  // brings back stays finite). The pointwise pass then activates them.
  linear_out(gates, bias, x, transposed(weights));
  THO_DISPATCH_V2(input.scalar_type(), "lltm_forward_cpu", AT_WRAP([&] {
                    forward_pointwise<scalar_t>(gates, old_cell, new_h, new_cell, n.batch, n.state);
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
  selected_isa();  // a bad LLTM_CPU_ISA raises here, outside any parallel region
  // The pointwise pass always runs: every gradient but grad_old_cell needs
  // d_gates, and grad_old_cell is one of its products.
  Tensor d_gates = new_matrix(input, n.batch, 3 * n.state);
  Tensor grad_old_cell = new_matrix(input, n.batch, n.state);
  std::optional<Tensor> grad_bias;
  if (want.bias) grad_bias = new_vector(weights, 3 * n.state);
  THO_DISPATCH_V2(input.scalar_type(), "lltm_backward_cpu", AT_WRAP([&] {
                    backward_pointwise<scalar_t>(grad_h, grad_cell, new_cell, gates, d_gates,
                                                 grad_old_cell, grad_bias ? &*grad_bias : nullptr,
                                                 n.batch, n.state);
                  }),
                  AT_FLOATING_TYPES, torch::headeronly::ScalarType::Half,
                  torch::headeronly::ScalarType::BFloat16);

  // grad_weights = d_gates^T @ [old_h, input].
  std::optional<Tensor> grad_weights;
  if (want.weights) {
    grad_weights = new_matrix(weights, 3 * n.state, n.state + n.features);
    addmm_out(*grad_weights, *grad_weights, transposed(d_gates), concat_h_x(old_h, input, n), 0.0);
  }
  // grad_[old_h, input] = d_gates @ W, only the blocks wanted: with inputs
  // that need no grad, as in the tutorial's own benchmark, no product runs.
  // Both wanted: one GEMM and a split copy, which at the tutorial's size
  // took 31 us against 39 for two GEMMs of half the width.
  std::optional<Tensor> grad_old_h, grad_input;
  if (want.old_h) grad_old_h = new_matrix(input, n.batch, n.state);
  if (want.input) grad_input = new_matrix(input, n.batch, n.features);
  if (want.old_h && want.input) {
    Tensor grad_x = new_matrix(input, n.batch, n.state + n.features);
    addmm_out(grad_x, grad_x, d_gates, weights, 0.0);
    copy_columns(*grad_old_h, column_block(grad_x, 0, n.state, false), 0);
    copy_columns(*grad_input, column_block(grad_x, n.state, n.features, false), 0);
  } else if (want.old_h) {
    addmm_out(*grad_old_h, *grad_old_h, d_gates, column_block(weights, 0, n.state, false), 0.0);
  } else if (want.input) {
    addmm_out(*grad_input, *grad_input, d_gates, column_block(weights, n.state, n.features, false),
              0.0);
  }
  return {grad_input, grad_weights, grad_bias, grad_old_h,
          want.old_cell ? std::optional<Tensor>(grad_old_cell) : std::nullopt};
}

}  // namespace
}  // namespace lltm::cpu

STABLE_TORCH_LIBRARY_IMPL(lltm, CPU, m) {
  m.impl("forward", TORCH_BOX(&lltm::cpu::forward));
  m.impl("backward", TORCH_BOX(&lltm::cpu::backward));
}
