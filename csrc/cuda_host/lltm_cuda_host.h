// The CUDA runtime emulated on the host, for the test-only host build of
// csrc/cuda (tests/cuda_host.py; csrc/cuda/lltm_cuda_runtime.h includes this
// instead of <cuda_runtime.h> when LLTM_CUDA_HOST is defined).
//
// lltm's kernels are grid-stride loops with no shared memory, barriers or
// warp intrinsics, so running every thread of a grid one after the other
// computes what the GPU computes. This header provides:
//   * CUDA's built-in variables (threadIdx, blockIdx, blockDim, gridDim) as
//     thread-locals, and __global__/__device__ defined away;
//   * launch(): runs every block and thread of a grid in turn, after the
//     checks the GPU makes (at most 1024 threads a block, grid.y and grid.z
//     at most 65535, ...: a bad configuration is the launch error the GPU
//     gives), and checks that the launch goes to torch's current stream;
//   * LLTM_CHECK_ALIGNED: every vector (Pack) load and store is aligned, as
//     the GPU requires (where it would fault, this throws);
//   * an emulated GPU: the current stream, the multiprocessor count (settable,
//     to exercise the tiling of small and large GPUs), devices, their primary
//     contexts, compute capability and injectable errors, for the runtime
//     calls of csrc/cuda;
//   * aoti_torch_cuda_addmm_out mapped to torch's CPU shim.
// CPU tensors have device index -1: the emulated device they run on.
#pragma once

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/inductor/aoti_torch/generated/c_shim_cpu.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>

// --- The language ---------------------------------------------------------------------

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline

struct uint3 {
  unsigned x, y, z;
};

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

// The thread being run (one host thread runs a grid's threads in turn).
inline thread_local uint3 threadIdx{0, 0, 0};
inline thread_local uint3 blockIdx{0, 0, 0};
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;

// --- Errors (the runtime's codes and messages) ------------------------------------------

enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInitializationError = 3,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorDevicesUnavailable = 46,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidKernelImage = 200,
  cudaErrorNoKernelImageForDevice = 209,
  cudaErrorInvalidPtx = 218,
  cudaErrorUnsupportedPtxVersion = 222,
  cudaErrorMisalignedAddress = 716,
};
using cudaError_t = cudaError;

inline const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInitializationError:
      return "initialization error";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorDevicesUnavailable:
      return "CUDA-capable device(s) is/are busy or unavailable";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorInvalidKernelImage:
      return "device kernel image is invalid";
    case cudaErrorNoKernelImageForDevice:
      return "no kernel image is available for execution on the device";
    case cudaErrorInvalidPtx:
      return "a PTX JIT compilation failed";
    case cudaErrorUnsupportedPtxVersion:
      return "the provided PTX was compiled with an unsupported toolchain.";
    case cudaErrorMisalignedAddress:
      return "misaligned address";
  }
  return "unrecognized error code";
}

// --- The emulated GPU -------------------------------------------------------------------

namespace lltm::cuda_host {

constexpr int kMaxDevices = 8;

struct Gpu {
  // An H100's 132 multiprocessors unless a test sets another count.
  std::atomic<int> multiprocessors{132};
  std::atomic<int> devices{2};
  std::atomic<int> capability_major{9};
  std::atomic<int> capability_minor{0};
  // Errors the next runtime calls return (cudaSuccess: none): loading the
  // kernels' code (cudaFuncGetAttributes), selecting a device
  // (cudaSetDevice), and querying an attribute.
  std::atomic<int> image_error{cudaSuccess};
  std::atomic<int> set_device_error{cudaSuccess};
  std::atomic<int> attribute_error{cudaSuccess};
  // Whether each device has its primary context (CUDA >= 12 creates it in
  // cudaSetDevice, or at the first use of a thread's current device).
  std::atomic<bool> contexts[kMaxDevices] = {};
  // Kernel launches run: lets a test see that the kernels ran.
  std::atomic<int64_t> launches{0};
  // While `hold_load` is set, loading the kernels' code waits (as creating a
  // context takes a while), for at most two seconds: `held` while it waits,
  // `timed_out` if the two seconds passed.
  std::atomic<bool> hold_load{false}, held{false}, timed_out{false};
};

inline Gpu& gpu() {
  static Gpu state;
  return state;
}

// The runtime's per-thread state: the current device (0 until set) and the
// last error, which cudaGetLastError reads and clears.
inline thread_local int current_device = 0;
inline thread_local cudaError_t last_error = cudaSuccess;

inline bool valid_device(int device) { return device >= 0 && device < gpu().devices.load(); }

inline void create_context(int device) {
  if (device >= 0 && device < kMaxDevices) gpu().contexts[device] = true;
}

inline cudaError_t injected(std::atomic<int>& error) {
  return static_cast<cudaError_t>(error.load());
}

}  // namespace lltm::cuda_host

enum cudaDeviceAttr {
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrComputeCapabilityMinor = 76,
};

struct cudaFuncAttributes {
  int maxThreadsPerBlock;
  int numRegs;
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

// Device -1 is the one CPU tensors run on; it has the emulated
// multiprocessor count too.
inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attribute, int device) {
  using namespace lltm::cuda_host;
  if (device != -1 && !valid_device(device)) return last_error = cudaErrorInvalidDevice;
  if (const cudaError_t error = injected(gpu().attribute_error)) return last_error = error;
  switch (attribute) {
    case cudaDevAttrMultiProcessorCount:
      *value = gpu().multiprocessors.load();
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor:
      *value = gpu().capability_major.load();
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor:
      *value = gpu().capability_minor.load();
      return cudaSuccess;
  }
  return last_error = cudaErrorInvalidValue;
}

// Loads the kernels' code on the current device, creating its primary
// context first, as any first use of a device does.
inline cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attributes, const void* /*func*/) {
  using namespace lltm::cuda_host;
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
  *attributes = {1024, 32};
  return cudaSuccess;
}

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
// emulated device, and GEMMs on the CPU.
#define aoti_torch_get_current_cuda_stream ::lltm::cuda_host::current_cuda_stream
#define aoti_torch_cuda_addmm_out aoti_torch_cpu_addmm_out

// --- Launches ---------------------------------------------------------------------------

namespace lltm::cuda_host {

// What makes the GPU refuse a launch configuration (any GPU since Volta), or
// nullptr.
inline const char* configuration_problem(dim3 grid, dim3 block) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return "an empty grid";
  if (block.x == 0 || block.y == 0 || block.z == 0) return "an empty block";
  if (grid.x > 2147483647u) return "grid.x > 2^31 - 1";
  if (grid.y > 65535 || grid.z > 65535) return "grid.y or grid.z > 65535";
  if (block.x > 1024 || block.y > 1024 || block.z > 64) return "a block dimension past its limit";
  if (uint64_t(block.x) * block.y * block.z > 1024) return "more than 1024 threads a block";
  return nullptr;
}

[[noreturn]] inline void fault(const std::string& what) {
  throw std::runtime_error("lltm host emulation of CUDA: " + what);
}

template <typename... Params>
class Launch {
 public:
  Launch(dim3 grid, dim3 block, cudaStream_t stream, void (*kernel)(Params...))
      : grid_(grid), block_(block), stream_(stream), kernel_(kernel) {}

  // Every thread of the grid in turn, block by block, as the GPU's index
  // space has them: x fastest, then y, then z.
  template <typename... Args>
  void operator()(const Args&... args) const {
    if (configuration_problem(grid_, block_) != nullptr) {
      last_error = cudaErrorInvalidConfiguration;  // as the GPU reports it
      return;
    }
    if (stream_ != torch_stream(current_device)) {
      fault("a kernel was launched on another stream than torch's current stream of device " +
            std::to_string(current_device));
    }
    gpu().launches.fetch_add(1);
    gridDim = grid_;
    blockDim = block_;
    for (unsigned bz = 0; bz < grid_.z; ++bz)
      for (unsigned by = 0; by < grid_.y; ++by)
        for (unsigned bx = 0; bx < grid_.x; ++bx)
          for (unsigned tz = 0; tz < block_.z; ++tz)
            for (unsigned ty = 0; ty < block_.y; ++ty)
              for (unsigned tx = 0; tx < block_.x; ++tx) {
                blockIdx = {bx, by, bz};
                threadIdx = {tx, ty, tz};
                kernel_(args...);
              }
  }

 private:
  dim3 grid_, block_;
  cudaStream_t stream_;
  void (*kernel_)(Params...);
};

template <typename... Params>
Launch<Params...> launch(dim3 grid, dim3 block, cudaStream_t stream, void (*kernel)(Params...)) {
  return Launch<Params...>(grid, block, stream, kernel);
}

// A vector load or store must be aligned to its size: the GPU faults with
// "misaligned address" otherwise.
inline void check_aligned(const void* pointer, std::size_t alignment) {
  if (reinterpret_cast<std::uintptr_t>(pointer) % alignment != 0) {
    std::ostringstream s;
    s << "misaligned address: a " << alignment << "-byte vector access at " << pointer
      << " (the GPU stops the kernel with cudaErrorMisalignedAddress)";
    fault(s.str());
  }
}

}  // namespace lltm::cuda_host

#define LLTM_CHECK_ALIGNED(pointer, alignment) ::lltm::cuda_host::check_aligned(pointer, alignment)

// CUDART_VERSION, for the module's cuda_version: no CUDA at all.
#define CUDART_VERSION 0
