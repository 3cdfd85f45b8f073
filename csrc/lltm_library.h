// What a compiled lltm library exports besides its operators: a few plain C
// functions, which the Python layer calls through ctypes (lltm/_native.py).
//
// The libraries are not Python extension modules: they use no CPython API at
// all, so one file loads in every interpreter (CPython 3.10 and later, the
// free-threaded 3.14t among them) and the wheels are tagged
// py3-none-<platform>. Loading one (torch.ops.load_library) runs its static
// initialisers, which register lltm's operators with torch.
//
// Strings cross as `const char*` (constants) or are written into a buffer the
// caller owns (`out`, `size` bytes, always NUL-terminated); a function that
// can fail returns 0 on success and 1 with the error message in `out`.
#pragma once

#include <torch/csrc/stable/version.h>

#include <cstddef>
#include <cstring>
#include <exception>
#include <string>

#define LLTM_STRINGIFY_(x) #x
#define LLTM_STRINGIFY(x) LLTM_STRINGIFY_(x)

#if defined(_WIN32)
#define LLTM_EXPORT extern "C" __declspec(dllexport)
#else
#define LLTM_EXPORT extern "C" __attribute__((visibility("default")))
#endif

namespace lltm {

// `text` into out[0, size), cut short if need be, always terminated.
inline void copy_text(const std::string& text, char* out, std::size_t size) {
  if (out == nullptr || size == 0) return;
  const std::size_t length = text.size() < size - 1 ? text.size() : size - 1;
  std::memcpy(out, text.data(), length);
  out[length] = '\0';
}

// fn()'s string into `out` and 0, or the message of what it threw and 1. No
// exception may cross the C boundary.
template <typename Fn>
int report(Fn&& fn, char* out, std::size_t size) noexcept {
  try {
    copy_text(fn(), out, size);
    return 0;
  } catch (const std::exception& error) {
    copy_text(error.what(), out, size);
  } catch (...) {
    copy_text("lltm: unknown C++ exception", out, size);
  }
  return 1;
}

}  // namespace lltm
