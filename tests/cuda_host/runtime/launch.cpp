// The checks a GPU makes of a cudaLaunchKernelEx launch, kernel attributes,
// the occupancy calculator, and the emulated GPU's reset.
//
// Occupancy as CUDA computes it, less registers (the host compiler cannot
// tell how many a kernel needs on the GPU): a multiprocessor holds as many
// blocks as its threads (in whole warps), its shared memory (each block's
// dynamic shared memory plus the 1 KiB the driver reserves for it) and its
// block slots allow. A thread-block cluster runs within one GPC: the
// multiprocessors free for the launch are spread over the GPCs as evenly as
// whole TPCs (two multiprocessors) go, the first GPCs taking the rest (an
// H100 SXM's 132: two GPCs of 18, six of 16), and a GPC holds
// floor(its multiprocessors x blocks per multiprocessor / cluster size)
// clusters.
//
// The errors are the runtime's: a documented one where CUDA documents it,
// else what a GPU was seen to return. Dynamic shared memory past a kernel's
// limit: cudaErrorInvalidValue (cuLaunchKernel's CUDA_ERROR_INVALID_VALUE,
// "invalid argument", as reported against GPUs for launches past 48 KiB
// without the attribute). Every cluster misconfiguration (a cluster on a GPU
// below compute capability 9.0, dimensions that do not divide the grid, too
// many blocks, a cluster that fits no GPC): cudaErrorInvalidClusterSize, the
// error the driver names "cluster misconfiguration" (seen on GPUs without
// clusters and for a cluster that fits none of a GPU's GPCs). A cooperative
// grid larger than can be resident at once: cudaErrorCooperativeLaunchTooLarge.
#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "runtime.h"

namespace lltm::cuda_host {
namespace {

struct KernelAttributes {
  int max_dynamic_shared = H100::kSharedPerBlock;
  bool non_portable_clusters = false;
};

struct KernelTable {
  std::mutex mutex;
  std::map<std::pair<int, const void*>, KernelAttributes> attributes;
};

KernelTable& kernels() {
  static KernelTable table;
  return table;
}

KernelAttributes attributes_of(const void* func) {
  KernelTable& table = kernels();
  const std::lock_guard<std::mutex> lock(table.mutex);
  const auto found = table.attributes.find({current_device, func});
  return found == table.attributes.end() ? KernelAttributes{} : found->second;
}

// Blocks of `threads` threads and `shared` bytes of dynamic shared memory
// that one multiprocessor holds at once.
int blocks_per_multiprocessor(int threads, std::size_t shared) {
  const Gpu& g = gpu();
  if (threads <= 0 || threads > 1024) return 0;
  const int warps = (threads + 31) / 32;
  const std::size_t per_block = shared + H100::kReservedSharedPerBlock;
  const int by_threads = g.threads_per_multiprocessor.load() / (warps * 32);
  const auto by_shared =
      static_cast<int>(std::size_t(std::max(0, g.shared_per_multiprocessor.load())) / per_block);
  return std::max(0, std::min({by_threads, by_shared, g.blocks_per_multiprocessor.load()}));
}

// Clusters of `size` blocks that the free multiprocessors hold at once.
int clusters_at_once(int blocks_per_sm, int size) {
  const int free = free_multiprocessors();
  const int gpcs = std::max(1, gpu().gpcs.load());
  const int tpcs = free / 2;
  int clusters = 0;
  for (int i = 0; i < gpcs; ++i) {
    int sms = 2 * (tpcs / gpcs + (i < tpcs % gpcs ? 1 : 0));
    if (i == 0) sms += free % 2;
    clusters += sms * blocks_per_sm / size;
  }
  return clusters;
}

int largest_cluster(const KernelAttributes& kernel) {
  return kernel.non_portable_clusters ? gpu().non_portable_cluster_size.load()
                                      : gpu().portable_cluster_size.load();
}

// What a launch asks for in its attributes.
struct Requested {
  bool cooperative = false;
  bool clustered = false;
  dim3 cluster{1, 1, 1};
};

cudaError_t parse(const cudaLaunchConfig_t& config, Requested& requested) {
  if (config.numAttrs > 0 && config.attrs == nullptr) return cudaErrorInvalidValue;
  for (unsigned i = 0; i < config.numAttrs; ++i) {
    const cudaLaunchAttribute& a = config.attrs[i];
    switch (a.id) {
      case cudaLaunchAttributeIgnore:
        break;
      case cudaLaunchAttributeCooperative:
        requested.cooperative = a.val.cooperative != 0;
        break;
      case cudaLaunchAttributeClusterDimension:
        requested.clustered = true;
        requested.cluster = dim3(a.val.clusterDim.x, a.val.clusterDim.y, a.val.clusterDim.z);
        break;
      default:
        fault("launch attribute " + std::to_string(static_cast<int>(a.id)) +
              " is not emulated (launch.h lists those that are)");
    }
  }
  return cudaSuccess;
}

// The cluster checks: cudaSuccess and the clusters the GPU holds at once.
cudaError_t check_cluster(const dim3& cluster, const KernelAttributes& kernel, int blocks_per_sm,
                          int& at_once) {
  if (gpu().capability_major.load() < 9) return cudaErrorInvalidClusterSize;
  if (cluster.x == 0 || cluster.y == 0 || cluster.z == 0) return cudaErrorInvalidClusterSize;
  const uint64_t size = uint64_t(cluster.x) * cluster.y * cluster.z;
  if (size > uint64_t(largest_cluster(kernel))) return cudaErrorInvalidClusterSize;
  at_once = clusters_at_once(blocks_per_sm, static_cast<int>(size));
  return cudaSuccess;
}

cudaError_t check(const cudaLaunchConfig_t& config, const void* func, Requested& requested) {
  if (const cudaError_t error = parse(config, requested)) return error;
  const dim3 grid = config.gridDim, block = config.blockDim;
  if (configuration_problem(grid, block) != nullptr) return cudaErrorInvalidConfiguration;

  const KernelAttributes kernel = attributes_of(func);
  const std::size_t shared = config.dynamicSmemBytes;
  if (shared > std::size_t(kernel.max_dynamic_shared) ||
      shared > std::size_t(gpu().shared_per_block_optin.load())) {
    return cudaErrorInvalidValue;
  }
  const int threads = static_cast<int>(block.x * block.y * block.z);
  const int per_sm = blocks_per_multiprocessor(threads, shared);
  // A block no multiprocessor can hold: resources that can never be had.
  if (per_sm == 0) return cudaErrorInvalidConfiguration;

  const uint64_t blocks = uint64_t(grid.x) * grid.y * grid.z;
  uint64_t resident = uint64_t(per_sm) * free_multiprocessors();
  if (requested.clustered) {
    const dim3 c = requested.cluster;
    int at_once = 0;
    if (const cudaError_t error = check_cluster(c, kernel, per_sm, at_once)) return error;
    if (grid.x % c.x != 0 || grid.y % c.y != 0 || grid.z % c.z != 0 || at_once == 0) {
      return cudaErrorInvalidClusterSize;
    }
    resident = std::min<uint64_t>(resident, uint64_t(at_once) * c.x * c.y * c.z);
  }
  if (requested.cooperative) {
    if (!gpu().cooperative_launch.load()) return cudaErrorNotSupported;
    if (blocks > resident) return cudaErrorCooperativeLaunchTooLarge;
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t launch_kernel_ex(const cudaLaunchConfig_t* config, const KernelCall& call) {
  if (config == nullptr) return last_error = cudaErrorInvalidValue;
  Requested requested;
  if (const cudaError_t error = check(*config, call.kernel, requested)) return last_error = error;
  check_stream(config->stream);
  gpu().launches.fetch_add(1);
  count_call("cudaLaunchKernelEx");
  charge(requested.clustered ? "cudaLaunchKernelEx/cluster" : "cudaLaunchKernelEx/cooperative");
  gridDim = config->gridDim;
  blockDim = config->blockDim;
  const FiberLaunch launch{config->gridDim, config->blockDim, requested.cluster,
                           config->dynamicSmemBytes, requested.cooperative};
  run_fibers(launch, call);
  return cudaSuccess;
}

cudaError_t occupancy_blocks(int* blocks, const void* func, int block_size,
                             std::size_t dynamic_shared) {
  if (blocks == nullptr || block_size <= 0) return last_error = cudaErrorInvalidValue;
  if (func == nullptr) return last_error = cudaErrorInvalidDeviceFunction;
  const KernelAttributes kernel = attributes_of(func);
  // A block past the kernel's shared memory limit never launches.
  *blocks = dynamic_shared > std::size_t(kernel.max_dynamic_shared)
                ? 0
                : blocks_per_multiprocessor(block_size, dynamic_shared);
  return cudaSuccess;
}

cudaError_t occupancy_clusters(int* clusters, const void* func, const cudaLaunchConfig_t* config) {
  if (clusters == nullptr || config == nullptr) return last_error = cudaErrorInvalidValue;
  if (func == nullptr) return last_error = cudaErrorInvalidDeviceFunction;
  Requested requested;
  if (const cudaError_t error = parse(*config, requested)) return last_error = error;
  // The cluster size must come with the configuration (lltm's kernels
  // declare none of their own).
  if (!requested.clustered) return last_error = cudaErrorInvalidValue;
  const KernelAttributes kernel = attributes_of(func);
  const dim3 block = config->blockDim;
  const int threads = static_cast<int>(uint64_t(block.x) * block.y * block.z);
  int per_sm = 0;
  if (occupancy_blocks(&per_sm, func, threads, config->dynamicSmemBytes) != cudaSuccess) {
    return last_error;
  }
  int at_once = 0;
  if (const cudaError_t error = check_cluster(requested.cluster, kernel, per_sm, at_once)) {
    return last_error = error;
  }
  *clusters = at_once;
  return cudaSuccess;
}

int capability_major() { return gpu().capability_major.load(); }

void reset() {
  Gpu& g = gpu();
  g.multiprocessors = H100::kMultiprocessors;
  g.gpcs = H100::kGpcs;
  g.free_multiprocessors = -1;
  g.devices = 2;
  g.capability_major = H100::kCapabilityMajor;
  g.capability_minor = H100::kCapabilityMinor;
  g.shared_per_multiprocessor = H100::kSharedPerMultiprocessor;
  g.shared_per_block_optin = H100::kSharedPerBlockOptin;
  g.threads_per_multiprocessor = H100::kThreadsPerMultiprocessor;
  g.blocks_per_multiprocessor = H100::kBlocksPerMultiprocessor;
  g.cooperative_launch = true;
  g.portable_cluster_size = H100::kPortableClusterSize;
  g.non_portable_cluster_size = H100::kNonPortableClusterSize;
  g.image_error = cudaSuccess;
  g.set_device_error = cudaSuccess;
  g.attribute_error = cudaSuccess;
  g.launch_error = cudaSuccess;
  for (auto& created : g.contexts) created = false;
  g.hold_load = false;
  g.timed_out = false;
  g.capturing = false;
  set_costs({});
  {
    KernelTable& table = kernels();
    const std::lock_guard<std::mutex> lock(table.mutex);
    table.attributes.clear();
  }
  set_schedule(Order::kForward, 0);
  drop_barriers(0);
  current_device = 0;
  last_error = cudaSuccess;
  gpu_changed();
}

}  // namespace lltm::cuda_host

using namespace lltm::cuda_host;

cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attributes, const void* func) {
  count_call("cudaFuncGetAttributes");
  if (gpu().hold_load) {
    gpu().held = true;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (gpu().hold_load && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    gpu().timed_out = gpu().hold_load.load();
    gpu().held = false;
  }
  create_context(current_device);
  if (const cudaError_t error = injected(gpu().image_error)) return last_error = error;
  const KernelAttributes kernel = attributes_of(func);
  *attributes = {0, 1024, 32, kernel.max_dynamic_shared, kernel.non_portable_clusters ? 1 : 0};
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attribute, int value) {
  count_call("cudaFuncSetAttribute");
  if (func == nullptr) return last_error = cudaErrorInvalidDeviceFunction;
  KernelTable& table = kernels();
  const std::lock_guard<std::mutex> lock(table.mutex);
  KernelAttributes& kernel = table.attributes[{current_device, func}];
  switch (attribute) {
    case cudaFuncAttributeMaxDynamicSharedMemorySize:
      if (value < 0 || value > gpu().shared_per_block_optin.load()) {
        return last_error = cudaErrorInvalidValue;
      }
      kernel.max_dynamic_shared = value;
      return cudaSuccess;
    case cudaFuncAttributeNonPortableClusterSizeAllowed:
      if (value != 0 && value != 1) return last_error = cudaErrorInvalidValue;
      kernel.non_portable_clusters = value == 1;
      return cudaSuccess;
  }
  fault("kernel attribute " + std::to_string(static_cast<int>(attribute)) + " is not emulated");
}
