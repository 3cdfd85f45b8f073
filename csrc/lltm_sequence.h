// What the CPU and CUDA sequence kernels share: the order of the steps and
// where each step's rows are, and the layout of the tensors they make.
#pragma once

#include <torch/csrc/stable/tensor.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "lltm_sequence_checks.h"
#include "lltm_tensor.h"

namespace lltm {

// The steps in the order they run, and where each step's rows are: step t
// owns rows [starts[t], starts[t] + sizes[t]) of the input, and updates the
// first sizes[t] rows of the running (batch, state) state.
struct Schedule {
  std::vector<int64_t> sizes;   // active batch of step t
  std::vector<int64_t> starts;  // first row of step t
  bool reverse;

  Schedule(std::vector<int64_t> batch_sizes, bool reverse_)
      : sizes(std::move(batch_sizes)), starts(sizes.size()), reverse(reverse_) {
    int64_t row = 0;
    for (size_t t = 0; t < sizes.size(); ++t) {
      starts[t] = row;
      row += sizes[t];
    }
  }
  int64_t steps() const { return static_cast<int64_t>(sizes.size()); }
  // The k-th step to run.
  int64_t step(int64_t k) const { return reverse ? steps() - 1 - k : k; }
  // The active batch and first row of the step run before the k-th (none: 0).
  int64_t previous_size(int64_t k) const { return k == 0 ? 0 : sizes[step(k - 1)]; }
  int64_t previous_start(int64_t k) const { return k == 0 ? 0 : starts[step(k - 1)]; }
};

// A new contiguous tensor of the input's layout with `width` columns.
inline Tensor new_sequence_tensor(const Tensor& like, const SequenceSizes& n, int64_t width) {
  if (n.packed) return new_matrix(like, n.rows, width);
  return new_contiguous(like, {n.steps, n.batch, width});
}

}  // namespace lltm
