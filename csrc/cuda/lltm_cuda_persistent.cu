// The persistent sequence kernels' launchers (lltm_cuda_persistent.h): the
// device's limits and the occupancy calculator's answers for the rule of
// lltm_cuda_persistent_plan.h, the plans remembered per device and size,
// and the launches, cooperative or in clusters, with their fallback: a
// launch the GPU refuses as too large (too few multiprocessors free, MPS)
// returns false and the sequence op runs its per-step path instead.
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
#include "lltm_cuda_persistent_backward.cuh"
#include "lltm_cuda_persistent_forward.cuh"
#include "lltm_cuda_persistent_plan.h"
#include "lltm_cuda_runtime.h"

namespace lltm::cuda {
namespace {

using persistent::BackwardArgs;
using persistent::ClusterExchange;
using persistent::ForwardArgs;
using persistent::GridExchange;
using persistent::Steps;
using torch::headeronly::BFloat16;
using torch::headeronly::Half;

template <typename T>
using ForwardKernel = void (*)(ForwardArgs<T>);
template <typename T>
using BackwardKernel = void (*)(BackwardArgs<T>);

// The kernel of a plan's mode and tile height: 1 or 4 rows, products on the
// CUDA cores; kTensorCoreTileRows (16-bit dtypes only), on the tensor cores.
template <typename T>
ForwardKernel<T> forward_kernel(SequencePath path, int tile_rows) {
  using persistent::sequence_forward_kernel;
  if constexpr (sizeof(T) == 2) {
    if (tile_rows == kTensorCoreTileRows) {
      return path == SequencePath::kCluster
                 ? sequence_forward_kernel<T, kTensorCoreTileRows, ClusterExchange>
                 : sequence_forward_kernel<T, kTensorCoreTileRows, GridExchange>;
    }
  }
  if (path == SequencePath::kCluster) {
    return tile_rows == 4 ? sequence_forward_kernel<T, 4, ClusterExchange>
                          : sequence_forward_kernel<T, 1, ClusterExchange>;
  }
  return tile_rows == 4 ? sequence_forward_kernel<T, 4, GridExchange>
                        : sequence_forward_kernel<T, 1, GridExchange>;
}

template <typename T>
BackwardKernel<T> backward_kernel(SequencePath path, int tile_rows) {
  using persistent::sequence_backward_kernel;
  if constexpr (sizeof(T) == 2) {
    if (tile_rows == kTensorCoreTileRows) {
      return path == SequencePath::kCluster
                 ? sequence_backward_kernel<T, kTensorCoreTileRows, ClusterExchange>
                 : sequence_backward_kernel<T, kTensorCoreTileRows, GridExchange>;
    }
  }
  if (path == SequencePath::kCluster) {
    return tile_rows == 4 ? sequence_backward_kernel<T, 4, ClusterExchange>
                          : sequence_backward_kernel<T, 1, ClusterExchange>;
  }
  return tile_rows == 4 ? sequence_backward_kernel<T, 4, GridExchange>
                        : sequence_backward_kernel<T, 1, GridExchange>;
}

// Whether LLTM_CUDA_PERSISTENT lets the persistent kernels run ("0": no),
// read at every call, so that a process can compare both paths.
bool persistent_enabled() {
  const char* value = std::getenv("LLTM_CUDA_PERSISTENT");
  return value == nullptr || std::strcmp(value, "0") != 0;
}

// The plan LLTM_CUDA_PLAN forces (lltm_cuda_persistent_plan.h), read at
// every call as LLTM_CUDA_PERSISTENT; parsed again only when it changes. An
// invalid value raises an argument error (a ValueError in Python).
ForcedPlan forced_plan() {
  const char* value = std::getenv(kPlanVariable);
  if (value == nullptr || value[0] == '\0') return {};
  static std::mutex mutex;
  static std::string last;
  static ForcedPlan parsed;
  static bool known = false;
  const std::lock_guard<std::mutex> lock(mutex);
  if (!known || last != value) {
    ForcedPlan plan;
    const std::string error = parse_forced_plan(value, plan);
    if (!error.empty()) fail_argument(error);
    parsed = plan;
    last = value;
    known = true;
  }
  return parsed;
}

int attribute(cudaDeviceAttr which, int device) {
  int value = 0;
  const cudaError_t error = cudaDeviceGetAttribute(&value, which, device);
  if (error != cudaSuccess) fail_cuda("querying the GPU", error);
  return value;
}

DeviceLimits device_limits(int device) {
  static PerDevice<DeviceLimits> known;
  return known.get(device, [device] {
    DeviceLimits limits;
    limits.multiprocessors = attribute(cudaDevAttrMultiProcessorCount, device);
    limits.major = attribute(cudaDevAttrComputeCapabilityMajor, device);
    limits.minor = attribute(cudaDevAttrComputeCapabilityMinor, device);
    limits.cooperative = attribute(cudaDevAttrCooperativeLaunch, device) != 0;
    limits.clusters = attribute(cudaDevAttrClusterLaunch, device) != 0;
    limits.shared_per_block = attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    return limits;
  });
}

// The attributes a kernel needs on the current device before its occupancy
// is asked or it is launched: all the shared memory a block may have (above
// 48 KiB only on request) and, for clusters, the non-portable size 16. Set
// once per kernel and device. A refusal is no error here: the occupancy
// calculator then answers 0 and the plan does without.
template <typename Kernel>
void prepare(Kernel kernel, int device, SequencePath path, int64_t shared_limit) {
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

template <typename T>
class KernelOccupancy final : public Occupancy {
 public:
  KernelOccupancy(int device, const DeviceLimits& limits) : device_(device), limits_(limits) {}

  int blocks_per_multiprocessor(SequencePass pass, int tile_rows, int threads,
                                int64_t shared_bytes) const override {
    int blocks = 0;
    cudaError_t error;
    if (pass == SequencePass::kForward) {
      const auto kernel = forward_kernel<T>(SequencePath::kCooperative, tile_rows);
      prepare(kernel, device_, SequencePath::kCooperative, limits_.shared_per_block);
      error = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads,
                                                            static_cast<size_t>(shared_bytes));
    } else {
      const auto kernel = backward_kernel<T>(SequencePath::kCooperative, tile_rows);
      prepare(kernel, device_, SequencePath::kCooperative, limits_.shared_per_block);
      error = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads,
                                                            static_cast<size_t>(shared_bytes));
    }
    if (error != cudaSuccess) {
      forget_error(error);
      return 0;
    }
    return blocks;
  }

  int active_clusters(SequencePass pass, int tile_rows, int cluster_size, int groups, int threads,
                      int64_t shared_bytes) const override {
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
    cudaError_t error;
    if (pass == SequencePass::kForward) {
      const auto kernel = forward_kernel<T>(SequencePath::kCluster, tile_rows);
      prepare(kernel, device_, SequencePath::kCluster, limits_.shared_per_block);
      error = cudaOccupancyMaxActiveClusters(&clusters, kernel, &config);
    } else {
      const auto kernel = backward_kernel<T>(SequencePath::kCluster, tile_rows);
      prepare(kernel, device_, SequencePath::kCluster, limits_.shared_per_block);
      error = cudaOccupancyMaxActiveClusters(&clusters, kernel, &config);
    }
    if (error != cudaSuccess) {
      forget_error(error);
      return 0;
    }
    return clusters;
  }

 private:
  int device_;
  DeviceLimits limits_;
};

// Whether the plan of such a call depends on the device at all.
bool plan_reads_device(const ForcedPlan& forced, int element_size, int64_t batch, int64_t state) {
  return persistent_enabled() && forced.mode != ForcedMode::kPerStep &&
         persistent_element_size(element_size) && batch > 0 && state > 0;
}

// The plan for a call, remembered per device, epoch, pass, element size,
// batch, state and forced plan (the occupancy calculator is not free: a plan
// may ask it a few dozen times).
SequencePlan plan_for(SequencePass pass, int device, int element_size, int64_t batch,
                      int64_t state) {
  const ForcedPlan forced = forced_plan();
  if (!plan_reads_device(forced, element_size, batch, state)) {
    // The reason only: no device query.
    struct Unused final : Occupancy {
      int blocks_per_multiprocessor(SequencePass, int, int, int64_t) const override { return 0; }
      int active_clusters(SequencePass, int, int, int, int, int64_t) const override { return 0; }
    } unused;
    return plan_forced(pass, element_size, batch, state, DeviceLimits{}, unused,
                       persistent_enabled(), forced);
  }
  using Key = std::tuple<int, uint64_t, int, int, int64_t, int64_t, std::string>;
  static std::mutex mutex;
  static std::map<Key, SequencePlan> plans;
  const int slot = device_slot(device);
  const Key key{slot,  device_epoch(), static_cast<int>(pass), element_size,
                batch, state,          forced.setting};
  const bool cached = slot >= 0;
  if (cached) {
    const std::lock_guard<std::mutex> lock(mutex);
    const auto found = plans.find(key);
    if (found != plans.end()) return found->second;
  }
  const DeviceLimits limits = device_limits(device);
  SequencePlan plan;
  if (element_size == 8) {
    plan = plan_forced(pass, element_size, batch, state, limits,
                       KernelOccupancy<double>(device, limits), true, forced);
  } else if (element_size == 4) {
    plan = plan_forced(pass, element_size, batch, state, limits,
                       KernelOccupancy<float>(device, limits), true, forced);
  } else {
    // float16 and bfloat16 share a plan: their kernels have the same shared
    // memory and launch bounds, and a plan needs one block a multiprocessor,
    // which the launch bounds guarantee in registers.
    plan = plan_forced(pass, element_size, batch, state, limits,
                       KernelOccupancy<BFloat16>(device, limits), true, forced);
  }
  if (cached) {
    const std::lock_guard<std::mutex> lock(mutex);
    if (plans.size() >= 4096) plans.clear();  // a bound, for programs of endless sizes
    plans.emplace(key, plan);
  }
  return plan;
}

// The schedule as the kernels carry it, or nothing where it does not fit in
// the launch's parameters (more distinct batch sizes than kPersistentMaxRuns,
// sizes past 32 bits).
std::optional<Steps> steps_of(const Schedule& schedule, int64_t rows) {
  constexpr int64_t kMax32 = 2147483647;
  Steps steps{};
  steps.step_count = schedule.steps();
  steps.input_rows = rows;
  if (steps.step_count > kMax32) return std::nullopt;
  for (int64_t t = 0; t < steps.step_count; ++t) {
    const int64_t size = schedule.sizes[t];
    if (size > kMax32) return std::nullopt;
    const int32_t runs = steps.run_count;
    if (runs > 0 && steps.run_batch_sizes[runs - 1] == size) {
      ++steps.run_lengths[runs - 1];
      continue;
    }
    if (runs == kPersistentMaxRuns) return std::nullopt;
    steps.run_batch_sizes[runs] = static_cast<int32_t>(size);
    steps.run_lengths[runs] = 1;
    ++steps.run_count;
  }
  return steps;
}

// Launch errors that say the launch cannot be had now, rather than that it
// is wrong: too many blocks to run at once (other work or MPS holds
// multiprocessors), a cluster that cannot be placed.
bool launch_unavailable(cudaError_t error) {
  return error == cudaErrorCooperativeLaunchTooLarge || error == cudaErrorInvalidClusterSize ||
         error == cudaErrorLaunchOutOfResources || error == cudaErrorNotSupported;
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

template <typename T>
bool forward_launch(const SequencePlan& plan, const SequenceSizes& n, const Steps& steps,
                    bool reverse, const Tensor& projection, Tensor* gates, Tensor& output,
                    Tensor* cells, Tensor& h_n, Tensor& c_n, const Tensor& weights,
                    const Tensor& h0, const Tensor& c0) {
  ForwardArgs<T> args{};
  args.projection = projection.const_data_ptr<acc_t<T>>();
  // Both or neither (sequence_inference): the kernel tests `gates` alone.
  args.gates = gates != nullptr && cells != nullptr ? gates->mutable_data_ptr<T>() : nullptr;
  args.cells = args.gates != nullptr ? cells->mutable_data_ptr<T>() : nullptr;
  args.output = output.mutable_data_ptr<T>();
  args.h_n = h_n.mutable_data_ptr<T>();
  args.c_n = c_n.mutable_data_ptr<T>();
  args.weights = weights.const_data_ptr<T>();
  args.weights_row_stride = weights.stride(0);
  args.weights_column_stride = weights.stride(1);
  args.h0 = h0.const_data_ptr<T>();
  args.c0 = c0.const_data_ptr<T>();
  // Cooperative, 16-bit or h read from global memory: h in the math type
  // through global memory, two steps' worth (see the kernel; where the
  // products read it there, rows padded to whole 32-byte vectors); freed
  // after the launch is queued, as `shares` below.
  std::optional<Tensor> h_exchange;
  args.h_exchange_pitch = plan.h_from_global ? plan_ceil_div(n.state, 8) * 8 : n.state;
  if (plan.path == SequencePath::kCooperative && (persistent::kWidened<T> || plan.h_from_global)) {
    const int64_t columns = args.h_exchange_pitch;
    h_exchange = persistent::kWidened<T> ? new_float_matrix(output, 2 * n.batch, columns)
                                         : new_matrix(output, 2 * n.batch, columns);
    args.h_exchange = h_exchange->mutable_data_ptr<acc_t<T>>();
  }
  args.h_from_global = plan.h_from_global;
  args.batch_size = n.batch;
  args.state_size = n.state;
  args.units_per_block = plan.units;
  args.rows_per_group = plan.group_rows;
  args.pitch = plan.pitch;
  args.dot_split = plan.split;
  args.layout = plan.layout;
  args.reverse = reverse;
  args.steps = steps;
  return launch_waves(forward_kernel<T>(plan.path, plan.tile_rows), plan, args, n.batch,
                      output.get_device_index(), "lltm sequence_forward_kernel");
}

template <typename T>
bool backward_launch(const SequencePlan& plan, const SequenceSizes& n, const Steps& steps,
                     bool reverse, const std::optional<Tensor>& grad_output,
                     const std::optional<Tensor>& grad_h_n, const std::optional<Tensor>& grad_c_n,
                     const Tensor& gates, const Tensor& cells, const Tensor& weights,
                     Tensor& d_gates, Tensor* grad_h, Tensor& grad_c,
                     std::optional<Tensor>* bias_sums) {
  using Math = acc_t<T>;
  BackwardArgs<T> args{};
  if (grad_output.has_value()) {
    args.grad_output = grad_output->const_data_ptr<T>();
    persistent::GradOutputStrides& strides = args.grad_output_strides;
    if (n.packed) {  // (input rows, S)
      strides.by_input_row = grad_output->stride(0);
      strides.by_row = grad_output->stride(0);
      strides.by_unit = grad_output->stride(1);
    } else {  // (steps, batch, S)
      strides.by_time = grad_output->stride(0);
      strides.by_row = grad_output->stride(1);
      strides.by_unit = grad_output->stride(2);
    }
  }
  // The final states' gradients, read through their strides: a broadcast
  // one (from h_n.sum()) is never copied dense.
  if (grad_h_n.has_value()) {
    args.grad_h_n = grad_h_n->const_data_ptr<T>();
    args.grad_h_n_strides = {grad_h_n->stride(0), grad_h_n->stride(1)};
  }
  if (grad_c_n.has_value()) {
    args.grad_c_n = grad_c_n->const_data_ptr<T>();
    args.grad_c_n_strides = {grad_c_n->stride(0), grad_c_n->stride(1)};
  }
  args.gates = gates.const_data_ptr<T>();
  args.cells = cells.const_data_ptr<T>();
  args.d_gates = d_gates.mutable_data_ptr<T>();
  args.grad_h = grad_h != nullptr ? grad_h->mutable_data_ptr<T>() : nullptr;
  args.grad_c = grad_c.mutable_data_ptr<T>();
  // Cooperative: the blocks' shares of the gradient of h in global memory,
  // two steps' worth (see the kernel), in the math type.
  std::optional<Tensor> shares;
  if (plan.path == SequencePath::kCooperative) {
    const int64_t rows = 2 * int64_t(plan.blocks) * n.batch;
    shares = persistent::kWidened<T> ? new_float_matrix(gates, rows, n.state)
                                     : new_matrix(gates, rows, n.state);
    args.shares = shares->mutable_data_ptr<Math>();
  }
  if constexpr (persistent::kWidened<T>) {
    if (bias_sums != nullptr) {
      *bias_sums = new_float_matrix(gates, n.batch, 3 * n.state);
      args.bias_sums = (*bias_sums)->mutable_data_ptr<Math>();
    }
  }
  args.weights = weights.const_data_ptr<T>();
  args.weights_row_stride = weights.stride(0);
  args.weights_column_stride = weights.stride(1);
  args.batch_size = n.batch;
  args.state_size = n.state;
  args.units_per_block = plan.units;
  args.rows_per_group = plan.group_rows;
  args.pitch = plan.pitch;
  args.layout = plan.layout;
  args.reverse = reverse;
  args.steps = steps;
  // `shares` is freed after the launch is queued: torch's caching allocator
  // hands its memory out again only to work queued after it on this stream.
  return launch_waves(backward_kernel<T>(plan.path, plan.tile_rows), plan, args, n.batch,
                      gates.get_device_index(), "lltm sequence_backward_kernel");
}

int element_size_of(const Tensor& t) {
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

}  // namespace

bool persistent_sequence_forward(const SequenceSizes& n, const Schedule& schedule,
                                 const Tensor& projection, Tensor* gates, Tensor& output,
                                 Tensor* cells, Tensor& h_n, Tensor& c_n, const Tensor& weights,
                                 const Tensor& h0, const Tensor& c0) {
  // The plan, as every choice here, by the output: the same with or without
  // gates and cells.
  const int element_size = element_size_of(output);
  const int device = output.get_device_index();
  const SequencePlan plan =
      plan_for(SequencePass::kForward, device, element_size, n.batch, n.state);
  if (!plan.persistent()) return false;
  const std::optional<Steps> steps = steps_of(schedule, n.rows);
  if (!steps) return false;
  return with_dtype(output, [&](auto type) {
    return forward_launch<decltype(type)>(plan, n, *steps, schedule.reverse, projection, gates,
                                          output, cells, h_n, c_n, weights, h0, c0);
  });
}

bool persistent_sequence_forward_planned(const SequenceSizes& n, const Schedule& schedule,
                                         const Tensor& like) {
  return plan_for(SequencePass::kForward, like.get_device_index(), element_size_of(like), n.batch,
                  n.state)
             .persistent() &&
         steps_of(schedule, n.rows).has_value();
}

bool persistent_sequence_backward(const SequenceSizes& n, const Schedule& schedule,
                                  const std::optional<Tensor>& grad_output,
                                  const std::optional<Tensor>& grad_h_n,
                                  const std::optional<Tensor>& grad_c_n, const Tensor& gates,
                                  const Tensor& cells, const Tensor& weights, Tensor& d_gates,
                                  Tensor* grad_h, Tensor& grad_c,
                                  std::optional<Tensor>* bias_sums) {
  const int element_size = element_size_of(gates);
  const int device = gates.get_device_index();
  const SequencePlan plan =
      plan_for(SequencePass::kBackward, device, element_size, n.batch, n.state);
  if (!plan.persistent()) return false;
  const std::optional<Steps> steps = steps_of(schedule, n.rows);
  if (!steps) return false;
  return with_dtype(gates, [&](auto type) {
    return backward_launch<decltype(type)>(plan, n, *steps, schedule.reverse, grad_output, grad_h_n,
                                           grad_c_n, gates, cells, weights, d_gates, grad_h, grad_c,
                                           bias_sums);
  });
}

std::string sequence_path(int device, int element_size, int64_t batch, int64_t state) {
  // On a thread of its own: the caller's current device and its contexts
  // stay as they are (see kernel_image_problem).
  std::string text, error;
  std::thread([&] {
    try {
      if (plan_reads_device(forced_plan(), element_size, batch, state)) {
        const cudaError_t selected = select_device(device);
        if (selected != cudaSuccess) fail_cuda("selecting the GPU", selected);
      }
      text = "forward: " +
             describe(plan_for(SequencePass::kForward, device, element_size, batch, state)) +
             "\nbackward: " +
             describe(plan_for(SequencePass::kBackward, device, element_size, batch, state));
    } catch (const std::exception& e) {
      error = e.what();
    }
  }).join();
  if (!error.empty()) throw std::runtime_error(error);
  return text;
}

}  // namespace lltm::cuda
