// The LLTM's pointwise math for one element, the device twin of
// csrc/cpu/pointwise/scalar_math.h.
//
// Layout of a row of `gates`: [input gate | output gate | candidate], each
// `state` wide. 16-bit types are widened to float for the arithmetic; double
// stays double throughout: the math functions below are overloaded per
// precision so that the double path can never pick a float-only function.
#pragma once

#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>

#include <type_traits>

#include "lltm_cuda_runtime.h"

namespace lltm::cuda {

template <typename scalar_t>
using acc_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;

__device__ __forceinline__ float exp_of(float x) { return expf(x); }
__device__ __forceinline__ double exp_of(double x) { return exp(x); }
__device__ __forceinline__ float expm1_of(float x) { return expm1f(x); }
__device__ __forceinline__ double expm1_of(double x) { return expm1(x); }
__device__ __forceinline__ float tanh_of(float x) { return tanhf(x); }
__device__ __forceinline__ double tanh_of(double x) { return tanh(x); }

// The smallest normal number of each precision.
__device__ __forceinline__ float min_normal(float) { return 1.17549435e-38f; }
__device__ __forceinline__ double min_normal(double) { return 2.2250738585072014e-308; }

// Exact at the extremes, as on the CPU (csrc/cpu/pointwise/scalar_math.h):
// sigmoid(-inf) = 0 through exp(inf) = inf, sigmoid(+inf) = 1, NaN stays NaN
// (it fails the comparison). Results below the smallest normal number are 0,
// as the CPU kernels give them: subnormal gates slow every later GEMM, and
// they differ from torch's by less than 1.2e-38.
template <typename T>
__device__ __forceinline__ T sigmoid(T x) {
  const T s = T(1) / (T(1) + exp_of(-x));
  return s < min_normal(s) ? T(0) : s;
}

// ELU with alpha = 1; expm1 keeps full precision for small negative inputs.
template <typename T>
__device__ __forceinline__ T elu(T x) {
  return x > T(0) ? x : expm1_of(x);
}

// d elu / dx at x, given y = elu(x): 1 where x > 0, else exp(x) = y + 1.
template <typename T>
__device__ __forceinline__ T elu_grad(T x, T y) {
  return x > T(0) ? T(1) : y + T(1);
}

// One column j of one row. The input and output gates hold their
// pre-activations (bias included) on entry and the activated gates on
// return; the candidate's pre-activation is only read: it is what backward
// keeps, since ELU's derivative needs x, not a rounded elu(x).
template <typename scalar_t>
__device__ __forceinline__ void forward_element(scalar_t& input_gate, scalar_t& output_gate,
                                                scalar_t candidate, scalar_t old_cell,
                                                scalar_t& new_h, scalar_t& new_cell) {
  using T = acc_t<scalar_t>;
  const T i = sigmoid(T(input_gate));
  const T o = sigmoid(T(output_gate));
  const T g = elu(T(candidate));
  const T c = T(old_cell) + g * i;
  input_gate = i;
  output_gate = o;
  new_cell = c;
  new_h = tanh_of(c) * o;
}

// Gradients of one element, in the math type T: from the gradients reaching
// new_h and new_cell, new_cell itself, the activated input and output gates
// and the candidate's pre-activation x.
// new_h = tanh(new_cell) * o; new_cell = old_cell + g * i, g = elu(x).
template <typename T>
__device__ __forceinline__ void backward_math(T grad_h, T grad_cell, T new_cell, T i, T o, T x,
                                              T& d_input_gate, T& d_output_gate, T& d_candidate,
                                              T& grad_old_cell) {
  const T g = elu(x);
  const T t = tanh_of(new_cell);
  const T d_cell = grad_h * o * (T(1) - t * t) + grad_cell;
  // Factors in the order of torch's derivatives (sigmoid's: grad * (1 - y)
  // * y), so that overflow, underflow and inf * 0 come out as they do there.
  d_input_gate = d_cell * g * (T(1) - i) * i;
  d_output_gate = grad_h * t * (T(1) - o) * o;
  d_candidate = d_cell * i * elu_grad(x, g);
  grad_old_cell = d_cell;
}

}  // namespace lltm::cuda
