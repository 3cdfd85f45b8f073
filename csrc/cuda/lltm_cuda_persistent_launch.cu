// The persistent sequence kernels' launches (lltm_cuda_persistent_launch.cuh):
// the schedule as the kernels carry it, and which launch errors mean the GPU
// cannot have the launch now (the caller then takes the per-step path).
#include "lltm_cuda_persistent_launch.cuh"

namespace lltm::cuda {

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

bool launch_unavailable(cudaError_t error) {
  return error == cudaErrorCooperativeLaunchTooLarge || error == cudaErrorInvalidClusterSize ||
         error == cudaErrorLaunchOutOfResources || error == cudaErrorNotSupported;
}

}  // namespace lltm::cuda
