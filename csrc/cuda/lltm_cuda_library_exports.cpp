// The C functions of the CUDA plugin's library (lltm_cuda<major>/lib/
// lltm_cuda), read by lltm_cuda<major>/_C.py: the lltm version it was built
// from, the CUDA runtime version and GPU architectures it was compiled for,
// and whether its kernels can run on a given GPU, for lltm's diagnostics and
// its per-device fallback. The CUDA kernels (lltm_cuda.cu,
// lltm_cuda_sequence_*.cu) linked into the same library register themselves,
// for the op schemas lltm's CPU library declares, when it is loaded.
#include <string>

#include "../lltm_library.h"
#include "lltm_cuda_device.h"
#include "lltm_cuda_persistent_measuring.h"
#include "lltm_cuda_runtime.h"

#ifndef LLTM_VERSION
#error "LLTM_VERSION must be defined by the build (setup.py)"
#endif

#ifndef LLTM_CUDA_ARCHS
#error "LLTM_CUDA_ARCHS must be defined by the build (setup.py)"
#endif

LLTM_EXPORT const char* lltm_cuda_lltm_version() { return LLTM_STRINGIFY(LLTM_VERSION); }

LLTM_EXPORT const char* lltm_cuda_torch_target_version() {
  return LLTM_STRINGIFY(TORCH_TARGET_VERSION);
}

// "13.0": CUDART_VERSION is major * 1000 + minor * 10.
LLTM_EXPORT const char* lltm_cuda_runtime_version() {
  static const std::string version =
      std::to_string(CUDART_VERSION / 1000) + "." + std::to_string(CUDART_VERSION % 1000 / 10);
  return version.c_str();
}

// "7.5/8.0/.../12.0+PTX": TORCH_CUDA_ARCH_LIST of the build.
LLTM_EXPORT const char* lltm_cuda_archs() { return LLTM_STRINGIFY(LLTM_CUDA_ARCHS); }

// "" into `out` when the kernels can run on that GPU, else why not; 1 and the
// reason when the probe cannot tell (see lltm_cuda_device.h). ctypes releases
// the GIL around the call: creating a context takes a while.
LLTM_EXPORT int lltm_cuda_kernel_image_problem(int device, char* out, std::size_t size) {
  return lltm::report([device] { return lltm::cuda::kernel_image_problem(device); }, out, size);
}

// How a sequence call of `element_size`-byte elements (4: float32, 8:
// float64, 2: 16-bit) with this batch and state runs on `device`, its
// allow_tf32 `tf32` (nonzero: TF32 allowed): the forward's path and the
// backward's, a line each (lltm_cuda_persistent_plan.h).
LLTM_EXPORT int lltm_cuda_sequence_path(int device, int element_size, int tf32, long long batch,
                                        long long state, char* out, std::size_t size) {
  return lltm::report(
      [=] { return lltm::cuda::sequence_path(device, element_size, batch, state, tf32 != 0); }, out,
      size);
}

// torch.backends.cudnn.benchmark, as lltm's Python side sees it (it calls
// this when the value changes): set, sequence calls measure their plans
// (lltm_cuda_persistent_measuring.h).
LLTM_EXPORT void lltm_cuda_set_measuring(int on) { lltm::cuda::set_measuring(on != 0); }

// The measured plans remembered, most recently used first: tab-separated
// lines, "plan ..." each followed by its "candidate ..." lines
// (lltm_cuda_persistent_measuring.h).
LLTM_EXPORT int lltm_cuda_measured_plans(char* out, std::size_t size) {
  return lltm::report([] { return lltm::cuda::measured_plans_text(); }, out, size);
}
