// The functions of the host build's `emulation` module (test-only) that
// module.cpp's table takes from other files: the probes of kernels with
// barriers and shared memory, and of cudaLaunchKernelEx's checks
// (probes.cpp), and of the tensor cores (tensor_core_probes.cpp).
#pragma once

#include <Python.h>

#include <exception>
#include <type_traits>
#include <utility>
#include <vector>

#include "../runtime/runtime.h"

namespace lltm::cuda_host::emulation {

// Runs fn(); a C++ exception becomes a Python RuntimeError. Returns false then.
template <typename Fn>
bool python_errors(Fn&& fn) {
  try {
    std::forward<Fn>(fn)();
    return true;
  } catch (const std::exception& error) {
    PyErr_SetString(PyExc_RuntimeError, error.what());
    return false;
  }
}

// A new Python list of `values` (unsigned integers or floats); null, with
// a Python error, where it cannot be made.
template <typename T>
PyObject* python_list(const std::vector<T>& values) {
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(values.size()));
  if (list == nullptr) return nullptr;
  for (std::size_t i = 0; i < values.size(); ++i) {
    PyObject* item;
    if constexpr (std::is_floating_point_v<T>) {
      item = PyFloat_FromDouble(values[i]);
    } else {
      item = PyLong_FromUnsignedLong(values[i]);
    }
    if (item == nullptr) {
      Py_DECREF(list);
      return nullptr;
    }
    PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i), item);
  }
  return list;
}

// A Python (x, y, z) as a dim3; false, with a Python error, otherwise.
bool parse_dim3(PyObject* tuple, dim3& out);

PyObject* neighbours(PyObject*, PyObject* args);
PyObject* cluster_neighbours(PyObject*, PyObject* args);
PyObject* grid_exchange(PyObject*, PyObject* args);
PyObject* schedule_seen(PyObject*, PyObject* args);
PyObject* barrier_rounds(PyObject*, PyObject* args);
PyObject* stall(PyObject*, PyObject* args);
PyObject* misuse(PyObject*, PyObject* args);
PyObject* alive(PyObject*, PyObject*);
PyObject* launch_check(PyObject*, PyObject* args);
PyObject* occupancy(PyObject*, PyObject* args);
// tensor_core_probes.cpp
PyObject* mma(PyObject*, PyObject* args);
PyObject* tensor_core_product(PyObject*, PyObject* args);
PyObject* mma_tf32(PyObject*, PyObject* args);
PyObject* tensor_core_product_tf32(PyObject*, PyObject* args);
PyObject* round_to_tf32(PyObject*, PyObject* args);
PyObject* max_active_clusters(PyObject*, PyObject* args);
PyObject* device_attribute(PyObject*, PyObject* args);
PyObject* set_schedule(PyObject*, PyObject* args);
PyObject* drop_barrier(PyObject*, PyObject* args);
PyObject* set_fiber_switch(PyObject*, PyObject* args);

}  // namespace lltm::cuda_host::emulation
