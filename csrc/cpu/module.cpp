// Python entry point of the CPU library (lltm._C): defines the op schemas
// (lltm_ops.cpp) and the CPU kernels (lltm_cpu.cpp) linked into it. It
// carries the lltm version it was built from, which `lltm info` compares
// with the Python package's to spot a stale build.
#include "../python_module.h"

#ifndef LLTM_VERSION
#error "LLTM_VERSION must be defined by the build (setup.py)"
#endif

static bool add_constants(PyObject* module) {
  return PyModule_AddStringConstant(module, "device", "cpu") == 0 &&
         PyModule_AddStringConstant(module, "lltm_version", LLTM_STRINGIFY(LLTM_VERSION)) == 0;
}

extern "C" {
LLTM_DEFINE_PYTHON_MODULE(_C, add_constants, nullptr)
}
