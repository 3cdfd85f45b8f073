// The one place where lltm's operator schemas are declared.
//
// Backends (csrc/cpu, csrc/cuda) only provide implementations of these
// schemas with STABLE_TORCH_LIBRARY_IMPL; Python (src/lltm/ops/) adds the
// autograd, fake (meta), vmap and autocast kernels through torch.library.
// Each operator's contract (arguments, layouts, what it returns) is the
// docstring of its handle in its family's contract.py (src/lltm/ops/cell_ops/,
// src/lltm/ops/sequence_ops/), which the API reference of the documentation
// renders together with the schema declared here.
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
  // One LLTM step; `gates` is what backward needs besides the inputs.
  m.def(
      "forward(Tensor input, Tensor weights, Tensor? bias, Tensor old_h, "
      "Tensor old_cell) -> (Tensor new_h, Tensor new_cell, Tensor gates)");
  // The gradients of one step; output_mask selects those computed.
  m.def(
      "backward(Tensor grad_h, Tensor grad_cell, Tensor new_cell, "
      "Tensor gates, Tensor input, Tensor old_h, Tensor weights, "
      "bool[5] output_mask) -> "
      "(Tensor? grad_input, Tensor? grad_weights, Tensor? grad_bias, "
      "Tensor? grad_old_h, Tensor? grad_old_cell)");

  // The cell over a whole sequence (padded or packed), in one call.
  //
  // allow_tf32 (the sequence operators): float32's matrix products may run on
  // TF32 tensor cores, as torch's own float32 matrix products may under
  // torch.set_float32_matmul_precision("high") (CUDA: each input in two TF32
  // terms, float32 sums and state: docs/cuda.md, "float32 and TF32"). The library cannot ask torch
  // for that setting, so the caller passes it (src/lltm/ops/precision.py),
  // and a graph compiled or exported under one setting keeps it. Backends
  // without TF32 (the CPU) compute exact float32 either way; other dtypes
  // ignore it.
  m.def(
      "sequence_forward(Tensor input, Tensor weights, Tensor? bias, Tensor old_h, "
      "Tensor old_cell, Tensor? batch_sizes, bool reverse, bool allow_tf32=False) -> "
      "(Tensor output, Tensor h_n, Tensor c_n, Tensor gates, Tensor cells)");
  // sequence_forward's outputs alone, when nothing will differentiate the call:
  // no gates or cells, which only the backward reads.
  m.def(
      "sequence_inference(Tensor input, Tensor weights, Tensor? bias, Tensor old_h, "
      "Tensor old_cell, Tensor? batch_sizes, bool reverse, bool allow_tf32=False) -> "
      "(Tensor output, Tensor h_n, Tensor c_n)");
  // Backpropagation through time: the gradients of sequence_forward.
  m.def(
      "sequence_backward(Tensor? grad_output, Tensor? grad_h_n, Tensor? grad_c_n, "
      "Tensor output, Tensor gates, Tensor cells, Tensor input, Tensor weights, "
      "Tensor old_h, Tensor? batch_sizes, bool reverse, bool[5] output_mask, "
      "bool allow_tf32=False) -> "
      "(Tensor? grad_input, Tensor? grad_weights, Tensor? grad_bias, "
      "Tensor? grad_old_h, Tensor? grad_old_cell)");
  // Backpropagation through time alone: every step's gate gradients.
  m.def(
      "sequence_gate_grads(Tensor? grad_output, Tensor? grad_h_n, Tensor? grad_c_n, "
      "Tensor output, Tensor gates, Tensor cells, Tensor input, Tensor weights, "
      "Tensor old_h, Tensor? batch_sizes, bool reverse, bool allow_tf32=False) -> "
      "(Tensor grad_gates, Tensor grad_old_h, Tensor grad_old_cell)");
}
