// lltm from C++ (libtorch, no Python): is lltm loaded in this process?
//
// A program that runs a model holding lltm's operators (an AOTInductor
// package, a TorchScript module) needs them registered with torch: link the
// CMake target lltm::lltm (find_package(lltm)), which loads lltm's library
// when the program starts. Call lltm::check_operators() before loading such a
// model: where lltm is not loaded, it throws an error that names what to link
// or load, where torch would say only "Could not find schema for
// lltm::sequence_forward" (AOTInductor) or "Unknown builtin op:
// lltm::sequence_forward" (TorchScript).
//
// Header-only; needs torch's C++ headers (the CMake target lltm::headers
// brings them, and this header, without loading lltm).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceType.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace lltm {

// lltm's operators, as its library declares them (csrc/lltm_ops.cpp).
inline const std::vector<std::string>& operator_names() {
  static const std::vector<std::string> names = {
      "lltm::forward",           "lltm::backward",
      "lltm::sequence_forward",  "lltm::sequence_inference",
      "lltm::sequence_backward", "lltm::sequence_gate_grads",
  };
  return names;
}

namespace detail {

inline c10::DispatchKey dispatch_key(c10::DeviceType device) {
  switch (device) {
    case c10::DeviceType::CPU:
      return c10::DispatchKey::CPU;
    case c10::DeviceType::CUDA:
      return c10::DispatchKey::CUDA;
    default:
      throw std::invalid_argument(std::string("lltm: no compiled kernels exist for ") +
                                  c10::DeviceTypeName(device) + "; lltm has CPU and CUDA kernels");
  }
}

inline std::string joined(const std::vector<std::string>& names) {
  std::string text;
  for (const auto& name : names) text += (text.empty() ? "" : ", ") + name;
  return text;
}

// Where lltm's CPU library is: the CMake package says (lltm::headers).
inline std::string cpu_library() {
#ifdef LLTM_CPU_LIBRARY
  return LLTM_CPU_LIBRARY;
#else
  return "lltm/lib/lltm_cpu.so of the lltm wheel";
#endif
}

}  // namespace detail

// Those of operator_names() that are not registered in this process, or that
// have no kernel for `device` (CPU: lltm's library; CUDA: its CUDA plugin).
inline std::vector<std::string> missing_operators(c10::DeviceType device = c10::DeviceType::CPU) {
  const c10::DispatchKey key = detail::dispatch_key(device);
  std::vector<std::string> missing;
  for (const auto& name : operator_names()) {
    const auto op = c10::Dispatcher::singleton().findSchema({name, ""});
    if (!op.has_value() || !op->hasKernelForDispatchKey(key)) missing.push_back(name);
  }
  return missing;
}

// Throws std::runtime_error, naming what to link or load, unless every lltm
// operator is registered with a kernel for `device` (CPU by default; CUDA:
// the CUDA plugin, lltm::cuda). Call it before loading a model.
inline void check_operators(c10::DeviceType device = c10::DeviceType::CPU) {
  const std::vector<std::string> missing = missing_operators(device);
  if (missing.empty()) return;
  std::vector<std::string> unknown;
  for (const auto& name : missing) {
    if (!c10::Dispatcher::singleton().findSchema({name, ""}).has_value()) unknown.push_back(name);
  }
  const std::string load =
      "Link the CMake target lltm::lltm (find_package(lltm), with the prefix that python -c "
      "\"import lltm; print(lltm.cmake_prefix_path)\" prints in CMAKE_PREFIX_PATH), which "
      "loads lltm's library when the program starts, or load " +
      detail::cpu_library() +
      " with dlopen(path, RTLD_NOW | RTLD_GLOBAL) before loading a model that uses them";
  if (unknown.size() == operator_names().size()) {
    throw std::runtime_error("lltm: lltm's operators (" + detail::joined(unknown) +
                             ") are not registered in this process: lltm's library "
                             "(lltm_cpu.so) is not loaded. " +
                             load);
  }
  if (!unknown.empty()) {
    throw std::runtime_error("lltm: " + detail::joined(unknown) +
                             " not registered: the lltm library loaded is older than this "
                             "header. Build against the lltm whose library the program loads");
  }
  if (device == c10::DeviceType::CUDA) {
    throw std::runtime_error(
        "lltm: lltm's CUDA kernels are not loaded in this process (no CUDA kernel for " +
        detail::joined(missing) +
        "): install the plugin for torch's CUDA version beside lltm (pip install "
        "'lltm[cuda13]', or [cuda12]), then link lltm::lltm, which loads it where it is "
        "installed (find_package(lltm REQUIRED COMPONENTS cuda) insists on it); or load its "
        "lltm_cuda<major>/lib/lltm_cuda.so with dlopen after lltm_cpu.so");
  }
  throw std::runtime_error("lltm: no CPU kernel registered for " + detail::joined(missing) +
                           ": lltm's library is not fully loaded. " + load);
}

}  // namespace lltm
