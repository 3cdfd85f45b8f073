// What the CPU sequence kernels' forward (sequence_forward_kernel.cpp) and
// backward (sequence_backward_kernel.cpp) share: the rows of a tensor laid
// out like the input, the blocks of batch rows the threads carry through every
// step, and the order of the steps for the fused kernels.
//
// Steps run on a running state: step t updates its first batch_sizes[t] rows,
// the others keep theirs, which is what a PackedSequence needs in both
// directions (sequence_forward's contract: src/lltm/ops/sequence_ops/contract.py).
// In float and double the steps are the fused kernels of fused_steps/, where they
// exist (GCC and Clang builds): the weights packed once per call, each step
// one pass of register tiles that computes its pre-activations (input
// projection included) and ends in the cell's pointwise work on the values it
// holds; forward and backward alike. With several threads each thread carries
// a block of batch rows through every step. In 16-bit, and where there are no
// fused kernels, each step is the cell's computation with torch's GEMM.
#pragma once

#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "../lltm_sequence.h"
#include "../lltm_sequence_checks.h"
#include "../lltm_tensor.h"
#include "fused_steps/dispatch.h"

namespace lltm::cpu {

// Below this many multiply-adds a step's product takes a few microseconds on
// one core, about what splitting it between threads costs.
constexpr int64_t kMinParallelProduct = 1 << 18;

// Row r of a tensor laid out like the input (fused_steps/step_args.h).
template <typename Element>
SequenceRows<Element> sequence_rows(const Tensor& t, const SequenceSizes& n) {
  return {static_cast<Element*>(t.data_ptr()), n.batch, n.packed, t.stride(0), t.stride(1),
          n.packed ? 0 : t.stride(2)};
}

// A tensor of the input's layout as a (rows, width) matrix, for the GEMMs
// over all steps: a view where the steps and batch merge, else a copy.
inline Tensor as_rows(const Tensor& t, const SequenceSizes& n) {
  if (n.packed) return t;
  const int64_t steps = t.size(0), batch = t.size(1), width = t.size(2);
  if (batch == 1) return reshaped_view(t, steps, width, t.stride(0), t.stride(2));
  if (steps <= 1 || t.stride(0) == batch * t.stride(1)) {
    return reshaped_view(t, steps * batch, width, t.stride(1), t.stride(2));
  }
  return reshaped_view(dense(t), steps * batch, width, width, 1);
}

// Blocks of batch rows, one per thread. Rows never interact in the
// recurrence (row r of step t reads only row r of the step before), so each
// thread carries its block through every step: one parallel region per
// call, no synchronisation between steps. (Splitting each step instead cost
// a parallel region per step, ~7 us apiece on a 2-core machine, more than
// the tutorial size's per-step product saves.)
struct RowBlocks {
  int64_t count;
  int64_t rows_per_block;

  // fn(block, first_row, end_row) for every block; rows [0, batch).
  template <typename Fn>
  void run(int64_t batch, const Fn& fn) const {
    if (count == 1) {
      fn(int64_t(0), int64_t(0), batch);
      return;
    }
    torch::stable::parallel_for(0, count, 1, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        fn(b, b * rows_per_block, std::min(batch, (b + 1) * rows_per_block));
      }
    });
  }
};

// Blocks of `block_rows` rows or multiples (whole register tiles of the
// kernels in use: RecurrentKernels::block_rows), as many as threads when the
// sequence's recurrent products (`work` multiply-adds) are worth splitting.
inline RowBlocks split_rows(int64_t batch, int64_t work, int64_t block_rows) {
  const int64_t threads = torch::stable::get_num_threads();
  const int64_t units = (batch + block_rows - 1) / block_rows;
  if (threads < 2 || units < 2 || work < kMinParallelProduct) return {1, batch};
  const int64_t count = std::min(threads, units);
  return {count, (units + count - 1) / count * block_rows};
}

// The steps in the order they run, for the fused kernels.
struct RunOrder {
  std::vector<int64_t> sizes, starts;

  explicit RunOrder(const Schedule& schedule) {
    for (int64_t k = 0; k < schedule.steps(); ++k) {
      sizes.push_back(schedule.sizes[schedule.step(k)]);
      starts.push_back(schedule.starts[schedule.step(k)]);
    }
  }
  StepOrder view() const {
    return {static_cast<int64_t>(sizes.size()), sizes.data(), starts.data()};
  }
};

template <typename T>
constexpr bool kHasFusedSteps = std::is_same_v<T, float> || std::is_same_v<T, double>;

}  // namespace lltm::cpu
