// SIMD vectors for the sequence's fused steps (dispatch.h): GCC and Clang
// vector extensions, whole and partial loads and stores of them, and cache
// prefetches. The activations on them are vector_math.h's.
//
// Vectors pass by reference: by value, a wide vector would have another
// calling convention in the baseline part of the library (GCC's -Wpsabi).
#pragma once

#if !defined(__GNUC__) && !defined(__clang__)
#error "csrc/cpu/fused_steps/simd.h needs GCC or Clang vector extensions"
#endif

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "../isa.h"
#include "../row_ref.h"

namespace lltm::cpu {

template <typename T, int kBytes>
struct Simd {
  static constexpr int64_t kLanes = kBytes / static_cast<int64_t>(sizeof(T));
  typedef T Vec __attribute__((vector_size(kBytes)));
  // Comparison masks, and the unsigned integers of T's width.
  using Int = std::conditional_t<sizeof(T) == 4, int32_t, int64_t>;
  typedef Int Mask __attribute__((vector_size(kBytes)));
  typedef std::make_unsigned_t<Int> Bits __attribute__((vector_size(kBytes)));
};

template <typename V, typename T>
LLTM_ALWAYS_INLINE void load_vec(V& v, const T* p) {
  std::memcpy(&v, p, sizeof v);
}

template <typename V, typename T>
LLTM_ALWAYS_INLINE void store_vec(T* p, const V& v) {
  std::memcpy(p, &v, sizeof v);
}

// Columns [col, col + count) of a strided row as a vector (count <= its
// lanes; zeros after them: lanes beyond the state size are computed, never
// stored), and the first `count` lanes of a vector into a dense row.
template <typename V, typename T>
LLTM_ALWAYS_INLINE void load_cols(V& v, RowRef<const T> row, int64_t col, int64_t count) {
  constexpr int64_t kLanes = sizeof(V) / sizeof(T);
  if (row.stride == 1 && count == kLanes) {
    load_vec(v, row.data + col);
    return;
  }
  alignas(64) T values[kLanes] = {};
  for (int64_t l = 0; l < count; ++l) values[l] = row.data[(col + l) * row.stride];
  load_vec(v, values);
}

template <typename V, typename T>
LLTM_ALWAYS_INLINE void store_cols(T* to, const V& v, int64_t count) {
  constexpr int64_t kLanes = sizeof(V) / sizeof(T);
  if (count == kLanes) {
    store_vec(to, v);
    return;
  }
  alignas(64) T values[kLanes];
  store_vec(values, v);
  for (int64_t l = 0; l < count; ++l) to[l] = values[l];
}

// Asks for the cache lines of `count` values from `data` into L2, ahead of
// their use: read (kWrite false) or about to be written.
template <bool kWrite = false, typename T>
LLTM_ALWAYS_INLINE void prefetch_values(const T* data, int64_t count) {
  const char* line = reinterpret_cast<const char*>(data);
  const char* end = reinterpret_cast<const char*>(data + count);
  for (; line < end; line += 64) __builtin_prefetch(line, kWrite ? 1 : 0, 2);
}

}  // namespace lltm::cpu
