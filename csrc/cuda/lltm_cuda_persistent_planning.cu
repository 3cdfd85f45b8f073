// The plan of a persistent sequence call (lltm_cuda_persistent.h): the
// environment's settings (LLTM_CUDA_PERSISTENT, LLTM_CUDA_PLAN), the device's
// limits and the occupancy calculator's answers for the rule of
// lltm_cuda_persistent_plan.h, the plans remembered per device and size, and
// the rule's answer as diagnostics show it.
#include "lltm_cuda_persistent_launch.cuh"
#include "lltm_cuda_persistent_measuring.h"

namespace lltm::cuda {
namespace {

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

// The occupancy calculator for the rule: the kernels of the call's pass
// (lltm_cuda_persistent_forward_entry.cu, _backward_entry.cu).
class KernelOccupancy final : public Occupancy {
 public:
  KernelOccupancy(int device, int element_size) : device_(device), element_size_(element_size) {}

  int blocks_per_multiprocessor(SequencePass pass, int tile_rows, int threads,
                                int64_t shared_bytes) const override {
    return pass == SequencePass::kForward
               ? forward_blocks_per_multiprocessor(device_, element_size_, tile_rows, threads,
                                                   shared_bytes)
               : backward_blocks_per_multiprocessor(device_, element_size_, tile_rows, threads,
                                                    shared_bytes);
  }

  int active_clusters(SequencePass pass, int tile_rows, int cluster_size, int groups, int threads,
                      int64_t shared_bytes) const override {
    return pass == SequencePass::kForward
               ? forward_active_clusters(device_, element_size_, tile_rows, cluster_size, groups,
                                         threads, shared_bytes)
               : backward_active_clusters(device_, element_size_, tile_rows, cluster_size, groups,
                                          threads, shared_bytes);
  }

 private:
  int device_;
  int element_size_;
};

// Whether the plan of such a call depends on the device at all.
bool plan_reads_device(const ForcedPlan& forced, int element_size, int64_t batch, int64_t state) {
  return persistent_enabled() && forced.mode != ForcedMode::kPerStep &&
         persistent_element_size(element_size) && batch > 0 && state > 0;
}

}  // namespace

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

// The plan for a call, remembered per device, epoch, pass, element size,
// batch, state and forced plan (the occupancy calculator is not free: a plan
// may ask it a few dozen times).
SequencePlan plan_for(SequencePass pass, int device, int element_size, int64_t batch, int64_t state,
                      bool tf32) {
  // A measured call (lltm_cuda_persistent_measuring.h) runs the plan it times.
  if (const SequencePlan* imposed = imposed_plan(pass)) return *imposed;
  tf32 = tf32 && element_size == 4;  // other dtypes' plans are the same either way
  const ForcedPlan forced = forced_plan();
  if (!plan_reads_device(forced, element_size, batch, state)) {
    // The reason only: no device query.
    struct Unused final : Occupancy {
      int blocks_per_multiprocessor(SequencePass, int, int, int64_t) const override { return 0; }
      int active_clusters(SequencePass, int, int, int, int, int64_t) const override { return 0; }
    } unused;
    return plan_forced(pass, element_size, batch, state, DeviceLimits{}, unused,
                       persistent_enabled(), forced, tf32);
  }
  using Key = std::tuple<int, uint64_t, int, int, int64_t, int64_t, std::string, bool>;
  static std::mutex mutex;
  static std::map<Key, SequencePlan> plans;
  const int slot = device_slot(device);
  const Key key{slot,  device_epoch(), static_cast<int>(pass), element_size,
                batch, state,          forced.setting,         tf32};
  const bool cached = slot >= 0;
  if (cached) {
    const std::lock_guard<std::mutex> lock(mutex);
    const auto found = plans.find(key);
    if (found != plans.end()) return found->second;
  }
  // float16 and bfloat16 share a plan: their kernels have the same shared
  // memory and launch bounds, and a plan needs one block a multiprocessor,
  // which the launch bounds guarantee in registers.
  const SequencePlan plan = plan_forced(pass, element_size, batch, state, device_limits(device),
                                        KernelOccupancy(device, element_size), true, forced, tf32);
  if (cached) {
    const std::lock_guard<std::mutex> lock(mutex);
    if (plans.size() >= 4096) plans.clear();  // a bound, for programs of endless sizes
    plans.emplace(key, plan);
  }
  return plan;
}

bool tf32_products(bool allow_tf32, const Tensor& like) {
  return allow_tf32 && like.scalar_type() == torch::headeronly::ScalarType::Float &&
         device_limits(like.get_device_index()).major >= 8;
}

bool plans_measurable() { return persistent_enabled() && !forced_plan().forced(); }

SequencePlan plan_with(SequencePass pass, int device, int element_size, int64_t batch,
                       int64_t state, const ForcedPlan& forced, bool tf32) {
  return plan_sequence(pass, element_size, batch, state, device_limits(device),
                       KernelOccupancy(device, element_size), true, forced,
                       tf32 && element_size == 4);
}

std::string sequence_path(int device, int element_size, int64_t batch, int64_t state, bool tf32) {
  // On a thread of its own: the caller's current device and its contexts
  // stay as they are (see kernel_image_problem).
  std::string text, error;
  std::thread([&] {
    try {
      if (plan_reads_device(forced_plan(), element_size, batch, state)) {
        const cudaError_t selected = select_device(device);
        if (selected != cudaSuccess) fail_cuda("selecting the GPU", selected);
      }
      // TF32 where the call allows it and the GPU has it (tf32_products).
      tf32 = tf32 && device_limits(device).major >= 8;
      text = "forward: " +
             describe(plan_for(SequencePass::kForward, device, element_size, batch, state, tf32)) +
             "\nbackward: " +
             describe(plan_for(SequencePass::kBackward, device, element_size, batch, state, tf32));
    } catch (const std::exception& e) {
      error = e.what();
    }
  }).join();
  if (!error.empty()) throw std::runtime_error(error);
  return text;
}

}  // namespace lltm::cuda
