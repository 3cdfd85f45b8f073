// The recurrent products of lltm's sequence kernels: C = A @ B (or C += A @ B)
// for a few rows of A at a time, with B fixed for the whole sequence
// (W_h^T forward, W_h backward).
//
// A library GEMM call re-packs B on every call and pays its own set-up; at
// the tutorial's size (16 x 128 by 128 x 384) that is a third of its time.
// Here B is packed once per sequence into panels of kPanel columns (three
// SIMD vectors wide), and each step's product is a sweep of register tiles:
// kRows rows of A by one panel, the A values broadcast, kRows * 3 vector
// accumulators (12 of AVX2's 16 registers, 24 of AVX-512's 32, 18 of NEON's
// 32). Measured on a 2-core AMD EPYC (Zen 3, AVX2), single thread:
// 16x128x384 took 18 us against 25-28 us for MKL through torch, 64x512x1536
// 1.1 ms against 1.3 ms.
//
// Compiled per instruction set (lltm_cpu_isa.h) for float and double: AVX2
// and AVX-512 on x86-64, NEON on arm64 (the same source, with 128-bit vectors). The baseline set
// has no packed kernel and the callers use torch's GEMM. GCC's vector extensions keep the source
// portable; `acc += a * b` becomes one fused multiply-add (C++ allows the contraction, and GCC and
// Clang do it by default).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <type_traits>

#include "lltm_cpu_isa.h"

namespace lltm::cpu {

// The packed kernel for one element type and instruction set.
template <typename T>
struct GemmKernel {
  // Columns per packed panel.
  int64_t panel;
  // Rows of A that threads take in blocks of: whole register tiles.
  int64_t block_rows;
  // Rows [0, m) of C (row stride ldc) = (or +=) A @ B, where a_rows[i] points
  // at row i of A (k contiguous values) and `packed` is B from pack_panels().
  void (*run)(int64_t m, const T* const* a_rows, const T* packed, int64_t k, int64_t n, T* c,
              int64_t ldc, bool accumulate);
};

// B (k x n, element [i][j] at data[i * k_stride + j * n_stride]) as panels of
// `panel` columns: panel p holds rows 0..k-1 of its columns, each row
// `panel` contiguous values, zero beyond column n.
template <typename T>
struct PackedPanels {
  struct Free {
    void operator()(T* p) const { ::operator delete[](p, std::align_val_t(64)); }
  };
  std::unique_ptr<T[], Free> data;

  PackedPanels(const T* b, int64_t k, int64_t n, int64_t k_stride, int64_t n_stride,
               int64_t panel) {
    const int64_t panels = (n + panel - 1) / panel;
    const size_t count = static_cast<size_t>(std::max<int64_t>(1, panels * k * panel));
    data.reset(static_cast<T*>(::operator new[](count * sizeof(T), std::align_val_t(64))));
    T* out = data.get();
    for (int64_t p = 0; p < panels; ++p) {
      const int64_t first = p * panel;
      const int64_t cols = std::min(panel, n - first);
      for (int64_t i = 0; i < k; ++i, out += panel) {
        const T* row = b + i * k_stride + first * n_stride;
        for (int64_t j = 0; j < cols; ++j) out[j] = row[j * n_stride];
        std::fill(out + cols, out + panel, T(0));
      }
    }
  }
};

#if LLTM_X86_DISPATCH || LLTM_ARM64_NEON

template <typename T, int kLanes>
struct VecOf {
  typedef T type __attribute__((vector_size(sizeof(T) * kLanes)));
};

// Vectors pass by reference: by value they would have a different calling
// convention in the baseline part of the library (GCC's -Wpsabi).
template <typename V, typename T>
LLTM_ALWAYS_INLINE void load_vec(V& v, const T* p) {
  std::memcpy(&v, p, sizeof v);
}

template <typename V, typename T>
LLTM_ALWAYS_INLINE void store_vec(T* p, const V& v) {
  std::memcpy(p, &v, sizeof v);
}

// One register tile: rows a[0..kRows) by one panel (3 vectors of kLanes).
// `cols` < the panel width only in the last panel, whose tail is not stored.
template <typename T, int kLanes, int kRows>
LLTM_ALWAYS_INLINE void gemm_tile(const T* const* a, const T* panel, int64_t k, T* c, int64_t ldc,
                                  int64_t cols, bool accumulate) {
  using V = typename VecOf<T, kLanes>::type;
  constexpr int64_t kPanel = 3 * kLanes;
  V acc[kRows][3];
  for (int r = 0; r < kRows; ++r) acc[r][0] = acc[r][1] = acc[r][2] = V{};
  const T* rows[kRows];
  for (int r = 0; r < kRows; ++r) rows[r] = a[r];
  for (int64_t i = 0; i < k; ++i, panel += kPanel) {
    V b0, b1, b2;
    load_vec(b0, panel);
    load_vec(b1, panel + kLanes);
    load_vec(b2, panel + 2 * kLanes);
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      const T x = rows[r][i];
      acc[r][0] += x * b0;
      acc[r][1] += x * b1;
      acc[r][2] += x * b2;
    }
  }
  for (int r = 0; r < kRows; ++r) {
    T* out = c + r * ldc;
    if (cols == kPanel) {
      for (int v = 0; v < 3; ++v) {
        V value = acc[r][v];
        if (accumulate) {
          V old;
          load_vec(old, out + v * kLanes);
          value += old;
        }
        store_vec(out + v * kLanes, value);
      }
    } else {
      T tile[kPanel];
      for (int v = 0; v < 3; ++v) store_vec(tile + v * kLanes, acc[r][v]);
      for (int64_t j = 0; j < cols; ++j) out[j] = accumulate ? out[j] + tile[j] : tile[j];
    }
  }
}

// The last m < kRows rows, one tile of exactly m rows (no wasted rows).
template <typename T, int kLanes, int kRows>
LLTM_ALWAYS_INLINE void gemm_tail(int64_t m, const T* const* a, const T* panel, int64_t k, T* c,
                                  int64_t ldc, int64_t cols, bool accumulate) {
  if constexpr (kRows > 0) {
    if (m == kRows) {
      gemm_tile<T, kLanes, kRows>(a, panel, k, c, ldc, cols, accumulate);
    } else {
      gemm_tail<T, kLanes, kRows - 1>(m, a, panel, k, c, ldc, cols, accumulate);
    }
  }
}

template <typename T, int kLanes, int kRows>
LLTM_ALWAYS_INLINE void gemm_body(int64_t m, const T* const* a, const T* packed, int64_t k,
                                  int64_t n, T* c, int64_t ldc, bool accumulate) {
  constexpr int64_t kPanel = 3 * kLanes;
  // Panel by panel: one panel (k x kPanel) stays in L1/L2 while every row
  // tile of A sweeps over it.
  for (int64_t first = 0; first < n; first += kPanel) {
    const T* panel = packed + first * k;
    const int64_t cols = std::min(kPanel, n - first);
    int64_t r = 0;
    for (; r + kRows <= m; r += kRows) {
      gemm_tile<T, kLanes, kRows>(a + r, panel, k, c + r * ldc + first, ldc, cols, accumulate);
    }
    gemm_tail<T, kLanes, kRows - 1>(m - r, a + r, panel, k, c + r * ldc + first, ldc, cols,
                                    accumulate);
  }
}

#endif  // LLTM_X86_DISPATCH || LLTM_ARM64_NEON

#if LLTM_X86_DISPATCH

template <typename T>
LLTM_TARGET_AVX2 void gemm_avx2(int64_t m, const T* const* a, const T* packed, int64_t k, int64_t n,
                                T* c, int64_t ldc, bool accumulate) {
  gemm_body<T, 32 / sizeof(T), 4>(m, a, packed, k, n, c, ldc, accumulate);
}

template <typename T>
LLTM_TARGET_AVX512 void gemm_avx512(int64_t m, const T* const* a, const T* packed, int64_t k,
                                    int64_t n, T* c, int64_t ldc, bool accumulate) {
  gemm_body<T, 64 / sizeof(T), 8>(m, a, packed, k, n, c, ldc, accumulate);
}

#endif  // LLTM_X86_DISPATCH

#if LLTM_ARM64_NEON

// 32 registers of 128 bits, which the A values share (a scalar float is the
// low lane of a vector register): tiles of 6 rows, 18 accumulators, 3
// vectors of the panel's row and the 6 A values. With AVX-512's 8 rows GCC
// spilled 3 accumulators to the stack in the inner loop.
template <typename T>
void gemm_neon(int64_t m, const T* const* a, const T* packed, int64_t k, int64_t n, T* c,
               int64_t ldc, bool accumulate) {
  gemm_body<T, 16 / sizeof(T), 6>(m, a, packed, k, n, c, ldc, accumulate);
}

#endif  // LLTM_ARM64_NEON

// The packed kernel for this CPU, or nullptr where torch's GEMM serves (the
// baseline instruction set, other architectures, other element types).
template <typename T>
const GemmKernel<T>* packed_gemm() {
#if LLTM_ARM64_NEON
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    static const GemmKernel<T> neon{3 * 16 / sizeof(T), 12, &gemm_neon<T>};
    if (selected_isa() == Isa::kNeon) return &neon;
  }
#endif
#if LLTM_X86_DISPATCH
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    static const GemmKernel<T> avx2{3 * 32 / sizeof(T), 8, &gemm_avx2<T>};
    static const GemmKernel<T> avx512{3 * 64 / sizeof(T), 8, &gemm_avx512<T>};
    switch (selected_isa()) {
      case Isa::kAvx512:
        return &avx512;
      case Isa::kAvx2:
        return &avx2;
      default:
        return nullptr;
    }
  }
#endif
  return nullptr;
}

}  // namespace lltm::cpu
