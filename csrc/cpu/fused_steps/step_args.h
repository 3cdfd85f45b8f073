// What the sequence's fused steps (dispatch.h) are given: plain pointers and
// strides, no torch type.
#pragma once

#include <cstdint>

#include "../row_ref.h"
#include "weight_panels.h"

namespace lltm::cpu {

// Row r of a tensor laid out like the sequence input: (steps, batch, width)
// with rows counted step by step, or packed (rows, width).
template <typename Element>
struct SequenceRows {
  Element* data;
  int64_t batch;
  bool packed;
  int64_t stride0, stride1, stride2;

  RowRef<Element> row(int64_t r) const {
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

// The arguments of the forward steps (forward_steps.h). Row r of input, of
// old_h (h_0) and of old_cell (c_0) starts at r times its row stride.
template <typename T>
struct ForwardSteps {
  StepOrder order;
  int64_t state, features;
  const T* input;  // columns dense
  int64_t input_row_stride;
  const T* old_h;  // columns dense
  int64_t old_h_row_stride;
  const T* old_cell;
  int64_t old_cell_row_stride, old_cell_column_stride;
  // dense (rows, 3S): activated input and output gates, candidate
  // pre-activation; null in inference, which keeps nothing for a backward.
  T* gates;
  T* output;  // dense (rows, S)
  // dense (rows, S): every step's cells; with running_cells, (batch, S):
  // each row's latest cell, overwritten step by step (inference).
  T* cells;
  bool running_cells;
  const ForwardPanels<T>* weights;
};

// The arguments of the backward steps (backward_steps.h).
template <typename T>
struct BackwardSteps {
  StepOrder order;
  int64_t state;
  bool has_grad_output;
  SequenceRows<const T> grad_output, gates, cells;
  T* d_gates;    // dense (rows, 3S)
  T* grad_h;     // dense (batch, S): in the gradient of h_n, out that of h_0
  T* grad_cell;  // dense (batch, S): in the gradient of c_n, out that of c_0
  const BackwardPanels<T>* weights;
  bool want_old_h;  // whether the gradient of h_0 is wanted (in grad_h)
};

}  // namespace lltm::cpu
