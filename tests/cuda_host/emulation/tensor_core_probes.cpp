// Probes of the emulated tensor cores, for tests/test_cuda_host.py
// (test-only): mma.sync m16n8k16 with fragments built here from the PTX
// ISA's layout, written out again (not taken from csrc/cuda), so that the
// emulation's reading of them is checked against the instruction's
// definition; and csrc/cuda/lltm_cuda_tensor_cores.cuh's block product, the
// one the persistent kernels run, at any size.
#include "module.h"
// The emulation first, then the CUDA sources' helpers.
#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda/lltm_cuda_launch.cuh"
#include "cuda/lltm_cuda_tensor_cores.cuh"

namespace lltm::cuda_host::probes {

// Every warp of the block computes D = A B + C from A (16 x 16), B (16 x 8)
// as 16-bit patterns and C (16 x 8) in row-major order; warp 0 writes D.
// Lane `absent` (-1: none) returns before the instruction.
template <bool kBFloat16>
__global__ void mma_kernel(const uint16_t* a, const uint16_t* b, const float* c, float* d,
                           int absent) {
  const int lane = int(threadIdx.x % 32), group = lane / 4, t = lane % 4;
  if (int(threadIdx.x) == absent) return;
  uint32_t a_registers[4], b_registers[2];
  float accumulators[4];
  for (int i = 0; i < 8;
       ++i) {  // a_i: rows group (+ 8 for i in 2, 3, 6, 7), columns 2t + i % 2 (+ 8 from i = 4)
    const int row = (i < 2 || (i >= 4 && i < 6)) ? group : group + 8;
    const int col = 2 * t + (i & 1) + (i >= 4 ? 8 : 0);
    const uint32_t bits = a[row * 16 + col];
    if (i % 2 == 0)
      a_registers[i / 2] = bits;
    else
      a_registers[i / 2] |= bits << 16;
  }
  for (int i = 0; i < 4; ++i) {  // b_i: rows 2t + i % 2 (+ 8 from i = 2), column group
    const int row = 2 * t + (i & 1) + (i >= 2 ? 8 : 0);
    const uint32_t bits = b[row * 8 + group];
    if (i % 2 == 0)
      b_registers[i / 2] = bits;
    else
      b_registers[i / 2] |= bits << 16;
  }
  for (int i = 0; i < 4; ++i) {  // c_i: rows group (+ 8 from i = 2), columns 2t + i % 2
    accumulators[i] = c[(group + (i >= 2 ? 8 : 0)) * 8 + 2 * t + (i & 1)];
  }
  lltm::cuda::warp_mma_m16n8k16<kBFloat16>(accumulators, a_registers, b_registers);
  if (threadIdx.x >= 32) return;
  for (int i = 0; i < 4; ++i) d[(group + (i >= 2 ? 8 : 0)) * 8 + 2 * t + (i & 1)] = accumulators[i];
}

// The same for mma.sync m16n8k8 .tf32: A (16 x 8), B (8 x 8) as float32
// bit patterns, one element a register, placed as the PTX ISA's figures
// for m16n8k8 .tf32 show them.
__global__ void mma_tf32_kernel(const uint32_t* a, const uint32_t* b, const float* c, float* d) {
  const int lane = int(threadIdx.x % 32), group = lane / 4, t = lane % 4;
  uint32_t a_registers[4], b_registers[2];
  float accumulators[4];
  a_registers[0] = a[group * 8 + t];
  a_registers[1] = a[(group + 8) * 8 + t];
  a_registers[2] = a[group * 8 + t + 4];
  a_registers[3] = a[(group + 8) * 8 + t + 4];
  b_registers[0] = b[t * 8 + group];
  b_registers[1] = b[(t + 4) * 8 + group];
  for (int i = 0; i < 4; ++i) {
    accumulators[i] = c[(group + (i >= 2 ? 8 : 0)) * 8 + 2 * t + (i & 1)];
  }
  lltm::cuda::warp_mma_m16n8k8_tf32(accumulators, a_registers, b_registers);
  if (threadIdx.x >= 32) return;
  for (int i = 0; i < 4; ++i) d[(group + (i >= 2 ? 8 : 0)) * 8 + 2 * t + (i & 1)] = accumulators[i];
}

// lltm::cuda::tensor_core_product of W (ms x inner, 16-bit: w[m * inner + k]
// where k_contiguous, else w[k * ms + m]) and X (ns x inner, float32, rows
// `inner` apart); each part's D into out[(part * ms + m) * ns + n].
template <typename T>
__global__ void tensor_core_product_kernel(const T* w, const float* x, float* out, int ms, int ns,
                                           int inner, int split, bool k_contiguous) {
  lltm::cuda::tensor_core_product<T>(
      w, k_contiguous ? inner : 1, k_contiguous ? 1 : ms,
      [&](int n, int k) { return x[int64_t(n) * inner + k]; }, ms, ns, inner, split,
      [&](int part, int m, int n, float value) { out[(int64_t(part) * ms + m) * ns + n] = value; });
}

// The same of a float32 W (TF32 values) and X: the product in TF32.
__global__ void tensor_core_product_tf32_kernel(const float* w, const float* x, float* out, int ms,
                                                int ns, int inner, int split, bool k_contiguous) {
  lltm::cuda::tensor_core_product<float>(
      w, k_contiguous ? inner : 1, k_contiguous ? 1 : ms,
      [&](int n, int k) { return x[int64_t(n) * inner + k]; }, ms, ns, inner, split,
      [&](int part, int m, int n, float value) { out[(int64_t(part) * ms + m) * ns + n] = value; });
}

// round_to_tf32 as the kernels run it.
__global__ void round_to_tf32_kernel(const float* x, float* out, int count) {
  for (int i = int(threadIdx.x); i < count; i += int(blockDim.x)) {
    out[i] = lltm::cuda::round_to_tf32(x[i]);
  }
}

}  // namespace lltm::cuda_host::probes

namespace lltm::cuda_host::emulation {
namespace {

template <typename T>
bool parse_list(PyObject* list, std::vector<T>& out) {
  PyObject* sequence = PySequence_Fast(list, "a list");
  if (sequence == nullptr) return false;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(sequence);
  out.resize(static_cast<std::size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = PySequence_Fast_GET_ITEM(sequence, i);
    if constexpr (std::is_floating_point_v<T>) {
      out[i] = static_cast<T>(PyFloat_AsDouble(item));
    } else {
      out[i] = static_cast<T>(PyLong_AsUnsignedLong(item));
    }
  }
  Py_DECREF(sequence);
  return PyErr_Occurred() == nullptr;
}

template <typename Launch>
void launch_fibers(const char* name, unsigned threads, const Launch& launch) {
  const lltm::cuda::DeviceGuard guard(-1);
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(1);
  config.blockDim = dim3(threads);
  config.stream = lltm::cuda::current_stream(-1);
  const cudaError_t error = launch(config);
  if (error != cudaSuccess) lltm::cuda::fail_cuda(std::string("launching ") + name, error);
}

}  // namespace

// mma(a_bits, b_bits, c, bfloat16, threads, absent) -> D (16 x 8, row-major).
PyObject* mma(PyObject*, PyObject* args) {
  PyObject *a_list = nullptr, *b_list = nullptr, *c_list = nullptr;
  int bfloat16 = 0, absent = -1;
  unsigned threads = 32;
  if (!PyArg_ParseTuple(args, "OOOpIi", &a_list, &b_list, &c_list, &bfloat16, &threads, &absent)) {
    return nullptr;
  }
  std::vector<uint16_t> a, b;
  std::vector<float> c;
  if (!parse_list(a_list, a) || !parse_list(b_list, b) || !parse_list(c_list, c)) return nullptr;
  if (a.size() != 256 || b.size() != 128 || c.size() != 128) {
    PyErr_SetString(PyExc_ValueError, "A 16 x 16, B 16 x 8, C 16 x 8");
    return nullptr;
  }
  std::vector<float> d(128, -1.0f);
  const bool ok = python_errors([&] {
    launch_fibers("mma_kernel", threads, [&](const cudaLaunchConfig_t& config) {
      return bfloat16 ? cudaLaunchKernelEx(&config, probes::mma_kernel<true>, a.data(), b.data(),
                                           c.data(), d.data(), absent)
                      : cudaLaunchKernelEx(&config, probes::mma_kernel<false>, a.data(), b.data(),
                                           c.data(), d.data(), absent);
    });
  });
  return ok ? python_list(d) : nullptr;
}

// tensor_core_product(w_bits, x, ms, ns, inner, split, k_contiguous,
// bfloat16, threads) -> each part's D, (split, ms, ns) flattened.
PyObject* tensor_core_product(PyObject*, PyObject* args) {
  PyObject *w_list = nullptr, *x_list = nullptr;
  int ms = 0, ns = 0, inner = 0, split = 1, k_contiguous = 0, bfloat16 = 0;
  unsigned threads = 128;
  if (!PyArg_ParseTuple(args, "OOiiiippI", &w_list, &x_list, &ms, &ns, &inner, &split,
                        &k_contiguous, &bfloat16, &threads)) {
    return nullptr;
  }
  std::vector<uint16_t> w;
  std::vector<float> x;
  if (!parse_list(w_list, w) || !parse_list(x_list, x)) return nullptr;
  if (w.size() != std::size_t(ms) * inner || x.size() != std::size_t(ns) * inner) {
    PyErr_SetString(PyExc_ValueError, "w: ms x inner, x: ns x inner");
    return nullptr;
  }
  std::vector<float> out(std::size_t(split) * ms * ns, 0.0f);
  const bool ok = python_errors([&] {
    launch_fibers("tensor_core_product_kernel", threads, [&](const cudaLaunchConfig_t& config) {
      using torch::headeronly::BFloat16;
      using torch::headeronly::Half;
      if (bfloat16) {
        return cudaLaunchKernelEx(&config, probes::tensor_core_product_kernel<BFloat16>,
                                  reinterpret_cast<const BFloat16*>(w.data()), x.data(), out.data(),
                                  ms, ns, inner, split, k_contiguous != 0);
      }
      return cudaLaunchKernelEx(&config, probes::tensor_core_product_kernel<Half>,
                                reinterpret_cast<const Half*>(w.data()), x.data(), out.data(), ms,
                                ns, inner, split, k_contiguous != 0);
    });
  });
  return ok ? python_list(out) : nullptr;
}

}  // namespace lltm::cuda_host::emulation

namespace lltm::cuda_host::emulation {

// mma_tf32(a_bits, b_bits, c, threads) -> D (16 x 8, row-major): A 16 x 8
// and B 8 x 8 as float32 bit patterns.
PyObject* mma_tf32(PyObject*, PyObject* args) {
  PyObject *a_list = nullptr, *b_list = nullptr, *c_list = nullptr;
  unsigned threads = 32;
  if (!PyArg_ParseTuple(args, "OOOI", &a_list, &b_list, &c_list, &threads)) return nullptr;
  std::vector<uint32_t> a, b;
  std::vector<float> c;
  if (!parse_list(a_list, a) || !parse_list(b_list, b) || !parse_list(c_list, c)) return nullptr;
  if (a.size() != 128 || b.size() != 64 || c.size() != 128) {
    PyErr_SetString(PyExc_ValueError, "A 16 x 8, B 8 x 8, C 16 x 8");
    return nullptr;
  }
  std::vector<float> d(128, -1.0f);
  const bool ok = python_errors([&] {
    launch_fibers("mma_tf32_kernel", threads, [&](const cudaLaunchConfig_t& config) {
      return cudaLaunchKernelEx(&config, probes::mma_tf32_kernel, a.data(), b.data(), c.data(),
                                d.data());
    });
  });
  return ok ? python_list(d) : nullptr;
}

// tensor_core_product_tf32(w, x, ms, ns, inner, split, k_contiguous,
// threads) -> each part's D, (split, ms, ns) flattened.
PyObject* tensor_core_product_tf32(PyObject*, PyObject* args) {
  PyObject *w_list = nullptr, *x_list = nullptr;
  int ms = 0, ns = 0, inner = 0, split = 1, k_contiguous = 0;
  unsigned threads = 128;
  if (!PyArg_ParseTuple(args, "OOiiiipI", &w_list, &x_list, &ms, &ns, &inner, &split, &k_contiguous,
                        &threads)) {
    return nullptr;
  }
  std::vector<float> w, x;
  if (!parse_list(w_list, w) || !parse_list(x_list, x)) return nullptr;
  if (w.size() != std::size_t(ms) * inner || x.size() != std::size_t(ns) * inner) {
    PyErr_SetString(PyExc_ValueError, "w: ms x inner, x: ns x inner");
    return nullptr;
  }
  std::vector<float> out(std::size_t(split) * ms * ns, 0.0f);
  const bool ok = python_errors([&] {
    launch_fibers(
        "tensor_core_product_tf32_kernel", threads, [&](const cudaLaunchConfig_t& config) {
          return cudaLaunchKernelEx(&config, probes::tensor_core_product_tf32_kernel, w.data(),
                                    x.data(), out.data(), ms, ns, inner, split, k_contiguous != 0);
        });
  });
  return ok ? python_list(out) : nullptr;
}

// round_to_tf32(x) -> each element rounded as the kernels round it.
PyObject* round_to_tf32(PyObject*, PyObject* args) {
  PyObject* x_list = nullptr;
  if (!PyArg_ParseTuple(args, "O", &x_list)) return nullptr;
  std::vector<float> x;
  if (!parse_list(x_list, x)) return nullptr;
  std::vector<float> out(x.size(), 0.0f);
  const bool ok = python_errors([&] {
    launch_fibers("round_to_tf32_kernel", 32, [&](const cudaLaunchConfig_t& config) {
      return cudaLaunchKernelEx(&config, probes::round_to_tf32_kernel, x.data(), out.data(),
                                int(x.size()));
    });
  });
  return ok ? python_list(out) : nullptr;
}

}  // namespace lltm::cuda_host::emulation
