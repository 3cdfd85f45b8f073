// What the CUDA plugin can tell about a GPU before running on it, for lltm's
// per-device fallback (src/lltm/_backends.py). Plain C++: module.cpp, built
// by the host compiler, calls it.
#pragma once

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

}  // namespace lltm::cuda
