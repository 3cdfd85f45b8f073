// csrc/cuda/module.cpp, the CUDA plugin's Python module (lltm_cuda<major>._C),
// compiled for the host build: the host build's _C, with the plugin's own
// kernel_image_problem, run against the emulated GPU.
#include "../cuda/module.cpp"
