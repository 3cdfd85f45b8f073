// Python entry point of the CPU library (lltm._C): defines the op schemas
// (lltm_ops.cpp) and the CPU kernels (lltm_cpu.cpp) linked into it.
#include "../python_module.h"

static bool add_constants(PyObject* module) {
  return PyModule_AddStringConstant(module, "device", "cpu") == 0;
}

extern "C" {
LLTM_DEFINE_PYTHON_MODULE(_C, add_constants, nullptr)
}
