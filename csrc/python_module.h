// A Python extension module: importing it loads the shared library, whose
// static initialisers register lltm's operators with torch.
//
// Plain CPython limited API (no pybind11) so that one cp310-abi3 binary serves
// every CPython >= 3.10. The module carries a few build facts as constants
// and, for the CUDA plugin, a function or two of diagnostics.
#pragma once

#include <Python.h>
#include <torch/csrc/stable/version.h>

#define LLTM_STRINGIFY_(x) #x
#define LLTM_STRINGIFY(x) LLTM_STRINGIFY_(x)

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
