// The forward of the sequence's fused steps (dispatch.h): every step of a
// block of batch rows, as register tiles over the packed [W_x | W_h]^T that
// end in the cell's pointwise forward.
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

// A forward tile's rows and columns: its first `real_rows` rows are real
// (the others pad it to its height).
template <typename T>
struct ForwardTile {
  const RowRef<const T>* previous_cells;  // c_prev of each real row
  int64_t first_row;                      // output row of the tile's first row
  T* cells;                               // new cell of the tile's first row; rows S apart
  int64_t real_rows;
  int64_t first_column, columns;  // state columns [first_column, first_column + columns)
};

// After the product: acc holds the pre-activations of the tile's input
// gates, output gates and candidates. Activates them and writes the tile's
// gates (unless args.gates is null: inference), new h and new cell: first
// the three activations of every row, then the cells (a row at a time from
// start to end would chain ~150 cycles of latency per row, more than the
// out-of-order window overlaps).
template <typename T, typename Set, int kRows>
LLTM_ALWAYS_INLINE void forward_epilogue(
    const ForwardSteps<T>& args, const ForwardTile<T>& tile,
    typename Simd<T, Set::kVectorBytes>::Vec (&acc)[kRows][3]) {
  using V = typename Simd<T, Set::kVectorBytes>::Vec;
  using M = VectorMath<T, Set::kVectorBytes>;
  const int64_t S = args.state, j0 = tile.first_column, columns = tile.columns;
  V i[kRows], o[kRows], g[kRows];
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
    M::sigmoid(i[r], acc[r][0]);
    M::sigmoid(o[r], acc[r][1]);
    M::elu(g[r], acc[r][2]);
  }
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
    if (r >= tile.real_rows) break;
    const int64_t row = tile.first_row + r;
    V c, t;
    load_cols(c, tile.previous_cells[r], j0, columns);
    c = c + g[r] * i[r];
    M::tanh(t, c);
    const V h = t * o[r];
    if (args.gates != nullptr) {
      T* gates = args.gates + row * 3 * S + j0;
      store_cols(gates, i[r], columns);
      store_cols(gates + S, o[r], columns);
      store_cols(gates + 2 * S, acc[r][2], columns);
    }
    store_cols(args.output + row * S + j0, h, columns);
    // In place over c_prev when the cells are the running state: this
    // tile alone reads or writes these columns of the row in this step.
    store_cols(tile.cells + r * S + j0, c, columns);
  }
}

// Where a forward pass of register tiles works: k in [k_begin, k_end) of
// the depth features + state (the input's columns, then h_prev's), and its
// rows' partial sums (3 vectors a row) when the product takes several passes.
template <typename T>
struct ForwardPass {
  int64_t k_begin, k_end;
  T* partial_sums;  // null: a single pass
};

// One forward tile: kRows rows of the input and of h_prev (inputs[r],
// h_prev[r]) by the three gates of a panel's L state columns over one
// pass's k; after the last pass, the epilogue.
template <typename T, typename Set, int kRows>
LLTM_ALWAYS_INLINE void forward_tile(const ForwardSteps<T>& args, const T* const* inputs,
                                     const T* const* h_prev, const T* panel,
                                     const ForwardTile<T>& tile, const ForwardPass<T>& pass) {
  using V = typename Simd<T, Set::kVectorBytes>::Vec;
  constexpr int64_t L = Simd<T, Set::kVectorBytes>::kLanes;
  const int64_t F = args.features, depth = args.features + args.state;
  V acc[kRows][3];
  if (pass.k_begin == 0) {
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
      for (int v = 0; v < 3; ++v) load_vec(acc[r][v], pass.partial_sums + (r * 3 + v) * L);
    }
  }
  const T* weights = panel + 3 * L;  // after the bias
  if (pass.k_begin < F) {
    const int64_t k1 = std::min(pass.k_end, F);
    const T* xs[kRows];
    for (int r = 0; r < kRows; ++r) xs[r] = inputs[r] + pass.k_begin;
    multiply_panel<V, T, kRows, 3>(acc, xs, weights + pass.k_begin * 3 * L, k1 - pass.k_begin);
  }
  if (pass.k_end > F) {
    const int64_t k0 = std::max(pass.k_begin, F) - F;
    const T* hs[kRows];
    for (int r = 0; r < kRows; ++r) hs[r] = h_prev[r] + k0;
    multiply_panel<V, T, kRows, 3>(acc, hs, weights + (F + k0) * 3 * L, pass.k_end - F - k0);
  }
  if (pass.k_end == depth) {
    forward_epilogue<T, Set, kRows>(args, tile, acc);
  } else {
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 3
      for (int v = 0; v < 3; ++v) store_vec(pass.partial_sums + (r * 3 + v) * L, acc[r][v]);
    }
  }
}

// Rows [0, row_count) of a step, row_count >= 1, by tiles of kRows; the
// last tile is the smallest of kRows, kRows / 2, kRows / 4, ... (8, 4, 2, 1
// or NEON's 6, 3, 1) that holds the rows left, padded by repeating the last
// real row.
template <typename T, typename Set, int kRows>
LLTM_ALWAYS_INLINE void forward_rows(const ForwardSteps<T>& args, const T* const* inputs,
                                     const T* const* h_prev, int64_t row_count, const T* panel,
                                     ForwardTile<T> tile, ForwardPass<T> pass) {
  constexpr int64_t kRowValues = 3 * Simd<T, Set::kVectorBytes>::kLanes;
  for (; row_count >= kRows; row_count -= kRows, inputs += kRows, h_prev += kRows) {
    tile.real_rows = kRows;
    forward_tile<T, Set, kRows>(args, inputs, h_prev, panel, tile, pass);
    tile.previous_cells += kRows;
    tile.first_row += kRows;
    tile.cells += kRows * args.state;
    if (pass.partial_sums != nullptr) pass.partial_sums += kRows * kRowValues;
  }
  if constexpr (kRows > 1) {
    if (row_count > kRows / 2) {
      const T* inputs_padded[kRows];
      const T* h_prev_padded[kRows];
      for (int r = 0; r < kRows; ++r) {
        inputs_padded[r] = inputs[std::min<int64_t>(r, row_count - 1)];
        h_prev_padded[r] = h_prev[std::min<int64_t>(r, row_count - 1)];
      }
      tile.real_rows = row_count;
      forward_tile<T, Set, kRows>(args, inputs_padded, h_prev_padded, panel, tile, pass);
    } else if (row_count > 0) {
      forward_rows<T, Set, kRows / 2>(args, inputs, h_prev, row_count, panel, tile, pass);
    }
  }
}

template <typename T, typename Set>
LLTM_ALWAYS_INLINE void forward_block(const ForwardSteps<T>& args, int64_t first, int64_t last) {
  const int64_t S = args.state;
  const ForwardPanels<T>& w = *args.weights;
  const StepOrder& order = args.order;
  std::vector<const T*> inputs(last - first), h_prev(last - first);
  std::vector<RowRef<const T>> previous_cells(last - first);
  const auto [passes, pass_depth] = passes_of<T>(args.features + S, 3 * w.lanes);
  // Partial sums of every row (and of a padded tile's extra rows).
  std::vector<T> partial(passes > 1 ? (last - first + Set::kTileRows) * 3 * w.lanes : 0);
  for (int64_t k = 0; k < order.steps; ++k) {
    const int64_t end = std::min(last, order.sizes[k]);
    if (end <= first) continue;
    const int64_t start = order.starts[k];
    const int64_t previous = order.size(k - 1);
    const int64_t previous_start = k == 0 ? 0 : order.starts[k - 1];
    // Row r's state before this step: the step before's when it had the
    // row, else the initial one.
    // With running cells (args.running_cells), row r's cell is at row r of
    // args.cells in every step.
    const int64_t cells_start = args.running_cells ? 0 : start;
    const int64_t previous_cells_start = args.running_cells ? 0 : previous_start;
    for (int64_t r = first; r < end; ++r) {
      inputs[r - first] = args.input + (start + r) * args.input_row_stride;
      if (r < previous) {
        h_prev[r - first] = args.output + (previous_start + r) * S;
        previous_cells[r - first] = {args.cells + (previous_cells_start + r) * S, 1};
      } else {
        h_prev[r - first] = args.old_h + r * args.old_h_row_stride;
        previous_cells[r - first] = {args.old_cell + r * args.old_cell_row_stride,
                                     args.old_cell_column_stride};
      }
    }
    // Panel by panel, pass by pass: each slice stays in L1 while every row
    // tile sweeps it.
    for (int64_t p = 0; p < w.panels; ++p) {
      const int64_t j0 = p * w.lanes;
      const ForwardTile<T> tile{
          previous_cells.data(),    start + first, args.cells + (cells_start + first) * S, 0, j0,
          std::min(w.lanes, S - j0)};
      for (int64_t k0 = 0; k0 < args.features + S; k0 += pass_depth) {
        const ForwardPass<T> pass{k0, std::min(k0 + pass_depth, args.features + S),
                                  passes > 1 ? partial.data() : nullptr};
        forward_rows<T, Set, Set::kTileRows>(args, inputs.data(), h_prev.data(), end - first,
                                             w.values.get() + p * w.panel_size, tile, pass);
      }
    }
  }
}

}  // namespace lltm::cpu
