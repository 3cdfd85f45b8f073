// What the CUDA plugin can tell about a GPU before running on it, for lltm's
// per-device fallback (src/lltm/_backends.py). Plain C++: module.cpp, built
// by the host compiler, calls it.
#pragma once

#include <string>

namespace lltm::cuda {

// "" when lltm's CUDA kernels can run on `device` (the binary has code for
// its architecture, compiled or as PTX the driver can JIT), else why not.
// Creates the device's primary context, as any first use of it would.
std::string kernel_image_problem(int device);

}  // namespace lltm::cuda
