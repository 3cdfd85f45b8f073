// Kernel launches on the emulated GPU: plain launches (LLTM_LAUNCH), which
// run each thread to its end in turn, and cudaLaunchKernelEx, whose threads
// run as fibers (fibers.h) after the checks a GPU makes
// (launch.cpp); kernel attributes, the occupancy calculator,
// and the alignment of vector accesses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <utility>

#include "calls.h"
#include "errors.h"
#include "fibers.h"
#include "gpu.h"
#include "language.h"

// --- Kernel attributes ------------------------------------------------------------------

// The fields of CUDA's struct that a host can know of a kernel here.
struct cudaFuncAttributes {
  std::size_t sharedSizeBytes;
  int maxThreadsPerBlock;
  int numRegs;
  int maxDynamicSharedSizeBytes;
  int nonPortableClusterSizeAllowed;
};

enum cudaFuncAttribute {
  cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
  cudaFuncAttributeNonPortableClusterSizeAllowed = 14,
};

// Loads the kernels' code on the current device, creating its primary
// context first, as any first use of a device does.
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attributes, const void* func);

// Per kernel and device, as on a GPU: the dynamic shared memory a launch may
// ask for (48 KiB until set; at most the device's opt-in limit) and whether
// clusters past the portable size are allowed.
cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attribute, int value);

template <typename T>
cudaError_t cudaFuncSetAttribute(T* func, cudaFuncAttribute attribute, int value) {
  return cudaFuncSetAttribute(reinterpret_cast<const void*>(func), attribute, value);
}

// --- cudaLaunchKernelEx -------------------------------------------------------------------

enum cudaLaunchAttributeID {
  cudaLaunchAttributeIgnore = 0,
  cudaLaunchAttributeCooperative = 2,
  cudaLaunchAttributeClusterDimension = 4,
};

union cudaLaunchAttributeValue {
  char pad[64];
  int cooperative;
  struct {
    unsigned int x;
    unsigned int y;
    unsigned int z;
  } clusterDim;
};

struct cudaLaunchAttribute {
  cudaLaunchAttributeID id;
  cudaLaunchAttributeValue val;
};

struct cudaLaunchConfig_t {
  dim3 gridDim;
  dim3 blockDim;
  std::size_t dynamicSmemBytes;
  cudaStream_t stream;
  cudaLaunchAttribute* attrs;
  unsigned int numAttrs;
};

namespace lltm::cuda_host {

// Checks the launch as a GPU would (returning its error), then runs it.
cudaError_t launch_kernel_ex(const cudaLaunchConfig_t* config, const KernelCall& call);

cudaError_t occupancy_blocks(int* blocks, const void* func, int block_size,
                             std::size_t dynamic_shared);
cudaError_t occupancy_clusters(int* clusters, const void* func, const cudaLaunchConfig_t* config);

}  // namespace lltm::cuda_host

// As cuda_runtime.h's C++ form: the arguments converted to the kernel's
// parameter types once, each thread getting its own copy of them.
template <typename... Params, typename... Args>
cudaError_t cudaLaunchKernelEx(const cudaLaunchConfig_t* config, void (*kernel)(Params...),
                               Args&&... args) {
  return [&](Params... params) {
    auto run = [&] { kernel(params...); };
    const lltm::cuda_host::KernelCall call{
        [](const void* context) { (*static_cast<const decltype(run)*>(context))(); }, &run,
        reinterpret_cast<const void*>(kernel)};
    return lltm::cuda_host::launch_kernel_ex(config, call);
  }(std::forward<Args>(args)...);
}

template <typename T>
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, T func, int block_size,
                                                          std::size_t dynamic_shared) {
  lltm::cuda_host::count_call("cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  return lltm::cuda_host::occupancy_blocks(blocks, reinterpret_cast<const void*>(func), block_size,
                                           dynamic_shared);
}

template <typename T>
cudaError_t cudaOccupancyMaxActiveClusters(int* clusters, T* func,
                                           const cudaLaunchConfig_t* config) {
  lltm::cuda_host::count_call("cudaOccupancyMaxActiveClusters");
  return lltm::cuda_host::occupancy_clusters(clusters, reinterpret_cast<const void*>(func), config);
}

// --- Plain launches -----------------------------------------------------------------------

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

// A launch must go to torch's current stream of the current device.
inline void check_stream(cudaStream_t stream) {
  if (stream != torch_stream(current_device)) {
    fault("a kernel was launched on another stream than torch's current stream of device " +
          std::to_string(current_device));
  }
}

template <typename... Params>
class Launch {
 public:
  Launch(dim3 grid, dim3 block, cudaStream_t stream, void (*kernel)(Params...))
      : grid_(grid), block_(block), stream_(stream), kernel_(kernel) {}

  // Every thread of the grid in turn, block by block, as the GPU's index
  // space has them: x fastest, then y, then z. No fibers: a barrier or
  // shared memory here is a fault (fibers.cpp). Returns the launch's error,
  // which becomes the thread's last error too, as the runtime's
  // cudaLaunchKernelEx does (LLTM_LAUNCH of the nvcc build).
  template <typename... Args>
  cudaError_t operator()(const Args&... args) const {
    if (configuration_problem(grid_, block_) != nullptr) {
      return last_error = cudaErrorInvalidConfiguration;  // as the GPU reports it
    }
    if (const cudaError_t error = injected(gpu().launch_error)) return last_error = error;
    check_stream(stream_);
    gpu().launches.fetch_add(1);
    count_call("LLTM_LAUNCH");
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
    return cudaSuccess;
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
