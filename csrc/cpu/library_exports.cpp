// The plain C functions lltm's CPU library (lltm/lib/lltm_cpu) exports
// besides its operators, read through ctypes (lltm/_native.py, lltm/_C.py):
// the lltm version it was built from, which `lltm info` compares with the
// Python package's to spot a stale build, the oldest torch it loads in, and
// the instruction set its kernels run. The op schemas (lltm_ops.cpp) and the
// CPU kernels (cell_kernel.cpp, sequence_*_kernel.cpp) linked into the same
// library register themselves when it is loaded.
#include <string>

#include "../lltm_library.h"
#include "isa.h"

#ifndef LLTM_VERSION
#error "LLTM_VERSION must be defined by the build (setup.py)"
#endif

LLTM_EXPORT const char* lltm_cpu_lltm_version() { return LLTM_STRINGIFY(LLTM_VERSION); }

LLTM_EXPORT const char* lltm_cpu_torch_target_version() {
  return LLTM_STRINGIFY(TORCH_TARGET_VERSION);
}

// The instruction set the CPU kernels run ("baseline", "avx2", "avx512" or
// "neon"), chosen now if no kernel has run yet; 1 and the message a kernel
// call would raise while LLTM_CPU_ISA is invalid.
LLTM_EXPORT int lltm_cpu_isa(char* out, std::size_t size) {
  return lltm::report([] { return std::string(lltm::cpu::isa_name(lltm::cpu::selected_isa())); },
                      out, size);
}
