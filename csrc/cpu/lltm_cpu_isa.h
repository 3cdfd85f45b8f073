// Which x86-64 instruction set lltm's CPU kernels run, chosen at run time.
//
// On x86-64 with GCC or Clang the vectorized kernels (lltm_cpu_spans.h,
// lltm_cpu_recurrence.h) are compiled a second and third time, for AVX2+FMA and
// for AVX-512, and the widest set the CPU supports is picked once, at the
// first kernel call. The baseline (SSE2 on x86-64, NEON on arm64) is always
// there, so the library runs on any CPU of its architecture.
// LLTM_CPU_ISA=baseline|avx2|avx512 caps the choice, to test or time every
// variant on one machine; lltm._C.cpu_isa() and `lltm info` name the set in
// use.
//
// Any other value is an error, raised (as a ValueError) by the first kernel
// call and by lltm._C.cpu_isa(), and again by every call until it is fixed:
// silently running another set than the one asked for would make a test or
// a timing of one variant measure another. Not at import: `import lltm` and
// `lltm info` must keep working to report the problem, and the choice is made
// at first use anyway, so a value set after the import still counts.
#pragma once

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

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

// The widest set this CPU supports.
inline Isa best_isa() {
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
  return best;
}

// The best set, capped by LLTM_CPU_ISA (unset or empty: no cap). A request
// can only lower the choice: never run what the CPU lacks.
inline Isa detect_isa() {
  const Isa best = best_isa();
  const char* requested = std::getenv("LLTM_CPU_ISA");
  if (requested == nullptr || requested[0] == '\0') return best;
  for (Isa cap : {Isa::kBaseline, Isa::kAvx2, Isa::kAvx512}) {
    if (std::strcmp(requested, isa_name(cap)) == 0) return cap < best ? cap : best;
  }
  throw std::invalid_argument(std::string("lltm: LLTM_CPU_ISA=") + requested +
                              " is not an instruction set of lltm's CPU kernels; use baseline, "
                              "avx2 or avx512, or unset it for the widest this CPU supports");
}

// The set in use, chosen at the first call. Throws std::invalid_argument
// (a ValueError in Python) while LLTM_CPU_ISA is invalid: a static whose
// initialisation throws is initialised again at the next call. Kernels call
// it on entry, before any parallel region, so the error reaches the caller.
inline Isa selected_isa() {
  static const Isa isa = detect_isa();
  return isa;
}

}  // namespace lltm::cpu
