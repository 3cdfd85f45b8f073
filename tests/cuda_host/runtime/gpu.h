// The emulated GPU of the host build: its devices, attributes and limits (an
// H100 SXM's unless a test sets others), the runtime's per-thread state, the
// device calls of csrc/cuda, streams, and torch's C shim as the CUDA sources
// call it (the calls that make work, and the attribute queries, are counted:
// calls.h). CPU tensors have
// device index -1: the emulated device they run on.
#pragma once

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/inductor/aoti_torch/generated/c_shim_cpu.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

#include "calls.h"
#include "errors.h"

namespace lltm::cuda_host {

constexpr int kMaxDevices = 8;

// An H100 SXM, as CUDA reports it (the GPU the emulation starts as).
struct H100 {
  static constexpr int kMultiprocessors = 132;
  // Graphics processing clusters: a thread-block cluster runs within one.
  static constexpr int kGpcs = 8;
  static constexpr int kCapabilityMajor = 9;
  static constexpr int kCapabilityMinor = 0;
  static constexpr int kSharedPerMultiprocessor = 228 * 1024;
  static constexpr int kSharedPerBlockOptin = 227 * 1024;
  // What a kernel may use without cudaFuncAttributeMaxDynamicSharedMemorySize.
  static constexpr int kSharedPerBlock = 48 * 1024;
  // What the driver keeps of each block's share of the multiprocessor.
  static constexpr int kReservedSharedPerBlock = 1024;
  static constexpr int kThreadsPerMultiprocessor = 2048;
  static constexpr int kBlocksPerMultiprocessor = 32;
  static constexpr int kPortableClusterSize = 8;
  static constexpr int kNonPortableClusterSize = 16;
};

struct Gpu {
  std::atomic<int> multiprocessors{H100::kMultiprocessors};
  std::atomic<int> gpcs{H100::kGpcs};
  // Multiprocessors a cooperative or cluster launch can have (MPS, or other
  // work on the GPU); -1: all of them.
  std::atomic<int> free_multiprocessors{-1};
  std::atomic<int> devices{2};
  std::atomic<int> capability_major{H100::kCapabilityMajor};
  std::atomic<int> capability_minor{H100::kCapabilityMinor};
  std::atomic<int> shared_per_multiprocessor{H100::kSharedPerMultiprocessor};
  std::atomic<int> shared_per_block_optin{H100::kSharedPerBlockOptin};
  std::atomic<int> threads_per_multiprocessor{H100::kThreadsPerMultiprocessor};
  std::atomic<int> blocks_per_multiprocessor{H100::kBlocksPerMultiprocessor};
  std::atomic<bool> cooperative_launch{true};
  std::atomic<int> portable_cluster_size{H100::kPortableClusterSize};
  std::atomic<int> non_portable_cluster_size{H100::kNonPortableClusterSize};
  // Errors the next runtime calls return (cudaSuccess: none): loading the
  // kernels' code (cudaFuncGetAttributes), selecting a device
  // (cudaSetDevice), querying an attribute, and plain launches (LLTM_LAUNCH;
  // as a context an earlier kernel broke fails them).
  std::atomic<int> image_error{cudaSuccess};
  std::atomic<int> launch_error{cudaSuccess};
  std::atomic<int> set_device_error{cudaSuccess};
  std::atomic<int> attribute_error{cudaSuccess};
  // Whether each device has its primary context (CUDA >= 12 creates it in
  // cudaSetDevice, or at the first use of a thread's current device).
  std::atomic<bool> contexts[kMaxDevices] = {};
  // Bumped at every change of the settings above (module.cpp, reset()): the
  // CUDA sources ask the GPU again what they remembered of an older epoch
  // (csrc/cuda/lltm_cuda_device_cache.h), as a process on another GPU would.
  std::atomic<uint64_t> epoch{0};
  // Kernel launches run: lets a test see that the kernels ran.
  std::atomic<int64_t> launches{0};
  // While `hold_load` is set, loading the kernels' code waits (as creating a
  // context takes a while), for at most two seconds: `held` while it waits,
  // `timed_out` if the two seconds passed.
  std::atomic<bool> hold_load{false}, held{false}, timed_out{false};
  // Whether torch's current streams are being captured into a CUDA graph
  // (cudaStreamIsCapturing answers so), as under torch.cuda.graph().
  std::atomic<bool> capturing{false};
};

inline Gpu& gpu() {
  static Gpu state;
  return state;
}

// The runtime's per-thread state: the current device (0 until set) and the
// last error, which cudaGetLastError reads and clears.
inline thread_local int current_device = 0;
inline thread_local cudaError_t last_error = cudaSuccess;

inline uint64_t gpu_epoch() { return gpu().epoch.load(); }

// After a change of the emulated GPU's settings.
inline void gpu_changed() { ++gpu().epoch; }

inline bool valid_device(int device) { return device >= 0 && device < gpu().devices.load(); }

inline void create_context(int device) {
  if (device >= 0 && device < kMaxDevices) gpu().contexts[device] = true;
}

inline cudaError_t injected(std::atomic<int>& error) {
  return static_cast<cudaError_t>(error.load());
}

inline int free_multiprocessors() {
  const int all = gpu().multiprocessors.load();
  const int free = gpu().free_multiprocessors.load();
  return free < 0 ? all : std::min(free, all);
}

// The emulated GPU as it starts: an H100, no context, no injected error, no
// kernel attribute set, the schedule forward with every barrier in place
// (launch.cpp).
void reset();

}  // namespace lltm::cuda_host

// The attributes csrc/cuda and its tests query, with their CUDA values.
enum cudaDeviceAttr {
  cudaDevAttrMaxThreadsPerBlock = 1,
  cudaDevAttrMaxSharedMemoryPerBlock = 8,
  cudaDevAttrWarpSize = 10,
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrMaxThreadsPerMultiProcessor = 39,
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrComputeCapabilityMinor = 76,
  cudaDevAttrMaxSharedMemoryPerMultiprocessor = 81,
  cudaDevAttrCooperativeLaunch = 95,
  cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
  cudaDevAttrMaxBlocksPerMultiprocessor = 106,
  cudaDevAttrReservedSharedMemoryPerBlock = 111,
  cudaDevAttrClusterLaunch = 120,
};

inline cudaError_t cudaGetLastError() {
  const cudaError_t error = lltm::cuda_host::last_error;
  lltm::cuda_host::last_error = cudaSuccess;
  return error;
}

inline cudaError_t cudaPeekAtLastError() { return lltm::cuda_host::last_error; }

inline cudaError_t cudaGetDevice(int* device) {
  *device = lltm::cuda_host::current_device;
  return cudaSuccess;
}

inline cudaError_t cudaGetDeviceCount(int* count) {
  *count = lltm::cuda_host::gpu().devices.load();
  return cudaSuccess;
}

// As in CUDA >= 12: selecting a device creates its primary context.
inline cudaError_t cudaSetDevice(int device) {
  using namespace lltm::cuda_host;
  if (!valid_device(device)) return last_error = cudaErrorInvalidDevice;
  if (const cudaError_t error = injected(gpu().set_device_error)) return last_error = error;
  current_device = device;
  create_context(device);
  return cudaSuccess;
}

// Device -1 is the one CPU tensors run on; it is the emulated GPU too.
inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attribute, int device) {
  using namespace lltm::cuda_host;
  count_call("cudaDeviceGetAttribute");
  if (device != -1 && !valid_device(device)) return last_error = cudaErrorInvalidDevice;
  if (const cudaError_t error = injected(gpu().attribute_error)) return last_error = error;
  const Gpu& g = gpu();
  switch (attribute) {
    case cudaDevAttrMaxThreadsPerBlock:
      *value = 1024;
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlock:
      *value = H100::kSharedPerBlock;
      return cudaSuccess;
    case cudaDevAttrWarpSize:
      *value = 32;
      return cudaSuccess;
    case cudaDevAttrMultiProcessorCount:
      *value = g.multiprocessors.load();
      return cudaSuccess;
    case cudaDevAttrMaxThreadsPerMultiProcessor:
      *value = g.threads_per_multiprocessor.load();
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor:
      *value = g.capability_major.load();
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor:
      *value = g.capability_minor.load();
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor:
      *value = g.shared_per_multiprocessor.load();
      return cudaSuccess;
    case cudaDevAttrCooperativeLaunch:
      *value = g.cooperative_launch.load() ? 1 : 0;
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = g.shared_per_block_optin.load();
      return cudaSuccess;
    case cudaDevAttrMaxBlocksPerMultiprocessor:
      *value = g.blocks_per_multiprocessor.load();
      return cudaSuccess;
    case cudaDevAttrReservedSharedMemoryPerBlock:
      *value = H100::kReservedSharedPerBlock;
      return cudaSuccess;
    case cudaDevAttrClusterLaunch:
      // Thread-block clusters came with compute capability 9.0.
      *value = g.capability_major.load() >= 9 ? 1 : 0;
      return cudaSuccess;
  }
  return last_error = cudaErrorInvalidValue;
}

namespace lltm::cuda_host {

// The calling thread's current device: -1, the emulated GPU of CPU tensors,
// as DeviceGuard sets it (cudaSetDevice takes only the GPUs' indices).
inline cudaError_t select_device(int device) {
  if (device != -1) return cudaSetDevice(device);
  current_device = -1;
  return cudaSuccess;
}

}  // namespace lltm::cuda_host

// --- Streams ----------------------------------------------------------------------------

// One stream per emulated device, standing for torch's current stream there;
// the default stream is nullptr, as in CUDA.
struct CUstream_st {
  int device;
};
using cudaStream_t = CUstream_st*;

namespace lltm::cuda_host {

inline cudaStream_t torch_stream(int32_t device) {
  static CUstream_st streams[kMaxDevices + 1] = {{-1}, {0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}};
  if (device < -1 || device >= kMaxDevices) return nullptr;
  return &streams[device + 1];
}

inline AOTITorchError current_cuda_stream(int32_t device, void** stream) {
  *stream = torch_stream(device);
  return *stream != nullptr ? AOTI_TORCH_SUCCESS : AOTI_TORCH_FAILURE;
}

// torch::stable::accelerator::DeviceGuard on the emulated devices.
class DeviceGuard {
 public:
  explicit DeviceGuard(int32_t device) : previous_(current_device) { current_device = device; }
  ~DeviceGuard() { current_device = previous_; }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_;
};

}  // namespace lltm::cuda_host

namespace lltm::cuda {
using DeviceGuard = ::lltm::cuda_host::DeviceGuard;
}  // namespace lltm::cuda

// torch's C shim, as the CUDA sources call it: the current stream of the
// emulated device (GEMMs run on the CPU, counted: calls.h).
#define aoti_torch_get_current_cuda_stream ::lltm::cuda_host::current_cuda_stream

// --- Stream capture and events ---------------------------------------------------------

enum cudaStreamCaptureStatus {
  cudaStreamCaptureStatusNone = 0,
  cudaStreamCaptureStatusActive = 1,
  cudaStreamCaptureStatusInvalidated = 2,
};

inline cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  lltm::cuda_host::count_call("cudaStreamIsCapturing");
  if (status == nullptr) return lltm::cuda_host::last_error = cudaErrorInvalidValue;
  // The default stream is never captured here (torch captures its own).
  *status = stream != nullptr && lltm::cuda_host::gpu().capturing.load()
                ? cudaStreamCaptureStatusActive
                : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}

// An event holds the emulated clock (calls.h) as its stream had it when it
// was recorded: work runs as it is queued here, so the time between two
// events is the cost of what was queued between them.
struct CUevent_st {
  double recorded_us = -1;
};
using cudaEvent_t = CUevent_st*;

inline cudaError_t cudaEventCreate(cudaEvent_t* event) {
  if (event == nullptr) return lltm::cuda_host::last_error = cudaErrorInvalidValue;
  *event = new CUevent_st;
  return cudaSuccess;
}

inline cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete event;
  return cudaSuccess;
}

inline cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr) {
  using namespace lltm::cuda_host;
  count_call("cudaEventRecord");
  if (event == nullptr) return last_error = cudaErrorInvalidValue;
  if (stream != torch_stream(current_device)) {
    fault("an event was recorded on another stream than torch's current stream of device " +
          std::to_string(current_device));
  }
  event->recorded_us = clock_us();
  return cudaSuccess;
}

inline cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (event == nullptr) return lltm::cuda_host::last_error = cudaErrorInvalidValue;
  return cudaSuccess;
}

// Milliseconds, as CUDA's; an event never recorded: cudaErrorInvalidValue
// (CUDA's cudaErrorInvalidResourceHandle, not emulated).
inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == nullptr || start == nullptr || end == nullptr || start->recorded_us < 0 ||
      end->recorded_us < 0) {
    return lltm::cuda_host::last_error = cudaErrorInvalidValue;
  }
  *ms = static_cast<float>((end->recorded_us - start->recorded_us) / 1000.0);
  return cudaSuccess;
}

// CUDART_VERSION, for the module's cuda_version: no CUDA at all.
#define CUDART_VERSION 0
