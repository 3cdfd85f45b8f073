// The weights of the sequence's fused steps (dispatch.h), packed once per
// call into the order their register tiles read them: each tile then streams
// one contiguous panel, whatever the strides of `weights`.
// Packing is the same for every instruction set but for the vector width L.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <new>
#include <vector>

namespace lltm::cpu {

// Memory aligned for the widest vectors, released with the matching delete;
// left uninitialised (the panels below write every value they hold: packing
// runs on every call, and zeroing a quarter of a megabyte first showed in
// the profile).
template <typename T>
struct AlignedArray {
  struct Free {
    void operator()(T* p) const { ::operator delete[](p, std::align_val_t(64)); }
  };
  std::unique_ptr<T[], Free> data;

  explicit AlignedArray(int64_t count) {
    const size_t n = static_cast<size_t>(std::max<int64_t>(count, 1));
    data.reset(static_cast<T*>(::operator new[](n * sizeof(T), std::align_val_t(64))));
  }
  T* get() const { return data.get(); }
};

// The forward's right-hand side, [W_x | W_h]^T with the bias, as panels of
// L state columns: panel p holds 3L bias values, then for each k of the
// input (features rows) and then of h_prev (state rows) 3L weights: the
// input gate's columns p*L .. p*L+L-1, the output gate's, the candidate's;
// zero beyond the state size.
template <typename T>
struct ForwardPanels {
  int64_t lanes, panels, panel_size;
  AlignedArray<T> values;

  // W[r][c] at weights[r * row_stride + c * column_stride] (3S x (S + F),
  // columns [h | x]); bias[r] at bias[r * bias_stride], or no bias.
  ForwardPanels(const T* weights, int64_t row_stride, int64_t column_stride, const T* bias,
                int64_t bias_stride, int64_t state, int64_t features, int64_t lanes_)
      : lanes(lanes_),
        panels((state + lanes_ - 1) / lanes_),
        panel_size((1 + features + state) * 3 * lanes_),
        values(panels * panel_size) {
    const int64_t S = state, F = features, L = lanes;
    for (int64_t p = 0; p < panels; ++p) {
      T* out = values.get() + p * panel_size;
      const int64_t cols = std::min(L, S - p * L);
      // Zeros where no weight lands: lanes past the state size, or the bias.
      if (cols < L || bias == nullptr) std::fill(out, out + panel_size, T(0));
      for (int64_t gate = 0; gate < 3; ++gate) {
        for (int64_t l = 0; l < cols; ++l) {
          const int64_t r = gate * S + p * L + l;
          if (bias != nullptr) out[gate * L + l] = bias[r * bias_stride];
          for (int64_t k = 0; k < F; ++k) {
            out[(1 + k) * 3 * L + gate * L + l] = weights[r * row_stride + (S + k) * column_stride];
          }
          for (int64_t k = 0; k < S; ++k) {
            out[(1 + F + k) * 3 * L + gate * L + l] = weights[r * row_stride + k * column_stride];
          }
        }
      }
    }
  }
};

// The backward's right-hand side W_h (3S x S) as panels of up to three
// vectors of state columns: panel p holds, for each k < 3S,
// `panel_vectors[p] * L` values of row k of W_h, zero beyond the state size.
// Three vectors make the best tile; a state of 3q + 1 vectors ends in two
// panels of two rather than one of a single vector, whose tile would wait on
// its FMAs' latency.
template <typename T>
struct BackwardPanels {
  int64_t lanes;
  // Per panel: its first state column, its width in vectors, where its
  // values start.
  std::vector<int64_t> panel_first_column, panel_vectors, panel_offset;
  AlignedArray<T> values;

  // W_h[r][c] at weights[r * row_stride + c * column_stride].
  BackwardPanels(const T* weights, int64_t row_stride, int64_t column_stride, int64_t state,
                 int64_t lanes_)
      : lanes(lanes_), values(plan(state, lanes_)) {
    const int64_t S = state, L = lanes;
    for (size_t p = 0; p < panel_first_column.size(); ++p) {
      T* out = values.get() + panel_offset[p];
      const int64_t width = panel_vectors[p] * L;
      const int64_t cols = std::min(width, S - panel_first_column[p]);
      if (cols < width) std::fill(out, out + 3 * S * width, T(0));  // lanes past the state
      for (int64_t k = 0; k < 3 * S; ++k) {
        for (int64_t l = 0; l < cols; ++l)
          out[k * width + l] =
              weights[k * row_stride + (panel_first_column[p] + l) * column_stride];
      }
    }
  }

 private:
  // Fills panel_first_column, panel_vectors and panel_offset; returns the
  // number of values.
  int64_t plan(int64_t state, int64_t L) {
    int64_t left = (state + L - 1) / L;  // vectors of state columns
    int64_t column = 0, size = 0;
    while (left > 0) {
      const int64_t v = left == 4 ? 2 : std::min<int64_t>(left, 3);
      panel_first_column.push_back(column);
      panel_vectors.push_back(v);
      panel_offset.push_back(size);
      column += v * L;
      size += 3 * state * v * L;
      left -= v;
    }
    return size;
  }
};

}  // namespace lltm::cpu
