// What the fused sequence kernels (dispatch.h) are given: plain
// pointers and strides, no torch type.
#pragma once

#include <cstdint>

#include "../row_ref.h"
#include "weight_panels.h"

namespace lltm::cpu {

// Row r of a tensor laid out like the sequence input: (steps, batch, width)
// with rows counted step by step, or packed (rows, width).
template <typename S>
struct SequenceRows {
  S* data;
  int64_t batch;
  bool packed;
  int64_t stride0, stride1, stride2;

  RowRef<S> row(int64_t r) const {
    if (packed) return {data + r * stride0, stride1};
    return {data + (r / batch) * stride0 + (r % batch) * stride1, stride2};
  }
  // The distance between consecutive rows of one step, and whether each
  // row's values are contiguous.
  int64_t step_stride() const { return packed ? stride0 : stride1; }
  bool dense() const { return (packed ? stride1 : stride2) == 1; }
};

// The steps in the order they run: the k-th step has sizes[k] rows, rows
// starts[k] ... of the input and of every output (lltm_sequence.h).
struct StepOrder {
  int64_t steps;
  const int64_t* sizes;
  const int64_t* starts;
  int64_t size(int64_t k) const { return k < 0 || k >= steps ? 0 : sizes[k]; }
};

template <typename T>
struct ForwardSteps {
  StepOrder order;
  int64_t state, features;
  const T* x;  // row r of the input at x + r * x_stride, columns dense
  int64_t x_stride;
  const T* h0;  // row r of h_0 at h0 + r * h0_stride, columns dense
  int64_t h0_stride;
  const T* c0;  // c_0[r][j] at c0 + r * c0_row + j * c0_col
  int64_t c0_row, c0_col;
  T* gates;  // dense (rows, 3S): activated input and output gates, candidate pre-activation
  T* out;    // dense (rows, S)
  T* cells;  // dense (rows, S)
  const ForwardPanels<T>* weights;
};

template <typename T>
struct BackwardSteps {
  StepOrder order;
  int64_t state;
  bool has_dy;
  SequenceRows<const T> dy, gates, cells;  // dy: the gradient of the output
  T* d_gates;                              // dense (rows, 3S)
  T* dh;  // dense (batch, S): in the gradient of h_n, out that of h_0
  T* dc;  // dense (batch, S): in the gradient of c_n, out that of c_0
  const BackwardPanels<T>* weights;
  bool want_old_h;  // whether the gradient of h_0 is wanted (in dh)
};

}  // namespace lltm::cpu
