// The sequence's fused steps in float and double, the entry of this folder:
// the kernels of each instruction set and the choice for this CPU
// (recurrent_kernels()). Each step's products run as register tiles on
// weights packed once per call (weight_panels.h), with the step's pointwise
// work next to them (forward_steps.h, backward_steps.h).
//
// A step's product is small (16 x 160 by 160 x 384 at the tutorial's size);
// a library GEMM call packs its right-hand side every time and ran these at
// about 60 % of the core's FMA peak. Here the weights stay packed for every
// step ("weights-stationary"):
//
//   forward   gates = b + x_t W_x^T + h_prev W_h^T in one pass of register
//             tiles over k < features + state (bias and input projection
//             included: no separate pass over the gates). The packed columns
//             interleave the gates, so that a tile of kTileRows rows by three
//             vectors holds the input gates, output gates and candidates of
//             kTileRows x L cells (L = SIMD lanes), and the tile ends in the
//             cell's pointwise forward on its own registers: activations, new
//             cell and new h, each written once.
//   backward  per step, dh = dg_{t+1} W_h (tiles of kTileRows rows by up to
//             three vectors of state columns, into the running gradient of
//             h), then the cell's backward of those rows while they are in
//             L1: d_gates of step t, the gradient of c_prev, grad_bias sums.
//             (Fused into each tile's epilogue, as in the forward, the
//             per-tile bookkeeping cost more than it saved: the product is
//             read once, from L1, either way.)
//
// Measured per step against the packed GEMM and separate pointwise pass
// these replace (AVX2, one core of a 2-core AMD EPYC, Zen 3, float, medians
// of interleaved runs): at (16, 32, 128) forward 0.96x, backward 0.93x the
// time; at (64, 256, 512) forward 0.98x-1.0x, backward 0.92x-0.96x.
//
// Instruction sets (isa.h): one source, compiled per set through a small
// struct of the set's vector width, tile height and target attribute
// (BaselineSet, Avx2Set, Avx512Set, NeonSet below): AVX-512 (64-byte vectors,
// 8-row tiles), AVX2+FMA (32 bytes, 4 rows), NEON on arm64 (16 bytes, 6
// rows) and the baseline (16 bytes, 4 rows: SSE2 on x86-64, NEON under
// LLTM_CPU_ISA=baseline on arm64, whatever 16-byte vectors the compiler
// lowers to elsewhere). Another set is one more such struct and one more
// case in recurrent_kernels(). The vectors are GCC/Clang vector extensions
// (simd.h); other compilers (MSVC) get no kernels here, and the sequence
// runs the cell's path with torch's GEMM.
//
// The pointwise math is the cell's (pointwise/scalar_math.h, formula for
// formula), and every product sums over k in the same order whatever the
// vector width, so AVX2 and AVX-512 give the same bits. So should arm64's
// baseline and NEON, by the same argument (both contract a * b + c into one
// FMA, and the tile height changes which rows run together, never a row's
// arithmetic), though no test has compared them on an arm64 CPU yet.
#pragma once

#include <cstdint>
#include <type_traits>

#include "../isa.h"
#include "step_args.h"

#if defined(__GNUC__) || defined(__clang__)
#define LLTM_RECURRENCE_KERNELS 1
#include "backward_steps.h"
#include "forward_steps.h"
#else
#define LLTM_RECURRENCE_KERNELS 0
#endif

namespace lltm::cpu {

// The kernels of one instruction set for one element type. Each runs rows
// [first, last) of the batch through every step; blocks of rows never
// interact, so threads can run disjoint blocks at once. backward adds the
// block's d_gates column sums to bias_sums (3S doubles) unless it is null.
template <typename T>
struct RecurrentKernels {
  int64_t lanes;
  // Threads take the batch in blocks of this many rows (or multiples): whole
  // register tiles, at least 8 rows (the blocks the x86-64 sets were
  // measured with; 12 for NEON's 6-row tiles).
  int64_t block_rows;
  void (*forward)(const ForwardSteps<T>&, int64_t first, int64_t last);
  void (*backward)(const BackwardSteps<T>&, int64_t first, int64_t last, double* bias_sums);
};

#if LLTM_RECURRENCE_KERNELS

// --- Per instruction set ------------------------------------------------------------
//
// A set is its vector width, its tile height (rows of a register tile: as
// many accumulators as leave registers for the operands) and the target
// attribute of its two entry points, into which everything above inlines.

// The sets that need no target attribute: the architecture's baseline
// compiles them.
template <int VectorBytes, int TileRows>
struct PortableSet {
  static constexpr int kVectorBytes = VectorBytes;
  static constexpr int kTileRows = TileRows;
  template <typename T>
  static void forward(const ForwardSteps<T>& args, int64_t first, int64_t last) {
    forward_block<T, PortableSet>(args, first, last);
  }
  template <typename T>
  static void backward(const BackwardSteps<T>& args, int64_t first, int64_t last,
                       double* bias_sums) {
    backward_block<T, PortableSet>(args, first, last, bias_sums);
  }
};

using BaselineSet = PortableSet<16, 4>;

#if LLTM_X86_DISPATCH
struct Avx2Set {
  static constexpr int kVectorBytes = 32;
  static constexpr int kTileRows = 4;
  template <typename T>
  LLTM_TARGET_AVX2 static void forward(const ForwardSteps<T>& args, int64_t first, int64_t last) {
    forward_block<T, Avx2Set>(args, first, last);
  }
  template <typename T>
  LLTM_TARGET_AVX2 static void backward(const BackwardSteps<T>& args, int64_t first, int64_t last,
                                        double* bias_sums) {
    backward_block<T, Avx2Set>(args, first, last, bias_sums);
  }
};

struct Avx512Set {
  static constexpr int kVectorBytes = 64;
  static constexpr int kTileRows = 8;
  template <typename T>
  LLTM_TARGET_AVX512 static void forward(const ForwardSteps<T>& args, int64_t first, int64_t last) {
    forward_block<T, Avx512Set>(args, first, last);
  }
  template <typename T>
  LLTM_TARGET_AVX512 static void backward(const BackwardSteps<T>& args, int64_t first, int64_t last,
                                          double* bias_sums) {
    backward_block<T, Avx512Set>(args, first, last, bias_sums);
  }
};
#endif  // LLTM_X86_DISPATCH

#if LLTM_ARM64_NEON
// NEON's 32 registers of 16 bytes (the baseline's tiles are sized for
// SSE2's 16): a forward tile of 6 rows holds 18 accumulators, 3 vectors of
// the panel's row and the 6 values of x or h broadcast from its rows; 8 rows
// (24 accumulators) would leave too few for those. No target attribute:
// NEON, and FMA with it, is every arm64 CPU's.
using NeonSet = PortableSet<16, 6>;
#endif  // LLTM_ARM64_NEON

template <typename Set, typename T>
const RecurrentKernels<T>* kernels_of() {
  constexpr int64_t kBlockRows = (8 + Set::kTileRows - 1) / Set::kTileRows * Set::kTileRows;
  static const RecurrentKernels<T> kernels{Set::kVectorBytes / static_cast<int64_t>(sizeof(T)),
                                           kBlockRows, &Set::template forward<T>,
                                           &Set::template backward<T>};
  return &kernels;
}

#endif  // LLTM_RECURRENCE_KERNELS

// The kernels for this CPU and element type (float, double), or nullptr
// where there are none (other element types, compilers without vector
// extensions): the sequence then runs the cell's path with torch's GEMM.
template <typename T>
const RecurrentKernels<T>* recurrent_kernels() {
#if LLTM_RECURRENCE_KERNELS
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    switch (selected_isa()) {
#if LLTM_X86_DISPATCH
      case Isa::kAvx512:
        return kernels_of<Avx512Set, T>();
      case Isa::kAvx2:
        return kernels_of<Avx2Set, T>();
#endif
#if LLTM_ARM64_NEON
      case Isa::kNeon:
        return kernels_of<NeonSet, T>();
#endif
      default:
        return kernels_of<BaselineSet, T>();
    }
  }
#endif
  return nullptr;
}

}  // namespace lltm::cpu
