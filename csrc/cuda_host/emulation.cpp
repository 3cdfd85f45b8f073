// The host build's second Python module, `emulation`: the controls of the
// emulated GPU (lltm_cuda_host.h) and the probes tests/test_cuda_host.py runs
// through the emulation's own launch path and csrc/cuda's grid-stride loops.
// Test-only, like the rest of the host build.
#include <algorithm>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "../cuda/lltm_cuda_launch.cuh"
#include "lltm_cuda_host.h"
#include "python_module.h"

#ifndef LLTM_CUDA_HOST
#error "emulation.cpp belongs to the host build (LLTM_CUDA_HOST)"
#endif

namespace {

namespace host = lltm::cuda_host;

// Runs fn(); a C++ exception becomes a Python RuntimeError. Returns false then.
template <typename Fn>
bool python_errors(Fn&& fn) {
  try {
    fn();
    return true;
  } catch (const std::exception& error) {
    PyErr_SetString(PyExc_RuntimeError, error.what());
    return false;
  }
}

// --- Probes of the launch path --------------------------------------------------------

// One entry per thread run: blockIdx, threadIdx, gridDim, blockDim.
struct ThreadSeen {
  unsigned v[12];
};

__global__ void record_thread(std::vector<ThreadSeen>* seen) {
  seen->push_back({{blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y, threadIdx.z,
                    gridDim.x, gridDim.y, gridDim.z, blockDim.x, blockDim.y, blockDim.z}});
}

bool parse_dim3(PyObject* tuple, dim3& out) {
  unsigned x = 0, y = 0, z = 0;
  if (!PyArg_ParseTuple(tuple, "III", &x, &y, &z)) return false;
  out = dim3(x, y, z);
  return true;
}

// index_space(grid, block) -> list of the 12-tuples each thread saw, in the
// order run; RuntimeError where the GPU would refuse the configuration.
PyObject* index_space(PyObject*, PyObject* args) {
  PyObject *grid_arg = nullptr, *block_arg = nullptr;
  dim3 grid, block;
  if (!PyArg_ParseTuple(args, "OO", &grid_arg, &block_arg) || !parse_dim3(grid_arg, grid) ||
      !parse_dim3(block_arg, block)) {
    return nullptr;
  }
  std::vector<ThreadSeen> seen;
  const bool ok = python_errors([&] {
    const lltm::cuda::DeviceGuard guard(-1);
    LLTM_LAUNCH(grid, block, lltm::cuda::current_stream(-1), record_thread)(&seen);
    lltm::cuda::check_launch("record_thread");
  });
  if (!ok) return nullptr;
  PyObject* list = PyList_New(0);
  for (const ThreadSeen& t : seen) {
    PyObject* item = Py_BuildValue("(IIIIIIIIIIII)", t.v[0], t.v[1], t.v[2], t.v[3], t.v[4], t.v[5],
                                   t.v[6], t.v[7], t.v[8], t.v[9], t.v[10], t.v[11]);
    if (item == nullptr || PyList_Append(list, item) < 0) {
      Py_XDECREF(item);
      Py_DECREF(list);
      return nullptr;
    }
    Py_DECREF(item);
  }
  return list;
}

__global__ void do_nothing() {}

// launch_on_stream(default_stream: bool): a launch on torch's current stream,
// or on the default one (which the emulation refuses).
PyObject* launch_on_stream(PyObject*, PyObject* args) {
  int default_stream = 0;
  if (!PyArg_ParseTuple(args, "p", &default_stream)) return nullptr;
  const bool ok = python_errors([&] {
    const lltm::cuda::DeviceGuard guard(-1);
    const cudaStream_t stream = default_stream ? nullptr : lltm::cuda::current_stream(-1);
    LLTM_LAUNCH(dim3(1), dim3(1), stream, do_nothing)();
    lltm::cuda::check_launch("do_nothing");
  });
  if (!ok) return nullptr;
  Py_RETURN_NONE;
}

// vector_access(offset, store): one 16-byte load (or store) of four floats,
// `offset` bytes into an aligned buffer.
PyObject* vector_access(PyObject*, PyObject* args) {
  int offset = 0, store = 0;
  if (!PyArg_ParseTuple(args, "ip", &offset, &store)) return nullptr;
  if (offset < 0 || offset > 16) {
    PyErr_SetString(PyExc_ValueError, "offset must be in [0, 16]");
    return nullptr;
  }
  alignas(16) char buffer[48] = {};
  const bool ok = python_errors([&] {
    float* p = reinterpret_cast<float*>(buffer + offset);
    const auto pack = lltm::cuda::load_pack<4>(p);
    if (store) lltm::cuda::store_pack<4>(p, pack);
  });
  if (!ok) return nullptr;
  Py_RETURN_NONE;
}

// --- Coverage of the grid-stride loops ------------------------------------------------

// What a grid's threads wrote of a (rows, cols) matrix: one bit per element.
struct Written {
  std::vector<uint64_t> bits;
  int64_t duplicates = 0;  // elements written more than once (counted again each time)
  int64_t outside = 0;     // elements written outside the matrix

  // Elements [e, e + count) of the matrix, count <= 64.
  void mark(int64_t e, int count) {
    while (count > 0) {
      const int shift = static_cast<int>(e % 64);
      const int n = std::min(count, 64 - shift);
      const uint64_t mask = (n == 64 ? ~uint64_t(0) : (uint64_t(1) << n) - 1) << shift;
      uint64_t& word = bits[e / 64];
      duplicates += __builtin_popcountll(word & mask);
      word |= mask;
      e += n;
      count -= n;
    }
  }
};

// Marks every element a thread of the real kernels' loops (for_each_pack)
// would write, at the same 64-bit offsets.
template <int kVec>
__global__ void coverage_kernel(Written* written, int64_t rows, int64_t cols) {
  lltm::cuda::for_each_pack<kVec>(rows, cols, [&](int64_t row, int64_t j) {
    if (row < 0 || row >= rows || j < 0 || j + kVec > cols) {
      written->outside += kVec;
      return;
    }
    written->mark(row * cols + j, kVec);
  });
}

template <int kVec>
lltm::cuda::RowTiling cover(Written& written, int64_t rows, int64_t cols) {
  // As the launchers tile and launch: packs per row, the current stream.
  const lltm::cuda::RowTiling t = lltm::cuda::row_tiling(rows, cols / kVec, -1);
  LLTM_LAUNCH(t.grid, t.block, lltm::cuda::current_stream(-1), coverage_kernel<kVec>)(&written,
                                                                                      rows, cols);
  lltm::cuda::check_launch("coverage_kernel");
  return t;
}

// coverage(rows, cols, vec) -> (missing, duplicates, outside, grid, block):
// the loops of a kernel moving packs of `vec` elements (1, 2, 4 or 8; cols a
// multiple of it) over a (rows, cols) matrix, tiled for the emulated GPU's
// multiprocessor count.
PyObject* coverage(PyObject*, PyObject* args) {
  long long rows = 0, cols = 0;
  int vec = 0;
  if (!PyArg_ParseTuple(args, "LLi", &rows, &cols, &vec)) return nullptr;
  if (rows < 1 || cols < 1 || !(vec == 1 || vec == 2 || vec == 4 || vec == 8) || cols % vec) {
    PyErr_SetString(PyExc_ValueError, "need rows, cols >= 1 and vec in (1, 2, 4, 8) dividing cols");
    return nullptr;
  }
  Written written;
  lltm::cuda::RowTiling t;
  const bool ok = python_errors([&] {
    const lltm::cuda::DeviceGuard guard(-1);
    written.bits.assign((rows * cols + 63) / 64, 0);
    switch (vec) {
      case 1:
        t = cover<1>(written, rows, cols);
        break;
      case 2:
        t = cover<2>(written, rows, cols);
        break;
      case 4:
        t = cover<4>(written, rows, cols);
        break;
      default:
        t = cover<8>(written, rows, cols);
        break;
    }
  });
  if (!ok) return nullptr;
  int64_t set = 0;
  for (const uint64_t word : written.bits) set += __builtin_popcountll(word);
  const int64_t missing = rows * cols - set;
  return Py_BuildValue("(LLL(III)(III))", static_cast<long long>(missing),
                       static_cast<long long>(written.duplicates),
                       static_cast<long long>(written.outside), t.grid.x, t.grid.y, t.grid.z,
                       t.block.x, t.block.y, t.block.z);
}

// --- The emulated GPU ---------------------------------------------------------------

// reset(): an H100-like GPU of 132 multiprocessors, two devices of compute
// capability 9.0, no context, no injected error; the calling thread on device
// 0.
PyObject* reset(PyObject*, PyObject*) {
  host::Gpu& gpu = host::gpu();
  gpu.multiprocessors = 132;
  gpu.devices = 2;
  gpu.capability_major = 9;
  gpu.capability_minor = 0;
  gpu.image_error = cudaSuccess;
  gpu.set_device_error = cudaSuccess;
  gpu.attribute_error = cudaSuccess;
  for (auto& created : gpu.contexts) created = false;
  gpu.hold_load = false;
  gpu.timed_out = false;
  host::current_device = 0;
  host::last_error = cudaSuccess;
  Py_RETURN_NONE;
}

PyObject* set_multiprocessors(PyObject*, PyObject* args) {
  int count = 0;
  if (!PyArg_ParseTuple(args, "i", &count)) return nullptr;
  host::gpu().multiprocessors = count;
  Py_RETURN_NONE;
}

PyObject* set_capability(PyObject*, PyObject* args) {
  int major = 0, minor = 0;
  if (!PyArg_ParseTuple(args, "ii", &major, &minor)) return nullptr;
  host::gpu().capability_major = major;
  host::gpu().capability_minor = minor;
  Py_RETURN_NONE;
}

// inject(call, error): the error that every later `call` returns ("load":
// loading the kernels' code, "set_device", "attribute"); 0 for none.
PyObject* inject(PyObject*, PyObject* args) {
  const char* call = nullptr;
  int error = 0;
  if (!PyArg_ParseTuple(args, "si", &call, &error)) return nullptr;
  const std::string name = call;
  host::Gpu& gpu = host::gpu();
  if (name == "load") {
    gpu.image_error = error;
  } else if (name == "set_device") {
    gpu.set_device_error = error;
  } else if (name == "attribute") {
    gpu.attribute_error = error;
  } else {
    PyErr_SetString(PyExc_ValueError, "call must be 'load', 'set_device' or 'attribute'");
    return nullptr;
  }
  Py_RETURN_NONE;
}

// contexts() -> for each device, whether it has its primary context.
PyObject* contexts(PyObject*, PyObject*) {
  const int devices = std::min(host::gpu().devices.load(), host::kMaxDevices);
  PyObject* created = PyTuple_New(devices);
  for (int d = 0; d < devices; ++d) {
    PyTuple_SetItem(created, d, PyBool_FromLong(host::gpu().contexts[d].load()));
  }
  return created;
}

PyObject* current_device(PyObject*, PyObject*) { return PyLong_FromLong(host::current_device); }

// hold_load(hold): loading the kernels' code waits while `hold` is set.
PyObject* hold_load(PyObject*, PyObject* args) {
  int hold = 0;
  if (!PyArg_ParseTuple(args, "p", &hold)) return nullptr;
  host::gpu().hold_load = hold != 0;
  Py_RETURN_NONE;
}

// load_state() -> (waiting, timed_out): whether a load waits now, and
// whether one waited for two seconds without being let through.
PyObject* load_state(PyObject*, PyObject*) {
  return Py_BuildValue("(OO)", host::gpu().held.load() ? Py_True : Py_False,
                       host::gpu().timed_out.load() ? Py_True : Py_False);
}

PyObject* launches(PyObject*, PyObject*) {
  return PyLong_FromLongLong(host::gpu().launches.load());
}

PyMethodDef methods[] = {
    {"index_space", index_space, METH_VARARGS, "What every thread of a grid saw, in order run."},
    {"launch_on_stream", launch_on_stream, METH_VARARGS, "An empty kernel on a given stream."},
    {"vector_access", vector_access, METH_VARARGS, "A 16-byte load or store at a byte offset."},
    {"coverage", coverage, METH_VARARGS, "What the grid-stride loops write of a matrix."},
    {"reset", reset, METH_NOARGS, "The emulated GPU as it starts."},
    {"set_multiprocessors", set_multiprocessors, METH_VARARGS, "The multiprocessor count."},
    {"set_capability", set_capability, METH_VARARGS, "The compute capability."},
    {"inject", inject, METH_VARARGS, "An error a runtime call returns from now on."},
    {"contexts", contexts, METH_NOARGS, "Primary contexts created, per device."},
    {"current_device", current_device, METH_NOARGS, "The calling thread's current device."},
    {"hold_load", hold_load, METH_VARARGS, "Whether loading the kernels' code waits."},
    {"load_state", load_state, METH_NOARGS, "Whether a load waits, whether one timed out."},
    {"launches", launches, METH_NOARGS, "Kernel launches run so far."},
    {nullptr, nullptr, 0, nullptr},
};

bool add_constants(PyObject* module) {
  const std::pair<const char*, cudaError_t> errors[] = {
      {"cudaErrorMemoryAllocation", cudaErrorMemoryAllocation},
      {"cudaErrorDevicesUnavailable", cudaErrorDevicesUnavailable},
      {"cudaErrorInvalidValue", cudaErrorInvalidValue},
      {"cudaErrorNoKernelImageForDevice", cudaErrorNoKernelImageForDevice},
      {"cudaErrorUnsupportedPtxVersion", cudaErrorUnsupportedPtxVersion},
  };
  for (const auto& [name, code] : errors) {
    if (PyModule_AddIntConstant(module, name, code) < 0) return false;
  }
  return true;
}

}  // namespace

extern "C" {
LLTM_DEFINE_PYTHON_MODULE(emulation, add_constants, methods)
}
