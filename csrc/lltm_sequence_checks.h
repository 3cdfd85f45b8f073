// Argument validation of the sequence operators, shared by every backend:
// the layout of input (3-D, or packed 2-D with batch_sizes), the states and
// the gradients, and the values of batch_sizes. Messages as in
// lltm_checks.h; src/lltm/ops/sequence_ops/contract.py makes the same checks
// for the fake and composite kernels.
#pragma once

#include <torch/csrc/stable/tensor.h>

#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "lltm_checks.h"

namespace lltm {

// A sequence call: `steps` steps over `batch` sequences, `rows` rows of input
// in all (steps * batch unless packed).
struct SequenceSizes {
  int64_t steps, batch, rows, features, state;
  bool packed;
};

// `t` has the layout of the input with `width` columns: (steps, batch, width),
// or (rows, width) when packed.
inline void check_sequence_layout(const Tensor& t, const char* name, const SequenceSizes& n,
                                  int64_t width, const char* width_name) {
  const bool ok = n.packed ? (t.dim() == 2 && t.size(0) == n.rows && t.size(1) == width)
                           : (t.dim() == 3 && t.size(0) == n.steps && t.size(1) == n.batch &&
                              t.size(2) == width);
  if (!ok) {
    std::ostringstream s;
    if (n.packed) {
      s << name << " must have shape (sum(batch_sizes), " << width_name << ") = (" << n.rows << ", "
        << width << ")";
    } else {
      s << name << " must have shape (seq_len, batch, " << width_name << ") = (" << n.steps << ", "
        << n.batch << ", " << width << ")";
    }
    s << ", got " << shape_str(t);
    fail(s.str());
  }
}

inline void check_batch_sizes_tensor(const Tensor& batch_sizes) {
  if (batch_sizes.dim() != 1 || batch_sizes.scalar_type() != ScalarType::Long ||
      !batch_sizes.is_cpu()) {
    fail("batch_sizes must be a 1-D int64 tensor on the CPU, as a PackedSequence's; got shape " +
         shape_str(batch_sizes) + " of " + dtype_str(batch_sizes.scalar_type()) +
         (batch_sizes.is_cpu() ? "" : " on another device"));
  }
}

// The sizes of a sequence call, from input's layout (3-D, or packed 2-D with
// batch_sizes) and old_h.
inline SequenceSizes sequence_sizes(const Tensor& input, const Tensor& old_h,
                                    const std::optional<Tensor>& batch_sizes) {
  if (old_h.dim() != 2) {
    fail("old_h must be 2-D (batch, state_size), got shape " + shape_str(old_h));
  }
  SequenceSizes n{};
  n.packed = batch_sizes.has_value();
  n.state = old_h.size(1);
  if (n.packed) {
    check_batch_sizes_tensor(*batch_sizes);
    if (input.dim() != 2) {
      fail(
          "input must be 2-D (sum(batch_sizes), input_features) when batch_sizes is given, got "
          "shape " +
          shape_str(input));
    }
    n.steps = batch_sizes->size(0);
    n.batch = old_h.size(0);
    n.rows = input.size(0);
    n.features = input.size(1);
  } else {
    if (input.dim() != 3) {
      fail("input must be 3-D (seq_len, batch, input_features), got shape " + shape_str(input));
    }
    n.steps = input.size(0);
    n.batch = input.size(1);
    n.rows = n.steps * n.batch;
    n.features = input.size(2);
  }
  return n;
}

// The checks every sequence kernel (and the fake kernel) makes: dtypes,
// devices and shapes. The values of batch_sizes are checked by
// sequence_batch_sizes(), where they are read.
inline SequenceSizes check_sequence_args(const Tensor& input, const Tensor& weights,
                                         const std::optional<Tensor>& bias, const Tensor& old_h,
                                         const Tensor& old_cell,
                                         const std::optional<Tensor>& batch_sizes) {
  check_supported_dtype(input);
  check_same_dtype_and_device(input, "input", weights, "weights");
  if (bias.has_value()) check_same_dtype_and_device(input, "input", *bias, "bias");
  check_same_dtype_and_device(input, "input", old_h, "old_h");
  check_same_dtype_and_device(input, "input", old_cell, "old_cell");
  const SequenceSizes n = sequence_sizes(input, old_h, batch_sizes);
  check_matrix(old_h, "old_h", n.batch, n.state, "(batch, state_size)");
  check_matrix(old_cell, "old_cell", n.batch, n.state, "(batch, state_size)");
  check_weights(weights, n.state, n.features);
  check_bias_shape(bias, n.state);
  return n;
}

inline SequenceSizes check_sequence_backward_args(const std::optional<Tensor>& grad_output,
                                                  const std::optional<Tensor>& grad_h_n,
                                                  const std::optional<Tensor>& grad_c_n,
                                                  const Tensor& output, const Tensor& gates,
                                                  const Tensor& cells, const Tensor& input,
                                                  const Tensor& weights, const Tensor& old_h,
                                                  const std::optional<Tensor>& batch_sizes) {
  check_supported_dtype(input);
  const std::pair<const Tensor*, const char*> others[] = {{&output, "output"},
                                                          {&gates, "gates"},
                                                          {&cells, "cells"},
                                                          {&weights, "weights"},
                                                          {&old_h, "old_h"}};
  for (const auto& [t, name] : others) check_same_dtype_and_device(input, "input", *t, name);
  const std::pair<const std::optional<Tensor>*, const char*> grads[] = {
      {&grad_output, "grad_output"}, {&grad_h_n, "grad_h_n"}, {&grad_c_n, "grad_c_n"}};
  for (const auto& [t, name] : grads) {
    if (t->has_value()) check_same_dtype_and_device(input, "input", **t, name);
  }
  const SequenceSizes n = sequence_sizes(input, old_h, batch_sizes);
  check_matrix(old_h, "old_h", n.batch, n.state, "(batch, state_size)");
  check_sequence_layout(input, "input", n, n.features, "input_features");
  check_sequence_layout(output, "output", n, n.state, "state_size");
  check_sequence_layout(cells, "cells", n, n.state, "state_size");
  check_sequence_layout(gates, "gates", n, 3 * n.state, "3 * state_size");
  if (grad_output.has_value()) {
    check_sequence_layout(*grad_output, "grad_output", n, n.state, "state_size");
  }
  if (grad_h_n.has_value())
    check_matrix(*grad_h_n, "grad_h_n", n.batch, n.state, "(batch, state_size)");
  if (grad_c_n.has_value())
    check_matrix(*grad_c_n, "grad_c_n", n.batch, n.state, "(batch, state_size)");
  check_weights(weights, n.state, n.features);
  return n;
}

// The active batch size of every step, checked against the sizes: positive,
// non-increasing, the first equal to the batch of old_h, summing to the rows
// of input. Without batch_sizes every step has the whole batch.
inline std::vector<int64_t> sequence_batch_sizes(const std::optional<Tensor>& batch_sizes,
                                                 const SequenceSizes& n) {
  if (!batch_sizes.has_value()) return std::vector<int64_t>(n.steps, n.batch);
  const Tensor& t = *batch_sizes;
  const auto* values = static_cast<const int64_t*>(t.data_ptr());
  const int64_t stride = t.stride(0);
  std::vector<int64_t> sizes(n.steps);
  int64_t total = 0;
  for (int64_t step = 0; step < n.steps; ++step) {
    sizes[step] = values[step * stride];
    const int64_t limit = step == 0 ? n.batch : sizes[step - 1];
    if (sizes[step] < 1 || sizes[step] > limit || (step == 0 && sizes[step] != n.batch)) {
      std::ostringstream s;
      s << "batch_sizes must be positive and non-increasing, starting at the batch of old_h ("
        << n.batch << "); got " << sizes[step] << " at step " << step;
      fail(s.str());
    }
    total += sizes[step];
  }
  if (total != n.rows) {
    std::ostringstream s;
    s << "batch_sizes must sum to the rows of input (" << n.rows << "), got " << total;
    fail(s.str());
  }
  return sizes;
}

}  // namespace lltm
