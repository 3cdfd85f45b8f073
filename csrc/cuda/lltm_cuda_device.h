// What the CUDA plugin can tell about a GPU before running on it, for lltm's
// per-device fallback (src/lltm/_backends.py). Plain C++: lltm_cuda_library_exports.cpp, built
// by the host compiler, calls it.
#pragma once

#include <cstdint>
#include <string>

namespace lltm::cuda {

// "" when lltm's CUDA kernels can run on `device` (the binary has code for
// its architecture, compiled or as PTX the driver can JIT), else why not: an
// answer that holds for the process. Throws std::runtime_error where the
// probe cannot tell (an error that may pass, such as no memory for the
// context): nothing to remember. Creates the device's primary context, as
// any first use of it would, and no other: the calling thread's current
// device is left as it is.
std::string kernel_image_problem(int device);

// How a sequence of `element_size`-byte elements (2: 16-bit) with this batch
// and state runs on `device` (the host build's emulated GPU: -1), forward and
// backward, a line each (lltm_cuda_persistent_plan.h): the persistent
// kernels' mode and split, or the per-step path and why. Queried on a
// thread of its own, as kernel_image_problem, creating `device`'s context
// only. Throws std::runtime_error where the device cannot be queried.
std::string sequence_path(int device, int element_size, int64_t batch, int64_t state, bool tf32);

}  // namespace lltm::cuda
