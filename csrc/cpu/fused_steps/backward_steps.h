// The backward of the sequence's fused steps (dispatch.h): backpropagation
// through time for a block of batch rows, each step's product with the
// packed W_h and then the cell's pointwise backward.
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

// One backward product tile: grad_h = dg_{t+1} W_h for kRows rows
// (d_gates_rows[r]: a row of dg_{t+1}, 3S values) by kVectors vectors of
// state columns from first_column (`columns` of them real), into rows
// first_row ... of args.grad_h; the first `real_rows` rows are real.
template <typename T, typename Set, int kRows, int kVectors>
LLTM_ALWAYS_INLINE void backward_tile(const BackwardSteps<T>& args, const T* const* d_gates_rows,
                                      const T* panel, int64_t real_rows, int64_t first_row,
                                      int64_t first_column, int64_t columns) {
  using V = typename Simd<T, Set::kVectorBytes>::Vec;
  constexpr int64_t L = Simd<T, Set::kVectorBytes>::kLanes;
  V acc[kRows][kVectors];
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 3
    for (int v = 0; v < kVectors; ++v) acc[r][v] = V{};
  }
  multiply_panel<V, T, kRows, kVectors>(acc, d_gates_rows, panel, 3 * args.state);
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
    if (r >= real_rows) break;
    T* dh = args.grad_h + (first_row + r) * args.state + first_column;
    if (columns == kVectors * L) {
#pragma GCC unroll 3
      for (int v = 0; v < kVectors; ++v) store_vec(dh + v * L, acc[r][v]);
    } else {
#pragma GCC unroll 3
      for (int v = 0; v < kVectors; ++v) {
        store_cols(dh + v * L, acc[r][v], std::min(L, columns - v * L));
      }
    }
  }
}

// Rows [first_row, first_row + row_count) of the batch, row_count >= 1, by
// tiles as forward_rows does.
template <typename T, typename Set, int kRows, int kVectors>
LLTM_ALWAYS_INLINE void backward_rows(const BackwardSteps<T>& args, const T* const* d_gates_rows,
                                      int64_t row_count, int64_t first_row, const T* panel,
                                      int64_t first_column, int64_t columns) {
  for (; row_count >= kRows; row_count -= kRows, d_gates_rows += kRows, first_row += kRows) {
    backward_tile<T, Set, kRows, kVectors>(args, d_gates_rows, panel, kRows, first_row,
                                           first_column, columns);
  }
  if constexpr (kRows > 1) {
    if (row_count > kRows / 2) {
      const T* padded[kRows];
      for (int r = 0; r < kRows; ++r) {
        padded[r] = d_gates_rows[std::min<int64_t>(r, row_count - 1)];
      }
      backward_tile<T, Set, kRows, kVectors>(args, padded, panel, row_count, first_row,
                                             first_column, columns);
    } else if (row_count > 0) {
      backward_rows<T, Set, kRows / 2, kVectors>(args, d_gates_rows, row_count, first_row, panel,
                                                 first_column, columns);
    }
  }
}

// args.grad_h rows [first_row, end_row) = dg_{t+1} W_h, d_gates_rows[r -
// first_row] being row r of dg_{t+1}.
template <typename T, typename Set>
LLTM_ALWAYS_INLINE void backward_product(const BackwardSteps<T>& args, const T* const* d_gates_rows,
                                         int64_t first_row, int64_t end_row) {
  // (The panels are swept from L2 whole: unlike the forward's, splitting
  // them into passes that stay in L1 measured no faster, at either size.)
  const BackwardPanels<T>& w = *args.weights;
  for (size_t p = 0; p < w.panel_first_column.size(); ++p) {
    const T* panel = w.values.get() + w.panel_offset[p];
    const int64_t first_column = w.panel_first_column[p];
    const int64_t columns = std::min(w.panel_vectors[p] * w.lanes, args.state - first_column);
    switch (w.panel_vectors[p]) {
      case 3:
        backward_rows<T, Set, Set::kTileRows, 3>(args, d_gates_rows, end_row - first_row, first_row,
                                                 panel, first_column, columns);
        break;
      case 2:
        backward_rows<T, Set, Set::kTileRows, 2>(args, d_gates_rows, end_row - first_row, first_row,
                                                 panel, first_column, columns);
        break;
      default:
        backward_rows<T, Set, Set::kTileRows, 1>(args, d_gates_rows, end_row - first_row, first_row,
                                                 panel, first_column, columns);
        break;
    }
  }
}

// One vector of the cell's backward: columns [column, column + count) of
// one row. kDense: the row is dense and count is the vector's width.
template <typename T, typename Set, bool kDense>
LLTM_ALWAYS_INLINE void backward_vector(RowRef<const T> grad_output, RowRef<const T> gates,
                                        RowRef<const T> cell, const T* grad_h_row, T* grad_cell_row,
                                        T* d_gates_row, int64_t state, int64_t column,
                                        int64_t count, T* bias_sums, int64_t bias_stride) {
  using V = typename Simd<T, Set::kVectorBytes>::Vec;
  using M = VectorMath<T, Set::kVectorBytes>;
  V dh, dc, c1, i, o, x, bi, bo, bg;
  if constexpr (kDense) {
    load_vec(dh, grad_h_row + column);
    if (grad_output.data != nullptr) {
      V y;
      load_vec(y, grad_output.data + column);
      dh = dh + y;
    }
    load_vec(dc, grad_cell_row + column);
    load_vec(c1, cell.data + column);
    load_vec(i, gates.data + column);
    load_vec(o, gates.data + state + column);
    load_vec(x, gates.data + 2 * state + column);
  } else {
    load_cols(dh, RowRef<const T>{grad_h_row, 1}, column, count);
    if (grad_output.data != nullptr) {
      V y;
      load_cols(y, grad_output, column, count);
      dh = dh + y;
    }
    load_cols(dc, RowRef<const T>{grad_cell_row, 1}, column, count);
    load_cols(c1, cell, column, count);
    load_cols(i, gates, column, count);
    load_cols(o, gates, state + column, count);
    load_cols(x, gates, 2 * state + column, count);
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
  T* bias_o = bias_sums + bias_stride;
  T* bias_g = bias_o + bias_stride;
  load_vec(bi, bias_sums + column);
  load_vec(bo, bias_o + column);
  load_vec(bg, bias_g + column);
  store_vec(bias_sums + column, bi + d_i);
  store_vec(bias_o + column, bo + d_o);
  store_vec(bias_g + column, bg + d_g);
  if constexpr (kDense) {
    store_vec(d_gates_row + column, d_i);
    store_vec(d_gates_row + state + column, d_o);
    store_vec(d_gates_row + 2 * state + column, d_g);
    store_vec(grad_cell_row + column, d_cell);
  } else {
    store_cols(d_gates_row + column, d_i, count);
    store_cols(d_gates_row + state + column, d_o, count);
    store_cols(d_gates_row + 2 * state + column, d_g, count);
    store_cols(grad_cell_row + column, d_cell, count);
  }
}

// Running sums of d_gates for grad_bias: kFoldRows rows at a time in T
// (`partial`: 3 blocks of the state rounded up to whole vectors), then in
// double (`total`).
template <typename T>
struct BiasSums {
  int64_t state, padded_state;
  std::vector<T> partial;
  int64_t rows_in_partial = 0;
  double* total;  // 3S, or null: not wanted

  BiasSums(int64_t state_, int64_t lanes, double* total_)
      : state(state_),
        padded_state((state_ + lanes - 1) / lanes * lanes),
        partial(3 * padded_state),
        total(total_) {}

  void row_done() {
    if (++rows_in_partial == kFoldRows) fold();
  }
  void fold() {
    if (total != nullptr) {
      for (int64_t gate = 0; gate < 3; ++gate) {
        for (int64_t j = 0; j < state; ++j) {
          total[gate * state + j] += partial[gate * padded_state + j];
        }
      }
    }
    std::fill(partial.begin(), partial.end(), T(0));
    rows_in_partial = 0;
  }
};

// The cell's backward of batch rows [first_row, end_row) of the step that
// starts at row `step_start`: args.grad_h plus the output's gradient is the
// gradient reaching h_t; writes d_gates and the gradient of c_prev (into
// args.grad_cell). An output gradient whose rows are not dense is gathered a
// row at a time into `grad_output_row` (S values; null where the rows are
// dense) first: the gradient of `output.sum()` or `.mean()` is one value
// broadcast by stride 0, and read element by element it cost the pass its
// vector loads: at the tutorial's size (AVX2, float, one thread) the loop
// through time took 1.10x-1.17x the time it takes with a dense gradient,
// 0.83x-1.03x with the gather (4 runs each).
template <typename T, typename Set>
LLTM_ALWAYS_INLINE void backward_pointwise(const BackwardSteps<T>& args, int64_t step_start,
                                           int64_t first_row, int64_t end_row, BiasSums<T>& bias,
                                           T* grad_output_row) {
  constexpr int64_t L = Simd<T, Set::kVectorBytes>::kLanes;
  const int64_t S = args.state, full = S / L * L;
  const bool dense = args.gates.dense() && args.cells.dense();
  // The step's rows are consecutive rows of the input's layout.
  const RowRef<const T> gates0 = args.gates.row(step_start + first_row);
  const RowRef<const T> cells0 = args.cells.row(step_start + first_row);
  const RowRef<const T> grad_output0 = args.has_grad_output
                                           ? args.grad_output.row(step_start + first_row)
                                           : RowRef<const T>{nullptr, 0};
  for (int64_t r = first_row; r < end_row; ++r) {
    const int64_t k = r - first_row;
    const RowRef<const T> gates{gates0.data + k * args.gates.step_stride(), gates0.stride};
    const RowRef<const T> cell{cells0.data + k * args.cells.step_stride(), cells0.stride};
    RowRef<const T> grad_output{
        args.has_grad_output ? grad_output0.data + k * args.grad_output.step_stride() : nullptr,
        grad_output0.stride};
    if (grad_output_row != nullptr) {
      for (int64_t j = 0; j < S; ++j) grad_output_row[j] = *grad_output.at(j);
      grad_output = {grad_output_row, 1};
    }
    const T* grad_h_row = args.grad_h + r * S;
    T* grad_cell_row = args.grad_cell + r * S;
    T* d_gates_row = args.d_gates + (step_start + r) * 3 * S;
    int64_t j = 0;
    if (dense) {
      for (; j < full; j += L) {
        backward_vector<T, Set, true>(grad_output, gates, cell, grad_h_row, grad_cell_row,
                                      d_gates_row, S, j, L, bias.partial.data(), bias.padded_state);
      }
    }
    for (; j < S; j += L) {
      backward_vector<T, Set, false>(grad_output, gates, cell, grad_h_row, grad_cell_row,
                                     d_gates_row, S, j, std::min(L, S - j), bias.partial.data(),
                                     bias.padded_state);
    }
    bias.row_done();
  }
}

// Step k's rows [first_row, end_row) as backward_pointwise reads them
// (gates, cells, the output's gradient) and writes them (d_gates), into L2
// while the product before it runs. Walked through time backwards, the rows
// are short runs that the hardware prefetchers never lock on to: the load of
// the gates was the pointwise pass's hottest instruction. (Measured at the
// tutorial's size, AVX2, one thread: the loop through time 3-7 % faster; no
// change at (64, 256, 512).) At most kPrefetchBytes of them, half of a small
// L2, so that a large step does not push out what its product is reading.
constexpr int64_t kPrefetchBytes = 128 * 1024;

template <typename T>
LLTM_ALWAYS_INLINE void prefetch_pointwise(const BackwardSteps<T>& args, int64_t step_start,
                                           int64_t first_row, int64_t end_row) {
  const int64_t S = args.state;
  const int64_t row_bytes = 8 * S * static_cast<int64_t>(sizeof(T));
  end_row = std::min(
      end_row, first_row + std::max<int64_t>(1, kPrefetchBytes / std::max<int64_t>(row_bytes, 1)));
  for (int64_t r = first_row; r < end_row; ++r) {
    const RowRef<const T> gates = args.gates.row(step_start + r),
                          cells = args.cells.row(step_start + r);
    if (gates.stride == 1) prefetch_values(gates.data, 3 * S);
    if (cells.stride == 1) prefetch_values(cells.data, S);
    if (args.has_grad_output) {
      const RowRef<const T> grad_output = args.grad_output.row(step_start + r);
      if (grad_output.stride == 1) prefetch_values(grad_output.data, S);
    }
    prefetch_values<true>(args.d_gates + (step_start + r) * 3 * S, 3 * S);
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
LLTM_ALWAYS_INLINE void backward_block(const BackwardSteps<T>& args, int64_t first, int64_t last,
                                       double* bias_sums) {
  const int64_t S = args.state;
  const StepOrder& order = args.order;
  std::vector<const T*> d_gates_rows(std::max<int64_t>(last - first, 1));
  // Where backward_pointwise gathers an output gradient's rows (see there).
  std::vector<T> gathered(args.has_grad_output && !args.grad_output.dense() ? S : 0);
  T* const grad_output_row = gathered.empty() ? nullptr : gathered.data();
  BiasSums<T> bias(S, args.weights->lanes, bias_sums);
  for (int64_t k = order.steps - 1; k >= -1; --k) {
    const int64_t here = std::min(last, order.size(k));
    const int64_t next = std::min(last, order.size(k + 1));
    const int64_t product_end = args.want_old_h ? next : std::min(here, next);
    if (here > first) prefetch_pointwise(args, order.starts[k], first, here);
    if (product_end > first) {
      const T* d_gates_next = args.d_gates + order.starts[k + 1] * 3 * S;
      for (int64_t r = first; r < product_end; ++r) {
        d_gates_rows[r - first] = d_gates_next + r * 3 * S;
      }
      backward_product<T, Set>(args, d_gates_rows.data(), first, product_end);
    }
    if (here > first) {
      backward_pointwise<T, Set>(args, order.starts[k], first, here, bias, grad_output_row);
    }
  }
  bias.fold();
}

}  // namespace lltm::cpu
