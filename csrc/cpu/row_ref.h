// A row of a matrix seen through its strides, as every CPU kernel reads its
// inputs: the cell's pointwise passes (pointwise/row_passes.h), the
// sequence's fused steps (fused_steps/) and the sequence kernels around them.
#pragma once

#include <cstdint>

namespace lltm::cpu {

// A row of a matrix: its first element and the distance between elements.
template <typename S>
struct RowRef {
  S* data;
  int64_t stride;
  S* at(int64_t column) const { return data + column * stride; }
};

}  // namespace lltm::cpu
