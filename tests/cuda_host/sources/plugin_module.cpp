// csrc/cuda/lltm_cuda_library_exports.cpp, the C functions of the CUDA plugin's
// library, compiled for the host build: what tests/cuda_host/__init__.py reads as
// the plugin's _C, with the plugin's own kernel_image_problem, run against the
// emulated GPU.
#include "../runtime/runtime.h"
// The emulation first.
#include "cuda/lltm_cuda_library_exports.cpp"
