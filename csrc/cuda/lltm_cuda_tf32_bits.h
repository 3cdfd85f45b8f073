// TF32's rounding of a float32, in integer arithmetic: the host's and the
// device's (lltm_cuda_runtime.h, round_to_tf32), and the host build's
// emulated cuBLAS (tests/cuda_host/runtime/cublas.cpp). No dependencies.
#pragma once

#include <cstdint>

namespace lltm::cuda {
// The TF32 bits of a float32 x: its significand rounded to 10 bits, to
// nearest with ties away from zero, as cvt.rna.tf32.f32 rounds (round_to_tf32 in
// lltm_cuda_runtime.h), the 13 bits dropped left zero. Finite values past
// TF32's largest round to infinity; infinities and NaN are kept as they are
// (clearing a NaN's low bits could make it an infinity).
constexpr uint32_t tf32_bits(uint32_t x) {
  return (x & 0x7f800000u) == 0x7f800000u ? x : (x + 0x1000u) & 0xffffe000u;
}
}  // namespace lltm::cuda
