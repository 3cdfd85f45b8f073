// The host build's second Python module, `emulation`: the controls of the
// emulated GPU (runtime/gpu.h), the counts of what the CUDA sources ask of it
// (runtime/calls.h) and the probes tests/test_cuda_host.py runs: of the plain
// launch path and csrc/cuda's grid-stride loops (here), of kernels with
// barriers and shared memory and of cudaLaunchKernelEx's checks (probes.cpp).
// Test-only, like the rest of the host build.
#include "module.h"
// The emulation first, then the CUDA sources' helpers.
#include <algorithm>
#include <cstdint>
#include <exception>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "cuda/lltm_cuda_launch.cuh"
#include "cuda/lltm_cuda_persistent_plan.h"
#include "python_module.h"

namespace lltm::cuda {
// lltm_cuda_persistent_planning.cu: the plan of a call (read here for its
// description on the emulated GPU as it is set up, with the call's TF32
// setting, without the device selection of the plugin's sequence_path).
SequencePlan plan_for(SequencePass pass, int device, int element_size, int64_t batch, int64_t state,
                      bool tf32);
}  // namespace lltm::cuda

namespace {

namespace host = lltm::cuda_host;
using host::emulation::parse_dim3;
using host::emulation::python_errors;

// --- Probes of the launch path --------------------------------------------------------

// One entry per thread run: blockIdx, threadIdx, gridDim, blockDim.
struct ThreadSeen {
  unsigned v[12];
};

__global__ void record_thread(std::vector<ThreadSeen>* seen) {
  seen->push_back({{blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y, threadIdx.z,
                    gridDim.x, gridDim.y, gridDim.z, blockDim.x, blockDim.y, blockDim.z}});
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
    lltm::cuda::check_launch(
        "record_thread",
        LLTM_LAUNCH(grid, block, lltm::cuda::current_stream(-1), record_thread)(&seen));
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
    lltm::cuda::check_launch("do_nothing", LLTM_LAUNCH(dim3(1), dim3(1), stream, do_nothing)());
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
  const cudaError_t error = LLTM_LAUNCH(t.grid, t.block, lltm::cuda::current_stream(-1),
                                        coverage_kernel<kVec>)(&written, rows, cols);
  lltm::cuda::check_launch("coverage_kernel", error);
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

// reset(): the emulated GPU as it starts (runtime/gpu.h): an H100 of
// 132 multiprocessors, two devices, no context, no injected error, no kernel
// attribute set, the forward schedule with every barrier; the calling thread
// on device 0.
PyObject* reset(PyObject*, PyObject*) {
  host::reset();
  host::use_assembly_switch(true);
  Py_RETURN_NONE;
}

PyObject* set_multiprocessors(PyObject*, PyObject* args) {
  int count = 0;
  if (!PyArg_ParseTuple(args, "i", &count)) return nullptr;
  host::gpu().multiprocessors = count;
  host::gpu_changed();
  Py_RETURN_NONE;
}

PyObject* set_capability(PyObject*, PyObject* args) {
  int major = 0, minor = 0;
  if (!PyArg_ParseTuple(args, "ii", &major, &minor)) return nullptr;
  host::gpu().capability_major = major;
  host::gpu().capability_minor = minor;
  host::gpu_changed();
  Py_RETURN_NONE;
}

// set_shared_memory(per_multiprocessor, per_block_optin): bytes.
PyObject* set_shared_memory(PyObject*, PyObject* args) {
  int per_multiprocessor = 0, per_block_optin = 0;
  if (!PyArg_ParseTuple(args, "ii", &per_multiprocessor, &per_block_optin)) return nullptr;
  host::gpu().shared_per_multiprocessor = per_multiprocessor;
  host::gpu().shared_per_block_optin = per_block_optin;
  host::gpu_changed();
  Py_RETURN_NONE;
}

// set_multiprocessor_limits(threads, blocks): what one multiprocessor holds.
PyObject* set_multiprocessor_limits(PyObject*, PyObject* args) {
  int threads = 0, blocks = 0;
  if (!PyArg_ParseTuple(args, "ii", &threads, &blocks)) return nullptr;
  host::gpu().threads_per_multiprocessor = threads;
  host::gpu().blocks_per_multiprocessor = blocks;
  host::gpu_changed();
  Py_RETURN_NONE;
}

PyObject* set_cooperative_launch(PyObject*, PyObject* args) {
  int supported = 0;
  if (!PyArg_ParseTuple(args, "p", &supported)) return nullptr;
  host::gpu().cooperative_launch = supported != 0;
  host::gpu_changed();
  Py_RETURN_NONE;
}

// set_cluster_sizes(portable, non_portable): the largest clusters, in blocks.
PyObject* set_cluster_sizes(PyObject*, PyObject* args) {
  int portable = 0, non_portable = 0;
  if (!PyArg_ParseTuple(args, "ii", &portable, &non_portable)) return nullptr;
  host::gpu().portable_cluster_size = portable;
  host::gpu().non_portable_cluster_size = non_portable;
  host::gpu_changed();
  Py_RETURN_NONE;
}

// set_gpcs(count): the GPCs the multiprocessors are spread over.
PyObject* set_gpcs(PyObject*, PyObject* args) {
  int count = 0;
  if (!PyArg_ParseTuple(args, "i", &count)) return nullptr;
  host::gpu().gpcs = count;
  host::gpu_changed();
  Py_RETURN_NONE;
}

// set_free_multiprocessors(count): those a cooperative or cluster launch can
// have (MPS, or other work on the GPU); -1: all.
PyObject* set_free_multiprocessors(PyObject*, PyObject* args) {
  int count = 0;
  if (!PyArg_ParseTuple(args, "i", &count)) return nullptr;
  host::gpu().free_multiprocessors = count;
  host::gpu_changed();
  Py_RETURN_NONE;
}

// inject(call, error): the error that every later `call` returns ("load":
// loading the kernels' code, "set_device", "attribute", "launch": a plain
// launch, LLTM_LAUNCH); 0 for none.
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
  } else if (name == "launch") {
    gpu.launch_error = error;
  } else {
    PyErr_SetString(PyExc_ValueError, "call must be 'load', 'set_device', 'attribute' or 'launch'");
    return nullptr;
  }
  host::gpu_changed();
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

// set_last_error(error): the calling thread's last error, as another
// library's failed call leaves it (pending until someone reads it).
PyObject* set_last_error(PyObject*, PyObject* args) {
  int error = 0;
  if (!PyArg_ParseTuple(args, "i", &error)) return nullptr;
  host::last_error = static_cast<cudaError_t>(error);
  Py_RETURN_NONE;
}

// peek_last_error() -> the calling thread's last error, left as it is
// (cudaPeekAtLastError).
PyObject* peek_last_error(PyObject*, PyObject*) { return PyLong_FromLong(cudaPeekAtLastError()); }

// plan(element_size, batch, state, tf32) -> "forward: ...\nbackward: ...":
// the plans of a call on the emulated GPU as it is set up, as
// sequence_path describes them, with allow_tf32 = tf32.
PyObject* plan(PyObject*, PyObject* args) {
  int element_size = 0, tf32 = 0;
  long long batch = 0, state = 0;
  if (!PyArg_ParseTuple(args, "iLLp", &element_size, &batch, &state, &tf32)) return nullptr;
  std::string text;
  const bool ok = python_errors([&] {
    using lltm::cuda::SequencePass;
    text = "forward: " +
           lltm::cuda::describe(lltm::cuda::plan_for(SequencePass::kForward, -1, element_size,
                                                     batch, state, tf32 != 0)) +
           "\nbackward: " +
           lltm::cuda::describe(lltm::cuda::plan_for(SequencePass::kBackward, -1, element_size,
                                                     batch, state, tf32 != 0));
  });
  return ok ? PyUnicode_FromString(text.c_str()) : nullptr;
}

// set_costs({name: microseconds}): what each call counted under that name
// (calls()), or charged under a finer one ("cudaLaunchKernelEx/cooperative",
// "cudaLaunchKernelEx/cluster"), adds to the emulated clock that CUDA events
// read (runtime/calls.h); names left out take no time. Not a change of the
// GPU: what the CUDA sources remember of it stays.
PyObject* set_costs(PyObject*, PyObject* args) {
  PyObject* costs = nullptr;
  if (!PyArg_ParseTuple(args, "O!", &PyDict_Type, &costs)) return nullptr;
  std::map<std::string, double> parsed;
  PyObject *key = nullptr, *value = nullptr;
  Py_ssize_t position = 0;
  while (PyDict_Next(costs, &position, &key, &value)) {
    const char* name = PyUnicode_AsUTF8(key);
    const double us = PyFloat_AsDouble(value);
    if (name == nullptr || PyErr_Occurred()) return nullptr;
    parsed[name] = us;
  }
  host::set_costs(std::move(parsed));
  Py_RETURN_NONE;
}

// clock() -> microseconds on the emulated clock so far.
PyObject* clock(PyObject*, PyObject*) { return PyFloat_FromDouble(host::clock_us()); }

// set_capturing(on): whether torch's current streams are being captured
// into a CUDA graph (cudaStreamIsCapturing). Not a change of the GPU.
PyObject* set_capturing(PyObject*, PyObject* args) {
  int on = 0;
  if (!PyArg_ParseTuple(args, "p", &on)) return nullptr;
  host::gpu().capturing = on != 0;
  Py_RETURN_NONE;
}

PyObject* launches(PyObject*, PyObject*) {
  return PyLong_FromLongLong(host::gpu().launches.load());
}

// {name: count} as a Python dict; null, with Python's error set, where
// one cannot be made.
PyObject* count_dict(const std::map<std::string, int64_t>& counts) {
  PyObject* dict = PyDict_New();
  if (dict == nullptr) return nullptr;
  for (const auto& [name, count] : counts) {
    PyObject* value = PyLong_FromLongLong(count);
    if (value == nullptr || PyDict_SetItemString(dict, name.c_str(), value) < 0) {
      Py_XDECREF(value);
      Py_DECREF(dict);
      return nullptr;
    }
    Py_DECREF(value);
  }
  return dict;
}

// calls() -> {name: count}: the kernel launches ("LLTM_LAUNCH",
// "cudaLaunchKernelEx"), the queries of the GPU (cudaDeviceGetAttribute,
// the occupancy calculator, cudaFuncSetAttribute, cudaFuncGetAttributes)
// and the calls of torch's C shim that make work or tensors (allocations,
// views, GEMMs, dispatcher operators by name) run so far (runtime/calls.h);
// never reset: tests take differences.
PyObject* calls(PyObject*, PyObject*) { return count_dict(host::calls()); }

// instructions() -> {name: count}: the tensor-core instructions the kernels
// ran so far, each warp's once (runtime/tensor_cores.h); never reset.
PyObject* instructions(PyObject*, PyObject*) { return count_dict(host::instructions()); }

// allocations() -> [(sizes, dtype)]: the tensors the CUDA sources allocated
// through torch's C shim since the last call (runtime/calls.h), in order;
// dtype is the shim's code (torch's ScalarType: 5 float16, 6 float32,
// 7 float64, 15 bfloat16). Operators called through torch's dispatcher
// allocate out of its sight: calls() counts them by name.
PyObject* allocations(PyObject*, PyObject*) {
  PyObject* list = PyList_New(0);
  if (list == nullptr) return nullptr;
  for (const host::Allocation& a : host::take_allocations()) {
    PyObject* sizes = PyTuple_New(static_cast<Py_ssize_t>(a.sizes.size()));
    if (sizes == nullptr) {
      Py_DECREF(list);
      return nullptr;
    }
    for (size_t d = 0; d < a.sizes.size(); ++d) {
      PyTuple_SET_ITEM(sizes, static_cast<Py_ssize_t>(d), PyLong_FromLongLong(a.sizes[d]));
    }
    PyObject* item = Py_BuildValue("(Ni)", sizes, a.dtype);
    if (item == nullptr || PyList_Append(list, item) < 0) {
      Py_XDECREF(item);
      Py_DECREF(list);
      return nullptr;
    }
    Py_DECREF(item);
  }
  return list;
}

PyMethodDef methods[] = {
    {"index_space", index_space, METH_VARARGS, "What every thread of a grid saw, in order run."},
    {"launch_on_stream", launch_on_stream, METH_VARARGS, "An empty kernel on a given stream."},
    {"vector_access", vector_access, METH_VARARGS, "A 16-byte load or store at a byte offset."},
    {"coverage", coverage, METH_VARARGS, "What the grid-stride loops write of a matrix."},
    {"reset", reset, METH_NOARGS, "The emulated GPU as it starts."},
    {"set_multiprocessors", set_multiprocessors, METH_VARARGS, "The multiprocessor count."},
    {"set_capability", set_capability, METH_VARARGS, "The compute capability."},
    {"set_shared_memory", set_shared_memory, METH_VARARGS, "Shared memory limits, in bytes."},
    {"set_multiprocessor_limits", set_multiprocessor_limits, METH_VARARGS,
     "Threads and blocks a multiprocessor holds."},
    {"set_cooperative_launch", set_cooperative_launch, METH_VARARGS,
     "Whether cooperative launches are supported."},
    {"set_cluster_sizes", set_cluster_sizes, METH_VARARGS, "The largest clusters, in blocks."},
    {"set_gpcs", set_gpcs, METH_VARARGS, "The GPCs the multiprocessors are spread over."},
    {"set_free_multiprocessors", set_free_multiprocessors, METH_VARARGS,
     "Multiprocessors a cooperative or cluster launch can have (-1: all)."},
    {"set_schedule", host::emulation::set_schedule, METH_VARARGS,
     "The order fibers run in between barriers."},
    {"drop_barrier", host::emulation::drop_barrier, METH_VARARGS,
     "Barriers of a kind return at once ('': none)."},
    {"set_fiber_switch", host::emulation::set_fiber_switch, METH_VARARGS,
     "'assembly' or 'ucontext': how fibers switch."},
    {"neighbours", host::emulation::neighbours, METH_VARARGS,
     "Shared memory read across a block barrier."},
    {"cluster_neighbours", host::emulation::cluster_neighbours, METH_VARARGS,
     "Distributed shared memory read across a cluster barrier."},
    {"grid_exchange", host::emulation::grid_exchange, METH_VARARGS,
     "Exchanges through global memory across grid barriers."},
    {"schedule_seen", host::emulation::schedule_seen, METH_VARARGS,
     "The order threads ran in around a barrier."},
    {"barrier_rounds", host::emulation::barrier_rounds, METH_VARARGS,
     "Rounds of barriers, to time fiber switches."},
    {"stall", host::emulation::stall, METH_VARARGS, "A barrier that can never complete."},
    {"misuse", host::emulation::misuse, METH_VARARGS, "What kernels may not do."},
    {"alive", host::emulation::alive, METH_NOARGS, "Objects of the probe kernels alive."},
    {"launch_check", host::emulation::launch_check, METH_VARARGS,
     "cudaFuncSetAttribute and cudaLaunchKernelEx of a probe kernel."},
    {"occupancy", host::emulation::occupancy, METH_VARARGS,
     "cudaOccupancyMaxActiveBlocksPerMultiprocessor of a probe kernel."},
    {"max_active_clusters", host::emulation::max_active_clusters, METH_VARARGS,
     "cudaOccupancyMaxActiveClusters of a probe kernel."},
    {"mma", host::emulation::mma, METH_VARARGS, "mma.sync m16n8k16 of fragments laid out here."},
    {"tensor_core_product", host::emulation::tensor_core_product, METH_VARARGS,
     "lltm::cuda::tensor_core_product of a 16-bit W and a float32 X."},
    {"mma_tf32", host::emulation::mma_tf32, METH_VARARGS,
     "mma.sync m16n8k8 .tf32 of fragments laid out here."},
    {"tensor_core_product_tf32", host::emulation::tensor_core_product_tf32, METH_VARARGS,
     "lltm::cuda::tensor_core_product of a float32 W and X, in TF32."},
    {"round_to_tf32", host::emulation::round_to_tf32, METH_VARARGS,
     "lltm::cuda::round_to_tf32 of each element."},
    {"device_attribute", host::emulation::device_attribute, METH_VARARGS,
     "cudaDeviceGetAttribute of the emulated device."},
    {"inject", inject, METH_VARARGS, "An error a runtime call returns from now on."},
    {"contexts", contexts, METH_NOARGS, "Primary contexts created, per device."},
    {"current_device", current_device, METH_NOARGS, "The calling thread's current device."},
    {"hold_load", hold_load, METH_VARARGS, "Whether loading the kernels' code waits."},
    {"load_state", load_state, METH_NOARGS, "Whether a load waits, whether one timed out."},
    {"set_last_error", set_last_error, METH_VARARGS, "The calling thread's last error."},
    {"peek_last_error", peek_last_error, METH_NOARGS, "The calling thread's last error, kept."},
    {"launches", launches, METH_NOARGS, "Kernel launches run so far."},
    {"plan", plan, METH_VARARGS, "The plans of a call, described, with its TF32 setting."},
    {"set_costs", set_costs, METH_VARARGS, "Microseconds each call takes on the clock."},
    {"clock", clock, METH_NOARGS, "Microseconds on the emulated clock so far."},
    {"set_capturing", set_capturing, METH_VARARGS, "Whether the streams are being captured."},
    {"calls", calls, METH_NOARGS, "Launches and torch shim calls run so far, by name."},
    {"instructions", instructions, METH_NOARGS,
     "Tensor-core instructions run so far (a warp's once), by name."},
    {"allocations", allocations, METH_NOARGS,
     "The shim's allocations since the last call: (sizes, dtype)."},
    {nullptr, nullptr, 0, nullptr},
};

bool add_constants(PyObject* module) {
  const std::pair<const char*, int> constants[] = {
      {"cudaSuccess", cudaSuccess},
      {"cudaErrorMemoryAllocation", cudaErrorMemoryAllocation},
      {"cudaErrorDevicesUnavailable", cudaErrorDevicesUnavailable},
      {"cudaErrorInvalidValue", cudaErrorInvalidValue},
      {"cudaErrorInvalidConfiguration", cudaErrorInvalidConfiguration},
      {"cudaErrorIllegalAddress", cudaErrorIllegalAddress},
      {"cudaErrorNoKernelImageForDevice", cudaErrorNoKernelImageForDevice},
      {"cudaErrorUnsupportedPtxVersion", cudaErrorUnsupportedPtxVersion},
      {"cudaErrorCooperativeLaunchTooLarge", cudaErrorCooperativeLaunchTooLarge},
      {"cudaErrorNotSupported", cudaErrorNotSupported},
      {"cudaErrorInvalidClusterSize", cudaErrorInvalidClusterSize},
      {"cudaDevAttrMultiProcessorCount", cudaDevAttrMultiProcessorCount},
      {"cudaDevAttrComputeCapabilityMajor", cudaDevAttrComputeCapabilityMajor},
      {"cudaDevAttrComputeCapabilityMinor", cudaDevAttrComputeCapabilityMinor},
      {"cudaDevAttrCooperativeLaunch", cudaDevAttrCooperativeLaunch},
      {"cudaDevAttrClusterLaunch", cudaDevAttrClusterLaunch},
      {"cudaDevAttrMaxSharedMemoryPerBlock", cudaDevAttrMaxSharedMemoryPerBlock},
      {"cudaDevAttrMaxSharedMemoryPerBlockOptin", cudaDevAttrMaxSharedMemoryPerBlockOptin},
      {"cudaDevAttrMaxSharedMemoryPerMultiprocessor", cudaDevAttrMaxSharedMemoryPerMultiprocessor},
      {"cudaDevAttrMaxThreadsPerMultiProcessor", cudaDevAttrMaxThreadsPerMultiProcessor},
      {"cudaDevAttrMaxBlocksPerMultiprocessor", cudaDevAttrMaxBlocksPerMultiprocessor},
      {"cudaDevAttrReservedSharedMemoryPerBlock", cudaDevAttrReservedSharedMemoryPerBlock},
  };
  for (const auto& [name, value] : constants) {
    if (PyModule_AddIntConstant(module, name, value) < 0) return false;
  }
  return true;
}

}  // namespace

extern "C" {
LLTM_DEFINE_PYTHON_MODULE(emulation, add_constants, methods)
}
