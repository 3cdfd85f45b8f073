// The CUDA runtime as lltm's CUDA sources see it, and the one place where the
// two builds of those sources differ.
//
// The plugin (setup.py, LLTM_VARIANT=cuda) compiles them with nvcc against
// the real runtime: kernels run on the GPU and register for the CUDA
// dispatch key of the lltm namespace.
//
// The host build (LLTM_CUDA_HOST, tests/cuda_host/__init__.py; test-only, never
// packaged) compiles the same files with the host C++ compiler, each after
// tests/cuda_host/runtime/runtime.h, an emulation of the runtime that runs a
// grid's threads on the CPU, and registers the kernels for CPU tensors under
// the test namespace lltm_cuda_host, which declares the very schemas of
// csrc/lltm_ops.cpp (compiled again with LLTM_OPS_NAMESPACE=lltm_cuda_host).
// Nothing here includes the emulation: it provides what the #else branch
// below takes from CUDA's headers.
#pragma once

#include <torch/csrc/stable/library.h>

#include <cstdint>
#include <cstring>
#include <utility>

#include "lltm_cuda_tf32_bits.h"

namespace lltm::cuda {
// Devices whose answers are remembered (lltm_cuda_device_cache.h).
constexpr int kDeviceSlots = 64;
}  // namespace lltm::cuda

#ifdef LLTM_CUDA_HOST

#ifndef LLTM_CUDA_HOST_EMULATION
#error "the host build includes tests/cuda_host/runtime/runtime.h before any csrc/cuda source"
#endif

#define LLTM_CUDA_DISPATCH_KEY CPU
// `kernel` (grid, block, stream)(args...): every thread of the grid, in turn;
// returns the launch's own error, as the nvcc build's does.
#define LLTM_LAUNCH(grid, block, stream, ...) \
  ::lltm::cuda_host::launch(grid, block, stream, __VA_ARGS__)

namespace lltm::cuda {
// What a device answers (attributes, occupancy, kernel attributes set) is
// remembered under a slot per device (lltm_cuda_device_cache.h). CPU tensors
// run on the one emulated GPU, whose slot is 0; a test may change that GPU
// between calls, which starts a new epoch: answers of an older one are
// asked again.
inline int device_slot(int device) { return device == -1 ? 0 : -1; }
inline uint64_t device_epoch() { return ::lltm::cuda_host::gpu_epoch(); }
// Makes `device` the calling thread's current device, as a thread of its own
// that queries it must (the kernel attributes set there are the device's):
// -1, the emulated GPU of CPU tensors, as the ops' DeviceGuard selects it.
inline cudaError_t select_device(int device) { return ::lltm::cuda_host::select_device(device); }
// The warp's mma.sync m16n8k16 (see the nvcc build's below), on the
// emulated GPU's tensor cores; the pair in one rendezvous of the warp.
template <bool kBFloat16>
inline void warp_mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  ::lltm::cuda_host::mma_m16n8k16(
      kBFloat16 ? ::lltm::cuda_host::MmaInput::kBFloat16 : ::lltm::cuda_host::MmaInput::kFloat16, d,
      a, &b, 1);
}
// The warp's mma.sync m16n8k8 .tf32 (see the nvcc build's below), on the
// emulated GPU's tensor cores.
inline void warp_mma_m16n8k8_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  ::lltm::cuda_host::mma_m16n8k8_tf32(d, a, b);
}
// Whether v is finite (finite_value below).
inline bool finite_value(float v) { return v - v == 0.0f; }
// x rounded to TF32 (tf32_bits), a float32 whose low 13 bits are zero.
inline float round_to_tf32(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  bits = tf32_bits(bits);
  std::memcpy(&x, &bits, sizeof bits);
  return x;
}
template <bool kBFloat16>
inline void warp_mma_m16n8k16_pair(float (&d)[4], const uint32_t (&a)[4],
                                   const uint32_t (&first)[2], const uint32_t (&second)[2]) {
  const uint32_t b[2][2] = {{first[0], first[1]}, {second[0], second[1]}};
  ::lltm::cuda_host::mma_m16n8k16(
      kBFloat16 ? ::lltm::cuda_host::MmaInput::kBFloat16 : ::lltm::cuda_host::MmaInput::kFloat16, d,
      a, b, 2);
}
}  // namespace lltm::cuda

#else

#include <cuda_runtime.h>
#include <torch/csrc/stable/accelerator.h>
#ifdef __CUDACC__
#include <cooperative_groups.h>
#endif

#define LLTM_CUDA_DISPATCH_KEY CUDA
// `kernel` (grid, block, stream)(args...): a launch with no shared memory,
// returning the launch's own error (check_launch, lltm_cuda_launch.cuh).
// Through cudaLaunchKernelEx rather than <<<>>>, which returns nothing: the
// only way to learn a <<<>>> launch's error is the thread's last error,
// which may as well hold another library's. The kernel comes last, so that
// its template arguments may hold commas.
#define LLTM_LAUNCH(grid, block, stream, ...) \
  ::lltm::cuda::plain_launch(grid, block, stream, __VA_ARGS__)

// A misaligned vector access faults on the GPU itself (the host build checks
// each one).
#define LLTM_CHECK_ALIGNED(pointer, alignment) ((void)0)

namespace lltm::cuda {
using DeviceGuard = torch::stable::accelerator::DeviceGuard;

// What a device answers (attributes, occupancy, kernel attributes set) is
// remembered under a slot per device (lltm_cuda_device_cache.h): devices
// 0 to 63 have one (-1: none, asked at every call). A GPU's answers hold for
// the process: one epoch.
inline int device_slot(int device) { return device >= 0 && device < kDeviceSlots ? device : -1; }
inline uint64_t device_epoch() { return 0; }
// Makes `device` the calling thread's current device, as a thread of its own
// that queries it must (the kernel attributes set there are the device's).
inline cudaError_t select_device(int device) {
  return device >= 0 ? cudaSetDevice(device) : cudaSuccess;
}

// LLTM_LAUNCH's launch: the arguments converted to the kernel's parameter
// types, as <<<>>> converts them (cudaLaunchKernelEx's C++ form).
template <typename... Params>
class PlainLaunch {
 public:
  PlainLaunch(dim3 grid, dim3 block, cudaStream_t stream, void (*kernel)(Params...))
      : kernel_(kernel) {
    config_.gridDim = grid;
    config_.blockDim = block;
    config_.dynamicSmemBytes = 0;
    config_.stream = stream;
    config_.attrs = nullptr;
    config_.numAttrs = 0;
  }

  template <typename... Args>
  cudaError_t operator()(Args&&... args) const {
    return cudaLaunchKernelEx(&config_, kernel_, std::forward<Args>(args)...);
  }

 private:
  cudaLaunchConfig_t config_ = {};
  void (*kernel_)(Params...);
};

template <typename... Params>
PlainLaunch<Params...> plain_launch(dim3 grid, dim3 block, cudaStream_t stream,
                                    void (*kernel)(Params...)) {
  return PlainLaunch<Params...>(grid, block, stream, kernel);
}

// Device code, for nvcc only: lltm_cuda_library_exports.cpp, host code compiled by the host
// compiler, includes this file too.
#ifdef __CUDACC__
// Block, cluster and grid barriers.
namespace cg = cooperative_groups;

// The block's dynamic shared memory (the launch's dynamicSmemBytes), 16-byte
// aligned. Kernels take all their shared memory from here: the host build
// gives every block an arena of its own, which a static __shared__ variable
// could not have there.
__device__ __forceinline__ unsigned char* dynamic_shared_memory() {
  extern __shared__ __align__(16) unsigned char lltm_dynamic_shared[];
  return lltm_dynamic_shared;
}

// d = A B + d on the tensor cores: the warp's
// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32, each
// lane holding the fragments the PTX ISA lays out for it
// (lltm_cuda_tensor_cores.cuh), every lane of the warp taking part. From
// sm_80 on; the plan never picks it below, and code compiled for older GPUs
// stops at once.
template <bool kBFloat16>
__device__ __forceinline__ void warp_mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4],
                                                  const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (kBFloat16) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
#else
  (void)d;
  (void)a;
  (void)b;
  __trap();
#endif
}

// d = A first + d, then d = A second + d: two instructions sharing A (one
// rendezvous of the warp in the host build's emulation).
template <bool kBFloat16>
__device__ __forceinline__ void warp_mma_m16n8k16_pair(float (&d)[4], const uint32_t (&a)[4],
                                                       const uint32_t (&first)[2],
                                                       const uint32_t (&second)[2]) {
  warp_mma_m16n8k16<kBFloat16>(d, a, first);
  warp_mma_m16n8k16<kBFloat16>(d, a, second);
}

// d = A B + d on the tensor cores in TF32: the warp's
// mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32, A 16 x 8 and B 8 x 8
// of TF32 values in 32-bit registers, one element a register (fragments:
// lltm_cuda_tensor_cores.cuh). lltm passes values already rounded
// (round_to_tf32): what the instruction does with the low 13 bits of an
// operand is not lltm's to rely on. From sm_80 on, as m16n8k16.
__device__ __forceinline__ void warp_mma_m16n8k8_tf32(float (&d)[4], const uint32_t (&a)[4],
                                                      const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  (void)d;
  (void)a;
  (void)b;
  __trap();
#endif
}

// Whether v is finite: v - v is 0 for every finite v and NaN for inf and
// NaN (IEEE arithmetic; lltm is never built with fast-math).
__device__ __forceinline__ bool finite_value(float v) { return v - v == 0.0f; }

// x rounded to TF32 (tf32_bits): cvt.rna.tf32.f32 from sm_80 on, its 13
// bits below TF32's cleared here rather than relied on, so that the value is
// the same wherever it is read as a float32; NaN kept as it is. Below sm_80
// (where no plan takes TF32) the same rounding in integer arithmetic.
__device__ __forceinline__ float round_to_tf32(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t bits;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(bits) : "f"(x));
  return x != x ? x : __uint_as_float(bits & 0xffffe000u);
#else
  return __uint_as_float(tf32_bits(__float_as_uint(x)));
#endif
}
#endif
}  // namespace lltm::cuda

#endif

#ifndef LLTM_OPS_NAMESPACE
#define LLTM_OPS_NAMESPACE lltm
#endif

// STABLE_TORCH_LIBRARY_IMPL(lltm, CUDA, m), or in the host build
// STABLE_TORCH_LIBRARY_IMPL(lltm_cuda_host, CPU, m). Two levels, so that the
// macros above are expanded before torch's pastes them into names.
#define LLTM_CUDA_KERNELS_(ns, key, m) STABLE_TORCH_LIBRARY_IMPL(ns, key, m)
#define LLTM_CUDA_KERNELS(m) LLTM_CUDA_KERNELS_(LLTM_OPS_NAMESPACE, LLTM_CUDA_DISPATCH_KEY, m)
