// The forward of lltm's fused sequence kernels (dispatch.h):
// every step of a block of batch rows, as register tiles over the packed
// [W_x | W_h]^T that end in the cell's pointwise forward.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "../row_ref.h"
#include "simd.h"
#include "step_args.h"
#include "tile_product.h"
#include "vector_math.h"

namespace lltm::cpu {

// A forward tile's rows and columns: its first `real` rows are real (the
// others pad it to its height).
template <typename T>
struct ForwardTile {
  const RowRef<const T>* c;  // c_prev of the real rows
  int64_t first_row;         // output row of the tile's first row
  int64_t real;
  int64_t j0, cols;  // state columns [j0, j0 + cols)
};

// After the product: acc holds the pre-activations of the tile's input
// gates, output gates and candidates. Activates them and writes the tile's
// gates, new h and new cell: first the three activations of every row, then
// the cells (a row at a time from start to end would chain ~150 cycles of
// latency per row, more than the out-of-order window overlaps).
template <typename T, typename Set, int kRows>
LLTM_ALWAYS_INLINE void forward_epilogue(const ForwardSteps<T>& a, const ForwardTile<T>& tile,
                                         typename Simd<T, Set::kBytes>::Vec (&acc)[kRows][3]) {
  using V = typename Simd<T, Set::kBytes>::Vec;
  using M = VectorMath<T, Set::kBytes>;
  const int64_t S = a.state, j0 = tile.j0, cols = tile.cols;
  V i[kRows], o[kRows], g[kRows];
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
    M::sigmoid(i[r], acc[r][0]);
    M::sigmoid(o[r], acc[r][1]);
    M::elu(g[r], acc[r][2]);
  }
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
    if (r >= tile.real) break;
    const int64_t row = tile.first_row + r;
    V c, t;
    load_cols(c, tile.c[r], j0, cols);
    c = c + g[r] * i[r];
    M::tanh(t, c);
    const V h = t * o[r];
    T* gates = a.gates + row * 3 * S + j0;
    store_cols(gates, i[r], cols);
    store_cols(gates + S, o[r], cols);
    store_cols(gates + 2 * S, acc[r][2], cols);
    store_cols(a.out + row * S + j0, h, cols);
    store_cols(a.cells + row * S + j0, c, cols);
  }
}

// Where a forward pass of register tiles works: k in [k0, k1) of the
// depth features + state (x's columns, then h_prev's), its rows' partial
// sums (3 vectors a row) when the product takes several passes.
template <typename T>
struct ForwardPass {
  int64_t k0, k1;
  T* partial;  // null: a single pass
};

// One forward tile: kRows rows of x and h_prev (x[r], h[r]) by the three
// gates of a panel's L state columns over one pass's k; after the last
// pass, the epilogue.
template <typename T, typename Set, int kRows>
LLTM_ALWAYS_INLINE void forward_tile(const ForwardSteps<T>& a, const T* const* x, const T* const* h,
                                     const T* panel, const ForwardTile<T>& tile,
                                     const ForwardPass<T>& pass) {
  using V = typename Simd<T, Set::kBytes>::Vec;
  constexpr int64_t L = Simd<T, Set::kBytes>::kLanes;
  const int64_t F = a.features, depth = a.features + a.state;
  V acc[kRows][3];
  if (pass.k0 == 0) {
#pragma GCC unroll 3
    for (int v = 0; v < 3; ++v) {
      V b;
      load_vec(b, panel + v * L);
#pragma GCC unroll 8
      for (int r = 0; r < kRows; ++r) acc[r][v] = b;
    }
  } else {
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 3
      for (int v = 0; v < 3; ++v) load_vec(acc[r][v], pass.partial + (r * 3 + v) * L);
    }
  }
  const T* weights = panel + 3 * L;  // after the bias
  if (pass.k0 < F) {
    const int64_t k1 = std::min(pass.k1, F);
    const T* xs[kRows];
    for (int r = 0; r < kRows; ++r) xs[r] = x[r] + pass.k0;
    multiply_panel<V, T, kRows, 3>(acc, xs, weights + pass.k0 * 3 * L, k1 - pass.k0);
  }
  if (pass.k1 > F) {
    const int64_t k0 = std::max(pass.k0, F) - F;
    const T* hs[kRows];
    for (int r = 0; r < kRows; ++r) hs[r] = h[r] + k0;
    multiply_panel<V, T, kRows, 3>(acc, hs, weights + (F + k0) * 3 * L, pass.k1 - F - k0);
  }
  if (pass.k1 == depth) {
    forward_epilogue<T, Set, kRows>(a, tile, acc);
  } else {
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 3
      for (int v = 0; v < 3; ++v) store_vec(pass.partial + (r * 3 + v) * L, acc[r][v]);
    }
  }
}

// Rows [0, m) of a step, m >= 1, by tiles of kRows; the last tile is the
// smallest of kRows, kRows / 2, kRows / 4, ... (8, 4, 2, 1 or NEON's 6, 3,
// 1) that holds the rows left, padded by repeating the last real row.
template <typename T, typename Set, int kRows>
LLTM_ALWAYS_INLINE void forward_rows(const ForwardSteps<T>& a, const T* const* x, const T* const* h,
                                     int64_t m, const T* panel, ForwardTile<T> tile,
                                     ForwardPass<T> pass) {
  constexpr int64_t kRowValues = 3 * Simd<T, Set::kBytes>::kLanes;
  for (; m >= kRows; m -= kRows, x += kRows, h += kRows) {
    tile.real = kRows;
    forward_tile<T, Set, kRows>(a, x, h, panel, tile, pass);
    tile.c += kRows;
    tile.first_row += kRows;
    if (pass.partial != nullptr) pass.partial += kRows * kRowValues;
  }
  if constexpr (kRows > 1) {
    if (m > kRows / 2) {
      const T* x_padded[kRows];
      const T* h_padded[kRows];
      for (int r = 0; r < kRows; ++r) {
        x_padded[r] = x[std::min<int64_t>(r, m - 1)];
        h_padded[r] = h[std::min<int64_t>(r, m - 1)];
      }
      tile.real = m;
      forward_tile<T, Set, kRows>(a, x_padded, h_padded, panel, tile, pass);
    } else if (m > 0) {
      forward_rows<T, Set, kRows / 2>(a, x, h, m, panel, tile, pass);
    }
  }
}

template <typename T, typename Set>
LLTM_ALWAYS_INLINE void forward_block(const ForwardSteps<T>& a, int64_t first, int64_t last) {
  const int64_t S = a.state;
  const ForwardPanels<T>& w = *a.weights;
  const StepOrder& order = a.order;
  std::vector<const T*> x(last - first), h(last - first);
  std::vector<RowRef<const T>> c(last - first);
  const auto [passes, pass_depth] = passes_of<T>(a.features + S, 3 * w.lanes);
  // Partial sums of every row (and of a padded tile's extra rows).
  std::vector<T> partial(passes > 1 ? (last - first + Set::kRows) * 3 * w.lanes : 0);
  for (int64_t k = 0; k < order.steps; ++k) {
    const int64_t end = std::min(last, order.sizes[k]);
    if (end <= first) continue;
    const int64_t start = order.starts[k];
    const int64_t previous = order.size(k - 1);
    const int64_t previous_start = k == 0 ? 0 : order.starts[k - 1];
    // Row r's state before this step: the step before's when it had the
    // row, else the initial one.
    for (int64_t r = first; r < end; ++r) {
      x[r - first] = a.x + (start + r) * a.x_stride;
      if (r < previous) {
        h[r - first] = a.out + (previous_start + r) * S;
        c[r - first] = {a.cells + (previous_start + r) * S, 1};
      } else {
        h[r - first] = a.h0 + r * a.h0_stride;
        c[r - first] = {a.c0 + r * a.c0_row, a.c0_col};
      }
    }
    // Panel by panel, pass by pass: each slice stays in L1 while every row
    // tile sweeps it.
    for (int64_t p = 0; p < w.panels; ++p) {
      const int64_t j0 = p * w.lanes;
      const ForwardTile<T> tile{c.data(), start + first, 0, j0, std::min(w.lanes, S - j0)};
      for (int64_t k0 = 0; k0 < a.features + S; k0 += pass_depth) {
        const ForwardPass<T> pass{k0, std::min(k0 + pass_depth, a.features + S),
                                  passes > 1 ? partial.data() : nullptr};
        forward_rows<T, Set, Set::kRows>(a, x.data(), h.data(), end - first,
                                         w.values.get() + p * w.panel_size, tile, pass);
      }
    }
  }
}

}  // namespace lltm::cpu
