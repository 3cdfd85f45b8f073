// The emulated cuBLAS's GEMM (calls.h, cublas_addmm_out): torch's CPU addmm,
// with float32 operands rounded to TF32 first where cuBLAS would run the
// product on the TF32 tensor cores, so that the host build sees what TF32
// does to the products the CUDA sources leave to cuBLAS.
//
// cuBLAS follows torch's own setting (torch.backends.cuda.matmul, which
// torch.set_float32_matmul_precision sets) at each call, on a GPU of compute
// capability 8.0 or later. The stable ABI has no way to read that setting,
// so this file alone of the host build is compiled against torch's full
// C++ API (the build's TORCH_TARGET_VERSION undefined here) and reads it
// there, as torch's cuBLAS handles do. The rounding is to nearest, ties away
// from zero (cvt.rna.tf32.f32: lltm_cuda_runtime.h, tf32_bits); cuBLAS does
// not say how it rounds, and a product whose operands are TF32 values
// already, as lltm's split terms are, is the same either way.
#undef TORCH_TARGET_VERSION

#include <ATen/ATen.h>
#include <ATen/Context.h>

#include <cstdint>
#include <cstring>

#include "calls.h"
#include "cuda/lltm_cuda_tf32_bits.h"

namespace lltm::cuda_host {
namespace {

at::Tensor rounded_to_tf32(const at::Tensor& t) {
  at::Tensor out = t.contiguous().clone();
  float* p = out.data_ptr<float>();
  for (int64_t i = 0, n = out.numel(); i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, p + i, sizeof bits);
    bits = ::lltm::cuda::tf32_bits(bits);
    std::memcpy(p + i, &bits, sizeof bits);
  }
  return out;
}

}  // namespace

AOTITorchError cublas_addmm_out(AtenTensorHandle out, AtenTensorHandle self, AtenTensorHandle mat1,
                                AtenTensorHandle mat2, double beta, double alpha) {
  const at::Tensor& a = *reinterpret_cast<at::Tensor*>(mat1);
  const at::Tensor& b = *reinterpret_cast<at::Tensor*>(mat2);
  // The new API's setting, as torch's cuBLAS handles read it (the legacy
  // getter raises once the two APIs have both been used in a process).
  const bool tf32 =
      capability_major() >= 8 &&
      at::globalContext().float32Precision(at::Float32Backend::CUDA, at::Float32Op::MATMUL) ==
          at::Float32Precision::TF32 &&
      a.scalar_type() == at::kFloat && b.scalar_type() == at::kFloat;
  if (!tf32) return ::aoti_torch_cpu_addmm_out(out, self, mat1, mat2, beta, alpha);
  at::Tensor a_tf32, b_tf32;
  try {
    a_tf32 = rounded_to_tf32(a);
    b_tf32 = rounded_to_tf32(b);
  } catch (...) {
    return AOTI_TORCH_FAILURE;
  }
  return ::aoti_torch_cpu_addmm_out(out, self, reinterpret_cast<AtenTensorHandle>(&a_tf32),
                                    reinterpret_cast<AtenTensorHandle>(&b_tf32), beta, alpha);
}

}  // namespace lltm::cuda_host
