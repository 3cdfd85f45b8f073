// csrc/cuda/lltm_cuda_persistent_measuring.cu, compiled by the host C++ compiler for the host
// build after the emulation of the CUDA runtime it runs against (see
// runtime/runtime.h): the same source, not a copy.
#include "../runtime/runtime.h"
// The emulation first.
#include "cuda/lltm_cuda_persistent_measuring.cu"
