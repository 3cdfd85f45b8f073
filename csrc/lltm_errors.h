// Errors from torch's C shim, with torch's own message.
//
// A failing shim call only returns an error code; the header-only
// TORCH_ERROR_CODE_CHECK then throws "<call> API call failed at <file>,
// line N", which tells a user nothing (an out-of-memory, a cuBLAS failure,
// a bad shape all read alike). torch >= 2.13 keeps the message of the last
// failure per thread behind torch_exception_get_what_without_backtrace().
// Calling it directly would make the binary fail to load in torch 2.10-2.12,
// which lack it, so it is looked up at run time; where it is missing, the
// shim has printed the message to stderr and the error says so.
//
// The Python side turns a CUDA out-of-memory, which reaches it as a
// RuntimeError with torch's text, back into torch.OutOfMemoryError
// (src/lltm/ops/errors.py): no exception type crosses the stable ABI.
#pragma once

#include <torch/csrc/inductor/aoti_torch/c/shim.h>

#include <stdexcept>
#include <string>

#if defined(_WIN32)
#ifndef NOMINMAX
#define NOMINMAX
#endif
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#include <windows.h>
#else
#include <dlfcn.h>
#endif

namespace lltm {

using TorchMessageFn = const char* (*)();

// torch_exception_get_what_without_backtrace from the loaded libtorch_cpu,
// or nullptr (torch < 2.13).
inline TorchMessageFn torch_message_function() {
  static const TorchMessageFn fn = []() -> TorchMessageFn {
    constexpr const char* kName = "torch_exception_get_what_without_backtrace";
#if defined(_WIN32)
    HMODULE torch_cpu = GetModuleHandleA("torch_cpu.dll");
    return torch_cpu ? reinterpret_cast<TorchMessageFn>(GetProcAddress(torch_cpu, kName)) : nullptr;
#else
#if defined(__APPLE__)
    constexpr const char* kLibrary = "libtorch_cpu.dylib";
#else
    constexpr const char* kLibrary = "libtorch_cpu.so";
#endif
    if (void* symbol = dlsym(RTLD_DEFAULT, kName)) return reinterpret_cast<TorchMessageFn>(symbol);
    // Already loaded (lltm links it): RTLD_NOLOAD only returns a handle.
    void* torch_cpu = dlopen(kLibrary, RTLD_LAZY | RTLD_NOLOAD);
    return torch_cpu ? reinterpret_cast<TorchMessageFn>(dlsym(torch_cpu, kName)) : nullptr;
#endif
  }();
  return fn;
}

// torch's message for the last failure in this thread, as well as it can.
inline std::string torch_error_message() {
  if (const TorchMessageFn fn = torch_message_function()) {
    if (const char* what = fn()) return what;
  }
  return "torch < 2.13 passes no message across its stable ABI; it printed the reason to "
         "stderr";
}

[[noreturn]] inline void fail_torch_call(const char* what) {
  throw std::runtime_error(std::string("lltm: ") + what + " failed: " + torch_error_message());
}

// Runs a call into torch (a torch::stable op, which throws on failure) and
// rethrows its failure with torch's message and what lltm was doing.
template <typename Fn>
auto with_torch_message(const char* what, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const std::runtime_error&) {
    fail_torch_call(what);
  }
}

}  // namespace lltm

// For every shim call: on failure, throws with `what` and torch's message.
#define LLTM_CHECK_TORCH(call, what)    \
  do {                                  \
    if ((call) != AOTI_TORCH_SUCCESS) { \
      ::lltm::fail_torch_call(what);    \
    }                                   \
  } while (0)
