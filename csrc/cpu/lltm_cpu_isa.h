// Which x86-64 instruction set lltm's CPU kernels run, chosen at run time.
//
// On x86-64 with GCC or Clang the vectorized kernels (lltm_cpu_spans.h,
// lltm_cpu_gemm.h) are compiled a second and third time, for AVX2+FMA and
// for AVX-512, and the widest set the CPU supports is picked once, at the
// first call. The baseline (SSE2 on x86-64, NEON on arm64) is always there,
// so the library runs on any CPU of its architecture. LLTM_CPU_ISA=
// baseline|avx2 forces a lower set, to test or time every variant on one
// machine.
#pragma once

#include <cstdlib>
#include <cstring>

#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(_MSC_VER)
#define LLTM_X86_DISPATCH 1
#define LLTM_TARGET_AVX2 __attribute__((target("avx2,fma")))
#define LLTM_TARGET_AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")))
#else
#define LLTM_X86_DISPATCH 0
#endif

// The vectorized loops are written as small functions that must be inlined
// into the per-instruction-set entry points to be compiled for that set.
#if defined(__GNUC__) || defined(__clang__)
#define LLTM_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define LLTM_ALWAYS_INLINE __forceinline
#endif

namespace lltm::cpu {

enum class Isa { kBaseline, kAvx2, kAvx512 };

inline const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx2:
      return "avx2";
    default:
      return "baseline";
  }
}

inline Isa detect_isa() {
  Isa best = Isa::kBaseline;
#if LLTM_X86_DISPATCH
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) best = Isa::kAvx2;
  if (best == Isa::kAvx2 && __builtin_cpu_supports("avx512f") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq")) {
    best = Isa::kAvx512;
  }
#endif
  // An explicit request can only lower the choice: never run what the CPU
  // lacks.
  if (const char* forced = std::getenv("LLTM_CPU_ISA")) {
    if (std::strcmp(forced, "baseline") == 0) best = Isa::kBaseline;
    if (std::strcmp(forced, "avx2") == 0 && best == Isa::kAvx512) best = Isa::kAvx2;
  }
  return best;
}

inline Isa selected_isa() {
  static const Isa isa = detect_isa();
  return isa;
}

}  // namespace lltm::cpu
