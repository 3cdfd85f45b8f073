// The glue between tensors and the span kernels (span_kernels.h), shared by
// the cell (cell_kernel.cpp) and the sequence's per-step path
// (sequence_forward_kernel.cpp, sequence_backward_kernel.cpp): strided
// and 16-bit rows are staged through small dense buffers of the math type,
// dense rows of that type are used in place.
#pragma once

#include <torch/csrc/stable/ops.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "../row_ref.h"
#include "span_kernels.h"

namespace lltm::cpu {

// The type the pointwise math runs in: double for double, float otherwise.
template <typename scalar_t>
using acc_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;

// Columns handled per call of a span kernel: long enough to amortise the
// call and fill SIMD registers, short enough for the staging buffers of
// 16-bit and strided inputs to live on the stack.
constexpr int64_t kSpanColumns = 128;

// grad_bias: the rows' d_gates are summed in T, kFoldRows rows at a time,
// and those partial sums in double, so the error does not grow with the
// batch while the hot loop stays in T.
constexpr int64_t kFoldRows = 16;

// Below this many (row, column) elements a pointwise pass takes under ~20 us
// on one core; splitting it gained nothing measurable on two cores, while at
// 8192 elements two threads cut it by a third.
constexpr int64_t kMinParallelElements = 1 << 13;

inline bool worth_parallel(int64_t elements) {
  return elements >= kMinParallelElements && torch::stable::get_num_threads() > 1;
}

// Elements [0, count) of a strided span of Stored values as a dense array of
// the math type T: the span itself when it already is one, else a converted
// copy in `buffer`.
template <typename T, typename Stored>
T* load_span(Stored* data, int64_t stride, int64_t count, T* buffer) {
  if constexpr (std::is_same_v<std::remove_const_t<Stored>, T>) {
    if (stride == 1) return const_cast<T*>(data);
  }
  if (stride == 0) {  // a broadcast, e.g. the gradient of a .sum()
    std::fill(buffer, buffer + count, static_cast<T>(data[0]));
  } else {
    for (int64_t k = 0; k < count; ++k) buffer[k] = static_cast<T>(data[k * stride]);
  }
  return buffer;
}

// Where a kernel writes a dense output span: in place, or in `buffer` to be
// converted by store_span.
template <typename T, typename Stored>
T* output_span(Stored* data, T* buffer) {
  if constexpr (std::is_same_v<Stored, T>) {
    return data;
  } else {
    return buffer;
  }
}

template <typename T, typename Stored>
void store_span(Stored* data, const T* values, int64_t count) {
  if constexpr (!std::is_same_v<Stored, T>) {
    for (int64_t k = 0; k < count; ++k) data[k] = static_cast<Stored>(values[k]);
  }
}

// Staging space of one thread for forward_row.
template <typename T>
struct ForwardBuffers {
  T gate_i[kSpanColumns], gate_o[kSpanColumns], gate_g[kSpanColumns], old_cell[kSpanColumns],
      new_h[kSpanColumns], new_cell[kSpanColumns];
};

// One row of the forward pass. `gates` (a dense row of 3 * state) holds the
// pre-activations, bias included, on entry; on return the input and output
// gates are activated and the candidate keeps its pre-activation (what
// backward needs).
template <typename scalar_t, typename T = acc_t<scalar_t>>
void forward_row(ForwardBuffers<T>& buf, scalar_t* gates, RowRef<const scalar_t> old_cell,
                 scalar_t* new_h, scalar_t* new_cell, int64_t state) {
  const auto kernel = span_kernels<T>().forward;
  for (int64_t j = 0; j < state; j += kSpanColumns) {
    const int64_t len = std::min(kSpanColumns, state - j);
    scalar_t* gate_i = gates + j;
    scalar_t* gate_o = gate_i + state;
    scalar_t* gate_g = gate_i + 2 * state;
    ForwardSpan<T> span{};
    span.gate_i = load_span(gate_i, 1, len, buf.gate_i);
    span.gate_o = load_span(gate_o, 1, len, buf.gate_o);
    span.gate_g = load_span(gate_g, 1, len, buf.gate_g);
    span.old_cell = load_span(old_cell.at(j), old_cell.stride, len, buf.old_cell);
    span.new_h = output_span(new_h + j, buf.new_h);
    span.new_cell = output_span(new_cell + j, buf.new_cell);
    if (span.old_cell == span.new_cell) {
      // The running cell updated in place (lltm::sequence_inference): the
      // kernel's spans are restrict, so it reads a copy.
      std::copy(span.old_cell, span.old_cell + len, buf.old_cell);
      span.old_cell = buf.old_cell;
    }
    kernel(span, len);
    store_span(gate_i, span.gate_i, len);
    store_span(gate_o, span.gate_o, len);
    store_span(new_h + j, span.new_h, len);
    store_span(new_cell + j, span.new_cell, len);
  }
}

// Staging space of one thread for backward_span.
template <typename T>
struct BackwardBuffers {
  T grad_h[kSpanColumns], grad_cell[kSpanColumns], new_cell[kSpanColumns], gate_i[kSpanColumns],
      gate_o[kSpanColumns], gate_g[kSpanColumns], d_gate_i[kSpanColumns], d_gate_o[kSpanColumns],
      d_gate_g[kSpanColumns], grad_old_cell[kSpanColumns];
};

// Columns [first_column, first_column + columns) of one row of the backward
// pass: d_gates (a dense row of 3 * state) and grad_old_cell (dense) are
// written; the d_gates are also added to the running sums bias_i/o/g
// (`columns` values each). grad_h may be of another type than the other
// inputs (the sequence kernels sum it in T).
template <typename scalar_t, typename GradH, typename T = acc_t<scalar_t>>
void backward_span(BackwardBuffers<T>& buf, RowRef<const GradH> grad_h,
                   RowRef<const scalar_t> grad_cell, RowRef<const scalar_t> new_cell,
                   RowRef<const scalar_t> gates, scalar_t* d_gates, scalar_t* grad_old_cell,
                   T* bias_i, T* bias_o, T* bias_g, int64_t state, int64_t first_column,
                   int64_t columns) {
  const scalar_t* gate_i = gates.at(first_column);
  scalar_t* d_gate_i = d_gates + first_column;
  BackwardSpan<T> span{};
  span.grad_h = load_span(grad_h.at(first_column), grad_h.stride, columns, buf.grad_h);
  span.grad_cell = load_span(grad_cell.at(first_column), grad_cell.stride, columns, buf.grad_cell);
  span.new_cell = load_span(new_cell.at(first_column), new_cell.stride, columns, buf.new_cell);
  span.gate_i = load_span(gate_i, gates.stride, columns, buf.gate_i);
  span.gate_o = load_span(gate_i + state * gates.stride, gates.stride, columns, buf.gate_o);
  span.gate_g = load_span(gate_i + 2 * state * gates.stride, gates.stride, columns, buf.gate_g);
  span.d_gate_i = output_span(d_gate_i, buf.d_gate_i);
  span.d_gate_o = output_span(d_gate_i + state, buf.d_gate_o);
  span.d_gate_g = output_span(d_gate_i + 2 * state, buf.d_gate_g);
  span.grad_old_cell = output_span(grad_old_cell + first_column, buf.grad_old_cell);
  span.bias_i = bias_i;
  span.bias_o = bias_o;
  span.bias_g = bias_g;
  span_kernels<T>().backward(span, columns);
  store_span(d_gate_i, span.d_gate_i, columns);
  store_span(d_gate_i + state, span.d_gate_o, columns);
  store_span(d_gate_i + 2 * state, span.d_gate_g, columns);
  store_span(grad_old_cell + first_column, span.grad_old_cell, columns);
}

}  // namespace lltm::cpu
