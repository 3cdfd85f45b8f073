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
constexpr int64_t kSpan = 128;

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

// Elements [0, n) of a strided span as a dense array of T: the span itself
// when it already is one, else a converted copy in `buffer`.
template <typename T, typename S>
T* load_span(S* p, int64_t stride, int64_t n, T* buffer) {
  if constexpr (std::is_same_v<std::remove_const_t<S>, T>) {
    if (stride == 1) return const_cast<T*>(p);
  }
  if (stride == 0) {  // a broadcast, e.g. the gradient of a .sum()
    std::fill(buffer, buffer + n, static_cast<T>(p[0]));
  } else {
    for (int64_t k = 0; k < n; ++k) buffer[k] = static_cast<T>(p[k * stride]);
  }
  return buffer;
}

// Where a kernel writes a dense output span: in place, or in `buffer` to be
// converted by store_span.
template <typename T, typename S>
T* output_span(S* p, T* buffer) {
  if constexpr (std::is_same_v<S, T>) {
    return p;
  } else {
    return buffer;
  }
}

template <typename T, typename S>
void store_span(S* p, const T* values, int64_t n) {
  if constexpr (!std::is_same_v<S, T>) {
    for (int64_t k = 0; k < n; ++k) p[k] = static_cast<S>(values[k]);
  }
}

// Staging space of one thread for forward_row.
template <typename T>
struct ForwardBuffers {
  T gate_i[kSpan], gate_o[kSpan], gate_g[kSpan], old_cell[kSpan], new_h[kSpan], new_cell[kSpan];
};

// One row of the forward pass. `gates` (a dense row of 3 * state) holds the
// pre-activations, bias included, on entry; on return the input and output
// gates are activated and the candidate keeps its pre-activation (what
// backward needs).
template <typename scalar_t, typename T = acc_t<scalar_t>>
void forward_row(ForwardBuffers<T>& buf, scalar_t* gates, RowRef<const scalar_t> old_cell,
                 scalar_t* new_h, scalar_t* new_cell, int64_t state) {
  const auto kernel = span_kernels<T>().forward;
  for (int64_t j = 0; j < state; j += kSpan) {
    const int64_t len = std::min(kSpan, state - j);
    scalar_t* gi = gates + j;
    scalar_t* go = gi + state;
    scalar_t* gg = gi + 2 * state;
    ForwardSpan<T> s{};
    s.gate_i = load_span(gi, 1, len, buf.gate_i);
    s.gate_o = load_span(go, 1, len, buf.gate_o);
    s.gate_g = load_span(gg, 1, len, buf.gate_g);
    s.old_cell = load_span(old_cell.at(j), old_cell.stride, len, buf.old_cell);
    s.new_h = output_span(new_h + j, buf.new_h);
    s.new_cell = output_span(new_cell + j, buf.new_cell);
    kernel(s, len);
    store_span(gi, s.gate_i, len);
    store_span(go, s.gate_o, len);
    store_span(new_h + j, s.new_h, len);
    store_span(new_cell + j, s.new_cell, len);
  }
}

// Staging space of one thread for backward_span.
template <typename T>
struct BackwardBuffers {
  T grad_h[kSpan], grad_cell[kSpan], new_cell[kSpan], gate_i[kSpan], gate_o[kSpan], gate_g[kSpan],
      d_gate_i[kSpan], d_gate_o[kSpan], d_gate_g[kSpan], grad_old_cell[kSpan];
};

// Columns [j, j + len) of one row of the backward pass: d_gates (a dense row
// of 3 * state) and grad_old_cell (dense) are written; the d_gates are also
// added to the running sums bias_i/o/g (len values each). grad_h may be of
// another type than the other inputs (the sequence kernels sum it in T).
template <typename scalar_t, typename GradH, typename T = acc_t<scalar_t>>
void backward_span(BackwardBuffers<T>& buf, RowRef<const GradH> grad_h,
                   RowRef<const scalar_t> grad_cell, RowRef<const scalar_t> new_cell,
                   RowRef<const scalar_t> gates, scalar_t* d_gates, scalar_t* grad_old_cell,
                   T* bias_i, T* bias_o, T* bias_g, int64_t state, int64_t j, int64_t len) {
  const scalar_t* gi = gates.at(j);
  scalar_t* di = d_gates + j;
  BackwardSpan<T> s{};
  s.grad_h = load_span(grad_h.at(j), grad_h.stride, len, buf.grad_h);
  s.grad_cell = load_span(grad_cell.at(j), grad_cell.stride, len, buf.grad_cell);
  s.new_cell = load_span(new_cell.at(j), new_cell.stride, len, buf.new_cell);
  s.gate_i = load_span(gi, gates.stride, len, buf.gate_i);
  s.gate_o = load_span(gi + state * gates.stride, gates.stride, len, buf.gate_o);
  s.gate_g = load_span(gi + 2 * state * gates.stride, gates.stride, len, buf.gate_g);
  s.d_gate_i = output_span(di, buf.d_gate_i);
  s.d_gate_o = output_span(di + state, buf.d_gate_o);
  s.d_gate_g = output_span(di + 2 * state, buf.d_gate_g);
  s.grad_old_cell = output_span(grad_old_cell + j, buf.grad_old_cell);
  s.bias_i = bias_i;
  s.bias_o = bias_o;
  s.bias_g = bias_g;
  span_kernels<T>().backward(s, len);
  store_span(di, s.d_gate_i, len);
  store_span(di + state, s.d_gate_o, len);
  store_span(di + 2 * state, s.d_gate_g, len);
  store_span(grad_old_cell + j, s.grad_old_cell, len);
}

}  // namespace lltm::cpu
