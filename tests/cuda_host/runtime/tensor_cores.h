// The tensor-core instruction lltm's kernels use, on the emulated GPU:
// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32, a warp's
// D (16 x 8, float32) = A (16 x 16) B (16 x 8) + C, with each lane holding
// the fragments the PTX ISA defines for that shape ("Matrix Fragments for
// mma.m16n8k16 with floating point type"). With groupID = lane / 4 and
// t = lane % 4:
//   A: four 32-bit registers of two elements each, low half first:
//      a0, a1: (groupID, 2t), (groupID, 2t + 1); a2, a3: row groupID + 8;
//      a4 to a7: the same rows, columns + 8.
//   B: two registers: b0, b1: (2t, groupID), (2t + 1, groupID); b2, b3:
//      rows + 8.
//   C, D: four floats: c0, c1: (groupID, 2t), (groupID, 2t + 1); c2, c3:
//      row groupID + 8.
// Every lane passes its fragments through the warp's exchange (fibers.h),
// so a lane that does not take part, or a fragment in the wrong place,
// gives a fault or a wrong product, as on the GPU. The products of 16-bit
// inputs are exact in float32; each element of D adds them in k order to C.
//
// And mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32, D (16 x 8,
// float32) = A (16 x 8) B (8 x 8) + C, one TF32 element (a float32's bits)
// a register ("Matrix Fragments for mma.m16n8k8" with .tf32):
//   A: a0: (groupID, t), a1: (groupID + 8, t), a2: (groupID, t + 4),
//      a3: (groupID + 8, t + 4).
//   B: b0: (t, groupID), b1: (t + 4, groupID).
//   C, D: as m16n8k16's.
// The ISA defines the operands as TF32 and leaves what the hardware does
// with the low 13 bits of a register unspecified; the emulation ignores
// them (an operand is its register with those bits cleared, truncation),
// which is what the low bits of a value rounded to TF32 hold anyway: the
// kernels round every operand first (lltm_cuda_runtime.h, round_to_tf32),
// so their results do not depend on this choice. The products of TF32
// values (11-bit significands) are exact in float32, and each element of D
// adds them in k order to C, as for 16 bits.
//
// Each warp's instruction is counted by its name, once a warp
// (instructions() below; apart from calls.h's device work, which tests hold
// to declared numbers).
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace lltm::cuda_host {

enum class MmaInput : int { kBFloat16 = 0, kFloat16 = 1 };

// A 16-bit input's value.
float mma_input_value(uint16_t bits, MmaInput type);

// For the calling lane's fragments: d = A b[0] + d, then d = A b[i] + d for
// each further i < count (at most 2: one instruction, or two sharing A, in
// one rendezvous of the warp). Faults below compute capability 8.0 (where
// the instruction does not exist for these types).
void mma_m16n8k16(MmaInput type, float (&d)[4], const uint32_t (&a)[4], const uint32_t (*b)[2],
                  int count);

// For the calling lane's fragments: d = A b + d in TF32 (m16n8k8). Faults
// below compute capability 8.0.
void mma_m16n8k8_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]);

// A TF32 operand's value: the register's low 13 bits ignored.
float mma_tf32_value(uint32_t bits);

// The tensor-core instructions run so far, warps counted once, by the
// instruction's name (never reset: tests take differences; thread-safe).
std::map<std::string, int64_t> instructions();

}  // namespace lltm::cuda_host
