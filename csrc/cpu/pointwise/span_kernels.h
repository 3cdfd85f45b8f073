// The LLTM's pointwise passes over one span of a batch row, in float or
// double, compiled for each instruction set.
//
// A row of `gates` is [input gate | output gate | candidate], each `state`
// wide; a span is `n` consecutive columns of each of the three blocks. The
// loops have no branches and no calls (scalar_math.h), and every pointer is
// restrict-qualified, so the compiler vectorizes them.
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
LLTM_ALWAYS_INLINE void forward_span_loop(int64_t n, T* __restrict gi, T* __restrict go,
                                          const T* __restrict gg, const T* __restrict c0,
                                          T* __restrict h1, T* __restrict c1) {
  for (int64_t j = 0; j < n; ++j) {
    const T i = fast_sigmoid<T, MulAdd>(gi[j]);
    const T o = fast_sigmoid<T, MulAdd>(go[j]);
    const T g = fast_elu<T, MulAdd>(gg[j]);
    const T c = c0[j] + g * i;
    gi[j] = i;
    go[j] = o;
    c1[j] = c;
    h1[j] = fast_tanh<T, MulAdd>(c) * o;
  }
}

template <typename T, typename MulAdd>
LLTM_ALWAYS_INLINE void backward_span_loop(int64_t n, const T* __restrict dh,
                                           const T* __restrict dc, const T* __restrict c1,
                                           const T* __restrict gi, const T* __restrict go,
                                           const T* __restrict gg, T* __restrict dgi,
                                           T* __restrict dgo, T* __restrict dgg, T* __restrict dc0,
                                           T* __restrict bi, T* __restrict bo, T* __restrict bg) {
  for (int64_t j = 0; j < n; ++j) {
    const T i = gi[j];
    const T o = go[j];
    // ELU and its derivative from the pre-activation: exact where a rounded
    // 16-bit elu(x) + 1 would lose exp(x) (all of it below about -6).
    const T x = gg[j];
    const T g = fast_elu<T, MulAdd>(x);
    const T t = fast_tanh<T, MulAdd>(c1[j]);
    // new_h = tanh(new_cell) * o; new_cell = old_cell + g * i.
    const T d_cell = dh[j] * o * (T(1) - t * t) + dc[j];
    // Factors in the order of torch's derivatives (sigmoid's: grad * (1 - y)
    // * y), so that overflow, underflow and inf * 0 come out as they do there.
    const T d_i = d_cell * g * (T(1) - i) * i;
    const T d_o = dh[j] * t * (T(1) - o) * o;
    const T d_g = d_cell * i * elu_grad(x, g);
    dgi[j] = d_i;
    dgo[j] = d_o;
    dgg[j] = d_g;
    dc0[j] = d_cell;
    bi[j] += d_i;
    bo[j] += d_o;
    bg[j] += d_g;
  }
}

// Unpacks a span into restrict-qualified arguments: what lets the compiler
// vectorize (it does not trust restrict on pointers read from a struct).
template <typename T, typename MulAdd>
LLTM_ALWAYS_INLINE void forward_span_body(const ForwardSpan<T>& s, int64_t n) {
  forward_span_loop<T, MulAdd>(n, s.gate_i, s.gate_o, s.gate_g, s.old_cell, s.new_h, s.new_cell);
}

template <typename T, typename MulAdd>
LLTM_ALWAYS_INLINE void backward_span_body(const BackwardSpan<T>& s, int64_t n) {
  backward_span_loop<T, MulAdd>(n, s.grad_h, s.grad_cell, s.new_cell, s.gate_i, s.gate_o, s.gate_g,
                                s.d_gate_i, s.d_gate_o, s.d_gate_g, s.grad_old_cell, s.bias_i,
                                s.bias_o, s.bias_g);
}

#if defined(__aarch64__) || defined(_M_ARM64)
using BaselineMulAdd = FusedMulAdd;  // every arm64 CPU has FMA
#else
using BaselineMulAdd = SeparateMulAdd;
#endif

template <typename T>
void forward_span_baseline(const ForwardSpan<T>& s, int64_t n) {
  forward_span_body<T, BaselineMulAdd>(s, n);
}
template <typename T>
void backward_span_baseline(const BackwardSpan<T>& s, int64_t n) {
  backward_span_body<T, BaselineMulAdd>(s, n);
}

#if LLTM_X86_DISPATCH
template <typename T>
LLTM_TARGET_AVX2 void forward_span_avx2(const ForwardSpan<T>& s, int64_t n) {
  forward_span_body<T, FusedMulAdd>(s, n);
}
template <typename T>
LLTM_TARGET_AVX2 void backward_span_avx2(const BackwardSpan<T>& s, int64_t n) {
  backward_span_body<T, FusedMulAdd>(s, n);
}
template <typename T>
LLTM_TARGET_AVX512 void forward_span_avx512(const ForwardSpan<T>& s, int64_t n) {
  forward_span_body<T, FusedMulAdd>(s, n);
}
template <typename T>
LLTM_TARGET_AVX512 void backward_span_avx512(const BackwardSpan<T>& s, int64_t n) {
  backward_span_body<T, FusedMulAdd>(s, n);
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
