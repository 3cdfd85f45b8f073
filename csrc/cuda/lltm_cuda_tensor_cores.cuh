// A block's product on the tensor cores, for the persistent kernels'
// recurrence in 16 bits, and in float32 under TF32 (below)
// (lltm_cuda_persistent_forward.cuh, _backward.cuh):
// D(m, n) = sum_k W(m, k) X(n, k), with W the block's slice of W_h in 16
// bits (its gate rows in the forward, the state's units in the backward: M)
// and X float32, a row per batch row (the running h, or the step's gate
// gradients: N), read through a function of (n, k) (shared memory, or
// global memory at L2 where a plan reads h there), D float32. Each warp
// computes 16 x 8 tiles of D with mma.sync m16n8k16 (warp_mma_m16n8k16_pair,
// lltm_cuda_runtime.h) in float32 accumulators. The batch is the
// instruction's N, 8 rows, as the blocks' groups have few rows (2 to 24 at
// the GPU sizes): as M it would leave more of each instruction idle.
//
// X is float32 and stays so: each of its elements enters the product as two
// 16-bit terms, high = T(x) and low = T(x - high), so that the product
// reads x to about 16 significant bits (bf16: 8 + 8; fp16: 11 + 11), two
// instructions per tile, where x rounded once to 16 bits would put that
// rounding into every step's recurrent input and the steps after it carry it
// on (tests/test_cuda_persistent_16_bit.py holds the result to nn.LSTM's own
// error). W_h is in T already: its products are exact in float32.
//
// Non-finite values keep their meaning: an x that is inf or NaN (or past
// fp16's 65504: inf in `high`, as it is in the d_gates the backward writes
// in fp16) enters as `high` alone, with a low term of zero, since inf - inf
// would make it NaN. An infinite weight would meet a low term of zero and
// give NaN where the product is infinite: the kernels take the CUDA cores'
// product for a block whose slice of W_h is not all finite
// (lltm_cuda_persistent.cuh, load_weight_slice_flagged).
//
// float32 in TF32 (the plan's tf32: float32 where torch allows TF32 for its
// matrix products): mma.sync m16n8k8 .tf32 (warp_mma_m16n8k8_tf32) in
// float32 accumulators, with every float32 input split in two TF32 terms,
// x = high + low (high = x rounded to TF32, low = the rest rounded to TF32:
// x to about 22 significant bits), and each product of the tile taken as
// three instructions, W_low X_high + W_high X_low + W_high X_high (the low
// terms' product, 2**-22 of the whole, left out): "3xTF32". One term each
// would be TF32 as cuBLAS and cuDNN run it, an error of up to 2**-11 in
// every input, and the LLTM cell, without a forget gate, adds each step's
// error to its cell state and keeps it: at 50 steps that made lltm 1.4 to
// 9 times less accurate than nn.LSTM under cuDNN's one-term TF32, which its
// forget gate damps (tests/test_cuda_tf32.py). With three terms the
// products are as accurate as float32's, at three times the tensor cores'
// instructions, still a fraction of what the CUDA cores take for the same
// product. W stays exact float32 in shared memory and both operands are
// split as their fragments are loaded (a cvt, a subtraction and a cvt).
//
// Non-finite values keep their meaning, as float32's product has it, with
// no fallback: a non-finite x has a low term of zero (inf - inf is NaN),
// and its high term meets the other operand's low term only as zero (the
// high term where finite, else zero: finite_or_zero). So an infinite input
// times a finite non-zero one is infinite, and NaN goes where float32's
// product has it.
//
// Fragments, as the PTX ISA lays them out for m16n8k16 (lane = 4 group +
// t): A's rows group and group + 8, columns 2t, 2t + 1, 2t + 8, 2t + 9; B's
// rows (k) 2t, 2t + 1, 2t + 8, 2t + 9 of column group; D's rows group and
// group + 8, columns 2t and 2t + 1. For m16n8k8 .tf32, one element a
// register: A's rows group and group + 8 at columns t and t + 4 (registers
// 0, 1, 2, 3: (group, t), (group + 8, t), (group, t + 4), (group + 8,
// t + 4)); B's rows t and t + 4 of column group; D as m16n8k16's. Elements
// past the product's edges read as zero (never memory past them), so that
// any size works.
#pragma once

#include <torch/headeronly/util/BFloat16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "lltm_cuda_persistent_plan.h"
#include "lltm_cuda_runtime.h"

namespace lltm::cuda {

// The instruction's shape: lltm_cuda_persistent_plan.h's kTensorCoreTileWeights
// (M: rows of W), kTensorCoreTileRows (N: batch rows), kTensorCoreInner (K).

// Two elements of T, the first in the low half, as a fragment register
// holds them.
template <typename T>
__device__ __forceinline__ uint32_t pack_pair(T first, T second) {
  return uint32_t(first.x) | (uint32_t(second.x) << 16);
}

// x - high in T, the low term of x = high + low; zero where high is not
// finite.
template <typename T>
__device__ __forceinline__ T low_term(float x, T high) {
  const float h = float(high);
  return finite_value(h) ? T(x - h) : T(0.0f);
}

// A lane's A fragment: W's tile at (m0, k0), W(m, k) = w[m * m_stride +
// k * k_stride]; zero at m >= ms or k >= inner.
template <typename T>
__device__ __forceinline__ void load_a(const T* w, int m_stride, int k_stride, int m0, int k0,
                                       int ms, int inner, uint32_t (&fragment)[4]) {
  const int lane = int(threadIdx.x % 32);
  const int group = lane / 4, t = lane % 4;
#pragma unroll
  for (int r = 0; r < 4; ++r) {  // register r: row + 8 for odd r, k + 8 from r = 2
    const int m = m0 + group + (r % 2) * 8;
    const int k = k0 + 2 * t + (r / 2) * 8;
    const T* at = w + m * m_stride + k * k_stride;
    const T first = m < ms && k < inner ? at[0] : T(0.0f);
    const T second = m < ms && k + 1 < inner ? at[k_stride] : T(0.0f);
    fragment[r] = pack_pair(first, second);
  }
}

// A lane's B fragment: X's tile at (k0, n0), B(k, n) = X(n, k) =
// x_at(n, k), split in its high and low 16-bit terms; zero at n >= ns or
// k >= inner (x_at is not called there).
template <typename T, typename XAt>
__device__ __forceinline__ void load_b_split(const XAt& x_at, int k0, int n0, int ns, int inner,
                                             uint32_t (&high)[2], uint32_t (&low)[2]) {
  const int lane = int(threadIdx.x % 32);
  const int n = n0 + lane / 4, t = lane % 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {  // register r: k + 8 for r = 1
    const int k = k0 + 2 * t + r * 8;
    const float first = n < ns && k < inner ? x_at(n, k) : 0.0f;
    const float second = n < ns && k + 1 < inner ? x_at(n, k + 1) : 0.0f;
    const T first_high(first), second_high(second);
    high[r] = pack_pair(first_high, second_high);
    low[r] = pack_pair(low_term<T>(first, first_high), low_term<T>(second, second_high));
  }
}

// A float32's bits, as a TF32 fragment register holds it.
__device__ __forceinline__ uint32_t tf32_register(float x) {
  uint32_t bits;
  static_assert(sizeof bits == sizeof x);
  memcpy(&bits, &x, sizeof bits);
  return bits;
}

// x's TF32 terms as fragment registers: high = x rounded to TF32, low =
// x - high rounded to TF32, zero where high is not finite.
__device__ __forceinline__ void split_tf32(float x, uint32_t& high, uint32_t& low) {
  const float h = round_to_tf32(x);
  high = tf32_register(h);
  low = finite_value(h) ? tf32_register(round_to_tf32(x - h)) : 0u;
}

// A fragment register's TF32 value where finite, else zero: a high term as
// the partner of the other operand's low term.
__device__ __forceinline__ uint32_t finite_or_zero(uint32_t bits) {
  return (bits & 0x7f800000u) == 0x7f800000u ? 0u : bits;
}

// A lane's m16n8k8 .tf32 A fragment of W's tile at (m0, k0), W(m, k) =
// w[m * m_stride + k * k_stride] (float32), in its two TF32 terms; zero at
// m >= ms or k >= inner.
__device__ __forceinline__ void load_a_tf32_split(const float* w, int m_stride, int k_stride,
                                                  int m0, int k0, int ms, int inner,
                                                  uint32_t (&high)[4], uint32_t (&low)[4]) {
  const int lane = int(threadIdx.x % 32);
  const int group = lane / 4, t = lane % 4;
#pragma unroll
  for (int r = 0; r < 4; ++r) {  // register r: row + 8 for odd r, k + 4 from r = 2
    const int m = m0 + group + (r % 2) * 8;
    const int k = k0 + t + (r / 2) * 4;
    split_tf32(m < ms && k < inner ? w[m * m_stride + k * k_stride] : 0.0f, high[r], low[r]);
  }
}

// A lane's m16n8k8 .tf32 B fragment of X's tile at (k0, n0), B(k, n) =
// X(n, k) = x_at(n, k), in its two TF32 terms; zero at n >= ns or
// k >= inner (x_at is not called there).
template <typename XAt>
__device__ __forceinline__ void load_b_tf32_split(const XAt& x_at, int k0, int n0, int ns,
                                                  int inner, uint32_t (&high)[2],
                                                  uint32_t (&low)[2]) {
  const int lane = int(threadIdx.x % 32);
  const int n = n0 + lane / 4, t = lane % 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {  // register r: k + 4 for r = 1
    const int k = k0 + t + r * 4;
    split_tf32(n < ns && k < inner ? x_at(n, k) : 0.0f, high[r], low[r]);
  }
}

// Steps whose X fragments a warp loads before it issues their instructions,
// so that their loads are in flight together: where X is read at L2 (a plan
// that reads h in global memory) as much as from shared memory. Two, not
// more: the cooperative forward, which carries both ways of reading h, stays
// within its 128 registers.
constexpr int kStepsInFlight = 2;

// tensor_core_product of 16-bit W: X split in two terms (above).
template <typename T, typename XAt, typename Store>
__device__ __forceinline__ void tensor_core_product_16_bit(const T* w, int m_stride, int k_stride,
                                                           const XAt& x_at, int ms, int ns,
                                                           int inner, int split,
                                                           const Store& store) {
  static_assert(sizeof(T) == 2, "16-bit inputs");
  constexpr bool kBFloat16 = std::is_same_v<T, torch::headeronly::BFloat16>;
  const int warp = int(threadIdx.x / 32), warps = int(blockDim.x / 32);
  const int lane = int(threadIdx.x % 32);
  const int m_tiles = (ms + kTensorCoreTileWeights - 1) / kTensorCoreTileWeights;
  const int n_tiles = (ns + kTensorCoreTileRows - 1) / kTensorCoreTileRows;
  const int steps = (inner + kTensorCoreInner - 1) / kTensorCoreInner;
  for (int item = warp; item < split * m_tiles * n_tiles; item += warps) {
    const int part = item % split;
    const int tile = item / split;
    const int m0 = (tile % m_tiles) * kTensorCoreTileWeights;
    const int n0 = (tile / m_tiles) * kTensorCoreTileRows;
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int first = part; first < steps; first += kStepsInFlight * split) {
      // X's fragments of kStepsInFlight steps first (zero past `inner`),
      // then their instructions in step order.
      uint32_t high[kStepsInFlight][2], low[kStepsInFlight][2];
#pragma unroll
      for (int i = 0; i < kStepsInFlight; ++i) {
        load_b_split<T>(x_at, (first + i * split) * kTensorCoreInner, n0, ns, inner, high[i],
                        low[i]);
      }
#pragma unroll
      for (int i = 0; i < kStepsInFlight; ++i) {
        const int step = first + i * split;  // the same in every lane
        if (step >= steps) break;
        uint32_t a[4];
        load_a<T>(w, m_stride, k_stride, m0, step * kTensorCoreInner, ms, inner, a);
        // The low terms first: the smaller sums meet first.
        warp_mma_m16n8k16_pair<kBFloat16>(d, a, low[i], high[i]);
      }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int m = m0 + lane / 4 + (i / 2) * 8;
      const int n = n0 + 2 * (lane % 4) + i % 2;
      if (m < ms && n < ns) store(part, m, n, d[i]);
    }
  }
}

// tensor_core_product in TF32, three terms (above): W and X float32.
template <typename XAt, typename Store>
__device__ __forceinline__ void tensor_core_product_tf32(const float* w, int m_stride, int k_stride,
                                                         const XAt& x_at, int ms, int ns, int inner,
                                                         int split, const Store& store) {
  const int warp = int(threadIdx.x / 32), warps = int(blockDim.x / 32);
  const int lane = int(threadIdx.x % 32);
  const int m_tiles = (ms + kTensorCoreTileWeights - 1) / kTensorCoreTileWeights;
  const int n_tiles = (ns + kTensorCoreTileRows - 1) / kTensorCoreTileRows;
  const int steps = (inner + kTensorCoreInnerTf32 - 1) / kTensorCoreInnerTf32;
  for (int item = warp; item < split * m_tiles * n_tiles; item += warps) {
    const int part = item % split;
    const int tile = item / split;
    const int m0 = (tile % m_tiles) * kTensorCoreTileWeights;
    const int n0 = (tile / m_tiles) * kTensorCoreTileRows;
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int first = part; first < steps; first += kStepsInFlight * split) {
      uint32_t b_high[kStepsInFlight][2], b_low[kStepsInFlight][2];
#pragma unroll
      for (int i = 0; i < kStepsInFlight; ++i) {
        load_b_tf32_split(x_at, (first + i * split) * kTensorCoreInnerTf32, n0, ns, inner,
                          b_high[i], b_low[i]);
      }
#pragma unroll
      for (int i = 0; i < kStepsInFlight; ++i) {
        const int step = first + i * split;  // the same in every lane
        if (step >= steps) break;
        uint32_t a_high[4], a_low[4];
        load_a_tf32_split(w, m_stride, k_stride, m0, step * kTensorCoreInnerTf32, ms, inner, a_high,
                          a_low);
        // The low terms first: the smaller sums meet first.
        const uint32_t b_partner[2] = {finite_or_zero(b_high[i][0]), finite_or_zero(b_high[i][1])};
        uint32_t a_partner[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) a_partner[r] = finite_or_zero(a_high[r]);
        warp_mma_m16n8k8_tf32(d, a_low, b_partner);
        warp_mma_m16n8k8_tf32(d, a_partner, b_low[i]);
        warp_mma_m16n8k8_tf32(d, a_high, b_high[i]);
      }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int m = m0 + lane / 4 + (i / 2) * 8;
      const int n = n0 + 2 * (lane % 4) + i % 2;
      if (m < ms && n < ns) store(part, m, n, d[i]);
    }
  }
}

// D(m, n) = sum_k W(m, k) X(n, k) for W(m, k) = w[m * m_stride + k *
// k_stride] (T, ms x inner) and X(n, k) = x_at(n, k) (ns x inner, float32),
// over the warps of the block: the inner dimension is split into `split`
// parts (part p takes the instructions' steps p, p + split, ...), and each
// warp takes (part, tile) items in turn, every lane of it the same ones. For
// each element of D (m < ms, n < ns) of a part, store(part, m, n, value) is
// called by the lane that holds it. Every thread of the block must call
// this, the block's size a multiple of 32.
//
// T = float: the product in TF32 with three terms (above), the
// instructions' steps kTensorCoreInnerTf32 long.
template <typename T, typename XAt, typename Store>
__device__ __forceinline__ void tensor_core_product(const T* w, int m_stride, int k_stride,
                                                    const XAt& x_at, int ms, int ns, int inner,
                                                    int split, const Store& store) {
  if constexpr (std::is_same_v<T, float>) {
    tensor_core_product_tf32(w, m_stride, k_stride, x_at, ms, ns, inner, split, store);
  } else {
    tensor_core_product_16_bit<T>(w, m_stride, k_stride, x_at, ms, ns, inner, split, store);
  }
}

}  // namespace lltm::cuda
