// Python entry point of the CUDA plugin (lltm_cuda<major>._C): importing it
// registers the CUDA kernels (lltm_cuda.cu) for the op schemas that lltm._C
// declares. It carries the lltm version it was built from and the CUDA
// runtime version it was compiled against, for lltm's diagnostics.
#include <cuda_runtime_api.h>

#include <string>

#include "../python_module.h"

#ifndef LLTM_VERSION
#error "LLTM_VERSION must be defined by the build (setup.py)"
#endif

static bool add_constants(PyObject* module) {
  // CUDART_VERSION is major * 1000 + minor * 10, e.g. 13000 for CUDA 13.0.
  const std::string cuda_version =
      std::to_string(CUDART_VERSION / 1000) + "." + std::to_string(CUDART_VERSION % 1000 / 10);
  return PyModule_AddStringConstant(module, "device", "cuda") == 0 &&
         PyModule_AddStringConstant(module, "lltm_version", LLTM_STRINGIFY(LLTM_VERSION)) == 0 &&
         PyModule_AddStringConstant(module, "cuda_version", cuda_version.c_str()) == 0;
}

extern "C" {
LLTM_DEFINE_PYTHON_MODULE(_C, add_constants)
}
