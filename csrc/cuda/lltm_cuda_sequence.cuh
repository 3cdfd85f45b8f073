// What the CUDA sequence kernels' forward (lltm_cuda_sequence_forward.cu) and
// backward (lltm_cuda_sequence_backward.cu) share, as
// csrc/cpu/sequence_common.h does for the CPU's: row blocks of the
// (rows, width) matrices and where each step's previous state is.
// Everything runs on the tensors' device and torch's current stream, so CUDA
// graphs capture a whole sequence. Steps run on a running state (step t
// updates its first batch_sizes[t] rows), as on the CPU.
#pragma once

#include <torch/csrc/stable/tensor.h>

#include <algorithm>
#include <cstdint>

#include "../lltm_sequence.h"
#include "../lltm_sequence_checks.h"
#include "../lltm_tensor.h"

namespace lltm::cuda {

// A contiguous tensor of the input's layout as a (rows, width) matrix.
inline Tensor as_rows(const Tensor& contiguous, const SequenceSizes& n, int64_t width) {
  return reshaped_view(contiguous, n.rows, width, width, 1);
}

// Rows [first, first + count) of a contiguous (rows, width) matrix.
inline Tensor row_block(const Tensor& rows, int64_t first, int64_t count) {
  const int64_t width = rows.size(1);
  return reshaped_view(rows, count, width, width, 1, first * width);
}

// For each step, the rows whose state is carried from the step before and
// those starting from the initial state (the latter only for packed
// sequences run in reverse): calls fn(first_row, count, source), source
// being the matching rows of `steps_data` or of `initial`.
template <typename Fn>
void previous_state_blocks(const Schedule& schedule, int64_t k, const Tensor& steps_data,
                           const Tensor& initial, const Fn& fn) {
  const int64_t size = schedule.sizes[schedule.step(k)];
  const int64_t carried = std::min(size, schedule.previous_size(k));
  if (carried > 0) fn(0, carried, row_block(steps_data, schedule.previous_start(k), carried));
  if (size > carried) fn(carried, size - carried, row_block(initial, carried, size - carried));
}

}  // namespace lltm::cuda
