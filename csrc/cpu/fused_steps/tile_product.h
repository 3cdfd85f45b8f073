// A register tile's product with a packed weight panel (weight_panels.h), as
// the forward and backward steps compute it (forward_steps.h,
// backward_steps.h), and the passes that keep a long product's slice of the
// panel in L1.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>

#include "../isa.h"
#include "simd.h"

namespace lltm::cpu {

// acc[r][v] += sum_k lhs_rows[r][k] * panel[k][v], k < depth; the panel's
// rows are kVectors vectors apart. The accumulation order (k ascending, one
// fused multiply-add each where the set has FMA) is the same for every width.
template <typename V, typename T, int kRows, int kVectors>
LLTM_ALWAYS_INLINE void multiply_panel(V (&acc)[kRows][kVectors], const T* const* lhs_rows,
                                       const T* panel, int64_t depth) {
  constexpr int64_t kLanes = sizeof(V) / sizeof(T);
  const T* rows[kRows];
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) rows[r] = lhs_rows[r];
  for (int64_t k = 0; k < depth; ++k, panel += kVectors * kLanes) {
    V b[kVectors];
#pragma GCC unroll 3
    for (int v = 0; v < kVectors; ++v) load_vec(b[v], panel + v * kLanes);
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      const T x = rows[r][k];
#pragma GCC unroll 3
      for (int v = 0; v < kVectors; ++v) acc[r][v] += x * b[v];
    }
  }
}

// How many k a pass of register tiles covers: the panel's slice (depth x
// width values) stays in L1 while every row tile of the step sweeps it. A
// longer product is split into passes of equal depth, the partial sums kept
// in memory between them (at (64, 256, 512) a forward panel is 74 KB: swept
// from L2 by each tile, the forward ran 4-12 % slower than in passes).
constexpr int64_t kSliceBytes = 24 * 1024;

// The depth of each pass over `depth` k of `width` values: (passes, depth).
template <typename T>
std::pair<int64_t, int64_t> passes_of(int64_t depth, int64_t width) {
  const int64_t most =
      std::max<int64_t>(16, kSliceBytes / (width * static_cast<int64_t>(sizeof(T))));
  const int64_t passes = std::max<int64_t>(1, (depth + most - 1) / most);
  return {passes, (depth + passes - 1) / passes};
}

}  // namespace lltm::cpu
