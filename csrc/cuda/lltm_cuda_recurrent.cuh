// The sequence's recurrent products, gates_t += h_prev @ W_h^T (forward) and
// grad_h = d_gates_t @ W_h (backward), at the sizes where cuBLAS has the least
// to work with: a few rows (the batch) against the (3 state, state) recurrent
// weights, once per step. For float32 there cuBLAS tiles the output 32 x 128:
// the tutorial's (16, 128) x (128, 384) is 3 thread blocks on a GPU of 132
// multiprocessors, 32 us a step on an H200 and 4.1 of a sequence's 4.5 ms of
// GPU time at T = 50 (benchmarks/RESULTS.md, the per-step path's profile).
// Here one thread computes one output element: the threads of a warp share a
// row of `a` (one broadcast load) and read consecutive columns of `b` (one
// coalesced load), and every multiprocessor has work from the first step.
//
// Each thread sums its `inner` products in turn, so the kernel's time grows
// with the inner dimension, where cuBLAS's hardly does. Measured on an H200
// at T = 50 (benchmarks/RESULTS.md, the per-step path's sequence tables,
// lltm 0.2.0, torch 2.11.0+cu130): at the tutorial's size, whose products
// have an inner dimension of 128 forward and 384 backward, a step took
// 16 us forward and 38 us backward with this kernel, against 36 us and
// 57 us through cuBLAS; at (8, 32, 256) the forward (inner 256) tied with
// cuBLAS, and the backward (inner 768) took 3.5 ms where torch's matrix
// products alone took 0.9 ms.
// Hence the limits below: inner at most 384, and at most 2**22 multiply-adds.
//
// float and double only. In 16 bits the products stay cuBLAS's: the forward
// rounds each step's pre-activations once, with the bias, as the cell does
// (lltm_cuda_sequence_forward.cu).
//
// float32 in TF32 (`tf32`, tf32_products: the call allows it on a GPU that
// has it): this kernel runs on the CUDA cores, in float32, TF32 or not; the
// products TF32 allows are as accurate as float32's (three TF32 terms:
// lltm_cuda_tensor_cores.cuh), and so are this kernel's. Where the products
// go to cuBLAS, in TF32 they are three of its TF32 GEMMs on each operand's
// two terms (lltm_cuda_tf32_gemm.cuh), else one exact float32 GEMM: cuBLAS
// follows torch's setting (torch.backends.cuda.matmul), which allow_tf32
// follows too.
#pragma once

#include <torch/csrc/stable/tensor.h>

#include <algorithm>
#include <cstdint>
#include <optional>

#include "../lltm_tensor.h"
#include "lltm_cuda_launch.cuh"
#include "lltm_cuda_runtime.h"
#include "lltm_cuda_tf32_gemm.cuh"
#include "lltm_cuda_torch_ops.cuh"

namespace lltm::cuda {

using torch::stable::Tensor;

// The products the kernel below takes: inner dimension and multiply-adds
// (rows x cols x inner) at most these. The tutorial's (16 x 384 x 128) is a
// fifth of the latter.
constexpr int64_t kRecurrentProductMaxInner = 384;
constexpr int64_t kRecurrentProductMaxWork = int64_t(1) << 22;
constexpr int64_t kRecurrentProductThreads = 128;

// out[i, j] = (accumulate ? out[i, j] : 0) + sum_k a[i, k] * b[k, j], rows of
// each matrix ld* elements apart, columns adjacent. Grid-stride over the
// output's elements; offsets are 64-bit.
template <typename T>
__global__ void recurrent_product_kernel(T* out, int64_t ldo, const T* a, int64_t lda, const T* b,
                                         int64_t ldb, int64_t rows, int64_t cols, int64_t inner,
                                         bool accumulate) {
  const int64_t count = rows * cols;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < count; e += stride) {
    const int64_t i = e / cols;
    const int64_t j = e - i * cols;
    const T* a_row = a + i * lda;
    const T* b_col = b + j;
    // Four running sums: four independent loads and multiply-adds in flight.
    T s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int64_t k = 0;
    for (; k + 4 <= inner; k += 4) {
      s0 += a_row[k] * b_col[k * ldb];
      s1 += a_row[k + 1] * b_col[(k + 1) * ldb];
      s2 += a_row[k + 2] * b_col[(k + 2) * ldb];
      s3 += a_row[k + 3] * b_col[(k + 3) * ldb];
    }
    for (; k < inner; ++k) s0 += a_row[k] * b_col[k * ldb];
    const T sum = (s0 + s1) + (s2 + s3);
    T* o = out + i * ldo + j;
    *o = accumulate ? *o + sum : sum;
  }
}

// Whether recurrent_product runs its own kernel for a (rows, inner) x
// (inner, cols) product of `like`'s dtype; the forward packs W_h^T for it.
inline bool own_recurrent_product(const Tensor& like, int64_t rows, int64_t cols, int64_t inner) {
  return !is_16_bit(like) && inner <= kRecurrentProductMaxInner &&
         rows * cols * inner <= kRecurrentProductMaxWork;
}

// A call's recurrent products, out = (accumulate ? out : 0) + a @ b, b the
// same each step (W_h^T forward, W_h backward; (inner, cols)), a a step's
// rows (at most `max_rows`), on the current stream: the kernel above where
// own_recurrent_product says so and every matrix has adjacent columns, else
// cuBLAS: with `tf32` (float32 in TF32) three TF32 GEMMs, b split once for
// the call (Tf32Product), else torch's addmm.
class RecurrentProduct {
 public:
  RecurrentProduct(const Tensor& b, int64_t max_rows, bool tf32)
      : b_(b), max_rows_(max_rows), tf32_(tf32) {}

  void operator()(Tensor& out, const Tensor& a, bool accumulate) {
    const int64_t rows = a.size(0);
    const int64_t inner = a.size(1);
    const int64_t cols = b_.size(1);
    const bool adjacent_columns = (inner <= 1 || a.stride(1) == 1) &&
                                  (cols <= 1 || (b_.stride(1) == 1 && out.stride(1) == 1));
    if (own_recurrent_product(a, rows, cols, inner) && adjacent_columns) {
      own_kernel(out, a, accumulate);
    } else if (tf32_) {
      if (!split_) split_.emplace(b_, max_rows_);
      split_->run(out, a, accumulate ? 1.0 : 0.0);
    } else {
      addmm_out(out, out, a, b_, accumulate ? 1.0 : 0.0);
    }
  }

 private:
  void own_kernel(Tensor& out, const Tensor& a, bool accumulate) const {
    const int64_t rows = a.size(0);
    const int64_t inner = a.size(1);
    const int64_t cols = b_.size(1);
    if (rows == 0 || cols == 0) return;
    const int32_t device = out.get_device_index();
    const cudaStream_t stream = current_stream(device);
    const int64_t max_blocks =
        std::max<int64_t>(1, multiprocessor_count(device)) * kMaxBlocksPerMultiprocessor;
    const dim3 grid(static_cast<unsigned>(
        std::min(ceil_div(rows * cols, kRecurrentProductThreads), max_blocks)));
    const dim3 block(static_cast<unsigned>(kRecurrentProductThreads));
    cudaError_t error;
    if (a.scalar_type() == torch::headeronly::ScalarType::Double) {
      error = LLTM_LAUNCH(grid, block, stream, recurrent_product_kernel<double>)(
          out.mutable_data_ptr<double>(), out.stride(0), a.const_data_ptr<double>(), a.stride(0),
          b_.const_data_ptr<double>(), b_.stride(0), rows, cols, inner, accumulate);
    } else {
      error = LLTM_LAUNCH(grid, block, stream, recurrent_product_kernel<float>)(
          out.mutable_data_ptr<float>(), out.stride(0), a.const_data_ptr<float>(), a.stride(0),
          b_.const_data_ptr<float>(), b_.stride(0), rows, cols, inner, accumulate);
    }
    check_launch("lltm recurrent_product_kernel", error);
  }

  Tensor b_;
  int64_t max_rows_;
  bool tf32_;
  std::optional<Tf32Product> split_;
};

}  // namespace lltm::cuda
