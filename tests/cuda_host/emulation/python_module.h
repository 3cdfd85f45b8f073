// A Python extension module inside the host build's library (test-only:
// module.cpp, the controls of the emulated GPU). lltm's own libraries have
// no Python module (csrc/lltm_library.h).
#pragma once

#include <Python.h>

#include "lltm_library.h"

// Defines PyInit_<name> for a module with the functions of `methods` (a
// PyMethodDef table, or nullptr) and the constants that add_constants(module)
// adds.
#define LLTM_DEFINE_PYTHON_MODULE(name, add_constants, methods)                       \
  static struct PyModuleDef lltm_module_def = {PyModuleDef_HEAD_INIT, #name,          \
                                               "lltm operator library", -1, methods}; \
  PyMODINIT_FUNC PyInit_##name(void) {                                                \
    PyObject* module = PyModule_Create(&lltm_module_def);                             \
    if (module == nullptr) return nullptr;                                            \
    if (PyModule_AddStringConstant(module, "torch_target_version",                    \
                                   LLTM_STRINGIFY(TORCH_TARGET_VERSION)) < 0 ||       \
        !(add_constants)(module)) {                                                   \
      Py_DECREF(module);                                                              \
      return nullptr;                                                                 \
    }                                                                                 \
    return module;                                                                    \
  }
