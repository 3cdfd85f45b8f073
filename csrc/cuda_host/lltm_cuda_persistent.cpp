// csrc/cuda/lltm_cuda_persistent.cu, compiled by the host C++ compiler for the host build
// after the emulation of the CUDA runtime it runs against (see
// lltm_cuda_host.h): the same source, not a copy.
#include "lltm_cuda_host.h"
// The emulation first.
#include "../cuda/lltm_cuda_persistent.cu"
