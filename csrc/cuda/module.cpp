// Python entry point of the CUDA plugin (lltm_cuda<major>._C): importing it
// registers the CUDA kernels (lltm_cuda.cu) for the op schemas that lltm._C
// declares. It carries the lltm version it was built from and the CUDA
// runtime version and GPU architectures it was compiled for, and tells
// whether its kernels can run on a given GPU, for lltm's diagnostics and its
// per-device fallback.
#include <exception>
#include <string>

#include "../python_module.h"
#include "lltm_cuda_device.h"
#include "lltm_cuda_runtime.h"

#ifndef LLTM_VERSION
#error "LLTM_VERSION must be defined by the build (setup.py)"
#endif

#ifndef LLTM_CUDA_ARCHS
#error "LLTM_CUDA_ARCHS must be defined by the build (setup.py)"
#endif

// kernel_image_problem(device: int) -> str: "" when the kernels can run on
// that GPU, else why not; RuntimeError when the probe cannot tell (see
// lltm_cuda_device.h).
static PyObject* kernel_image_problem(PyObject* /*module*/, PyObject* args) {
  int device = 0;
  if (!PyArg_ParseTuple(args, "i", &device)) return nullptr;
  std::string problem, failure;
  // Creating a context takes a while: other Python threads run meanwhile.
  Py_BEGIN_ALLOW_THREADS;
  try {
    problem = lltm::cuda::kernel_image_problem(device);
  } catch (const std::exception& error) {
    failure = error.what();
  }
  Py_END_ALLOW_THREADS;
  if (!failure.empty()) {
    PyErr_SetString(PyExc_RuntimeError, failure.c_str());
    return nullptr;
  }
  return PyUnicode_FromString(problem.c_str());
}

static PyMethodDef methods[] = {{"kernel_image_problem", kernel_image_problem, METH_VARARGS,
                                 "Why lltm's CUDA kernels cannot run on the given device, or ''; "
                                 "RuntimeError where that cannot be told now."},
                                {nullptr, nullptr, 0, nullptr}};

static bool add_constants(PyObject* module) {
  // CUDART_VERSION is major * 1000 + minor * 10, e.g. 13000 for CUDA 13.0.
  const std::string cuda_version =
      std::to_string(CUDART_VERSION / 1000) + "." + std::to_string(CUDART_VERSION % 1000 / 10);
  return PyModule_AddStringConstant(module, "device", "cuda") == 0 &&
         PyModule_AddStringConstant(module, "lltm_version", LLTM_STRINGIFY(LLTM_VERSION)) == 0 &&
         PyModule_AddStringConstant(module, "cuda_version", cuda_version.c_str()) == 0 &&
         PyModule_AddStringConstant(module, "cuda_archs", LLTM_STRINGIFY(LLTM_CUDA_ARCHS)) == 0;
}

extern "C" {
LLTM_DEFINE_PYTHON_MODULE(_C, add_constants, methods)
}
