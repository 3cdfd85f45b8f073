// The persistent sequence kernels as the sequence ops call them
// (lltm_cuda_persistent.cu), and the rule they follow as diagnostics show it.
#pragma once

#include <torch/csrc/stable/tensor.h>

#include <cstdint>
#include <optional>

#include "../lltm_sequence.h"
#include "../lltm_sequence_checks.h"

namespace lltm::cuda {

using torch::stable::Tensor;

// The recurrence of sequence_forward in one launch, float32 and float64:
// `gates` holds every step's input projection and bias on entry and what
// the per-step path leaves there on return; output, cells, h_n, c_n are
// written. False, with nothing written, where the plan takes the per-step
// path or the GPU refuses the launch as too large (busy, MPS): the caller
// then runs the per-step path. h0 and c0 are dense.
bool persistent_sequence_forward(const SequenceSizes& n, const Schedule& schedule, Tensor& gates,
                                 Tensor& output, Tensor& cells, Tensor& h_n, Tensor& c_n,
                                 const Tensor& weights, const Tensor& h0, const Tensor& c0);

// Backpropagation through time in one launch: d_gates of every step, the
// gradient of old_cell into grad_c and, when grad_h is given, of old_h. The
// same contract as the forward's. gates and cells are dense.
bool persistent_sequence_backward(const SequenceSizes& n, const Schedule& schedule,
                                  const std::optional<Tensor>& grad_output,
                                  const std::optional<Tensor>& grad_h_n,
                                  const std::optional<Tensor>& grad_c_n, const Tensor& gates,
                                  const Tensor& cells, const Tensor& weights, Tensor& d_gates,
                                  Tensor* grad_h, Tensor& grad_c);

}  // namespace lltm::cuda
