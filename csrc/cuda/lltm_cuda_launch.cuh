// How lltm's CUDA kernels are laid out on the GPU and launched.
//
// The pointwise kernels walk (row, column) of row-major (batch, state)
// matrices: threadIdx.x runs along a row, so the lanes of a warp in one row
// read consecutive elements (coalesced; where rows are short a warp spans
// several, see row_tiling), and each thread moves a Pack of up to 16 bytes per
// load when alignment allows. Grids are capped at a few waves of the GPU and
// the kernels loop (grid-stride) over whatever is left, so any batch and
// state size works with 64-bit offsets.
#pragma once

#include <torch/csrc/inductor/aoti_torch/c/shim.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "../lltm_errors.h"
#include "lltm_cuda_device_cache.h"
#include "lltm_cuda_runtime.h"

namespace lltm::cuda {

// kVec elements of T moved by one load or store instruction.
template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) Pack {
  T v[kVec];
};

template <int kVec, typename T>
__device__ __forceinline__ Pack<T, kVec> load_pack(const T* p) {
  LLTM_CHECK_ALIGNED(p, alignof(Pack<T, kVec>));
  return *reinterpret_cast<const Pack<T, kVec>*>(p);
}

template <int kVec, typename T>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, kVec>& pack) {
  LLTM_CHECK_ALIGNED(p, alignof(Pack<T, kVec>));
  *reinterpret_cast<Pack<T, kVec>*>(p) = pack;
}

// The grid-stride loops of every pointwise kernel: body(row, j) for each row
// < rows and each column j < cols where a pack of kVec starts (cols is a
// multiple of kVec), once over the whole grid, whatever the block and grid
// shapes row_tiling chose. threadIdx.x runs along a row (coalesced), y
// across rows; offsets are 64-bit.
template <int kVec, typename Body>
__device__ __forceinline__ void for_each_pack(int64_t rows, int64_t cols, const Body& body) {
  const int64_t row_stride = int64_t(gridDim.y) * blockDim.y;
  const int64_t col_stride = int64_t(gridDim.x) * blockDim.x * kVec;
  for (int64_t row = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; row < rows;
       row += row_stride) {
    for (int64_t j = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * kVec; j < cols;
         j += col_stride) {
      body(row, j);
    }
  }
}

// Widest pack (16 bytes) that divides every row, when every pointer is
// aligned to it; otherwise 1, the plain (still coalesced) path.
template <typename T>
constexpr int kWidePack = 16 / sizeof(T);

template <typename T>
bool rows_fit_wide_packs(int64_t state, std::initializer_list<const void*> pointers) {
  if (state % kWidePack<T> != 0) return false;
  return std::all_of(pointers.begin(), pointers.end(), [](const void* p) {
    return reinterpret_cast<std::uintptr_t>(p) % sizeof(Pack<T, kWidePack<T>>) == 0;
  });
}

// Clears `error`, a runtime call's of lltm's that lltm answers itself, from
// the thread's last error (cudaGetLastError), where it still stands there: a
// failing call makes its error the last one. Any other error is left alone:
// it is another library's (or the program's), pending until its owner reads
// it, and was there before lltm's calls, which all succeeded.
inline void forget_error(cudaError_t error) {
  if (error != cudaSuccess && cudaPeekAtLastError() == error) (void)cudaGetLastError();
}

// Errors no runtime call makes, only a kernel that ran: an earlier
// kernel's (lltm's or another's, run asynchronously), which left the context
// unusable and now fails every call.
inline bool is_earlier_kernel_error(cudaError_t error) {
  return error == cudaErrorIllegalAddress || error == cudaErrorLaunchFailure ||
         error == cudaErrorMisalignedAddress || error == cudaErrorIllegalInstruction ||
         error == cudaErrorAssert || error == cudaErrorHardwareStackError ||
         error == cudaErrorLaunchTimeout;
}

// Raises lltm's error of `what`, cleared from the thread's last error, as
// torch clears the errors it raises (C10_CUDA_CHECK).
[[noreturn]] inline void fail_cuda(const std::string& what, cudaError_t error) {
  forget_error(error);
  std::string message = "lltm: " + what + " failed: " + cudaGetErrorString(error);
  if (error == cudaErrorNoKernelImageForDevice) {
    message +=
        " (lltm's CUDA kernels were not compiled for this GPU; rebuild "
        "with its compute capability in TORCH_CUDA_ARCH_LIST)";
  } else if (is_earlier_kernel_error(error)) {
    message += " (an earlier kernel's error, which left the CUDA context unusable)";
  }
  throw std::runtime_error(message);
}

// A launch's error (bad configuration, missing kernel image), the code its
// LLTM_LAUNCH returned, is reported right away; errors inside the kernel
// surface at the next synchronisation, as for torch's own kernels. The
// launch's own code, not the thread's last error: that may hold another
// library's launch error, pending since before lltm's launch, which would
// be reported as lltm's (and cleared, so that its owner never sees it).
inline void check_launch(const char* kernel, cudaError_t error) {
  if (error != cudaSuccess) fail_cuda(std::string("launching ") + kernel, error);
}

// The stream torch is using on this device now: the one CUDA graphs capture
// and torch.cuda.stream() selects. Queried through libtorch_cuda's C shim,
// which every torch >= 2.10 has.
inline cudaStream_t current_stream(int32_t device_index) {
  void* stream = nullptr;
  LLTM_CHECK_TORCH(aoti_torch_get_current_cuda_stream(device_index, &stream),
                   "reading torch's current CUDA stream");
  return static_cast<cudaStream_t>(stream);
}

struct RowTiling {
  dim3 grid;
  dim3 block;
};

constexpr int64_t kThreadsPerBlock = 256;
// Enough resident blocks to keep memory busy, few enough that each thread
// does several iterations of the grid-stride loops.
constexpr int64_t kMaxBlocksPerMultiprocessor = 32;
constexpr int64_t kMaxGridY = 65535;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The device's multiprocessor count, queried once per device
// (lltm_cuda_device_cache.h): no runtime query on every launch.
inline int64_t multiprocessor_count(int32_t device_index) {
  static PerDevice<int64_t> counts;
  return counts.get(device_index, [device_index] {
    int count = 0;
    const cudaError_t error =
        cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device_index);
    if (error != cudaSuccess) fail_cuda("querying the GPU", error);
    return int64_t(count);
  });
}

// Block: x covers a row's packs (up to a whole block), y stacks as many rows
// as fit, so short rows still fill the block. Where a row has fewer than 32
// packs a warp spans several rows (up to 32, one pack each): in the dense
// (batch, state) matrices, whose rows follow one another, it still reads
// consecutive addresses; in `gates`, whose rows are 3 * state apart, it reads
// a separate run in each row (more memory transactions, the same results).
inline RowTiling row_tiling(int64_t rows, int64_t packs_per_row, int32_t device_index) {
  // At least one multiprocessor, whatever the driver says: a grid of 0
  // blocks would divide by zero below.
  const int64_t max_blocks =
      std::max<int64_t>(1, multiprocessor_count(device_index)) * kMaxBlocksPerMultiprocessor;

  const int64_t block_x = std::min(kThreadsPerBlock, packs_per_row);
  const int64_t block_y = kThreadsPerBlock / block_x;
  const int64_t grid_y = std::min({ceil_div(rows, block_y), kMaxGridY, max_blocks});
  const int64_t grid_x =
      std::min(ceil_div(packs_per_row, block_x), std::max<int64_t>(1, max_blocks / grid_y));
  return {dim3(static_cast<unsigned>(grid_x), static_cast<unsigned>(grid_y)),
          dim3(static_cast<unsigned>(block_x), static_cast<unsigned>(block_y))};
}

}  // namespace lltm::cuda
