// The two kinds of error lltm's kernels raise, and how Python tells them apart.
//
// Only an exception's text crosses torch's stable ABI, never its type: until
// torch 2.14 pybind11 turned std::invalid_argument into ValueError, from 2.15
// torch turns every exception that is not c10's own into RuntimeError. So the
// text says which type lltm documents, in one fixed form that the Python
// layer reads in one place (src/lltm/_errors.py), whatever torch delivers:
//
//   * a bad argument: fail_argument(), "lltm: [ValueError] <message>"; Python
//     raises ValueError("lltm: <message>"), the tag removed. A call that
//     reaches a kernel with no Python in between (torch.ops.lltm.* inside
//     torch.inference_mode()) shows the tag: the type lltm meant, in words.
//   * a failure inside torch: "lltm: <what lltm was doing> failed: <torch's
//     message>". torch >= 2.13 keeps the message of the last failure per
//     thread behind torch_exception_get_what_without_backtrace(); calling it
//     directly would make the binary fail to load in torch 2.10-2.12, which
//     lack it, so it is looked up at run time, and where it is missing the
//     shim has printed the message to stderr and the error says so. Python
//     raises it as it comes, but a CUDA out-of-memory, which becomes
//     torch.OutOfMemoryError.
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

// What precedes the message of every argument error (see the top of this file).
inline constexpr const char* kArgumentErrorPrefix = "lltm: [ValueError] ";

// A bad argument: `message` names it and what was expected.
[[noreturn]] inline void fail_argument(const std::string& message) {
  throw std::invalid_argument(kArgumentErrorPrefix + message);
}

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
