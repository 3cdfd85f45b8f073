// Elementwise math of the LLTM cell, written so that compilers vectorize it.
//
// std::exp, std::expm1 and std::tanh are opaque library calls: a loop that
// uses them runs one element at a time (glibc's expm1f alone took a third of
// the forward pass). The functions here are branch-free (selects, not jumps),
// use only +, -, *, / and integer bit operations, and are inlined into the
// loops of span_kernels.h, which the compiler then turns into SIMD code.
//
// Accuracy, measured against torch's float64 functions over [-800, 800] and
// tiny arguments: at most 1.5 units in the last place, in float and in double
// alike (the polynomial degree follows the type). Float64 outputs stay within
// ~1e-15 relative of the reference.
//
// At the extremes the results are exact, as torch's: sigmoid(-inf) = 0,
// sigmoid(+inf) = 1, tanh(+-inf) = +-1, elu(-inf) = -1, elu(+inf) = +inf,
// and NaN in gives NaN out. Exactness matters beyond the value itself: a
// sigmoid of 2^-127 instead of 0 turns the reference's inf * 0 = NaN into
// inf, and subnormal gates slow down every later GEMM that reads them.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "../isa.h"

namespace lltm::cpu {

// How a * b + c is computed. A fused multiply-add is one instruction (and
// one rounding) where the target has it; elsewhere it would be a library
// call, so targets without it multiply, then add.
struct SeparateMulAdd {
  template <typename T>
  static LLTM_ALWAYS_INLINE T mul_add(T a, T b, T c) {
    return a * b + c;
  }
};

struct FusedMulAdd {
#if defined(__GNUC__) || defined(__clang__)
  static LLTM_ALWAYS_INLINE float mul_add(float a, float b, float c) {
    return __builtin_fmaf(a, b, c);
  }
  static LLTM_ALWAYS_INLINE double mul_add(double a, double b, double c) {
    return __builtin_fma(a, b, c);
  }
#else
  template <typename T>
  static LLTM_ALWAYS_INLINE T mul_add(T a, T b, T c) {
    return a * b + c;
  }
#endif
};

// Constants of exp(x) = 2^n * exp(r), r = x - n * ln2, |r| <= ln2 / 2.
template <typename T>
struct ExpParams;

template <>
struct ExpParams<float> {
  using Bits = uint32_t;
  static constexpr int kMantissaBits = 23;
  static constexpr Bits kExponentBias = 127;
  // Adding 1.5 * 2^23 rounds to an integer, which lands in the low mantissa
  // bits: no float-to-int conversion (slow or missing in some SIMD sets).
  static constexpr float kShifter = 12582912.0f;
  static constexpr float kLog2e = 1.44269504088896341f;
  // ln2 split in two: kLn2Hi has trailing zero bits, so n * kLn2Hi is exact.
  static constexpr float kLn2Hi = 0.693359375f;
  static constexpr float kLn2Lo = -2.12194440e-4f;
  // Inputs are clamped here so that 2^n stays a normal number. Beyond, exp
  // is 0 or huge anyway: sigmoid and tanh are saturated, elu is -1.
  static constexpr float kMinArg = -87.0f;
  static constexpr float kMaxArg = 88.0f;
};

template <>
struct ExpParams<double> {
  using Bits = uint64_t;
  static constexpr int kMantissaBits = 52;
  static constexpr Bits kExponentBias = 1023;
  static constexpr double kShifter = 6755399441055744.0;  // 1.5 * 2^52
  static constexpr double kLog2e = 1.4426950408889634074;
  static constexpr double kLn2Hi = 6.93147180369123816490e-01;
  static constexpr double kLn2Lo = 1.90821492927058770002e-10;
  static constexpr double kMinArg = -708.0;
  static constexpr double kMaxArg = 709.0;
};

// expm1(r) on |r| <= ln2 / 2: Taylor series, r + r^2 (1/2! + r/3! + ...).
// The last term kept is r^8/8! for float and r^13/13! for double; the first
// dropped term is below half an ulp of the result on the whole interval.
template <typename T, typename MulAdd>
LLTM_ALWAYS_INLINE T expm1_reduced(T r) {
  T q;
  if constexpr (std::is_same_v<T, float>) {
    q = T(1.0 / 40320);
    q = MulAdd::mul_add(q, r, T(1.0 / 5040));
    q = MulAdd::mul_add(q, r, T(1.0 / 720));
    q = MulAdd::mul_add(q, r, T(1.0 / 120));
    q = MulAdd::mul_add(q, r, T(1.0 / 24));
    q = MulAdd::mul_add(q, r, T(1.0 / 6));
    q = MulAdd::mul_add(q, r, T(0.5));
  } else {
    q = T(1.0 / 6227020800.0);
    q = MulAdd::mul_add(q, r, T(1.0 / 479001600.0));
    q = MulAdd::mul_add(q, r, T(1.0 / 39916800.0));
    q = MulAdd::mul_add(q, r, T(1.0 / 3628800.0));
    q = MulAdd::mul_add(q, r, T(1.0 / 362880.0));
    q = MulAdd::mul_add(q, r, T(1.0 / 40320.0));
    q = MulAdd::mul_add(q, r, T(1.0 / 5040.0));
    q = MulAdd::mul_add(q, r, T(1.0 / 720.0));
    q = MulAdd::mul_add(q, r, T(1.0 / 120.0));
    q = MulAdd::mul_add(q, r, T(1.0 / 24.0));
    q = MulAdd::mul_add(q, r, T(1.0 / 6.0));
    q = MulAdd::mul_add(q, r, T(0.5));
  }
  return MulAdd::mul_add(r * r, q, r);
}

// Splits x into 2^n (returned in `scale`) and expm1(r) (the return value).
template <typename T, typename MulAdd>
LLTM_ALWAYS_INLINE T exp_split(T x, T& scale) {
  using P = ExpParams<T>;
  using Bits = typename P::Bits;
  // Written as selects that keep a NaN x (comparisons with NaN are false),
  // so NaN propagates to the result.
  T v = x < P::kMinArg ? T(P::kMinArg) : x;
  v = v > P::kMaxArg ? T(P::kMaxArg) : v;
  const T shifted = MulAdd::mul_add(v, P::kLog2e, P::kShifter);
  const T n = shifted - P::kShifter;
  T r = MulAdd::mul_add(n, -P::kLn2Hi, v);
  r = MulAdd::mul_add(n, -P::kLn2Lo, r);
  // The low bits of `shifted` hold n; moved into the exponent field they
  // make 2^n (the high bits of the shifter fall off the top).
  Bits bits;
  std::memcpy(&bits, &shifted, sizeof bits);
  bits = (bits + P::kExponentBias) << P::kMantissaBits;
  std::memcpy(&scale, &bits, sizeof bits);
  return expm1_reduced<T, MulAdd>(r);
}

template <typename T, typename MulAdd>
LLTM_ALWAYS_INLINE T fast_exp(T x) {
  T scale;
  const T p = exp_split<T, MulAdd>(x, scale);
  return MulAdd::mul_add(scale, p, scale);
}

// expm1(x) = 2^n - 1 + 2^n expm1(r): exact for small |x| (n = 0), where
// exp(x) - 1 would cancel.
template <typename T, typename MulAdd>
LLTM_ALWAYS_INLINE T fast_expm1(T x) {
  T scale;
  const T p = exp_split<T, MulAdd>(x, scale);
  return MulAdd::mul_add(scale, p, scale - T(1));
}

// The smallest normal number of T.
template <typename T>
constexpr T kMinNormal = std::numeric_limits<T>::min();

// fast_exp clamps its argument, so 1 / (1 + exp(-x)) alone would bottom out
// at 1 / (1 + exp(88)), a subnormal, for every x below -88 (-inf included).
// Results below the smallest normal number are 0 instead: exact where torch
// gives 0 (x < -88.7 in float), and within 1.2e-38 of torch's subnormals just
// above. NaN fails the comparison and stays NaN.
template <typename T, typename MulAdd>
LLTM_ALWAYS_INLINE T fast_sigmoid(T x) {
  const T s = T(1) / (T(1) + fast_exp<T, MulAdd>(-x));
  return s < kMinNormal<T> ? T(0) : s;
}

// ELU with alpha = 1.
template <typename T, typename MulAdd>
LLTM_ALWAYS_INLINE T fast_elu(T x) {
  const T negative = fast_expm1<T, MulAdd>(x);
  return x > T(0) ? x : negative;
}

// tanh(x) = e / (e + 2) with e = expm1(2|x|), sign restored: no cancellation
// for small |x|, and e = huge gives exactly 1.
template <typename T, typename MulAdd>
LLTM_ALWAYS_INLINE T fast_tanh(T x) {
  const T magnitude = x < T(0) ? -x : x;
  const T e = fast_expm1<T, MulAdd>(T(2) * magnitude);
  const T t = e / (e + T(2));
  return x < T(0) ? -t : t;
}

// d elu / dx at x, given y = elu(x) computed in T: 1 where x > 0, else
// exp(x) = y + 1 (y = expm1(x), so no cancellation worth speaking of).
template <typename T>
LLTM_ALWAYS_INLINE T elu_grad(T x, T y) {
  return x > T(0) ? T(1) : y + T(1);
}

}  // namespace lltm::cpu
