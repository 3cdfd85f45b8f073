// Argument validation shared by every backend: the cell's arguments, and the
// checks the sequence's (lltm_sequence_checks.h) are built from.
//
// Each check runs before any kernel and raises an argument error
// (lltm_errors.h: a ValueError in Python) with a short message naming the
// offending argument and what was expected.
// src/lltm/ops/checks.py and src/lltm/ops/cell_ops/contract.py make the same
// checks with the same messages for the fake kernels and the composite
// kernels, so eager, torch.compile and fallback runs fail alike.
#pragma once

#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "lltm_errors.h"

namespace lltm {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;

inline std::string shape_str(const Tensor& t) {
  std::ostringstream s;
  s << "(";
  for (int64_t d = 0; d < t.dim(); ++d) s << (d ? ", " : "") << t.size(d);
  s << (t.dim() == 1 ? ",)" : ")");
  return s.str();
}

// The dtype as Python prints it, so that messages match the fake kernels'.
inline std::string dtype_str(ScalarType t) {
  switch (t) {
    case ScalarType::Float:
      return "torch.float32";
    case ScalarType::Double:
      return "torch.float64";
    case ScalarType::Half:
      return "torch.float16";
    case ScalarType::Byte:
      return "torch.uint8";
    case ScalarType::Char:
      return "torch.int8";
    case ScalarType::Short:
      return "torch.int16";
    case ScalarType::Int:
      return "torch.int32";
    case ScalarType::Long:
      return "torch.int64";
    case ScalarType::ComplexHalf:
      return "torch.complex32";
    case ScalarType::ComplexFloat:
      return "torch.complex64";
    case ScalarType::ComplexDouble:
      return "torch.complex128";
    case ScalarType::BFloat16:
      return "torch.bfloat16";
    case ScalarType::Bool:
      return "torch.bool";
    case ScalarType::UInt16:
      return "torch.uint16";
    case ScalarType::UInt32:
      return "torch.uint32";
    case ScalarType::UInt64:
      return "torch.uint64";
    case ScalarType::Float8_e5m2:
      return "torch.float8_e5m2";
    case ScalarType::Float8_e4m3fn:
      return "torch.float8_e4m3fn";
    case ScalarType::Float8_e5m2fnuz:
      return "torch.float8_e5m2fnuz";
    case ScalarType::Float8_e4m3fnuz:
      return "torch.float8_e4m3fnuz";
    default:
      return "an unsupported dtype (ScalarType " + std::to_string(static_cast<int>(t)) + ")";
  }
}

[[noreturn]] inline void fail(const std::string& message) { fail_argument(message); }

inline void check_supported_dtype(const Tensor& input) {
  const ScalarType t = input.scalar_type();
  if (!(t == ScalarType::Float || t == ScalarType::Double || t == ScalarType::Half ||
        t == ScalarType::BFloat16)) {
    fail("input has dtype " + dtype_str(t) +
         "; expected torch.float32, torch.float64, torch.float16 or "
         "torch.bfloat16");
  }
}

// `expected` spells the expected shape, e.g. "(batch, state_size)".
inline void check_matrix(const Tensor& t, const char* name, int64_t rows, int64_t cols,
                         const char* expected) {
  if (t.dim() != 2 || t.size(0) != rows || t.size(1) != cols) {
    std::ostringstream s;
    s << name << " must have shape " << expected << " = (" << rows << ", " << cols << "), got "
      << shape_str(t);
    fail(s.str());
  }
}

// weights: (3 * state_size, state_size + input_features), with state_size
// from old_h and input_features from input. A matrix whose rows give a state
// size is checked against each of them in turn, so that the message names
// the argument that disagrees the way a caller reads it: a module's weights
// are rarely what is wrong, the input or state handed to it usually is.
inline void check_weights(const Tensor& weights, int64_t state, int64_t features) {
  if (weights.dim() == 2 && weights.size(0) == 3 * state && weights.size(1) == state + features) {
    return;
  }
  const char* layout = "(3 * state_size, state_size + input_features)";
  std::ostringstream s;
  if (weights.dim() == 2 && weights.size(0) % 3 == 0 && weights.size(1) >= weights.size(0) / 3) {
    const int64_t weights_state = weights.size(0) / 3;
    const int64_t weights_features = weights.size(1) - weights_state;
    if (weights_state != state) {
      s << "old_h has state_size = " << state << "; the weights expect " << weights_state
        << " (weights have shape " << shape_str(weights) << " = " << layout << ")";
    } else {
      s << "input has input_features = " << features << "; the weights expect " << weights_features
        << " (weights have shape " << shape_str(weights) << " = " << layout
        << " with state_size = " << state << ")";
    }
    fail(s.str());
  }
  s << "weights must have shape " << layout << " = (" << 3 * state << ", " << state + features
    << "), got " << shape_str(weights);
  fail(s.str());
}

// dtype and device of every tensor must match those of `first`.
inline void check_same_dtype_and_device(const Tensor& first, const char* first_name,
                                        const Tensor& t, const char* name) {
  if (t.scalar_type() != first.scalar_type()) {
    fail(std::string(name) + " has dtype " + dtype_str(t.scalar_type()) + " but " + first_name +
         " has " + dtype_str(first.scalar_type()) +
         "; all arguments must share one floating dtype");
  }
  if (!(t.device() == first.device())) {
    fail(std::string(name) + " is on another device than " + first_name +
         "; all arguments must be on one device");
  }
}

// Returns (batch, input_features, state_size).
struct Sizes {
  int64_t batch, features, state;
};

// bias: None, or (3 * state_size,). (Its dtype and device are checked with
// the other arguments', first.)
inline void check_bias_shape(const std::optional<Tensor>& bias, int64_t state) {
  if (!bias.has_value()) return;
  if (bias->dim() != 1 || bias->size(0) != 3 * state) {
    std::ostringstream s;
    s << "bias must have shape (3 * state_size,) = (" << 3 * state << ",), got "
      << shape_str(*bias);
    fail(s.str());
  }
}

inline Sizes check_forward_args(const Tensor& input, const Tensor& weights,
                                const std::optional<Tensor>& bias, const Tensor& old_h,
                                const Tensor& old_cell) {
  check_supported_dtype(input);
  check_same_dtype_and_device(input, "input", weights, "weights");
  if (bias.has_value()) check_same_dtype_and_device(input, "input", *bias, "bias");
  check_same_dtype_and_device(input, "input", old_h, "old_h");
  check_same_dtype_and_device(input, "input", old_cell, "old_cell");
  if (input.dim() != 2) {
    fail("input must be 2-D (batch, input_features), got shape " + shape_str(input));
  }
  if (old_h.dim() != 2) {
    fail("old_h must be 2-D (batch, state_size), got shape " + shape_str(old_h));
  }
  const Sizes n{input.size(0), input.size(1), old_h.size(1)};
  check_matrix(old_h, "old_h", n.batch, n.state, "(batch, state_size)");
  check_matrix(old_cell, "old_cell", n.batch, n.state, "(batch, state_size)");
  check_weights(weights, n.state, n.features);
  check_bias_shape(bias, n.state);
  return n;
}

inline Sizes check_backward_args(const Tensor& grad_h, const Tensor& grad_cell,
                                 const Tensor& new_cell, const Tensor& gates, const Tensor& input,
                                 const Tensor& old_h, const Tensor& weights) {
  check_supported_dtype(input);
  check_same_dtype_and_device(input, "input", grad_h, "grad_h");
  check_same_dtype_and_device(input, "input", grad_cell, "grad_cell");
  check_same_dtype_and_device(input, "input", new_cell, "new_cell");
  check_same_dtype_and_device(input, "input", gates, "gates");
  check_same_dtype_and_device(input, "input", old_h, "old_h");
  check_same_dtype_and_device(input, "input", weights, "weights");
  if (input.dim() != 2 || old_h.dim() != 2) {
    fail("input and old_h must be 2-D, got shapes " + shape_str(input) + " and " +
         shape_str(old_h));
  }
  const Sizes n{input.size(0), input.size(1), old_h.size(1)};
  check_matrix(old_h, "old_h", n.batch, n.state, "(batch, state_size)");
  check_matrix(grad_h, "grad_h", n.batch, n.state, "(batch, state_size)");
  check_matrix(grad_cell, "grad_cell", n.batch, n.state, "(batch, state_size)");
  check_matrix(new_cell, "new_cell", n.batch, n.state, "(batch, state_size)");
  check_matrix(gates, "gates", n.batch, 3 * n.state, "(batch, 3 * state_size)");
  check_weights(weights, n.state, n.features);
  return n;
}

// Which gradients lltm::backward computes: its output_mask, in the order of
// its outputs.
struct GradMask {
  bool input, weights, bias, old_h, old_cell;
};

inline GradMask check_output_mask(const std::vector<bool>& mask) {
  if (mask.size() != 5) {
    fail(
        "output_mask must have 5 entries (input, weights, bias, old_h, "
        "old_cell), got " +
        std::to_string(mask.size()));
  }
  return {mask[0], mask[1], mask[2], mask[3], mask[4]};
}

}  // namespace lltm
