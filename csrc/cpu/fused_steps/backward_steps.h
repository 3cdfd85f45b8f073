// The backward of lltm's fused sequence kernels (dispatch.h):
// backpropagation through time for a block of batch rows, each step's
// product with the packed W_h and then the cell's pointwise backward.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "../pointwise/row_passes.h"  // kFoldRows: grad_bias summed as the cell sums it
#include "../row_ref.h"
#include "simd.h"
#include "step_args.h"
#include "tile_product.h"
#include "vector_math.h"

namespace lltm::cpu {

// One backward product tile: dh = dg_{t+1} W_h for kRows rows (rows[r]: a
// row of dg_{t+1}, 3S values) by kV vectors of state columns from j0 (cols
// of them real), into rows r0 ... of a.dh; the first `real` rows are real.
template <typename T, typename Set, int kRows, int kV>
LLTM_ALWAYS_INLINE void backward_tile(const BackwardSteps<T>& a, const T* const* rows,
                                      const T* panel, int64_t real, int64_t r0, int64_t j0,
                                      int64_t cols) {
  using V = typename Simd<T, Set::kBytes>::Vec;
  constexpr int64_t L = Simd<T, Set::kBytes>::kLanes;
  V acc[kRows][kV];
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 3
    for (int v = 0; v < kV; ++v) acc[r][v] = V{};
  }
  multiply_panel<V, T, kRows, kV>(acc, rows, panel, 3 * a.state);
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
    if (r >= real) break;
    T* dh = a.dh + (r0 + r) * a.state + j0;
    if (cols == kV * L) {
#pragma GCC unroll 3
      for (int v = 0; v < kV; ++v) store_vec(dh + v * L, acc[r][v]);
    } else {
#pragma GCC unroll 3
      for (int v = 0; v < kV; ++v) store_cols(dh + v * L, acc[r][v], std::min(L, cols - v * L));
    }
  }
}

// Rows [r0, r0 + m) of the batch, m >= 1, by tiles as forward_rows does.
template <typename T, typename Set, int kRows, int kV>
LLTM_ALWAYS_INLINE void backward_rows(const BackwardSteps<T>& a, const T* const* rows, int64_t m,
                                      int64_t r0, const T* panel, int64_t j0, int64_t cols) {
  for (; m >= kRows; m -= kRows, rows += kRows, r0 += kRows) {
    backward_tile<T, Set, kRows, kV>(a, rows, panel, kRows, r0, j0, cols);
  }
  if constexpr (kRows > 1) {
    if (m > kRows / 2) {
      const T* padded[kRows];
      for (int r = 0; r < kRows; ++r) padded[r] = rows[std::min<int64_t>(r, m - 1)];
      backward_tile<T, Set, kRows, kV>(a, padded, panel, m, r0, j0, cols);
    } else if (m > 0) {
      backward_rows<T, Set, kRows / 2, kV>(a, rows, m, r0, panel, j0, cols);
    }
  }
}

// a.dh rows [r0, r1) = dg_{t+1} W_h, rows[r - r0] being row r of dg_{t+1}.
template <typename T, typename Set>
LLTM_ALWAYS_INLINE void backward_product(const BackwardSteps<T>& a, const T* const* rows,
                                         int64_t r0, int64_t r1) {
  // (The panels are swept from L2 whole: unlike the forward's, splitting
  // them into passes that stay in L1 measured no faster, at either size.)
  const BackwardPanels<T>& w = *a.weights;
  for (size_t p = 0; p < w.first.size(); ++p) {
    const T* panel = w.values.get() + w.offset[p];
    const int64_t j0 = w.first[p];
    const int64_t cols = std::min(w.vectors[p] * w.lanes, a.state - j0);
    switch (w.vectors[p]) {
      case 3:
        backward_rows<T, Set, Set::kRows, 3>(a, rows, r1 - r0, r0, panel, j0, cols);
        break;
      case 2:
        backward_rows<T, Set, Set::kRows, 2>(a, rows, r1 - r0, r0, panel, j0, cols);
        break;
      default:
        backward_rows<T, Set, Set::kRows, 1>(a, rows, r1 - r0, r0, panel, j0, cols);
        break;
    }
  }
}

// One vector of the cell's backward: columns [j, j + count) of one row.
// kDense: the row is dense and count is the vector's width.
template <typename T, typename Set, bool kDense>
LLTM_ALWAYS_INLINE void backward_vector(RowRef<const T> dy, RowRef<const T> gates,
                                        RowRef<const T> cell, const T* dh_row, T* dc_row, T* dg_row,
                                        int64_t S, int64_t j, int64_t count, T* bias,
                                        int64_t bias_stride) {
  using V = typename Simd<T, Set::kBytes>::Vec;
  using M = VectorMath<T, Set::kBytes>;
  V dh, dc, c1, i, o, x, bi, bo, bg;
  if constexpr (kDense) {
    load_vec(dh, dh_row + j);
    if (dy.data != nullptr) {
      V y;
      load_vec(y, dy.data + j);
      dh = dh + y;
    }
    load_vec(dc, dc_row + j);
    load_vec(c1, cell.data + j);
    load_vec(i, gates.data + j);
    load_vec(o, gates.data + S + j);
    load_vec(x, gates.data + 2 * S + j);
  } else {
    load_cols(dh, RowRef<const T>{dh_row, 1}, j, count);
    if (dy.data != nullptr) {
      V y;
      load_cols(y, dy, j, count);
      dh = dh + y;
    }
    load_cols(dc, RowRef<const T>{dc_row, 1}, j, count);
    load_cols(c1, cell, j, count);
    load_cols(i, gates, j, count);
    load_cols(o, gates, S + j, count);
    load_cols(x, gates, 2 * S + j, count);
  }
  V g, t, e;
  M::elu(g, x);
  M::tanh(t, c1);
  M::elu_grad(e, x, g);
  // new_h = tanh(new_cell) * o; new_cell = old_cell + g * i. Factors in the
  // order of torch's derivatives, as the cell's backward.
  const V d_cell = dh * o * (T(1) - t * t) + dc;
  const V d_i = d_cell * g * (T(1) - i) * i;
  const V d_o = dh * t * (T(1) - o) * o;
  const V d_g = d_cell * i * e;
  // bias: padded lanes hold zeros' gradients, summed but never read.
  T* bias_o = bias + bias_stride;
  T* bias_g = bias_o + bias_stride;
  load_vec(bi, bias + j);
  load_vec(bo, bias_o + j);
  load_vec(bg, bias_g + j);
  store_vec(bias + j, bi + d_i);
  store_vec(bias_o + j, bo + d_o);
  store_vec(bias_g + j, bg + d_g);
  if constexpr (kDense) {
    store_vec(dg_row + j, d_i);
    store_vec(dg_row + S + j, d_o);
    store_vec(dg_row + 2 * S + j, d_g);
    store_vec(dc_row + j, d_cell);
  } else {
    store_cols(dg_row + j, d_i, count);
    store_cols(dg_row + S + j, d_o, count);
    store_cols(dg_row + 2 * S + j, d_g, count);
    store_cols(dc_row + j, d_cell, count);
  }
}

// Running sums of d_gates for grad_bias: kFoldRows rows at a time in T
// (3 blocks of the state rounded up to whole vectors), then in double.
template <typename T>
struct BiasSums {
  int64_t state, padded;
  std::vector<T> rows;
  int64_t folded = 0;
  double* total;  // 3S, or null: not wanted

  BiasSums(int64_t state_, int64_t lanes, double* total_)
      : state(state_),
        padded((state_ + lanes - 1) / lanes * lanes),
        rows(3 * padded),
        total(total_) {}

  void row_done() {
    if (++folded == kFoldRows) fold();
  }
  void fold() {
    if (total != nullptr) {
      for (int64_t gate = 0; gate < 3; ++gate) {
        for (int64_t j = 0; j < state; ++j) total[gate * state + j] += rows[gate * padded + j];
      }
    }
    std::fill(rows.begin(), rows.end(), T(0));
    folded = 0;
  }
};

// The cell's backward of batch rows [r0, r1) of the step that starts at
// row `start`: dh (in a.dh) plus the output's gradient is the gradient
// reaching h_t; writes d_gates and the gradient of c_prev (into a.dc).
// An output gradient whose rows are not dense is gathered a row at a time
// into `dy_row` (S values; null where the rows are dense) first: the
// gradient of `output.sum()` or `.mean()` is one value broadcast by stride
// 0, and read element by element it cost the pass its vector loads: at the
// tutorial's size (AVX2, float, one thread) the loop through time took
// 1.10x-1.17x the time it takes with a dense gradient, 0.83x-1.03x with the
// gather (4 runs each).
template <typename T, typename Set>
LLTM_ALWAYS_INLINE void backward_pointwise(const BackwardSteps<T>& a, int64_t start, int64_t r0,
                                           int64_t r1, BiasSums<T>& bias, T* dy_row) {
  constexpr int64_t L = Simd<T, Set::kBytes>::kLanes;
  const int64_t S = a.state, full = S / L * L;
  const bool dense = a.gates.dense() && a.cells.dense();
  // The step's rows are consecutive rows of the input's layout.
  const RowRef<const T> gates0 = a.gates.row(start + r0), cells0 = a.cells.row(start + r0);
  const RowRef<const T> dy0 = a.has_dy ? a.dy.row(start + r0) : RowRef<const T>{nullptr, 0};
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t k = r - r0;
    const RowRef<const T> gates{gates0.data + k * a.gates.step_stride(), gates0.stride};
    const RowRef<const T> cell{cells0.data + k * a.cells.step_stride(), cells0.stride};
    RowRef<const T> dy{a.has_dy ? dy0.data + k * a.dy.step_stride() : nullptr, dy0.stride};
    if (dy_row != nullptr) {
      for (int64_t j = 0; j < S; ++j) dy_row[j] = *dy.at(j);
      dy = {dy_row, 1};
    }
    const T* dh_row = a.dh + r * S;
    T* dc_row = a.dc + r * S;
    T* dg_row = a.d_gates + (start + r) * 3 * S;
    int64_t j = 0;
    if (dense) {
      for (; j < full; j += L) {
        backward_vector<T, Set, true>(dy, gates, cell, dh_row, dc_row, dg_row, S, j, L,
                                      bias.rows.data(), bias.padded);
      }
    }
    for (; j < S; j += L) {
      backward_vector<T, Set, false>(dy, gates, cell, dh_row, dc_row, dg_row, S, j,
                                     std::min(L, S - j), bias.rows.data(), bias.padded);
    }
    bias.row_done();
  }
}

// Step k's rows [r0, r1) as backward_pointwise reads them (gates, cells, the
// output's gradient) and writes them (d_gates), into L2 while the product
// before it runs. Walked through time backwards, the rows are short runs that
// the hardware prefetchers never lock on to: the load of the gates was the
// pointwise pass's hottest instruction. (Measured at the tutorial's size,
// AVX2, one thread: the loop through time 3-7 % faster; no change at (64,
// 256, 512).) At most kPrefetchBytes of them, half of a small L2, so that a
// large step does not push out what its product is reading.
constexpr int64_t kPrefetchBytes = 128 * 1024;

template <typename T>
LLTM_ALWAYS_INLINE void prefetch_pointwise(const BackwardSteps<T>& a, int64_t start, int64_t r0,
                                           int64_t r1) {
  const int64_t S = a.state;
  const int64_t row_bytes = 8 * S * static_cast<int64_t>(sizeof(T));
  r1 = std::min(r1, r0 + std::max<int64_t>(1, kPrefetchBytes / std::max<int64_t>(row_bytes, 1)));
  for (int64_t r = r0; r < r1; ++r) {
    const RowRef<const T> gates = a.gates.row(start + r), cells = a.cells.row(start + r);
    if (gates.stride == 1) prefetch_values(gates.data, 3 * S);
    if (cells.stride == 1) prefetch_values(cells.data, S);
    if (a.has_dy) {
      const RowRef<const T> dy = a.dy.row(start + r);
      if (dy.stride == 1) prefetch_values(dy.data, S);
    }
    prefetch_values<true>(a.d_gates + (start + r) * 3 * S, 3 * S);
  }
}

// Backpropagation through time for batch rows [first, last). Stage k (from
// the last step down to k = -1): dh = dg_{k+1} W_h for the rows of step k+1,
// then the cell's backward of step k. By rows r of the block:
//   r < sizes[k], r < sizes[k+1]:  the product, then step k's backward
//   sizes[k+1] <= r < sizes[k]:    step k's backward on the carried dh (the
//                                  row's last step: the gradient of h_n)
//   sizes[k] <= r < sizes[k+1]:    the product only: the gradient of h_0
//                                  (the row joined at step k+1: packed,
//                                  reversed), when it is wanted
// Each step's product and pointwise work run back to back while its rows
// are in cache. (Fusing the pointwise work into each product tile, as the
// forward does, cost more in per-tile bookkeeping than it saved here: the
// product's output is read once, from L1, either way.)
template <typename T, typename Set>
LLTM_ALWAYS_INLINE void backward_block(const BackwardSteps<T>& a, int64_t first, int64_t last,
                                       double* bias_sums) {
  const int64_t S = a.state;
  const StepOrder& order = a.order;
  std::vector<const T*> rows(std::max<int64_t>(last - first, 1));
  // Where backward_pointwise gathers an output gradient's rows (see there).
  std::vector<T> dy_rows(a.has_dy && !a.dy.dense() ? S : 0);
  T* const dy_row = dy_rows.empty() ? nullptr : dy_rows.data();
  BiasSums<T> bias(S, a.weights->lanes, bias_sums);
  for (int64_t k = order.steps - 1; k >= -1; --k) {
    const int64_t here = std::min(last, order.size(k));
    const int64_t next = std::min(last, order.size(k + 1));
    const int64_t product_end = a.want_old_h ? next : std::min(here, next);
    if (here > first) prefetch_pointwise(a, order.starts[k], first, here);
    if (product_end > first) {
      const T* dg_next = a.d_gates + order.starts[k + 1] * 3 * S;
      for (int64_t r = first; r < product_end; ++r) rows[r - first] = dg_next + r * 3 * S;
      backward_product<T, Set>(a, rows.data(), first, product_end);
    }
    if (here > first) backward_pointwise<T, Set>(a, order.starts[k], first, here, bias, dy_row);
  }
  bias.fold();
}

}  // namespace lltm::cpu
