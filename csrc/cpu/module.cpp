// Python entry point of the CPU library (lltm._C): defines the op schemas
// (lltm_ops.cpp) and the CPU kernels (lltm_cpu.cpp) linked into it. It
// carries the lltm version it was built from, which `lltm info` compares
// with the Python package's to spot a stale build.
#include <exception>

#include "../python_module.h"
#include "lltm_cpu_isa.h"

// lltm._C.cpu_isa(): the instruction set the CPU kernels run ("baseline",
// "avx2" or "avx512"), chosen now if no kernel has run yet. A bad
// LLTM_CPU_ISA raises the ValueError a kernel call would.
static PyObject* cpu_isa(PyObject*, PyObject*) {
  try {
    return PyUnicode_FromString(lltm::cpu::isa_name(lltm::cpu::selected_isa()));
  } catch (const std::exception& error) {
    PyErr_SetString(PyExc_ValueError, error.what());
    return nullptr;
  }
}

static PyMethodDef methods[] = {
    {"cpu_isa", cpu_isa, METH_NOARGS,
     "The instruction set lltm's CPU kernels run: baseline, avx2 or avx512."},
    {nullptr, nullptr, 0, nullptr},
};

#ifndef LLTM_VERSION
#error "LLTM_VERSION must be defined by the build (setup.py)"
#endif

static bool add_constants(PyObject* module) {
  return PyModule_AddStringConstant(module, "device", "cpu") == 0 &&
         PyModule_AddStringConstant(module, "lltm_version", LLTM_STRINGIFY(LLTM_VERSION)) == 0;
}

extern "C" {
LLTM_DEFINE_PYTHON_MODULE(_C, add_constants, methods)
}
