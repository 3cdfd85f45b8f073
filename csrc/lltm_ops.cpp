// The one place where lltm's operator schemas are declared.
//
// Backends (csrc/cpu, csrc/cuda) only provide implementations of these
// schemas with STABLE_TORCH_LIBRARY_IMPL; Python (src/lltm/ops.py) adds the
// autograd formula and the fake (meta) kernels through torch.library.
#include <torch/csrc/stable/library.h>

// The namespace of the schemas: lltm. The test-only host build of the CUDA
// sources (csrc/cuda/lltm_cuda_runtime.h) compiles this file again with
// LLTM_OPS_NAMESPACE=lltm_cuda_host: its kernels get the same schemas, still
// written only here, under a namespace of their own.
#ifndef LLTM_OPS_NAMESPACE
#define LLTM_OPS_NAMESPACE lltm
#endif
// Two levels, so that LLTM_OPS_NAMESPACE is expanded before torch's macro
// pastes it into names.
#define LLTM_LIBRARY_(ns, m) STABLE_TORCH_LIBRARY(ns, m)
#define LLTM_LIBRARY(m) LLTM_LIBRARY_(LLTM_OPS_NAMESPACE, m)

LLTM_LIBRARY(m) {
  // One LLTM step. `gates` (batch, 3 * state) holds [sigmoid(input gate) |
  // sigmoid(output gate) | the candidate's pre-activation x]: everything
  // backward needs besides the inputs, since the derivatives of sigmoid and
  // tanh are functions of their outputs and ELU's is computed from x (a
  // rounded elu(x) would lose exp(x) in 16-bit). The pre-activations are
  // [old_h, input] @ W^T + bias, rounded once, as F.linear rounds them. It
  // is an implementation detail, not differentiable. Without a bias (None,
  // as F.linear takes it) no bias is added.
  m.def(
      "forward(Tensor input, Tensor weights, Tensor? bias, Tensor old_h, "
      "Tensor old_cell) -> (Tensor new_h, Tensor new_cell, Tensor gates)");
  // Gradients of one step with respect to (input, weights, bias, old_h,
  // old_cell), given the upstream gradients of new_h and new_cell. As in
  // ATen's own backward ops, output_mask says which of the five are wanted;
  // the others are not computed and come back as None. Autograd passes
  // ctx.needs_input_grad, so frozen parameters cost no weight-gradient GEMM
  // and inputs that need no grad no d_gates @ W.
  m.def(
      "backward(Tensor grad_h, Tensor grad_cell, Tensor new_cell, "
      "Tensor gates, Tensor input, Tensor old_h, Tensor weights, "
      "bool[5] output_mask) -> "
      "(Tensor? grad_input, Tensor? grad_weights, Tensor? grad_bias, "
      "Tensor? grad_old_h, Tensor? grad_old_cell)");

  // The cell run over a whole sequence in one call: step t is `forward` on
  // step t's input and the previous step's state. `input` is (T, batch,
  // features), or packed (sum(batch_sizes), features) with `batch_sizes`
  // (T,), an int64 CPU tensor of non-increasing sizes as in a PackedSequence:
  // step t then updates only the first batch_sizes[t] sequences. `reverse`
  // runs the steps from last to first (the backward direction of a
  // bidirectional layer). `output` holds every step's new_h, laid out like
  // `input`; h_n and c_n are each sequence's state after its last step.
  // `gates` and `cells` (every step's activated gates and new_cell) are what
  // backward needs; they are not differentiable.
  m.def(
      "sequence_forward(Tensor input, Tensor weights, Tensor? bias, Tensor old_h, "
      "Tensor old_cell, Tensor? batch_sizes, bool reverse) -> "
      "(Tensor output, Tensor h_n, Tensor c_n, Tensor gates, Tensor cells)");
  // Backpropagation through time. The gradients of output, h_n and c_n may
  // each be None (that output did not reach the loss); output_mask selects
  // the gradients wanted, as in `backward`.
  m.def(
      "sequence_backward(Tensor? grad_output, Tensor? grad_h_n, Tensor? grad_c_n, "
      "Tensor output, Tensor gates, Tensor cells, Tensor input, Tensor weights, "
      "Tensor old_h, Tensor? batch_sizes, bool reverse, bool[5] output_mask) -> "
      "(Tensor? grad_input, Tensor? grad_weights, Tensor? grad_bias, "
      "Tensor? grad_old_h, Tensor? grad_old_cell)");
  // Backpropagation through time alone: every step's gate gradients (d
  // loss / d pre-activations, laid out like `gates`) and the gradients of
  // old_h and old_cell. sequence_backward is this followed by the products
  // with W and [h_prev, input]; this op serves what needs the gate gradients
  // themselves: per-sample weight gradients, one product per sample, for
  // torch.vmap over a batch that shares the weights.
  m.def(
      "sequence_gate_grads(Tensor? grad_output, Tensor? grad_h_n, Tensor? grad_c_n, "
      "Tensor output, Tensor gates, Tensor cells, Tensor input, Tensor weights, "
      "Tensor old_h, Tensor? batch_sizes, bool reverse) -> "
      "(Tensor grad_gates, Tensor grad_old_h, Tensor grad_old_cell)");
}
