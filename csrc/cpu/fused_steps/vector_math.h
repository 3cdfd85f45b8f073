// The LLTM's activations on SIMD vectors (simd.h), for the sequence's fused
// steps: exp, expm1, sigmoid, tanh, ELU and ELU's derivative.
//
// They are pointwise/scalar_math.h's, formula for formula and in the same
// order (so the values are those of the cell's kernels), written on vectors
// instead of scalars for two reasons: the epilogues work on the tile's
// registers with no staging through memory, and the clamp of exp's argument
// (`x < lo ? lo : x`, then `x > hi ? hi : x`, NaN kept) stays two compares
// and two blends; the compiler's vectorization of the scalar form merged the
// two selects into four compares, two ands and three blends per exp, on the
// ports the FMAs need.
//
// Multiply-adds are written a * b + c: the compiler contracts them into one
// fused multiply-add where the target has FMA (GCC and Clang do by default),
// as pointwise/scalar_math.h's FusedMulAdd does, and computes them separately
// where it has none, as its SeparateMulAdd does.
#pragma once

#include <type_traits>

#include "../isa.h"
#include "../pointwise/scalar_math.h"
#include "simd.h"

namespace lltm::cpu {

// The activations on vectors of T.
template <typename T, int kBytes>
struct VectorMath {
  using V = typename Simd<T, kBytes>::Vec;
  using Mask = typename Simd<T, kBytes>::Mask;
  using Bits = typename Simd<T, kBytes>::Bits;
  using P = ExpParams<T>;

  // expm1(r) on |r| <= ln2 / 2, as expm1_reduced.
  static LLTM_ALWAYS_INLINE void expm1_reduced(V& out, const V& r) {
    V q;
    if constexpr (std::is_same_v<T, float>) {
      q = V{} + T(1.0 / 40320);
      q = q * r + T(1.0 / 5040);
      q = q * r + T(1.0 / 720);
      q = q * r + T(1.0 / 120);
      q = q * r + T(1.0 / 24);
      q = q * r + T(1.0 / 6);
      q = q * r + T(0.5);
    } else {
      q = V{} + T(1.0 / 6227020800.0);
      q = q * r + T(1.0 / 479001600.0);
      q = q * r + T(1.0 / 39916800.0);
      q = q * r + T(1.0 / 3628800.0);
      q = q * r + T(1.0 / 362880.0);
      q = q * r + T(1.0 / 40320.0);
      q = q * r + T(1.0 / 5040.0);
      q = q * r + T(1.0 / 720.0);
      q = q * r + T(1.0 / 120.0);
      q = q * r + T(1.0 / 24.0);
      q = q * r + T(1.0 / 6.0);
      q = q * r + T(0.5);
    }
    const V r2 = r * r;
    out = r2 * q + r;
  }

  // As exp_split: 2^n into scale, expm1(r) into out.
  static LLTM_ALWAYS_INLINE void exp_split(V& out, V& scale, const V& x) {
    V v = x < T(P::kMinArg) ? V{} + T(P::kMinArg) : x;
    v = v > T(P::kMaxArg) ? V{} + T(P::kMaxArg) : v;
    const V shifted = v * T(P::kLog2e) + T(P::kShifter);
    const V n = shifted - T(P::kShifter);
    V r = n * T(-P::kLn2Hi) + v;
    r = n * T(-P::kLn2Lo) + r;
    // The low bits of `shifted` hold n: moved into the exponent field they
    // make 2^n.
    Bits bits = (Bits)shifted;
    bits = (bits + P::kExponentBias) << P::kMantissaBits;
    scale = (V)bits;
    expm1_reduced(out, r);
  }

  static LLTM_ALWAYS_INLINE void exp(V& out, const V& x) {
    V scale, p;
    exp_split(p, scale, x);
    out = scale * p + scale;
  }

  static LLTM_ALWAYS_INLINE void expm1(V& out, const V& x) {
    V scale, p;
    exp_split(p, scale, x);
    out = scale * p + (scale - T(1));
  }

  static LLTM_ALWAYS_INLINE void sigmoid(V& out, const V& x) {
    V e;
    exp(e, -x);
    const V s = T(1) / (T(1) + e);
    out = s < kMinNormal<T> ? V{} : s;
  }

  static LLTM_ALWAYS_INLINE void elu(V& out, const V& x) {
    V negative;
    expm1(negative, x);
    out = x > T(0) ? x : negative;
  }

  static LLTM_ALWAYS_INLINE void tanh(V& out, const V& x) {
    const Mask negative = x < T(0);
    const V magnitude = negative ? -x : x;
    V e;
    expm1(e, T(2) * magnitude);
    const V t = e / (e + T(2));
    out = negative ? -t : t;
  }

  // d elu / dx from x and y = elu(x), as elu_grad.
  static LLTM_ALWAYS_INLINE void elu_grad(V& out, const V& x, const V& y) {
    out = x > T(0) ? V{} + T(1) : y + T(1);
  }
};

}  // namespace lltm::cpu
