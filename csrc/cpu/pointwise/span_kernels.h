// The LLTM's pointwise passes over one span of a batch row, in float or
// double, compiled for each instruction set.
//
// A row of `gates` is [input gate | output gate | candidate], each `state`
// wide; a span is `columns` consecutive columns of each of the three blocks.
// The loops have no branches and no calls (scalar_math.h), and every pointer
// is restrict-qualified, so the compiler vectorizes them.
//
// The same source is compiled for every instruction set of isa.h.
// At the tutorial's size (2048 elements) the float forward span takes 30 us
// as SSE2, 11 us as AVX2 and 6 us as AVX-512; double 85, 30 and 14 us.
#pragma once

#include <cstdint>

#include "../isa.h"
#include "scalar_math.h"

// GCC keeps FP comparisons as branches unless it may assume they do not
// trap, and a loop with branches is not vectorized. No value changes: only
// the floating-point exception flags, which torch never reads. (Clang
// assumes this by default.)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("no-trapping-math")
#endif
namespace lltm::cpu {

// The pre-activations come from the GEMM with the bias already added, rounded
// once to the storage type as F.linear rounds X W^T + b.
template <typename T>
struct ForwardSpan {
  T* gate_i;        // in: pre-activation; out: sigmoid
  T* gate_o;        // same, output gate
  const T* gate_g;  // the candidate's pre-activation, kept as it is for backward
  const T* old_cell;
  T* new_h;
  T* new_cell;
};

template <typename T>
struct BackwardSpan {
  const T* grad_h;
  const T* grad_cell;
  const T* new_cell;
  const T* gate_i;  // sigmoid
  const T* gate_o;  // sigmoid
  const T* gate_g;  // the candidate's pre-activation
  T* d_gate_i;
  T* d_gate_o;
  T* d_gate_g;
  T* grad_old_cell;
  T* bias_i;  // running sums of the d_gates columns (grad_bias)
  T* bias_o;
  T* bias_g;
};

template <typename T, typename MulAdd>
LLTM_ALWAYS_INLINE void forward_span_loop(int64_t columns, T* __restrict gate_i,
                                          T* __restrict gate_o, const T* __restrict gate_g,
                                          const T* __restrict old_cell, T* __restrict new_h,
                                          T* __restrict new_cell) {
  for (int64_t j = 0; j < columns; ++j) {
    const T i = fast_sigmoid<T, MulAdd>(gate_i[j]);
    const T o = fast_sigmoid<T, MulAdd>(gate_o[j]);
    const T g = fast_elu<T, MulAdd>(gate_g[j]);
    const T c = old_cell[j] + g * i;
    gate_i[j] = i;
    gate_o[j] = o;
    new_cell[j] = c;
    new_h[j] = fast_tanh<T, MulAdd>(c) * o;
  }
}

template <typename T, typename MulAdd>
LLTM_ALWAYS_INLINE void backward_span_loop(int64_t columns, const T* __restrict grad_h,
                                           const T* __restrict grad_cell,
                                           const T* __restrict new_cell, const T* __restrict gate_i,
                                           const T* __restrict gate_o, const T* __restrict gate_g,
                                           T* __restrict d_gate_i, T* __restrict d_gate_o,
                                           T* __restrict d_gate_g, T* __restrict grad_old_cell,
                                           T* __restrict bias_i, T* __restrict bias_o,
                                           T* __restrict bias_g) {
  for (int64_t j = 0; j < columns; ++j) {
    const T i = gate_i[j];
    const T o = gate_o[j];
    // ELU and its derivative from the pre-activation: exact where a rounded
    // 16-bit elu(x) + 1 would lose exp(x) (all of it below about -6).
    const T x = gate_g[j];
    const T g = fast_elu<T, MulAdd>(x);
    const T t = fast_tanh<T, MulAdd>(new_cell[j]);
    // new_h = tanh(new_cell) * o; new_cell = old_cell + g * i.
    const T d_cell = grad_h[j] * o * (T(1) - t * t) + grad_cell[j];
    // Factors in the order of torch's derivatives (sigmoid's: grad * (1 - y)
    // * y), so that overflow, underflow and inf * 0 come out as they do there.
    const T d_i = d_cell * g * (T(1) - i) * i;
    const T d_o = grad_h[j] * t * (T(1) - o) * o;
    const T d_g = d_cell * i * elu_grad(x, g);
    d_gate_i[j] = d_i;
    d_gate_o[j] = d_o;
    d_gate_g[j] = d_g;
    grad_old_cell[j] = d_cell;
    bias_i[j] += d_i;
    bias_o[j] += d_o;
    bias_g[j] += d_g;
  }
}

// Unpacks a span into restrict-qualified arguments: what lets the compiler
// vectorize (it does not trust restrict on pointers read from a struct).
template <typename T, typename MulAdd>
LLTM_ALWAYS_INLINE void forward_span_body(const ForwardSpan<T>& span, int64_t columns) {
  forward_span_loop<T, MulAdd>(columns, span.gate_i, span.gate_o, span.gate_g, span.old_cell,
                               span.new_h, span.new_cell);
}

template <typename T, typename MulAdd>
LLTM_ALWAYS_INLINE void backward_span_body(const BackwardSpan<T>& span, int64_t columns) {
  backward_span_loop<T, MulAdd>(columns, span.grad_h, span.grad_cell, span.new_cell, span.gate_i,
                                span.gate_o, span.gate_g, span.d_gate_i, span.d_gate_o,
                                span.d_gate_g, span.grad_old_cell, span.bias_i, span.bias_o,
                                span.bias_g);
}

#if defined(__aarch64__) || defined(_M_ARM64)
using BaselineMulAdd = FusedMulAdd;  // every arm64 CPU has FMA
#else
using BaselineMulAdd = SeparateMulAdd;
#endif

template <typename T>
void forward_span_baseline(const ForwardSpan<T>& span, int64_t columns) {
  forward_span_body<T, BaselineMulAdd>(span, columns);
}
template <typename T>
void backward_span_baseline(const BackwardSpan<T>& span, int64_t columns) {
  backward_span_body<T, BaselineMulAdd>(span, columns);
}

#if LLTM_X86_DISPATCH
template <typename T>
LLTM_TARGET_AVX2 void forward_span_avx2(const ForwardSpan<T>& span, int64_t columns) {
  forward_span_body<T, FusedMulAdd>(span, columns);
}
template <typename T>
LLTM_TARGET_AVX2 void backward_span_avx2(const BackwardSpan<T>& span, int64_t columns) {
  backward_span_body<T, FusedMulAdd>(span, columns);
}
template <typename T>
LLTM_TARGET_AVX512 void forward_span_avx512(const ForwardSpan<T>& span, int64_t columns) {
  forward_span_body<T, FusedMulAdd>(span, columns);
}
template <typename T>
LLTM_TARGET_AVX512 void backward_span_avx512(const BackwardSpan<T>& span, int64_t columns) {
  backward_span_body<T, FusedMulAdd>(span, columns);
}
#endif

template <typename T>
struct SpanKernels {
  void (*forward)(const ForwardSpan<T>&, int64_t);
  void (*backward)(const BackwardSpan<T>&, int64_t);
};

template <typename T>
SpanKernels<T> make_span_kernels(Isa isa) {
#if LLTM_X86_DISPATCH
  if (isa == Isa::kAvx512) return {&forward_span_avx512<T>, &backward_span_avx512<T>};
  if (isa == Isa::kAvx2) return {&forward_span_avx2<T>, &backward_span_avx2<T>};
#endif
  // arm64's sets share these: the baseline there is NEON with FMA already.
  (void)isa;
  return {&forward_span_baseline<T>, &backward_span_baseline<T>};
}

// The kernels for this CPU, chosen once.
template <typename T>
const SpanKernels<T>& span_kernels() {
  static const SpanKernels<T> kernels = make_span_kernels<T>(selected_isa());
  return kernels;
}

}  // namespace lltm::cpu
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif
