// The weights' gradient of a sequence, grad_weights = d_gates^T @ [h_prev,
// input] summed over every row of every step, in a number of device
// operations that does not grow with the sequence's length
// (lltm_cuda_sequence_backward.cu calls it after the recurrence, whichever
// path the recurrence took).
//
// The input's columns are the input itself: one GEMM on the (rows, features)
// view. h_prev, the state each row started its step from, is the output of
// the step run before, row for row, except where it is the initial state:
// within a run of steps of equal batch size b, the rows of step t and those of
// the step before lie b rows apart in the sequence's layout (after them in
// reverse), so the whole run is one shifted view of `output`. Where every
// step has the same size (a padded sequence, a packed one of equal lengths),
// that is [old_h; output[:-1]] (or [output[1:]; old_h] in reverse): two GEMMs
// on views, no copy. Packed sequences of several lengths have one such
// shift per run and an irregular boundary where runs meet; one gather kernel
// writes every row's h_prev (its runs in the launch's parameters, a launch
// per kWeightsGradMaxRuns runs), then one GEMM.
#pragma once

#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/Dispatch_v2.h>
#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "../lltm_sequence.h"
#include "../lltm_sequence_checks.h"
#include "../lltm_tensor.h"
#include "lltm_cuda_launch.cuh"
#include "lltm_cuda_runtime.h"
#include "lltm_cuda_sequence.cuh"
#include "lltm_cuda_torch_ops.cuh"

namespace lltm::cuda {

// A run of consecutive steps of equal batch size, as the gather reads it.
// Every step of the run but one starts from the rows of the step beside it,
// `shift` rows away (-size forward, +size in reverse); the `boundary` step
// (forward its first, in reverse its last) starts from the step run before it
// in another run: its first `carried` rows from that step's rows at
// `carried_from`, the others from old_h's.
struct PreviousStateRun {
  int64_t first_row;  // in the sequence's layout: its first step's first row
  int64_t size;       // rows a step
  int64_t steps;
  int64_t shift;
  int64_t boundary;  // the boundary step's index within the run
  int64_t carried;
  int64_t carried_from;
};

// Runs a launch carries in its parameters (56 bytes each: well inside the
// 4 KiB every GPU takes). A packed batch has at most as many runs as it has
// distinct lengths.
constexpr int kWeightsGradMaxRuns = 48;

struct PreviousStateRuns {
  PreviousStateRun run[kWeightsGradMaxRuns];
  int32_t count;
  int64_t first_row;  // of the first run
  int64_t rows;       // of all the launch's runs
};

// h_prev[r] = the state row r of the sequence started its step from, for the
// launch's rows; rows of `state` elements, packs of kVec.
template <typename scalar_t, int kVec>
__global__ void previous_state_kernel(scalar_t* __restrict__ h_prev,
                                      const scalar_t* __restrict__ output,
                                      const scalar_t* __restrict__ old_h, PreviousStateRuns runs,
                                      int64_t state) {
  for_each_pack<kVec>(runs.rows, state, [&](int64_t local, int64_t j) {
    const int64_t r = runs.first_row + local;
    // The last run starting at or before r.
    int32_t low = 0, high = runs.count - 1;
    while (low < high) {
      const int32_t mid = (low + high + 1) / 2;
      if (runs.run[mid].first_row <= r) {
        low = mid;
      } else {
        high = mid - 1;
      }
    }
    const PreviousStateRun run = runs.run[low];
    const int64_t offset = r - run.first_row;
    const int64_t step = offset / run.size;
    const int64_t i = offset - step * run.size;  // the row within its step
    const scalar_t* from;
    if (step != run.boundary) {
      from = output + (r + run.shift) * state;
    } else if (i < run.carried) {
      from = output + (run.carried_from + i) * state;
    } else {
      from = old_h + i * state;
    }
    store_pack<kVec>(h_prev + r * state + j, load_pack<kVec>(from + j));
  });
}

// The schedule's runs, in the layout's row order (steps in ascending t).
inline std::vector<PreviousStateRun> previous_state_runs(const Schedule& schedule) {
  std::vector<PreviousStateRun> runs;
  std::vector<int64_t> first_steps;
  for (int64_t t = 0; t < schedule.steps(); ++t) {
    const int64_t size = schedule.sizes[t];
    if (!runs.empty() && runs.back().size == size) {
      ++runs.back().steps;
      continue;
    }
    runs.push_back({schedule.starts[t], size, 1, 0, 0, 0, 0});
    first_steps.push_back(t);
  }
  for (size_t a = 0; a < runs.size(); ++a) {
    PreviousStateRun& run = runs[a];
    run.shift = schedule.reverse ? run.size : -run.size;
    run.boundary = schedule.reverse ? run.steps - 1 : 0;
    // The boundary step's place k in the order run, and the step before it
    // there, as previous_state_blocks (lltm_cuda_sequence.cuh) reads them.
    const int64_t t = first_steps[a] + run.boundary;
    const int64_t k = schedule.reverse ? schedule.steps() - 1 - t : t;
    run.carried = std::min(run.size, schedule.previous_size(k));
    run.carried_from = schedule.previous_start(k);
  }
  return runs;
}

template <typename scalar_t>
void gather_previous_state(Tensor& h_prev, const Tensor& output_rows, const Tensor& old_h,
                           const std::vector<PreviousStateRun>& runs, int64_t state) {
  const int32_t device = h_prev.get_device_index();
  const cudaStream_t stream = current_stream(device);
  scalar_t* to = h_prev.mutable_data_ptr<scalar_t>();
  const scalar_t* output = output_rows.const_data_ptr<scalar_t>();
  const scalar_t* h0 = old_h.const_data_ptr<scalar_t>();
  constexpr int kVec = kWidePack<scalar_t>;
  const bool wide = rows_fit_wide_packs<scalar_t>(state, {to, output, h0});
  for (size_t first = 0; first < runs.size(); first += kWeightsGradMaxRuns) {
    PreviousStateRuns launch{};
    launch.count = static_cast<int32_t>(std::min<size_t>(kWeightsGradMaxRuns, runs.size() - first));
    launch.first_row = runs[first].first_row;
    for (int32_t a = 0; a < launch.count; ++a) {
      launch.run[a] = runs[first + a];
      launch.rows += launch.run[a].size * launch.run[a].steps;
    }
    if (launch.rows == 0) continue;
    cudaError_t error;
    if (wide) {
      const RowTiling t = row_tiling(launch.rows, state / kVec, device);
      error = LLTM_LAUNCH(t.grid, t.block, stream, previous_state_kernel<scalar_t, kVec>)(
          to, output, h0, launch, state);
    } else {
      const RowTiling t = row_tiling(launch.rows, state, device);
      error = LLTM_LAUNCH(t.grid, t.block, stream, previous_state_kernel<scalar_t, 1>)(
          to, output, h0, launch, state);
    }
    check_launch("lltm previous_state_kernel", error);
  }
}

// grad_weights (3S, S + F) = d_gates^T @ [h_prev, input] over every row;
// d_gate_rows is (rows, 3S), output and input in the sequence's layout, old_h
// (batch, S).
inline void sequence_weights_grad(Tensor& grad_weights, const Tensor& d_gate_rows,
                                  const SequenceSizes& n, const Schedule& schedule,
                                  const Tensor& output, const Tensor& input, const Tensor& old_h) {
  const int64_t S = n.state;
  if (n.rows == 0) {  // no step, or an empty batch: nothing adds up
    fill_zeros(grad_weights);
    return;
  }
  const Tensor d_gates_t = transposed(d_gate_rows);  // (3S, rows)
  if (n.features > 0) {
    Tensor grad_w_x = column_block(grad_weights, S, n.features, false);
    addmm_out(grad_w_x, grad_w_x, d_gates_t, as_rows(dense(input), n, n.features), 0.0);
  }
  if (S == 0) return;
  Tensor grad_w_h = column_block(grad_weights, 0, S, false);
  const Tensor output_rows = as_rows(dense(output), n, S);
  const Tensor h0 = dense(old_h);
  const std::vector<PreviousStateRun> runs = previous_state_runs(schedule);
  if (runs.size() == 1) {
    // Every step of size b: the step run first starts from old_h, every
    // other from the rows b before it (b after it in reverse).
    const PreviousStateRun& run = runs[0];
    const int64_t b = run.size;
    const int64_t first = run.boundary * b;  // the rows of the step run first
    addmm_out(grad_w_h, grad_w_h, column_block(d_gates_t, first, b, false), row_block(h0, 0, b),
              0.0);
    if (run.steps > 1) {
      const int64_t rest = (run.steps - 1) * b;
      const int64_t from = schedule.reverse ? 0 : b;  // their d_gates' first row
      addmm_out(grad_w_h, grad_w_h, column_block(d_gates_t, from, rest, false),
                row_block(output_rows, from + run.shift, rest), 1.0);
    }
    return;
  }
  Tensor h_prev = new_matrix(input, n.rows, S);
  THO_DISPATCH_V2(input.scalar_type(), "lltm_sequence_weights_grad_cuda", AT_WRAP([&] {
                    gather_previous_state<scalar_t>(h_prev, output_rows, h0, runs, S);
                  }),
                  AT_FLOATING_TYPES, torch::headeronly::ScalarType::Half,
                  torch::headeronly::ScalarType::BFloat16);
  addmm_out(grad_w_h, grad_w_h, d_gates_t, h_prev, 0.0);
}

}  // namespace lltm::cuda
