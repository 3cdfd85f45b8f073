// mma.sync m16n8k16 on the emulated GPU (tensor_cores.h).
#include <cmath>
#include <cstring>
#include <mutex>
#include <string>

#include "runtime.h"

namespace lltm::cuda_host {
namespace {

// What one lane passes to the others: its A fragment and up to two B ones.
struct Fragments {
  uint32_t a[4];
  uint32_t b[2][2];
};
static_assert(sizeof(Fragments) <= kWarpExchangeBytes);

// Element i (0 to 7) of an A fragment, or (0 to 3) of a B fragment: the
// low half of register i / 2 for even i, the high half for odd.
uint16_t element(const uint32_t* registers, int i) {
  return static_cast<uint16_t>(registers[i / 2] >> (16 * (i % 2)));
}

struct Instructions {
  std::mutex mutex;
  std::map<std::string, int64_t> by_name;
};

Instructions& instruction_counts() {
  static Instructions state;
  return state;
}

void count_instruction(const char* name) {
  Instructions& c = instruction_counts();
  const std::lock_guard<std::mutex> lock(c.mutex);
  ++c.by_name[name];
}

}  // namespace

std::map<std::string, int64_t> instructions() {
  Instructions& c = instruction_counts();
  const std::lock_guard<std::mutex> lock(c.mutex);
  return c.by_name;
}

float mma_input_value(uint16_t bits, MmaInput type) {
  if (type == MmaInput::kBFloat16) {
    const uint32_t widened = uint32_t(bits) << 16;
    float value;
    std::memcpy(&value, &widened, sizeof value);
    return value;
  }
  // IEEE binary16: 1 sign, 5 exponent (bias 15), 10 fraction bits.
  const int exponent = (bits >> 10) & 0x1f;
  const int fraction = bits & 0x3ff;
  float magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(float(fraction), -24);  // zero and subnormals
  } else if (exponent == 0x1f) {
    magnitude = fraction == 0 ? INFINITY : NAN;
  } else {
    magnitude = std::ldexp(float(fraction | 0x400), exponent - 25);
  }
  return (bits & 0x8000) != 0 ? -magnitude : magnitude;
}

void mma_m16n8k16(MmaInput type, float (&d)[4], const uint32_t (&a)[4], const uint32_t (*b)[2],
                  int count) {
  const char* what = type == MmaInput::kBFloat16
                         ? "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
                         : "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32";
  if (gpu().capability_major.load() < 8) {
    fault(std::string(what) + " on a GPU of compute capability " +
          std::to_string(gpu().capability_major.load()) + "." +
          std::to_string(gpu().capability_minor.load()) + ": it needs 8.0");
  }
  if (count < 1 || count > 2) fault(std::string(what) + ": 1 or 2 B fragments a rendezvous");
  Fragments mine{};
  std::memcpy(mine.a, a, sizeof mine.a);
  for (int i = 0; i < count; ++i) std::memcpy(mine.b[i], b[i], sizeof mine.b[i]);
  const WarpExchange exchange = warp_exchange(&mine, sizeof mine, what);
  // The products A B[i], computed by the first lane to resume, for all.
  auto* products = reinterpret_cast<float*>(exchange.scratch + 16);  // (count, 16, 8)
  static_assert(16 + 2 * 16 * 8 * sizeof(float) <= kWarpScratchBytes);
  if (exchange.scratch[0] == 0) {
    count_instruction(what);
    // A(row, k) is element k % 2 + 2 (row >= 8) + 4 (k >= 8) of lane
    // (row % 8) * 4 + (k % 8) / 2; B(k, col) element k % 2 + 2 (k >= 8) of
    // lane col * 4 + (k % 8) / 2.
    float matrix_a[16][16], matrix_b[2][16][8];
    for (unsigned lane = 0; lane < 32; ++lane) {
      Fragments f;
      std::memcpy(&f, exchange.lanes + lane * sizeof(Fragments), sizeof f);
      const int group = int(lane / 4), t = int(lane % 4);
      for (int i = 0; i < 8; ++i) {
        const int row = group + ((i / 2) % 2) * 8;
        const int k = 2 * t + i % 2 + (i >= 4 ? 8 : 0);
        matrix_a[row][k] = mma_input_value(element(f.a, i), type);
      }
      for (int j = 0; j < count; ++j) {
        for (int i = 0; i < 4; ++i) {
          matrix_b[j][2 * t + i % 2 + (i >= 2 ? 8 : 0)][group] =
              mma_input_value(element(f.b[j], i), type);
        }
      }
    }
    for (int j = 0; j < count; ++j) {
      for (int row = 0; row < 16; ++row) {
        for (int col = 0; col < 8; ++col) {
          float sum = 0;  // in k order
          for (int k = 0; k < 16; ++k) sum += matrix_a[row][k] * matrix_b[j][k][col];
          products[(j * 16 + row) * 8 + col] = sum;
        }
      }
    }
    exchange.scratch[0] = 1;
  }
  const int group = int(exchange.lane / 4), t = int(exchange.lane % 4);
  for (int j = 0; j < count; ++j) {
    for (int i = 0; i < 4; ++i) {
      d[i] += products[(j * 16 + group + (i >= 2 ? 8 : 0)) * 8 + 2 * t + i % 2];
    }
  }
}

float mma_tf32_value(uint32_t bits) {
  bits &= 0xffffe000u;
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

void mma_m16n8k8_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  const char* what = "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32";
  if (gpu().capability_major.load() < 8) {
    fault(std::string(what) + " on a GPU of compute capability " +
          std::to_string(gpu().capability_major.load()) + "." +
          std::to_string(gpu().capability_minor.load()) + ": it needs 8.0");
  }
  Fragments mine{};
  std::memcpy(mine.a, a, sizeof mine.a);
  std::memcpy(mine.b[0], b, sizeof mine.b[0]);
  const WarpExchange exchange = warp_exchange(&mine, sizeof mine, what);
  auto* products = reinterpret_cast<float*>(exchange.scratch + 16);  // (16, 8)
  if (exchange.scratch[0] == 0) {
    count_instruction(what);
    // A(row, k) is register (row >= 8) + 2 (k >= 4) of lane (row % 8) * 4 +
    // k % 4; B(k, col) register (k >= 4) of lane col * 4 + k % 4.
    float matrix_a[16][8], matrix_b[8][8];
    for (unsigned lane = 0; lane < 32; ++lane) {
      Fragments f;
      std::memcpy(&f, exchange.lanes + lane * sizeof(Fragments), sizeof f);
      const int group = int(lane / 4), t = int(lane % 4);
      for (int i = 0; i < 4; ++i) {
        matrix_a[group + (i % 2) * 8][t + (i / 2) * 4] = mma_tf32_value(f.a[i]);
      }
      for (int i = 0; i < 2; ++i) matrix_b[t + i * 4][group] = mma_tf32_value(f.b[0][i]);
    }
    for (int row = 0; row < 16; ++row) {
      for (int col = 0; col < 8; ++col) {
        float sum = 0;  // in k order
        for (int k = 0; k < 8; ++k) sum += matrix_a[row][k] * matrix_b[k][col];
        products[row * 8 + col] = sum;
      }
    }
    exchange.scratch[0] = 1;
  }
  const int group = int(exchange.lane / 4), t = int(exchange.lane % 4);
  for (int i = 0; i < 4; ++i) d[i] += products[(group + (i >= 2 ? 8 : 0)) * 8 + 2 * t + i % 2];
}

}  // namespace lltm::cuda_host
