// The LLTM's pointwise math for one batch row, shared by forward and backward.
//
// Layout of a row of `gates`: [input gate | output gate | candidate], each
// `state` wide. 16-bit types are widened to float for the arithmetic.
#pragma once

#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

namespace lltm::cpu {

template <typename scalar_t>
using acc_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;

template <typename T>
inline T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

// ELU with alpha = 1; expm1 keeps full precision for small negative inputs.
template <typename T>
inline T elu(T x) {
  return x > T(0) ? x : std::expm1(x);
}

// d elu / dx expressed through y = elu(x): 1 where x > 0, else exp(x) = y + 1.
template <typename T>
inline T elu_grad_from_output(T y) {
  return y > T(0) ? T(1) : y + T(1);
}

template <typename scalar_t>
inline void forward_row(scalar_t* gates, const scalar_t* bias,
                        const scalar_t* old_cell, scalar_t* new_h,
                        scalar_t* new_cell, int64_t state) {
  using T = acc_t<scalar_t>;
  scalar_t* input_gate = gates;
  scalar_t* output_gate = gates + state;
  scalar_t* candidate = gates + 2 * state;
  for (int64_t j = 0; j < state; ++j) {
    const T i = sigmoid(T(input_gate[j]) + T(bias[j]));
    const T o = sigmoid(T(output_gate[j]) + T(bias[state + j]));
    const T g = elu(T(candidate[j]) + T(bias[2 * state + j]));
    const T c = T(old_cell[j]) + g * i;
    input_gate[j] = i;
    output_gate[j] = o;
    candidate[j] = g;
    new_cell[j] = c;
    new_h[j] = std::tanh(c) * o;
  }
}

template <typename scalar_t>
inline void backward_row(const scalar_t* grad_h, const scalar_t* grad_cell,
                         const scalar_t* new_cell, const scalar_t* gates,
                         scalar_t* d_gates, scalar_t* grad_old_cell,
                         int64_t state) {
  using T = acc_t<scalar_t>;
  for (int64_t j = 0; j < state; ++j) {
    const T i = T(gates[j]);
    const T o = T(gates[state + j]);
    const T g = T(gates[2 * state + j]);
    const T dh = T(grad_h[j]);
    const T t = std::tanh(T(new_cell[j]));
    // new_h = tanh(new_cell) * o; new_cell = old_cell + g * i.
    const T d_cell = dh * o * (T(1) - t * t) + T(grad_cell[j]);
    d_gates[j] = d_cell * g * i * (T(1) - i);
    d_gates[state + j] = dh * t * o * (T(1) - o);
    d_gates[2 * state + j] = d_cell * i * elu_grad_from_output(g);
    grad_old_cell[j] = d_cell;
  }
}

}  // namespace lltm::cpu
