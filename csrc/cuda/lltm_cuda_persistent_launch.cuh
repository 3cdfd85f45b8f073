// What the persistent sequence kernels' launchers share
// (lltm_cuda_persistent_planning.cu, lltm_cuda_persistent_launch.cu,
// lltm_cuda_persistent_forward_entry.cu, lltm_cuda_persistent_backward_entry.cu):
// the device's limits, the plan of a call, the kernels' attributes, the
// occupancy calculator's answers for a kernel, and the launches, cooperative
// or in clusters, with their fallback: a launch the GPU refuses as too large
// (too few multiprocessors free, MPS) returns false and the sequence op runs
// its per-step path instead.
#pragma once

#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <utility>

#include "../lltm_sequence.h"
#include "../lltm_tensor.h"
#include "lltm_cuda_device.h"
#include "lltm_cuda_device_cache.h"
#include "lltm_cuda_launch.cuh"
#include "lltm_cuda_persistent.cuh"
#include "lltm_cuda_persistent.h"
#include "lltm_cuda_persistent_measuring.h"
#include "lltm_cuda_persistent_plan.h"
#include "lltm_cuda_runtime.h"

namespace lltm::cuda {

using persistent::ClusterExchange;
using persistent::GridExchange;
using persistent::Steps;
using torch::headeronly::BFloat16;
using torch::headeronly::Half;

// lltm_cuda_persistent_planning.cu: the device's attributes the rule reads,
// once per device; the plan for a call, remembered (LLTM_CUDA_PERSISTENT and
// LLTM_CUDA_PLAN read at every call).
DeviceLimits device_limits(int device);
// `tf32`: float32's products may run in TF32 (tf32_products).
SequencePlan plan_for(SequencePass pass, int device, int element_size, int64_t batch, int64_t state,
                      bool tf32);

// lltm_cuda_persistent_forward_entry.cu and _backward_entry.cu: the
// occupancy calculator's answers for the kernel of a pass, mode and tile
// height, for `element_size`-byte elements (0 where it fails).
int forward_blocks_per_multiprocessor(int device, int element_size, int tile_rows, int threads,
                                      int64_t shared_bytes);
int forward_active_clusters(int device, int element_size, int tile_rows, int cluster_size,
                            int groups, int threads, int64_t shared_bytes);
int backward_blocks_per_multiprocessor(int device, int element_size, int tile_rows, int threads,
                                       int64_t shared_bytes);
int backward_active_clusters(int device, int element_size, int tile_rows, int cluster_size,
                             int groups, int threads, int64_t shared_bytes);

// lltm_cuda_persistent_launch.cu.
// The schedule as the kernels carry it, or nothing where it does not fit in
// the launch's parameters (more distinct batch sizes than kPersistentMaxRuns,
// sizes past 32 bits).
std::optional<Steps> steps_of(const Schedule& schedule, int64_t rows);
// Launch errors that say the launch cannot be had now, rather than that it
// is wrong: too many blocks to run at once (other work or MPS holds
// multiprocessors), a cluster that cannot be placed.
bool launch_unavailable(cudaError_t error);

// The attributes a kernel needs on the current device before its occupancy
// is asked or it is launched: all the shared memory a block may have (above
// 48 KiB only on request) and, for clusters, the non-portable size 16. Set
// once per kernel and device. A refusal is no error here: the occupancy
// calculator then answers 0 and the plan does without.
template <typename Kernel>
inline void prepare(Kernel kernel, int device, SequencePath path, int64_t shared_limit) {
  static std::mutex mutex;
  static std::set<std::tuple<const void*, int, uint64_t>> prepared;
  const int slot = device_slot(device);
  const auto key = std::make_tuple(reinterpret_cast<const void*>(kernel), slot, device_epoch());
  const bool cached = slot >= 0;
  if (cached) {
    const std::lock_guard<std::mutex> lock(mutex);
    if (prepared.count(key) != 0) return;
  }
  // A refusal's error is cleared from the thread's last error; another
  // library's pending there stays (forget_error, lltm_cuda_launch.cuh).
  forget_error(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(shared_limit)));
  if (path == SequencePath::kCluster) {
    forget_error(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  }
  if (cached) {
    const std::lock_guard<std::mutex> lock(mutex);
    prepared.insert(key);
  }
}

// cudaOccupancyMaxActiveBlocksPerMultiprocessor for a cooperative kernel (0
// where it fails).
template <typename Kernel>
int blocks_per_multiprocessor_of(Kernel kernel, int device, int threads, int64_t shared_bytes) {
  prepare(kernel, device, SequencePath::kCooperative, device_limits(device).shared_per_block);
  int blocks = 0;
  const cudaError_t error = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &blocks, kernel, threads, static_cast<size_t>(shared_bytes));
  if (error != cudaSuccess) {
    forget_error(error);
    return 0;
  }
  return blocks;
}

// cudaOccupancyMaxActiveClusters for clusters of `cluster_size` blocks of a
// cluster kernel in a grid of (cluster_size, groups) (0 where it fails).
template <typename Kernel>
int active_clusters_of(Kernel kernel, int device, int cluster_size, int groups, int threads,
                       int64_t shared_bytes) {
  prepare(kernel, device, SequencePath::kCluster, device_limits(device).shared_per_block);
  cudaLaunchAttribute cluster[1] = {};
  cluster[0].id = cudaLaunchAttributeClusterDimension;
  cluster[0].val.clusterDim.x = static_cast<unsigned>(cluster_size);
  cluster[0].val.clusterDim.y = 1;
  cluster[0].val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(cluster_size), static_cast<unsigned>(groups));
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.dynamicSmemBytes = static_cast<size_t>(shared_bytes);
  config.attrs = cluster;
  config.numAttrs = 1;
  int clusters = 0;
  const cudaError_t error = cudaOccupancyMaxActiveClusters(&clusters, kernel, &config);
  if (error != cudaSuccess) {
    forget_error(error);
    return 0;
  }
  return clusters;
}

// One launch of the plan's, of `groups` groups. False where the GPU cannot
// have it now (launch_unavailable) and `may_refuse`; any other error, or a
// refusal where the caller cannot fall back, raises.
template <typename Kernel, typename Args>
bool launch(Kernel kernel, const SequencePlan& plan, int groups, const Args& args, int device,
            const std::string& name, bool may_refuse) {
  prepare(kernel, device, plan.path, device_limits(device).shared_per_block);
  cudaLaunchAttribute attributes[1] = {};
  if (plan.path == SequencePath::kCluster) {
    attributes[0].id = cudaLaunchAttributeClusterDimension;
    attributes[0].val.clusterDim.x = static_cast<unsigned>(plan.blocks);
    attributes[0].val.clusterDim.y = 1;
    attributes[0].val.clusterDim.z = 1;
  } else {
    attributes[0].id = cudaLaunchAttributeCooperative;
    attributes[0].val.cooperative = 1;
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(plan.blocks), static_cast<unsigned>(groups));
  config.blockDim = dim3(static_cast<unsigned>(plan.threads));
  config.dynamicSmemBytes = static_cast<size_t>(plan.shared_bytes);
  config.stream = current_stream(device);
  config.attrs = attributes;
  config.numAttrs = 1;
  const cudaError_t error = cudaLaunchKernelEx(&config, kernel, args);
  if (error == cudaSuccess) return true;
  if (may_refuse && launch_unavailable(error)) {
    forget_error(error);  // answered here: the per-step path runs instead
    // A measured candidate's time would be the per-step path's.
    imposed_launch_refused();
    return false;
  }
  fail_cuda("launching " + name, error);
}

// Every wave of the plan in turn, each over its rows of the batch (the
// kernels' rows_begin, rows_end). False where the GPU refuses the first
// (the caller takes the per-step path); a later wave refused raises, as the
// waves before it have written their results (the forward's in place of
// its input projection).
template <typename Kernel, typename Args>
bool launch_waves(Kernel kernel, const SequencePlan& plan, Args& args, int64_t batch, int device,
                  const char* name) {
  for (int wave = 0; wave < plan.waves; ++wave) {
    args.rows_begin = wave * plan.wave_rows;
    args.rows_end = std::min<int64_t>(batch, args.rows_begin + plan.wave_rows);
    const int groups =
        static_cast<int>(plan_ceil_div(args.rows_end - args.rows_begin, plan.group_rows));
    const std::string what = plan.waves == 1
                                 ? std::string(name)
                                 : std::string(name) + " (wave " + std::to_string(wave + 1) +
                                       " of " + std::to_string(plan.waves) + ")";
    if (!launch(kernel, plan, groups, args, device, what, /*may_refuse=*/wave == 0)) return false;
  }
  return true;
}

inline int element_size_of(const Tensor& t) {
  switch (t.scalar_type()) {
    case torch::headeronly::ScalarType::Float:
      return 4;
    case torch::headeronly::ScalarType::Double:
      return 8;
    default:
      return 2;
  }
}

// fn(T{}) for the tensor's dtype: float, double, Half or BFloat16.
template <typename Fn>
bool with_dtype(const Tensor& t, const Fn& fn) {
  switch (t.scalar_type()) {
    case torch::headeronly::ScalarType::Double:
      return fn(double{});
    case torch::headeronly::ScalarType::Half:
      return fn(Half{});
    case torch::headeronly::ScalarType::BFloat16:
      return fn(BFloat16{});
    default:
      return fn(float{});
  }
}

// fn(T{}) for `element_size`-byte elements as the plans take them: float,
// double, or BFloat16 for both 16-bit dtypes (the same shared memory and
// launch bounds).
template <typename Fn>
int with_element_size(int element_size, const Fn& fn) {
  switch (element_size) {
    case 8:
      return fn(double{});
    case 4:
      return fn(float{});
    default:
      return fn(BFloat16{});
  }
}

}  // namespace lltm::cuda
