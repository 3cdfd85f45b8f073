// CUDA implementation of lltm::sequence_forward (the CPU's computes the same,
// organised for a core: csrc/cpu/sequence_forward_kernel.cpp): gates = b +
// input @ W_x^T for all steps at once (one GEMM), then every step in one
// persistent launch where the plan allows (lltm_cuda_persistent.cuh), else
// step by step: gates_t += h_prev @ W_h^T (lltm_cuda_recurrent.cuh: lltm's
// own kernel at small sizes, else cuBLAS) and the cell's fused pointwise
// kernel, writing output_t and cells_t. (16-bit: the persistent kernel
// takes the input projection in float32; the per-step path runs one GEMM
// per step over [h_prev, x_t], as the cell does.) lltm::sequence_inference
// takes the same path (forward_sequence) and keeps only output, h_n and c_n:
// no cells, and no gates beyond what the steps read. See
// lltm_cuda_sequence.cuh.
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/Dispatch_v2.h>
#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>

#include <algorithm>
#include <optional>
#include <tuple>
#include <vector>

#include "../lltm_sequence.h"
#include "../lltm_sequence_checks.h"
#include "../lltm_tensor.h"
#include "lltm_cuda_launch.cuh"
#include "lltm_cuda_persistent.h"
#include "lltm_cuda_persistent_measuring.h"
#include "lltm_cuda_pointwise.cuh"
#include "lltm_cuda_recurrent.cuh"
#include "lltm_cuda_runtime.h"
#include "lltm_cuda_sequence.cuh"
#include "lltm_cuda_tf32_gemm.cuh"
#include "lltm_cuda_torch_ops.cuh"

namespace lltm::cuda {
namespace {

// 16-bit, for the persistent kernel: every step's input projection and bias
// in float32, from x and W_x widened to float32 (their products are exact
// there) by one float32 GEMM. Rounded to 16 bits, the projection would put
// a rounding error into every step's pre-activations, which LLTM's cell, with
// no forget gate, adds up over the steps (the per-step path rounds each
// step's pre-activations once, as the cell does).
Tensor float_projection(const Tensor& x, const Tensor& weights, const std::optional<Tensor>& bias,
                        const SequenceSizes& n) {
  const int64_t S = n.state;
  // One float32 allocation for the projection and the widened x, W_x and
  // bias: each an aligned view of it (16 bytes: the kernel reads the
  // projection, first, in 16-byte vectors), freed with the projection.
  const auto aligned = [](int64_t elements) { return (elements + 3) / 4 * 4; };
  const int64_t x_at = aligned(n.rows * 3 * S);
  const int64_t w_x_at = x_at + aligned(n.rows * n.features);
  const int64_t bias_at = w_x_at + aligned(3 * S * n.features);
  const Tensor workspace = new_float_matrix(x, 1, bias_at + (bias.has_value() ? 3 * S : 0));
  Tensor projection = reshaped_view(workspace, n.rows, 3 * S, 3 * S, 1);
  if (n.rows == 0) return projection;
  Tensor x_float = reshaped_view(workspace, n.rows, n.features, n.features, 1, x_at);
  copy_into(x_float, x);
  Tensor w_x_float = reshaped_view(workspace, 3 * S, n.features, n.features, 1, w_x_at);
  copy_into(w_x_float, column_block(weights, S, n.features, false));
  std::optional<Tensor> bias_float;
  if (bias.has_value()) {
    bias_float = as_vector(reshaped_view(workspace, 1, 3 * S, 3 * S, 1, bias_at));
    copy_into(*bias_float, *bias);
  }
  linear_out(projection, bias_float, x_float, transposed(w_x_float));
  return projection;
}

// The rows of the running cell state that step k reads, for fn(first_row,
// count, source) as previous_state_blocks calls it: where nothing keeps every
// step's cells (sequence_inference), the running state in c_n, updated in
// place ([0, carried): the rows carried from the step before, which the
// pointwise kernel reads and writes element by element), and c0 for the rows
// that start at this step (packed, in reverse).
template <typename Fn>
void running_cell_blocks(const Schedule& schedule, int64_t k, const Tensor& c_n, const Tensor& c0,
                         const Fn& fn) {
  const int64_t size = schedule.sizes[schedule.step(k)];
  const int64_t carried = std::min(size, schedule.previous_size(k));
  if (carried > 0) fn(0, carried, row_block(c_n, 0, carried));
  if (size > carried) fn(carried, size - carried, row_block(c0, carried, size - carried));
}

struct ForwardResults {
  Tensor output, h_n, c_n;
  std::optional<Tensor> gates, cells;  // training only
};

// sequence_forward (`training`) and sequence_inference: one path, the same
// plan, launches and GEMMs, so the same output, h_n and c_n. Inference only
// leaves out what the backward alone reads: `cells` is never allocated (the
// running cell lives in c_n), and neither is `gates` in 16 bits (the
// persistent kernel reads the float32 projection; the per-step path one
// step's GEMM result at a time); in float32 and float64 `gates` holds the
// input projection of every step, which both paths read, so there it stays,
// as a temporary.
ForwardResults forward_sequence(const Tensor& input, const Tensor& weights,
                                const std::optional<Tensor>& bias, const Tensor& old_h,
                                const Tensor& old_cell, const std::optional<Tensor>& batch_sizes,
                                bool reverse, bool training, bool allow_tf32) {
  const SequenceSizes n = check_sequence_args(input, weights, bias, old_h, old_cell, batch_sizes);
  const Schedule schedule(sequence_batch_sizes(batch_sizes, n), reverse);
  const DeviceGuard guard(input.get_device_index());
  // The products in TF32, with three terms (float32 where the call allows it
  // and the GPU has it), on whichever path runs them: the recurrent ones, and
  // the input projection through cuBLAS (lltm_cuda_tf32_gemm.cuh).
  const bool tf32 = tf32_products(allow_tf32, input);
  const int64_t S = n.state;
  // In 16-bit each step runs as the cell does: [h_prev, x_t] and one GEMM
  // with the bias, so the pre-activations are rounded once and step t is
  // exactly lltm::forward on step t. In float and double, one GEMM for every
  // step's projection and bias, then per step one more adding h_prev @ W_h^T.
  const auto dtype = input.scalar_type();
  const bool one_gemm_per_step = is_16_bit(input);
  Tensor output = new_sequence_tensor(input, n, S);
  std::optional<Tensor> gates, cells;
  if (training || !one_gemm_per_step) gates = new_sequence_tensor(input, n, 3 * S);
  if (training) cells = new_sequence_tensor(input, n, S);
  Tensor h_n = new_matrix(input, n.batch, S);
  Tensor c_n = new_matrix(input, n.batch, S);
  Tensor output_rows = as_rows(output, n, S);
  std::optional<Tensor> gates_rows, cells_rows;
  if (gates) gates_rows = as_rows(*gates, n, 3 * S);
  if (cells) cells_rows = as_rows(*cells, n, S);
  // The kernels and the row blocks below read whole rows.
  const Tensor x = as_rows(dense(input), n, n.features);
  const Tensor h0 = dense(old_h);
  const Tensor c0 = dense(old_cell);
  const Tensor w_h_transposed = transposed(column_block(weights, 0, S, false));
  Tensor* gates_out = training ? &*gates : nullptr;
  Tensor* cells_out = training ? &*cells : nullptr;
  std::optional<Tensor> step_input;  // [h_prev, x_t] of a whole step
  // 16-bit inference: one step's GEMM result, (size, 3S), from an offset
  // below kStepOffset elements (256 bytes); see step_gates.
  std::optional<Tensor> step_scratch;
  constexpr int64_t kStepOffset = 128;
  const auto step_offset = [&](int64_t start) { return start * 3 * S % kStepOffset; };
  // The recurrent product's right side: W_h^T as a view (cuBLAS reads it
  // transposed), or packed once per call, (S, 3S) with adjacent columns,
  // for lltm's own kernel at small sizes (lltm_cuda_recurrent.cuh).
  Tensor w_h_rows = w_h_transposed;
  if (one_gemm_per_step) {
    if (persistent_sequence_forward_planned(n, schedule, input, tf32)) {
      const Tensor projection = float_projection(x, weights, bias, n);
      if (persistent_sequence_forward(n, schedule, projection, gates_out, output, cells_out, h_n,
                                      c_n, weights, h0, c0, tf32)) {
        return {output, h_n, c_n, gates, cells};
      }
    }
    step_input = new_matrix(input, n.batch, S + n.features);
    if (!gates) {
      // As far as the steps' rows reach: at most batch x 3S + 127 elements,
      // and never more than gates would hold (a step's offset here is at
      // most its offset there).
      int64_t extent = 0;
      for (int64_t t = 0; t < schedule.steps(); ++t) {
        extent = std::max(extent, step_offset(schedule.starts[t]) + schedule.sizes[t] * 3 * S);
      }
      step_scratch = new_matrix(input, 1, extent);
    }
  } else {
    if (n.rows > 0 && S > 0) {
      const Tensor w_x_transposed = transposed(column_block(weights, S, n.features, false));
      if (tf32) {
        Tf32Product(w_x_transposed, n.rows).run_linear(*gates_rows, x, bias);
      } else {
        linear_out(*gates_rows, bias, x, w_x_transposed);
      }
    }
    if (persistent_sequence_forward(n, schedule, *gates, gates_out, output, cells_out, h_n, c_n,
                                    weights, h0, c0, tf32)) {
      return {output, h_n, c_n, gates, cells};
    }
    if (own_recurrent_product(input, n.batch, 3 * S, S)) {
      w_h_rows = new_matrix(weights, S, 3 * S);
      copy_into(w_h_rows, w_h_transposed);
    }
  }
  RecurrentProduct recurrent_product(w_h_rows, n.batch, tf32);
  // Rows [first, first + count) of the gates of the step whose rows start
  // at `start`: in `gates`, or in 16-bit inference in step_scratch, at the
  // alignment (mod 256 bytes) they have in `gates`: torch picks cuBLAS's
  // kernel by its operands' alignment too, and the same kernel sums in the
  // same order, so the step's GEMM gives the bits it gives in training.
  const auto step_gates = [&](int64_t start, int64_t first, int64_t count) {
    if (gates_rows) return row_block(*gates_rows, start + first, count);
    return reshaped_view(*step_scratch, count, 3 * S, 3 * S, 1, step_offset(start) + first * 3 * S);
  };

  for (int64_t k = 0; k < schedule.steps(); ++k) {
    const int64_t t = schedule.step(k);
    const int64_t start = schedule.starts[t];
    const int64_t size = schedule.sizes[t];
    if (size == 0) continue;
    if (one_gemm_per_step) {
      previous_state_blocks(
          schedule, k, output_rows, h0, [&](int64_t first, int64_t count, const Tensor& h_prev) {
            Tensor to = column_block(row_block(*step_input, first, count), 0, S, false);
            copy_into(to, h_prev);
          });
      Tensor in = row_block(*step_input, 0, size);
      if (n.features > 0) {
        Tensor to = column_block(in, S, n.features, false);
        copy_into(to, row_block(x, start, size));
      }
      Tensor g = step_gates(start, 0, size);
      linear_out(g, bias, in, transposed(weights));
    } else {
      previous_state_blocks(schedule, k, output_rows, h0,
                            [&](int64_t first, int64_t count, const Tensor& h_prev) {
                              Tensor g = step_gates(start, first, count);
                              recurrent_product(g, h_prev, /*accumulate=*/true);
                            });
    }
    // The new cell: into `cells` (training), else over the running cell in
    // c_n, in place.
    const auto pointwise = [&](int64_t first, int64_t count, const Tensor& c_prev) {
      Tensor g = step_gates(start, first, count);
      Tensor h = row_block(output_rows, start + first, count);
      Tensor c =
          cells_rows ? row_block(*cells_rows, start + first, count) : row_block(c_n, first, count);
      THO_DISPATCH_V2(dtype, "lltm_sequence_forward_cuda",
                      AT_WRAP([&] { forward_pointwise<scalar_t>(g, c_prev, h, c, count, S); }),
                      AT_FLOATING_TYPES, torch::headeronly::ScalarType::Half,
                      torch::headeronly::ScalarType::BFloat16);
    };
    if (cells_rows) {
      previous_state_blocks(schedule, k, *cells_rows, c0, pointwise);
    } else {
      running_cell_blocks(schedule, k, c_n, c0, pointwise);
    }
  }

  // Each sequence's last state. Going back from the last step run, a step
  // of size s is the last step of rows [gathered, s) not gathered yet
  // (sizes shrink going forward; in reverse the last step run has them all).
  // Without `cells`, c_n holds the last cell of every row that ran already.
  for (auto [final_state, steps_data, initial] :
       {std::tuple{&h_n, &output_rows, &h0}, {&c_n, cells_rows ? &*cells_rows : nullptr, &c0}}) {
    int64_t gathered = 0;
    for (int64_t k = schedule.steps() - 1; k >= 0 && gathered < n.batch; --k) {
      const int64_t t = schedule.step(k);
      const int64_t size = schedule.sizes[t];
      if (size <= gathered) continue;
      if (steps_data != nullptr) {
        Tensor to = row_block(*final_state, gathered, size - gathered);
        copy_into(to, row_block(*steps_data, schedule.starts[t] + gathered, size - gathered));
      }
      gathered = size;
    }
    if (gathered < n.batch) {  // rows that had no step: their initial state
      Tensor to = row_block(*final_state, gathered, n.batch - gathered);
      copy_into(to, row_block(*initial, gathered, n.batch - gathered));
    }
  }
  return {output, h_n, c_n, gates, cells};
}

// forward_sequence under the plan measured for such a call where
// torch.backends.cudnn.benchmark is set (lltm_cuda_persistent_measuring.h):
// each run allocates its own results, c_n included, so the candidates' runs
// leave nothing behind in what the call returns.
ForwardResults measured_forward(const Tensor& input, const Tensor& weights,
                                const std::optional<Tensor>& bias, const Tensor& old_h,
                                const Tensor& old_cell, const std::optional<Tensor>& batch_sizes,
                                bool reverse, bool training, bool allow_tf32) {
  const auto run = [&] {
    return forward_sequence(input, weights, bias, old_h, old_cell, batch_sizes, reverse, training,
                            allow_tf32);
  };
  if (!measuring()) return run();
  const SequenceSizes n = check_sequence_args(input, weights, bias, old_h, old_cell, batch_sizes);
  const Schedule schedule(sequence_batch_sizes(batch_sizes, n), reverse);
  const DeviceGuard guard(input.get_device_index());
  const MeasuredPass pass = training ? MeasuredPass::kForward : MeasuredPass::kInference;
  return with_measured_plan(
      measured_call(pass, input, n, schedule, tf32_products(allow_tf32, input)), run);
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> sequence_forward(
    Tensor input, Tensor weights, std::optional<Tensor> bias, Tensor old_h, Tensor old_cell,
    std::optional<Tensor> batch_sizes, bool reverse, bool allow_tf32) {
  ForwardResults r = measured_forward(input, weights, bias, old_h, old_cell, batch_sizes, reverse,
                                      /*training=*/true, allow_tf32);
  return {r.output, r.h_n, r.c_n, *r.gates, *r.cells};
}

std::tuple<Tensor, Tensor, Tensor> sequence_inference(Tensor input, Tensor weights,
                                                      std::optional<Tensor> bias, Tensor old_h,
                                                      Tensor old_cell,
                                                      std::optional<Tensor> batch_sizes,
                                                      bool reverse, bool allow_tf32) {
  ForwardResults r = measured_forward(input, weights, bias, old_h, old_cell, batch_sizes, reverse,
                                      /*training=*/false, allow_tf32);
  return {r.output, r.h_n, r.c_n};
}

}  // namespace
}  // namespace lltm::cuda

LLTM_CUDA_KERNELS(m) {
  m.impl("sequence_forward", TORCH_BOX(&lltm::cuda::sequence_forward));
  m.impl("sequence_inference", TORCH_BOX(&lltm::cuda::sequence_inference));
}
