// Barriers and shared memory as kernels use them, on the emulation's fibers
// (fibers.h): __syncthreads, the cooperative_groups names of
// <cooperative_groups.h> that lltm's kernels use, and the two names
// csrc/cuda/lltm_cuda_runtime.h gives kernels in nvcc builds:
// lltm::cuda::cg and lltm::cuda::dynamic_shared_memory().
#pragma once

#include "errors.h"
#include "fibers.h"
#include "gpu.h"
#include "language.h"

inline void __syncthreads() { ::lltm::cuda_host::barrier(::lltm::cuda_host::BarrierKind::kBlock); }

// One host thread runs every CUDA thread: memory is always coherent.
inline void __threadfence() {}
inline void __threadfence_block() {}

[[noreturn]] inline void __trap() {
  ::lltm::cuda_host::fault("the kernel executed __trap() (cudaErrorLaunchFailure on a GPU)");
}

namespace cooperative_groups {

namespace detail {
inline unsigned long long linear(const uint3& i, const dim3& d) {
  return (static_cast<unsigned long long>(i.z) * d.y + i.y) * d.x + i.x;
}
inline unsigned long long volume(const dim3& d) {
  return static_cast<unsigned long long>(d.x) * d.y * d.z;
}
}  // namespace detail

class thread_block {
 public:
  void sync() const { ::lltm::cuda_host::barrier(::lltm::cuda_host::BarrierKind::kBlock); }
  unsigned thread_rank() const {
    return static_cast<unsigned>(detail::linear(threadIdx, blockDim));
  }
  unsigned num_threads() const { return static_cast<unsigned>(detail::volume(blockDim)); }
  unsigned size() const { return num_threads(); }
  dim3 group_index() const { return dim3(blockIdx.x, blockIdx.y, blockIdx.z); }
  dim3 thread_index() const { return dim3(threadIdx.x, threadIdx.y, threadIdx.z); }
  dim3 group_dim() const { return blockDim; }
  dim3 dim_threads() const { return blockDim; }
};

class grid_group {
 public:
  void sync() const { ::lltm::cuda_host::barrier(::lltm::cuda_host::BarrierKind::kGrid); }
  // Whether the launch was cooperative is checked where it matters: at sync().
  bool is_valid() const { return true; }
  unsigned long long thread_rank() const {
    return block_rank() * detail::volume(blockDim) + detail::linear(threadIdx, blockDim);
  }
  unsigned long long num_threads() const {
    return detail::volume(gridDim) * detail::volume(blockDim);
  }
  unsigned long long size() const { return num_threads(); }
  unsigned long long block_rank() const { return detail::linear(blockIdx, gridDim); }
  unsigned long long num_blocks() const { return detail::volume(gridDim); }
  dim3 block_index() const { return dim3(blockIdx.x, blockIdx.y, blockIdx.z); }
  dim3 dim_blocks() const { return gridDim; }
};

class cluster_group {
 public:
  void sync() const { ::lltm::cuda_host::barrier(::lltm::cuda_host::BarrierKind::kCluster); }
  // This block's rank in its cluster, x fastest.
  unsigned block_rank() const {
    const dim3 c = ::lltm::cuda_host::cluster_dims();
    return (blockIdx.z % c.z * c.y + blockIdx.y % c.y) * c.x + blockIdx.x % c.x;
  }
  unsigned num_blocks() const {
    return static_cast<unsigned>(detail::volume(::lltm::cuda_host::cluster_dims()));
  }
  dim3 block_index() const {
    const dim3 c = ::lltm::cuda_host::cluster_dims();
    return dim3(blockIdx.x % c.x, blockIdx.y % c.y, blockIdx.z % c.z);
  }
  dim3 dim_blocks() const { return ::lltm::cuda_host::cluster_dims(); }
  unsigned thread_rank() const {
    return block_rank() * static_cast<unsigned>(detail::volume(blockDim)) +
           static_cast<unsigned>(detail::linear(threadIdx, blockDim));
  }
  unsigned num_threads() const {
    return num_blocks() * static_cast<unsigned>(detail::volume(blockDim));
  }
  // `address`, in this block's shared memory, in block `rank`'s.
  template <typename T>
  T* map_shared_rank(T* address, unsigned rank) const {
    return reinterpret_cast<T*>(::lltm::cuda_host::cluster_shared_memory(address, rank));
  }
};

inline thread_block this_thread_block() { return {}; }
inline grid_group this_grid() { return {}; }
inline cluster_group this_cluster() { return {}; }

template <typename Group>
void sync(const Group& group) {
  group.sync();
}

}  // namespace cooperative_groups

namespace lltm::cuda {

// Block, cluster and grid barriers, as in nvcc builds.
namespace cg = ::cooperative_groups;

// The block's dynamic shared memory (the launch's dynamicSmemBytes), 16-byte
// aligned: an arena of the block's own.
inline unsigned char* dynamic_shared_memory() { return ::lltm::cuda_host::shared_memory(); }

}  // namespace lltm::cuda
