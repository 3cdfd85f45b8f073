// Probes of kernels with barriers and shared memory, and of the checks of
// cudaLaunchKernelEx, for tests/test_cuda_host.py (test-only, like the rest
// of the host build): small kernels whose answers show that each block has
// its own shared memory, that each barrier orders what it must (and that
// without it a schedule gives a wrong answer), that a barrier that can never
// complete is a fault, and that each launch check returns the GPU's error.
#include "module.h"
// The emulation first, then the CUDA sources' helpers.
#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/lltm_cuda_launch.cuh"

// Probe kernels, outside an anonymous namespace so that faults can name them.
namespace lltm::cuda_host::probes {

namespace cg = lltm::cuda::cg;

__device__ unsigned thread_rank() {
  return (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
}
__device__ unsigned block_rank() {
  return (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
}
__device__ unsigned block_threads() { return blockDim.x * blockDim.y * blockDim.z; }

// Objects of the probe kernels alive: a thread unwound at a fault destroys its own.
std::atomic<int64_t> objects_alive{0};
struct Alive {
  Alive() { ++objects_alive; }
  ~Alive() { --objects_alive; }
  Alive(const Alive&) = delete;
  Alive& operator=(const Alive&) = delete;
};

// Each thread writes its slot of the block's shared memory, waits at the
// block barrier (__syncthreads, or cg's, or none when the test dropped it),
// and reads its neighbour's slot: (block << 16 | neighbour).
__global__ void neighbour_kernel(unsigned* out, int group) {
  auto* shared = reinterpret_cast<unsigned*>(lltm::cuda::dynamic_shared_memory());
  const unsigned n = block_threads(), t = thread_rank(), b = block_rank();
  shared[t] = b << 16 | t;
  if (group) {
    cg::this_thread_block().sync();
  } else {
    __syncthreads();
  }
  out[b * n + t] = shared[(t + 1) % n];
}

// The same through distributed shared memory: each thread reads its slot of
// the next block of its cluster, after a cluster barrier, and stays until
// the whole cluster has read (a second one). Writes (value read, block
// rank, cluster size).
__global__ void cluster_neighbour_kernel(unsigned* out) {
  const cg::cluster_group cluster = cg::this_cluster();
  auto* shared = reinterpret_cast<unsigned*>(lltm::cuda::dynamic_shared_memory());
  const unsigned n = block_threads(), t = thread_rank(), b = block_rank();
  shared[t] = b << 16 | t;
  cluster.sync();
  const unsigned* peer =
      cluster.map_shared_rank(shared, (cluster.block_rank() + 1) % cluster.num_blocks());
  unsigned* o = out + 3 * (b * n + t);
  o[0] = peer[t];
  o[1] = cluster.block_rank();
  o[2] = cluster.num_blocks();
  cluster.sync();
}

// `steps` exchanges through global memory across the grid: each step every
// thread publishes its value, waits at the grid barrier, and takes
// 3 x (the value of the thread one block further on) + step. Two buffers in
// turn, so that one barrier a step suffices.
__global__ void grid_exchange_kernel(unsigned* buffers, unsigned* out, unsigned steps) {
  const cg::grid_group grid = cg::this_grid();
  const auto n = static_cast<unsigned>(grid.num_threads());
  const auto g = static_cast<unsigned>(grid.thread_rank());
  unsigned v = g;
  for (unsigned s = 0; s < steps; ++s) {
    unsigned* buffer = buffers + (s % 2) * n;
    buffer[g] = v;
    grid.sync();
    v = buffer[(g + block_threads()) % n] * 3 + s;
  }
  out[g] = v;
}

// The order threads run in: (round, block, thread) before and after a barrier.
__global__ void schedule_kernel(std::vector<std::array<unsigned, 3>>* seen) {
  seen->push_back({0, block_rank(), thread_rank()});
  __syncthreads();
  seen->push_back({1, block_rank(), thread_rank()});
}

// `rounds` of two barriers of `kind` each, with shared memory between.
__global__ void rounds_kernel(unsigned* out, unsigned rounds, int kind) {
  auto* shared = reinterpret_cast<unsigned*>(lltm::cuda::dynamic_shared_memory());
  const unsigned n = block_threads(), t = thread_rank();
  auto wait = [kind] {
    if (kind == 0) __syncthreads();
    if (kind == 1) cg::this_cluster().sync();
    if (kind == 2) cg::this_grid().sync();
  };
  unsigned v = t;
  for (unsigned r = 0; r < rounds; ++r) {
    shared[t] = v;
    wait();
    v += shared[(t + 1) % n];
    wait();
  }
  out[block_rank() * n + t] = v;
}

// Barriers that can never complete.
enum Stall : int {
  kExitBeforeBlockBarrier = 0,    // half of each block returns first
  kExitBeforeGridBarrier = 1,     // one block returns first
  kExitBeforeClusterBarrier = 2,  // a cluster's second block returns first
  kDifferentBarriers = 3,         // half a block at its barrier, half at the grid's
};

__global__ void stall_kernel(int stall) {
  const Alive alive;
  switch (stall) {
    case kExitBeforeBlockBarrier:
      if (thread_rank() >= block_threads() / 2) return;
      __syncthreads();
      return;
    case kExitBeforeGridBarrier:
      if (block_rank() == 1) return;
      cg::this_grid().sync();
      return;
    case kExitBeforeClusterBarrier:
      if (cg::this_cluster().block_rank() == 1) return;
      cg::this_cluster().sync();
      return;
    case kDifferentBarriers:
      if (thread_rank() % 2 != 0) {
        __syncthreads();
      } else {
        cg::this_grid().sync();
      }
      return;
  }
}

// What kernels may not do.
enum Misuse : int {
  kPlainBarrier = 0,       // __syncthreads in a plain launch
  kPlainSharedMemory = 1,  // dynamic_shared_memory() in a plain launch
  kGridBarrierNotCooperative = 2,
  kClusterBelowSm90 = 3,  // cg::this_cluster().sync() on compute capability 8.0
  kMapOutsideSharedMemory = 4,
  kMapPastCluster = 5,
  kTrap = 6,
};

__global__ void misuse_kernel(int misuse, unsigned* sink) {
  const Alive alive;
  // Every thread waits at a block barrier first, so that a fault of the
  // last one finds the others waiting: they must be unwound.
  if (misuse >= kGridBarrierNotCooperative) __syncthreads();
  switch (misuse) {
    case kPlainBarrier:
      __syncthreads();
      return;
    case kPlainSharedMemory:
      *sink = *lltm::cuda::dynamic_shared_memory();
      return;
    case kGridBarrierNotCooperative:
      cg::this_grid().sync();
      return;
    case kClusterBelowSm90:
      cg::this_cluster().sync();
      return;
    case kMapOutsideSharedMemory:
      *sink = *cg::this_cluster().map_shared_rank(sink, 0);
      return;
    case kMapPastCluster:
      *sink = *cg::this_cluster().map_shared_rank(lltm::cuda::dynamic_shared_memory(), 2);
      return;
    case kTrap:
      if (thread_rank() == block_threads() - 1) __trap();
      return;
  }
}

// The launch checks' kernel: counts the threads run.
__global__ void launch_probe_kernel(unsigned* ran) { ++*ran; }

}  // namespace lltm::cuda_host::probes

namespace lltm::cuda_host::emulation {
namespace {

// A cudaLaunchKernelEx launch of the probes.
struct Shape {
  dim3 grid, block;
  std::size_t shared = 0;
  bool clustered = false;
  dim3 cluster;
  bool cooperative = false;
};

template <typename... Params, typename... Args>
cudaError_t launch(const Shape& shape, void (*kernel)(Params...), Args... args) {
  cudaLaunchAttribute attributes[2] = {};
  unsigned count = 0;
  if (shape.cooperative) {
    attributes[count].id = cudaLaunchAttributeCooperative;
    attributes[count].val.cooperative = 1;
    ++count;
  }
  if (shape.clustered) {
    attributes[count].id = cudaLaunchAttributeClusterDimension;
    attributes[count].val.clusterDim.x = shape.cluster.x;
    attributes[count].val.clusterDim.y = shape.cluster.y;
    attributes[count].val.clusterDim.z = shape.cluster.z;
    ++count;
  }
  const cudaLaunchConfig_t config{
      shape.grid, shape.block, shape.shared, lltm::cuda::current_stream(-1), attributes, count};
  return cudaLaunchKernelEx(&config, kernel, args...);
}

// Launches and checks the launch, as lltm's launchers do.
template <typename... Params, typename... Args>
void run(const char* name, const Shape& shape, void (*kernel)(Params...), Args... args) {
  const cudaError_t error = launch(shape, kernel, args...);
  if (error != cudaSuccess) lltm::cuda::fail_cuda(std::string("launching ") + name, error);
}

uint64_t threads_of(const Shape& shape) {
  return uint64_t(shape.grid.x) * shape.grid.y * shape.grid.z * shape.block.x * shape.block.y *
         shape.block.z;
}

// An optional Python (x, y, z): None for none.
bool parse_cluster(PyObject* arg, Shape& shape) {
  if (arg == Py_None) return true;
  shape.clustered = true;
  return parse_dim3(arg, shape.cluster);
}

}  // namespace

bool parse_dim3(PyObject* tuple, dim3& out) {
  unsigned x = 0, y = 0, z = 0;
  if (!PyArg_ParseTuple(tuple, "III", &x, &y, &z)) return false;
  out = dim3(x, y, z);
  return true;
}

// neighbours(grid, block, cooperative, group) -> what each thread read of its
// neighbour's shared memory slot, by (block, thread) rank.
PyObject* neighbours(PyObject*, PyObject* args) {
  PyObject *grid = nullptr, *block = nullptr;
  int cooperative = 0, group = 0;
  Shape shape;
  if (!PyArg_ParseTuple(args, "OOpp", &grid, &block, &cooperative, &group) ||
      !parse_dim3(grid, shape.grid) || !parse_dim3(block, shape.block)) {
    return nullptr;
  }
  shape.cooperative = cooperative != 0;
  shape.shared = shape.block.x * shape.block.y * shape.block.z * sizeof(unsigned);
  std::vector<unsigned> out(threads_of(shape), 0xffffffffu);
  const bool ok = python_errors([&] {
    const lltm::cuda::DeviceGuard guard(-1);
    run("neighbour_kernel", shape, probes::neighbour_kernel, out.data(), group);
  });
  return ok ? python_list(out) : nullptr;
}

// cluster_neighbours(grid, cluster, block) -> (value read of the next block
// of the cluster, block rank, cluster size) for each thread, flattened.
PyObject* cluster_neighbours(PyObject*, PyObject* args) {
  PyObject *grid = nullptr, *cluster = nullptr, *block = nullptr;
  Shape shape;
  if (!PyArg_ParseTuple(args, "OOO", &grid, &cluster, &block) || !parse_dim3(grid, shape.grid) ||
      !parse_cluster(cluster, shape) || !parse_dim3(block, shape.block)) {
    return nullptr;
  }
  shape.shared = shape.block.x * shape.block.y * shape.block.z * sizeof(unsigned);
  std::vector<unsigned> out(3 * threads_of(shape), 0xffffffffu);
  const bool ok = python_errors([&] {
    const lltm::cuda::DeviceGuard guard(-1);
    run("cluster_neighbour_kernel", shape, probes::cluster_neighbour_kernel, out.data());
  });
  return ok ? python_list(out) : nullptr;
}

// grid_exchange(grid, block, steps) -> each thread's value after `steps`
// exchanges across the grid (a cooperative launch).
PyObject* grid_exchange(PyObject*, PyObject* args) {
  PyObject *grid = nullptr, *block = nullptr;
  unsigned steps = 0;
  Shape shape;
  if (!PyArg_ParseTuple(args, "OOI", &grid, &block, &steps) || !parse_dim3(grid, shape.grid) ||
      !parse_dim3(block, shape.block)) {
    return nullptr;
  }
  shape.cooperative = true;
  const uint64_t n = threads_of(shape);
  // Global memory nobody wrote yet: garbage, as on a GPU.
  std::vector<unsigned> buffers(2 * n, 0xffffffffu), out(n, 0xffffffffu);
  const bool ok = python_errors([&] {
    const lltm::cuda::DeviceGuard guard(-1);
    run("grid_exchange_kernel", shape, probes::grid_exchange_kernel, buffers.data(), out.data(),
        steps);
  });
  return ok ? python_list(out) : nullptr;
}

// schedule_seen(grid, block, cooperative) -> [(round, block, thread)], in the
// order threads ran, around one __syncthreads.
PyObject* schedule_seen(PyObject*, PyObject* args) {
  PyObject *grid = nullptr, *block = nullptr;
  int cooperative = 0;
  Shape shape;
  if (!PyArg_ParseTuple(args, "OOp", &grid, &block, &cooperative) ||
      !parse_dim3(grid, shape.grid) || !parse_dim3(block, shape.block)) {
    return nullptr;
  }
  shape.cooperative = cooperative != 0;
  std::vector<std::array<unsigned, 3>> seen;
  const bool ok = python_errors([&] {
    const lltm::cuda::DeviceGuard guard(-1);
    run("schedule_kernel", shape, probes::schedule_kernel, &seen);
  });
  if (!ok) return nullptr;
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(seen.size()));
  if (list == nullptr) return nullptr;
  for (std::size_t i = 0; i < seen.size(); ++i) {
    PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i),
                    Py_BuildValue("(III)", seen[i][0], seen[i][1], seen[i][2]));
  }
  return list;
}

// barrier_rounds(grid, block, rounds, kind) -> each thread's sum after
// `rounds` of two barriers of `kind` (0: block, 1: cluster, 2: grid in a
// cooperative launch): what the cost of a fiber switch is measured with.
PyObject* barrier_rounds(PyObject*, PyObject* args) {
  PyObject *grid = nullptr, *block = nullptr;
  unsigned rounds = 0;
  int kind = 0;
  Shape shape;
  if (!PyArg_ParseTuple(args, "OOIi", &grid, &block, &rounds, &kind) ||
      !parse_dim3(grid, shape.grid) || !parse_dim3(block, shape.block)) {
    return nullptr;
  }
  shape.cooperative = kind == 2;
  shape.shared = shape.block.x * shape.block.y * shape.block.z * sizeof(unsigned);
  std::vector<unsigned> out(threads_of(shape), 0);
  const bool ok = python_errors([&] {
    const lltm::cuda::DeviceGuard guard(-1);
    run("rounds_kernel", shape, probes::rounds_kernel, out.data(), rounds, kind);
  });
  return ok ? python_list(out) : nullptr;
}

// stall(which): a kernel whose barrier can never complete (see probes::Stall);
// raises the emulation's fault.
PyObject* stall(PyObject*, PyObject* args) {
  int which = 0;
  if (!PyArg_ParseTuple(args, "i", &which)) return nullptr;
  Shape shape;
  switch (which) {
    case probes::kExitBeforeBlockBarrier:
      shape.grid = dim3(2);
      shape.block = dim3(64);
      break;
    case probes::kExitBeforeGridBarrier:
      shape.grid = dim3(4);
      shape.block = dim3(32);
      shape.cooperative = true;
      break;
    case probes::kExitBeforeClusterBarrier:
      shape.grid = dim3(4);
      shape.block = dim3(32);
      shape.clustered = true;
      shape.cluster = dim3(2);
      break;
    case probes::kDifferentBarriers:
      shape.grid = dim3(2);
      shape.block = dim3(32);
      shape.cooperative = true;
      break;
    default:
      PyErr_SetString(PyExc_ValueError, "no such stall");
      return nullptr;
  }
  const bool ok = python_errors([&] {
    const lltm::cuda::DeviceGuard guard(-1);
    run("stall_kernel", shape, probes::stall_kernel, which);
  });
  if (!ok) return nullptr;
  Py_RETURN_NONE;
}

// misuse(which): a kernel doing what kernels may not (see probes::Misuse);
// raises the emulation's fault.
PyObject* misuse(PyObject*, PyObject* args) {
  int which = 0;
  if (!PyArg_ParseTuple(args, "i", &which)) return nullptr;
  if (which < probes::kPlainBarrier || which > probes::kTrap) {
    PyErr_SetString(PyExc_ValueError, "no such misuse");
    return nullptr;
  }
  unsigned sink = 0;
  const bool ok = python_errors([&] {
    const lltm::cuda::DeviceGuard guard(-1);
    const cudaStream_t stream = lltm::cuda::current_stream(-1);
    if (which <= probes::kPlainSharedMemory) {
      lltm::cuda::check_launch("misuse_kernel", LLTM_LAUNCH(dim3(2), dim3(4), stream,
                                                            probes::misuse_kernel)(which, &sink));
      return;
    }
    Shape shape;
    shape.grid = dim3(2);
    shape.block = dim3(4);
    shape.shared = 64;
    run("misuse_kernel", shape, probes::misuse_kernel, which, &sink);
  });
  if (!ok) return nullptr;
  Py_RETURN_NONE;
}

// alive() -> objects of the probe kernels not destroyed: 0 once a fault has
// unwound every thread.
PyObject* alive(PyObject*, PyObject*) { return PyLong_FromLongLong(probes::objects_alive.load()); }

// launch_check(grid, block, shared, cluster, cooperative, shared_attribute,
// non_portable) -> (attribute error, launch error, cudaGetLastError() after,
// threads run): cudaFuncSetAttribute of the probe kernel where
// shared_attribute (its maximum dynamic shared memory) or non_portable is
// >= 0, then a cudaLaunchKernelEx of it. cluster: None or (x, y, z).
PyObject* launch_check(PyObject*, PyObject* args) {
  PyObject *grid = nullptr, *block = nullptr, *cluster = nullptr;
  unsigned long long shared = 0;
  int cooperative = 0, shared_attribute = -1, non_portable = -1;
  Shape shape;
  if (!PyArg_ParseTuple(args, "OOKOpii", &grid, &block, &shared, &cluster, &cooperative,
                        &shared_attribute, &non_portable) ||
      !parse_dim3(grid, shape.grid) || !parse_dim3(block, shape.block) ||
      !parse_cluster(cluster, shape)) {
    return nullptr;
  }
  shape.shared = shared;
  shape.cooperative = cooperative != 0;
  cudaError_t attribute_error = cudaSuccess, launch_error = cudaSuccess, last = cudaSuccess;
  unsigned ran = 0;
  const bool ok = python_errors([&] {
    const lltm::cuda::DeviceGuard guard(-1);
    const auto kernel = probes::launch_probe_kernel;
    if (shared_attribute >= 0) {
      attribute_error = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             shared_attribute);
    }
    if (non_portable >= 0 && attribute_error == cudaSuccess) {
      attribute_error = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed,
                                             non_portable);
    }
    cudaGetLastError();
    launch_error = launch(shape, kernel, &ran);
    last = cudaGetLastError();
  });
  if (!ok) return nullptr;
  return Py_BuildValue("(iiiI)", static_cast<int>(attribute_error), static_cast<int>(launch_error),
                       static_cast<int>(last), ran);
}

// occupancy(block_threads, shared, shared_attribute) -> (error, blocks):
// cudaOccupancyMaxActiveBlocksPerMultiprocessor of the launch checks' kernel,
// its maximum dynamic shared memory set first where shared_attribute >= 0.
PyObject* occupancy(PyObject*, PyObject* args) {
  int threads = 0, shared_attribute = -1;
  unsigned long long shared = 0;
  if (!PyArg_ParseTuple(args, "iKi", &threads, &shared, &shared_attribute)) return nullptr;
  cudaError_t error = cudaSuccess;
  int blocks = -1;
  const bool ok = python_errors([&] {
    const lltm::cuda::DeviceGuard guard(-1);
    const auto kernel = probes::launch_probe_kernel;
    if (shared_attribute >= 0) {
      error = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   shared_attribute);
    }
    if (error == cudaSuccess) {
      error = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, shared);
    }
  });
  if (!ok) return nullptr;
  return Py_BuildValue("(ii)", static_cast<int>(error), blocks);
}

// max_active_clusters(cluster, block, shared, shared_attribute, non_portable)
// -> (error, clusters): cudaOccupancyMaxActiveClusters of the launch checks'
// kernel, its attributes set first as in launch_check. cluster: None or
// (x, y, z).
PyObject* max_active_clusters(PyObject*, PyObject* args) {
  PyObject *cluster = nullptr, *block = nullptr;
  unsigned long long shared = 0;
  int shared_attribute = -1, non_portable = -1;
  Shape shape;
  if (!PyArg_ParseTuple(args, "OOKii", &cluster, &block, &shared, &shared_attribute,
                        &non_portable) ||
      !parse_cluster(cluster, shape) || !parse_dim3(block, shape.block)) {
    return nullptr;
  }
  cudaError_t error = cudaSuccess;
  int clusters = -1;
  const bool ok = python_errors([&] {
    const lltm::cuda::DeviceGuard guard(-1);
    const auto kernel = probes::launch_probe_kernel;
    if (shared_attribute >= 0) {
      error = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   shared_attribute);
    }
    if (non_portable >= 0 && error == cudaSuccess) {
      error = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed,
                                   non_portable);
    }
    if (error != cudaSuccess) return;
    cudaLaunchAttribute attribute = {};
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim.x = shape.cluster.x;
    attribute.val.clusterDim.y = shape.cluster.y;
    attribute.val.clusterDim.z = shape.cluster.z;
    const cudaLaunchConfig_t config{dim3(1), shape.block, static_cast<std::size_t>(shared),
                                    nullptr, &attribute,  shape.clustered ? 1u : 0u};
    error = cudaOccupancyMaxActiveClusters(&clusters, kernel, &config);
  });
  if (!ok) return nullptr;
  return Py_BuildValue("(ii)", static_cast<int>(error), clusters);
}

// device_attribute(attribute) -> (error, value) of cudaDeviceGetAttribute on
// the device CPU tensors run on.
PyObject* device_attribute(PyObject*, PyObject* args) {
  int attribute = 0;
  if (!PyArg_ParseTuple(args, "i", &attribute)) return nullptr;
  int value = -1;
  const cudaError_t error =
      cudaDeviceGetAttribute(&value, static_cast<cudaDeviceAttr>(attribute), -1);
  cudaGetLastError();
  return Py_BuildValue("(ii)", static_cast<int>(error), value);
}

// set_schedule(order, seed=0): "forward", "reverse" or "random".
PyObject* set_schedule(PyObject*, PyObject* args) {
  const char* order = nullptr;
  unsigned long long seed = 0;
  if (!PyArg_ParseTuple(args, "s|K", &order, &seed)) return nullptr;
  const std::string name = order;
  if (name == "forward") {
    lltm::cuda_host::set_schedule(Order::kForward, seed);
  } else if (name == "reverse") {
    lltm::cuda_host::set_schedule(Order::kReverse, seed);
  } else if (name == "random") {
    lltm::cuda_host::set_schedule(Order::kRandom, seed);
  } else {
    PyErr_SetString(PyExc_ValueError, "order must be 'forward', 'reverse' or 'random'");
    return nullptr;
  }
  Py_RETURN_NONE;
}

// drop_barrier(kind): barriers of `kind` ("block", "cluster", "grid") return
// at once from now on; "" restores them all.
PyObject* drop_barrier(PyObject*, PyObject* args) {
  const char* kind = nullptr;
  if (!PyArg_ParseTuple(args, "s", &kind)) return nullptr;
  const std::string name = kind;
  if (name.empty()) {
    drop_barriers(0);
  } else if (name == "block") {
    drop_barriers(1u << static_cast<int>(BarrierKind::kBlock));
  } else if (name == "cluster") {
    drop_barriers(1u << static_cast<int>(BarrierKind::kCluster));
  } else if (name == "grid") {
    drop_barriers(1u << static_cast<int>(BarrierKind::kGrid));
  } else {
    PyErr_SetString(PyExc_ValueError, "kind must be 'block', 'cluster', 'grid' or ''");
    return nullptr;
  }
  Py_RETURN_NONE;
}

// set_fiber_switch(name) -> whether it is available: "assembly" (the
// emulation's own x86-64 code) or "ucontext" (swapcontext).
PyObject* set_fiber_switch(PyObject*, PyObject* args) {
  const char* name = nullptr;
  if (!PyArg_ParseTuple(args, "s", &name)) return nullptr;
  const std::string switch_name = name;
  if (switch_name != "assembly" && switch_name != "ucontext") {
    PyErr_SetString(PyExc_ValueError, "name must be 'assembly' or 'ucontext'");
    return nullptr;
  }
  return PyBool_FromLong(use_assembly_switch(switch_name == "assembly"));
}

}  // namespace lltm::cuda_host::emulation
