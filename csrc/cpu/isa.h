// Which instruction set lltm's CPU kernels run, chosen at run time.
//
// Each architecture has a baseline, the code every CPU of it runs (SSE2 on
// x86-64, NEON on arm64), and wider or better-fitted variants:
//
//   x86-64 (GCC or Clang): the vectorized kernels (pointwise/span_kernels.h,
//     fused_steps/) are compiled a second and third time, for AVX2+FMA and
//     for AVX-512, and the widest set the CPU supports is picked once, at
//     the first kernel call.
//   arm64 (GCC or Clang): "neon" compiles the sequence's fused steps
//     (fused_steps/) with register tiles sized for NEON's 32 vector
//     registers (the baseline's tiles are the portable ones, sized for
//     SSE2's 16). NEON is part of every arm64 CPU, so it is always the
//     default.
//
// LLTM_CPU_ISA caps the choice (baseline|avx2|avx512 on x86-64,
// baseline|neon on arm64), to test or time every variant on one machine;
// lltm._C.cpu_isa() and `lltm info` name the set in use.
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

#include "../lltm_errors.h"

#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(_MSC_VER)
#define LLTM_X86_DISPATCH 1
#define LLTM_TARGET_AVX2 __attribute__((target("avx2,fma")))
#define LLTM_TARGET_AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")))
#else
#define LLTM_X86_DISPATCH 0
#endif

// arm64's NEON steps are GCC/Clang vector extensions like the others; they
// need no target attribute: NEON is the architecture's own.
#if (defined(__aarch64__) || defined(_M_ARM64)) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(_MSC_VER)
#define LLTM_ARM64_NEON 1
#else
#define LLTM_ARM64_NEON 0
#endif

// The vectorized loops are written as small functions that must be inlined
// into the per-instruction-set entry points to be compiled for that set.
#if defined(__GNUC__) || defined(__clang__)
#define LLTM_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define LLTM_ALWAYS_INLINE __forceinline
#endif

namespace lltm::cpu {

enum class Isa { kBaseline, kAvx2, kAvx512, kNeon };

inline const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kNeon:
      return "neon";
    default:
      return "baseline";
  }
}

// The sets LLTM_CPU_ISA may name on this architecture, narrowest first (a
// build without the wider ones still accepts their names: the CPU's best,
// the baseline there, caps them).
#if defined(__x86_64__) || defined(_M_X64)
constexpr Isa kArchitectureIsas[] = {Isa::kBaseline, Isa::kAvx2, Isa::kAvx512};
constexpr const char* kIsaChoices = "baseline, avx2 or avx512";
#elif defined(__aarch64__) || defined(_M_ARM64)
constexpr Isa kArchitectureIsas[] = {Isa::kBaseline, Isa::kNeon};
constexpr const char* kIsaChoices = "baseline or neon";
#else
constexpr Isa kArchitectureIsas[] = {Isa::kBaseline};
constexpr const char* kIsaChoices = "baseline";
#endif

// Position of `isa` in kArchitectureIsas: what "wider" means.
inline int isa_rank(Isa isa) {
  int rank = 0;
  for (Isa known : kArchitectureIsas) {
    if (known == isa) return rank;
    ++rank;
  }
  return 0;
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
#elif LLTM_ARM64_NEON
  best = Isa::kNeon;
#endif
  return best;
}

// The best set, capped by LLTM_CPU_ISA (unset or empty: no cap). A request
// can only lower the choice: never run what the CPU lacks.
inline Isa detect_isa() {
  const Isa best = best_isa();
  const char* requested = std::getenv("LLTM_CPU_ISA");
  if (requested == nullptr || requested[0] == '\0') return best;
  for (Isa cap : kArchitectureIsas) {
    if (std::strcmp(requested, isa_name(cap)) == 0) {
      return isa_rank(cap) < isa_rank(best) ? cap : best;
    }
  }
  fail_argument(std::string("LLTM_CPU_ISA=") + requested +
                " is not an instruction set of lltm's CPU kernels; use " + kIsaChoices +
                ", or unset it for the widest this CPU supports");
}

// The set in use, chosen at the first call. Raises an argument error
// (a ValueError in Python) while LLTM_CPU_ISA is invalid: a static whose
// initialisation throws is initialised again at the next call. Kernels call
// it on entry, before any parallel region, so the error reaches the caller.
inline Isa selected_isa() {
  static const Isa isa = detect_isa();
  return isa;
}

}  // namespace lltm::cpu
