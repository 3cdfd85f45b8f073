// csrc/cuda/lltm_cuda_sequence_forward.cu, compiled by the host C++ compiler for the
// host build (see lltm_cuda_host.h): the same source, not a copy.
#include "../cuda/lltm_cuda_sequence_forward.cu"
