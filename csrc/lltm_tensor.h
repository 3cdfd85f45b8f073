// Tensor plumbing shared by the backends, straight on the C shim.
//
// At the tutorial's sizes one LLTM step is a few microseconds of arithmetic,
// so per-call overhead decides the speed. torch::stable's narrow, transpose,
// new_empty and contiguous each go through the boxed dispatcher (about
// 1-2 us apiece); the shim calls used here create tensors and views directly.
#pragma once

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <vector>

#include "lltm_errors.h"

namespace lltm {

using torch::stable::Tensor;

// A 2-D strided window on a tensor's data: what the pointwise loops read.
template <typename T>
struct Matrix {
  T* data;
  int64_t row_stride;
  int64_t col_stride;

  T* row(int64_t r) const { return data + r * row_stride; }
};

template <typename T>
Matrix<T> matrix_of(const Tensor& t) {
  const auto strides = t.strides();
  return {static_cast<T*>(t.data_ptr()), strides[0], strides[1]};
}

// A 1-D tensor seen as a single row.
template <typename T>
Matrix<T> row_of(const Tensor& t) {
  return {static_cast<T*>(t.data_ptr()), 0, t.stride(0)};
}

// A new tensor with the given sizes and strides on the device of `like`,
// with its dtype or `dtype` (a torch C shim dtype code) when given.
inline Tensor new_strided(const Tensor& like, int64_t dim, const int64_t* sizes,
                          const int64_t* strides, std::optional<int32_t> dtype = std::nullopt) {
  int32_t like_dtype = 0, device_type = 0, device_index = 0;
  LLTM_CHECK_TORCH(aoti_torch_get_dtype(like.get(), &like_dtype),
                   "reading a tensor's dtype and device");
  LLTM_CHECK_TORCH(aoti_torch_get_device_type(like.get(), &device_type),
                   "reading a tensor's dtype and device");
  LLTM_CHECK_TORCH(aoti_torch_get_device_index(like.get(), &device_index),
                   "reading a tensor's dtype and device");
  AtenTensorHandle out = nullptr;
  LLTM_CHECK_TORCH(aoti_torch_empty_strided(dim, sizes, strides, dtype.value_or(like_dtype),
                                            device_type, device_index, &out),
                   "allocating an output tensor");
  return Tensor(out);
}

// A new contiguous (rows, cols) tensor with the dtype and device of `like`
// (any device: the allocation goes to that device's allocator).
inline Tensor new_matrix(const Tensor& like, int64_t rows, int64_t cols) {
  const int64_t sizes[] = {rows, cols};
  const int64_t strides[] = {cols, 1};
  return new_strided(like, 2, sizes, strides);
}

// The same in float32: what 16-bit types are computed in.
inline Tensor new_float_matrix(const Tensor& like, int64_t rows, int64_t cols) {
  const int64_t sizes[] = {rows, cols};
  const int64_t strides[] = {cols, 1};
  return new_strided(like, 2, sizes, strides, aoti_torch_dtype_float32());
}

inline Tensor new_vector(const Tensor& like, int64_t size) {
  const int64_t sizes[] = {size};
  const int64_t strides[] = {1};
  return new_strided(like, 1, sizes, strides);
}

// A new contiguous tensor of any rank with the dtype and device of `like`.
inline Tensor new_contiguous(const Tensor& like, std::initializer_list<int64_t> sizes) {
  std::vector<int64_t> shape(sizes), strides(shape.size());
  int64_t stride = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    strides[d] = stride;
    stride *= std::max<int64_t>(shape[d], 1);
  }
  return new_strided(like, static_cast<int64_t>(shape.size()), shape.data(), strides.data());
}

inline bool is_16_bit(const Tensor& t) {
  const auto dtype = t.scalar_type();
  return dtype == torch::headeronly::ScalarType::Half ||
         dtype == torch::headeronly::ScalarType::BFloat16;
}

// A (rows, cols) view of t's storage with the given strides, starting
// `offset` elements after t's own first element.
inline Tensor reshaped_view(const Tensor& t, int64_t rows, int64_t cols, int64_t row_stride,
                            int64_t col_stride, int64_t offset = 0) {
  const int64_t sizes[] = {rows, cols};
  const int64_t strides[] = {row_stride, col_stride};
  AtenTensorHandle out = nullptr;
  LLTM_CHECK_TORCH(aoti_torch__reinterpret_tensor(t.get(), 2, sizes, strides, offset, &out),
                   "making a view of a tensor");
  return Tensor(out);
}

// t's data seen through a new tensor that carries no autograd history: what
// kernels hand to torch's dispatcher. A kernel can be reached in grad mode
// with autograd live (through a fallthrough at the Autograd key, or a
// redispatch to its own key) on tensors that require grad; a dispatcher op
// reading those would record history, and an output built by it would
// require grad.
inline Tensor detached(const Tensor& t) {
  const int64_t dim = t.dim();
  std::vector<int64_t> sizes(dim), strides(dim);
  for (int64_t d = 0; d < dim; ++d) {
    sizes[d] = t.size(d);
    strides[d] = t.stride(d);
  }
  AtenTensorHandle out = nullptr;
  LLTM_CHECK_TORCH(
      aoti_torch__reinterpret_tensor(t.get(), dim, sizes.data(), strides.data(), 0, &out),
      "making a view of a tensor");
  return Tensor(out);
}

// t itself when contiguous, else a contiguous copy: torch::stable::contiguous
// goes through the dispatcher even when there is nothing to do.
inline Tensor dense(const Tensor& t) {
  if (t.is_contiguous()) return t;
  return with_torch_message("making a contiguous copy",
                            [&] { return torch::stable::contiguous(detached(t)); });
}

// dst = src (same shape; any device and dtype), on the current stream. Only
// values are copied: dst gets no autograd history from src.
inline void copy_into(Tensor& dst, const Tensor& src) {
  with_torch_message("copying a tensor", [&] { return torch::stable::copy_(dst, detached(src)); });
}

inline void fill_zeros(Tensor& t) {
  with_torch_message("zeroing a tensor", [&] { return torch::stable::zero_(t); });
}

inline void fill_ones(Tensor& t) {
  with_torch_message("filling a tensor", [&] { return torch::stable::fill_(t, 1.0); });
}

// The sums of a 2-D tensor's columns.
inline Tensor column_sums(const Tensor& t) {
  const int64_t rows_dim[] = {0};
  return with_torch_message("summing columns", [&] {
    return torch::stable::sum(t, torch::headeronly::IntHeaderOnlyArrayRef(rows_dim, 1));
  });
}

// A contiguous tensor's elements as a vector (a view).
inline Tensor as_vector(const Tensor& contiguous) {
  const int64_t sizes[] = {contiguous.numel()};
  const int64_t strides[] = {1};
  AtenTensorHandle out = nullptr;
  LLTM_CHECK_TORCH(aoti_torch__reinterpret_tensor(contiguous.get(), 1, sizes, strides, 0, &out),
                   "making a view of a tensor");
  return Tensor(out);
}

// A vector's values rounded to the dtype of `like`, in a new vector.
inline Tensor rounded_like(const Tensor& vector, const Tensor& like) {
  Tensor out = new_vector(like, vector.size(0));
  copy_into(out, vector);
  return out;
}

// Columns [first, first + count) of a 2-D tensor, optionally transposed:
// a view sharing its storage (no copy, no dispatcher).
inline Tensor column_block(const Tensor& t, int64_t first, int64_t count, bool transposed) {
  const auto strides = t.strides();
  const int64_t rows = t.size(0);
  const int64_t sizes[] = {transposed ? count : rows, transposed ? rows : count};
  const int64_t view_strides[] = {transposed ? strides[1] : strides[0],
                                  transposed ? strides[0] : strides[1]};
  AtenTensorHandle out = nullptr;
  LLTM_CHECK_TORCH(
      aoti_torch__reinterpret_tensor(t.get(), 2, sizes, view_strides, first * strides[1], &out),
      "making a view of a tensor");
  return Tensor(out);
}

inline Tensor transposed(const Tensor& t) { return column_block(t, 0, t.size(1), true); }

}  // namespace lltm
