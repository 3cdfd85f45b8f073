// The persistent sequence kernels as the sequence ops call them
// (lltm_cuda_persistent_{forward,backward}_entry.cu, the plan:
// lltm_cuda_persistent_planning.cu), and the rule they follow as diagnostics show it.
#pragma once

#include <torch/csrc/stable/tensor.h>

#include <cstdint>
#include <optional>

#include "../lltm_sequence.h"
#include "../lltm_sequence_checks.h"

namespace lltm::cuda {

using torch::stable::Tensor;

// The recurrence of sequence_forward in one launch, in float32, float64,
// float16 and bfloat16 (the last two computed in float32): output, h_n, c_n
// are written, and `gates` and `cells` as the per-step path leaves them;
// both null where nothing will differentiate the call (sequence_inference):
// the same output, h_n and c_n, from the same plan and launch. `projection`
// holds every step's input projection and bias, (rows, 3S): in float32 and
// float64 in the dtype (in training the memory of `gates`, overwritten with
// them as the steps go), in 16 bits in float32. False, with nothing written,
// where the plan takes the per-step path or the GPU refuses the launch as
// too large (busy, MPS): the caller then runs the per-step path. h0 and c0
// are dense. `tf32`: float32's recurrent products on the TF32 tensor cores
// where the plan takes the tensor cores (tf32_products).
bool persistent_sequence_forward(const SequenceSizes& n, const Schedule& schedule,
                                 const Tensor& projection, Tensor* gates, Tensor& output,
                                 Tensor* cells, Tensor& h_n, Tensor& c_n, const Tensor& weights,
                                 const Tensor& h0, const Tensor& c0, bool tf32);

// Whether the plan takes such a call's forward to the persistent kernel (the
// GPU may still refuse the launch): 16-bit calls compute its float32
// projection only then.
bool persistent_sequence_forward_planned(const SequenceSizes& n, const Schedule& schedule,
                                         const Tensor& like, bool tf32);

// Backpropagation through time in one launch: d_gates of every step, the
// gradient of old_cell into grad_c and, when grad_h is given, of old_h. The
// same contract as the forward's. gates and cells are dense. `bias_sums`,
// given where grad_bias is wanted: for 16-bit dtypes set to a float32
// (batch, 3S) matrix, each row's gate gradients summed over the steps before
// they are rounded (grad_bias is its column sums, rounded once); left empty
// for float32 and float64, whose grad_bias is the column sums of d_gates.
bool persistent_sequence_backward(const SequenceSizes& n, const Schedule& schedule,
                                  const std::optional<Tensor>& grad_output,
                                  const std::optional<Tensor>& grad_h_n,
                                  const std::optional<Tensor>& grad_c_n, const Tensor& gates,
                                  const Tensor& cells, const Tensor& weights, Tensor& d_gates,
                                  Tensor* grad_h, Tensor& grad_c, std::optional<Tensor>* bias_sums,
                                  bool tf32);

// Whether a call of `like`'s dtype and device runs float32's recurrent
// products in TF32: float32 calls that allow it (allow_tf32: torch allows
// TF32 for float32 matrix products) on GPUs of compute capability 8.0 and
// later, where TF32 exists, in the persistent kernels and on the per-step
// path alike, so that an op is TF32 throughout or not at all.
bool tf32_products(bool allow_tf32, const Tensor& like);

}  // namespace lltm::cuda
