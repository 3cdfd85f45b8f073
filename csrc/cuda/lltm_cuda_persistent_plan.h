// How lltm runs a whole sequence's recurrence on a GPU: one persistent launch
// for every step (lltm_cuda_persistent.cuh), or the per-step path (a product
// and a pointwise kernel a step, lltm_cuda_sequence_*.cu). The rule is this
// file's plan_sequence(), a pure function of the call's sizes and what the
// device and the runtime's occupancy calculator answer, so that it can be
// shown (`python -m lltm info`, the bench) and tested without a GPU.
//
// A persistent launch splits the state across P thread blocks, each owning
// U = ceil(S / P) state units and keeping, in shared memory for the whole
// sequence, the rows of W_h of its units' three gates (3U x S); the batch
// splits into G groups of rows that never interact (grid.y). A step's new h
// is exchanged between the P blocks of a group with one barrier a step: a
// thread-block cluster (sm_90+: the cluster barrier, h pushed into every
// block's shared memory) or a cooperative grid (the grid barrier, h through
// global memory). The backward runs the same way, the gradient of h reduced
// across the P blocks.
//
// Where a cooperative forward finds no split whose blocks hold both their
// slice of W_h and a copy of the group's h (rows x S, in the math type), its
// products read h where the blocks wrote it, in global memory at L2
// (`h_from_global`): shared memory then holds W_h alone, so that W_h spread
// over every multiprocessor fits (at S = 1024 on an H100: 48 KiB of 16-bit
// W_h a block, beside 258 KiB of float32 h for 64 rows).
//
// Where no plan fits the whole batch at once but one fits a part of it
// (too many (row, unit) pairs for the blocks that run at once: (256, 1024)
// on an H100), the batch runs in waves: up to kMaxWaves launches one after
// another, each a persistent launch over every step for its rows (the rows
// never interact), rather than the per-step path.
//
// Dtypes: float32 and float64 compute in their own precision; float16 and
// bfloat16 keep W_h in 16 bits in shared memory (half the bytes of float32:
// slices twice as large fit, so sizes whose W_h does not fit on chip in
// float32 may in 16 bits) and everything else of a block, the running state,
// the exchanged h and the partial sums, in float32, the arithmetic's
// precision. The layout is therefore in bytes, by element size.
//
// The products: on GPUs of compute capability 8.0 and later the 16-bit
// kernels run the recurrent products on the tensor cores
// (lltm_cuda_tensor_cores.cuh: a warp per 16 x 8 tile, mma.sync m16n8k16,
// the 8 columns batch rows), and so do the float32 kernels in TF32 where
// the call allows it (`tf32`: torch allows TF32 for float32 matrix
// products; mma.sync m16n8k8 .tf32); elsewhere, and for float64, each
// thread sums dot products on the CUDA cores. The plan says which by its
// tile height: 8 batch rows, an instruction's, for the tensor cores; 1 or 4
// rows of a thread's tile for the CUDA cores. float32's tensor-core plans
// run in the float32 kernel of tile height 1, switched at run time (no
// kernel of its own to compile).
//
// LLTM_CUDA_PLAN forces a plan the rule considers (ForcedPlan below): a
// mode, a number of waves, the products on the CUDA cores. A forced plan
// that does not fit the device and sizes gives way to the rule's, and the
// plan says so (describe()).
//
// Plain C++ (no CUDA types): lltm_cuda_library_exports.cpp, compiled by the
// host compiler, and the tests' emulated GPU see the same rule.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>

namespace lltm::cuda {

enum class SequencePath { kPerStep, kCluster, kCooperative };
enum class SequencePass { kForward, kBackward };

// Threads a persistent block has at most (the kernels' launch bounds: 128
// registers a thread).
constexpr int kPersistentMaxThreads = 512;
// (batch row, state unit) pairs a thread owns at most: their cell state and
// next step's inputs live in its registers.
constexpr int kPersistentPairs = 2;
// Distinct batch sizes of a packed sequence the launch's parameters carry (a
// packed sequence with more takes the per-step path).
constexpr int kPersistentMaxRuns = 256;
// Launches a batch may be split into, one after another (each walks every
// step: more waves, more of the barriers' and the steps' fixed cost).
constexpr int kMaxWaves = 4;
// The tile height of plans whose products run on the tensor cores (the
// batch rows of an mma.sync m16n8k16: its N), and the rows of W_h (M) and
// inner elements (K) of one instruction.
constexpr int kTensorCoreTileRows = 8;
constexpr int kTensorCoreTileWeights = 16;
constexpr int kTensorCoreInner = 16;
// K of float32's instruction in TF32, mma.sync m16n8k8 .tf32 (M and N as
// above).
constexpr int kTensorCoreInnerTf32 = 8;
// Cluster sizes: 8 is portable, 16 needs the non-portable attribute and a GPU
// whose occupancy calculator accepts it.
constexpr int kPortableClusterSize = 8;
constexpr int kMaxClusterSize = 16;

// What the plan reads from the device (cudaDeviceGetAttribute).
struct DeviceLimits {
  int multiprocessors = 0;
  int major = 0, minor = 0;      // compute capability
  bool cooperative = false;      // cudaDevAttrCooperativeLaunch
  bool clusters = false;         // cudaDevAttrClusterLaunch
  int64_t shared_per_block = 0;  // cudaDevAttrMaxSharedMemoryPerBlockOptin, bytes
};

// The occupancy calculator for the kernel a plan would launch: the pass,
// mode and tile height pick the kernel (its registers count).
class Occupancy {
 public:
  virtual ~Occupancy() = default;
  // cudaOccupancyMaxActiveBlocksPerMultiprocessor (0 where it fails).
  virtual int blocks_per_multiprocessor(SequencePass pass, int tile_rows, int threads,
                                        int64_t shared_bytes) const = 0;
  // cudaOccupancyMaxActiveClusters for clusters of `cluster_size` blocks in a
  // grid of (cluster_size, groups) (0 where it fails).
  virtual int active_clusters(SequencePass pass, int tile_rows, int cluster_size, int groups,
                              int threads, int64_t shared_bytes) const = 0;
};

// Where each array lives in a block's shared memory: offsets in bytes, each
// a multiple of 16. `weights` holds elements of the tensors' dtype, every
// other array elements of the math type (math_element_size). Forward:
// `weights` (3U rows of W_h, `pitch` apart), `exchange` (the running h of the
// group's rows, S wide, `pitch` apart: two buffers in cluster mode, one in
// cooperative), `scratch` (the product's partial sums, split x rows x 3U),
// `state` (the running cell and h of the block's pairs, 2 x rows x U).
// Plans that read h from global memory (h_from_global) have no `exchange`.
// 16-bit tensor-core plans only: `flags` (16 bytes: whether the block's
// slice of W_h holds a non-finite value, lltm_cuda_persistent.cuh).
// Backward: `weights` (the same rows), `exchange` (cluster mode: the partial
// gradients of h the P blocks send, 2 x P x rows x U; cooperative: none,
// they go through global memory), `scratch` (the step's gate gradients of
// the block's units, rows x 3U), `state` (the carried gradients of h and c,
// 2 x rows x U).
struct SharedLayout {
  int64_t weights = 0, exchange = 0, scratch = 0, state = 0, flags = 0, total = 0;
};

struct SequencePlan {
  SequencePath path = SequencePath::kPerStep;
  int blocks = 0;          // P: blocks a group's state is split across (grid.x; a cluster)
  int groups = 0;          // G: groups of batch rows (grid.y)
  int64_t units = 0;       // U: state units of a block (the last block may have fewer)
  int64_t group_rows = 0;  // batch rows of a group (the last group may have fewer)
  int threads = 0;         // a block's
  int split = 1;           // forward: threads sharing one dot product (split along S)
  // Batch rows of a thread's tile in the products: 1 or 4 on the CUDA
  // cores; kTensorCoreTileRows for a warp's tile on the tensor cores.
  int tile_rows = 1;
  // The products on the tensor cores in TF32 (float32 only).
  bool tf32 = false;
  int64_t pitch = 0;  // elements between rows of W_h (and of h) in shared memory
  // Forward, cooperative: the products read the group's h in global memory
  // (at L2), not from a copy in shared memory.
  bool h_from_global = false;
  // Launches one after another, each of `wave_rows` batch rows (the last
  // may have fewer); blocks, groups and rows above are a wave's.
  int waves = 1;
  int64_t wave_rows = 0;
  SharedLayout layout;  // bytes
  int64_t shared_bytes = 0;
  std::string reason;  // per-step: why
  // The setting that forced this plan ("LLTM_CUDA_PLAN=..."), or empty.
  std::string forced_by;
  // Where a forced plan does not fit: "LLTM_CUDA_PLAN=... does not fit:
  // why", and this plan is the rule's.
  std::string fallback;

  bool persistent() const { return path != SequencePath::kPerStep; }
};

// A plan forced by LLTM_CUDA_PLAN: comma-separated words, at most one mode
// (per-step, clusters, cooperative: h in shared memory, cooperative-global-h:
// the forward's products read h in global memory; the backward never copies
// h, so it runs cooperative), waves=N (the batch in N launches, N from 1 to
// kMaxWaves; 1: the whole batch at once) and cuda-cores (the products on
// the CUDA cores rather than the tensor cores: 16-bit, and float32 in TF32).
// What it leaves out is the rule's. Unset, empty or "auto": the rule.
enum class ForcedMode { kRule, kPerStep, kClusters, kCooperative, kCooperativeGlobalH };

struct ForcedPlan {
  ForcedMode mode = ForcedMode::kRule;
  int waves = 0;  // 0: the rule's
  bool cuda_cores = false;
  std::string setting;  // "LLTM_CUDA_PLAN=<value>"; empty where nothing is forced

  bool forced() const { return !setting.empty(); }
};

constexpr const char* kPlanVariable = "LLTM_CUDA_PLAN";
constexpr const char* kPlanChoices =
    "per-step, clusters, cooperative or cooperative-global-h, and/or waves=N (N from 1 to 4) "
    "and cuda-cores, comma-separated (e.g. cooperative,waves=2)";

// `value` parsed into `plan`; the error's message where it is not a plan
// (empty where it is).
inline std::string parse_forced_plan(const std::string& value, ForcedPlan& plan) {
  plan = ForcedPlan{};
  const std::string setting = std::string(kPlanVariable) + "=" + value;
  const std::string error = setting + " is not a plan of lltm's persistent sequence kernels; use " +
                            kPlanChoices + ", or unset it for the rule's plan";
  if (value.empty() || value == "auto") return "";
  bool moded = false, waved = false, cored = false;
  std::size_t begin = 0;
  for (;;) {
    const std::size_t end = value.find(',', begin);
    const std::string word =
        value.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
    ForcedMode mode = ForcedMode::kRule;
    if (word == "per-step") {
      mode = ForcedMode::kPerStep;
    } else if (word == "clusters") {
      mode = ForcedMode::kClusters;
    } else if (word == "cooperative") {
      mode = ForcedMode::kCooperative;
    } else if (word == "cooperative-global-h") {
      mode = ForcedMode::kCooperativeGlobalH;
    } else if (word == "auto") {
      mode = ForcedMode::kRule;
    } else if (word.size() == 7 && word.compare(0, 6, "waves=") == 0 && word[6] >= '1' &&
               word[6] < '1' + kMaxWaves && !waved) {
      plan.waves = word[6] - '0';
      waved = true;
      if (end == std::string::npos) break;
      begin = end + 1;
      continue;
    } else if (word == "cuda-cores" && !cored) {
      plan.cuda_cores = cored = true;
      if (end == std::string::npos) break;
      begin = end + 1;
      continue;
    } else {
      return error;
    }
    if (moded) return error;  // two modes
    moded = true;
    plan.mode = mode;
    if (end == std::string::npos) break;
    begin = end + 1;
  }
  if (plan.mode == ForcedMode::kPerStep && (plan.waves != 0 || plan.cuda_cores)) return error;
  plan.setting = setting;
  return "";
}

inline int64_t plan_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Elements of a 16-byte vector.
inline int64_t vector_elements(int element_size) { return 16 / element_size; }

// Bytes of the type the kernels compute in: float32 for 16-bit dtypes.
inline int math_element_size(int element_size) { return std::max(element_size, 4); }

inline bool persistent_element_size(int element_size) {
  return element_size == 2 || element_size == 4 || element_size == 8;
}

// Rows of W_h in shared memory are read 16 bytes at a time by threads of
// consecutive units: a pitch of an odd number of 16-byte chunks puts eight
// consecutive rows on eight different groups of four banks (no conflict).
// Rows of h have the same pitch in elements (of the math type).
inline int64_t shared_pitch(int64_t state, int element_size) {
  const int64_t v = vector_elements(element_size);
  return v * (plan_ceil_div(state, v) | 1);
}

inline SharedLayout shared_layout(SequencePass pass, SequencePath path, int element_size,
                                  int64_t state, int blocks, int64_t units, int64_t rows, int split,
                                  bool tensor_cores, bool h_from_global = false) {
  const int64_t math = math_element_size(element_size);
  // Bytes of `elements` math elements, rounded up to 16.
  const auto math_bytes = [math](int64_t elements) {
    return plan_ceil_div(elements * math, 16) * 16;
  };
  const int64_t pitch = shared_pitch(state, element_size);
  const bool cluster = path == SequencePath::kCluster;
  SharedLayout l;
  l.weights = 0;
  l.exchange = 3 * units * pitch * element_size;
  int64_t exchange = 0, scratch = 0;
  if (pass == SequencePass::kForward) {
    exchange = h_from_global ? 0 : math_bytes((cluster ? 2 : 1) * rows * pitch);
    scratch = math_bytes(int64_t(split) * rows * 3 * units);
  } else {
    exchange = cluster ? math_bytes(2 * int64_t(blocks) * rows * units) : 0;
    scratch = math_bytes(rows * 3 * units);
  }
  l.scratch = l.exchange + exchange;
  l.state = l.scratch + scratch;
  l.flags = l.state + math_bytes(2 * rows * units);
  l.total = l.flags + (tensor_cores && element_size == 2 ? 16 : 0);
  return l;
}

// Threads, split and tile height of a block of `rows` x `units` pairs, or
// threads = 0 when no block can own that many pairs. Between 128 and
// kPersistentMaxThreads threads. On the CUDA cores: forward, a thread per
// (row tile, unit, part of S), about eight 16-byte chunks of S a part;
// backward, a thread per (row tile, 16 bytes of the state). On the tensor
// cores (`tensor_cores`): a warp per 16 x 8 tile of the product (forward:
// 3U x rows, in parts of about four instructions' steps along S, 16 long in
// 16 bits, 8 in TF32; backward: S x rows).
struct BlockShape {
  int threads = 0, split = 1, tile_rows = 1;
};

inline BlockShape block_shape(SequencePass pass, int element_size, int64_t state, int64_t units,
                              int64_t rows, bool tensor_cores) {
  BlockShape b;
  const int64_t pairs = rows * units;
  const bool forward = pass == SequencePass::kForward;
  int64_t work = 0, tiles = 0, steps = 0;  // threads wanted; a split's tiles, and its steps
  if (tensor_cores) {
    b.tile_rows = kTensorCoreTileRows;
    const int64_t row_tiles = plan_ceil_div(rows, kTensorCoreTileRows);
    const int64_t weight_rows = forward ? 3 * units : state;
    tiles = 32 * row_tiles * plan_ceil_div(weight_rows, kTensorCoreTileWeights);  // a warp a tile
    steps = plan_ceil_div(state, element_size == 2 ? kTensorCoreInner : kTensorCoreInnerTf32);
    work = forward ? tiles * std::max<int64_t>(1, steps / 4) : tiles;
  } else {
    b.tile_rows = rows >= 4 ? 4 : 1;
    const int64_t row_tiles = plan_ceil_div(rows, b.tile_rows);
    steps = plan_ceil_div(state, vector_elements(element_size));  // 16-byte chunks
    tiles = row_tiles * units;
    work = forward ? tiles * std::max<int64_t>(1, steps / 8) : row_tiles * steps;
  }
  const int64_t need = std::max(plan_ceil_div(pairs, kPersistentPairs), work);
  int threads = 128;
  while (threads < need && threads < kPersistentMaxThreads) threads *= 2;
  if (pairs > int64_t(threads) * kPersistentPairs) return b;  // threads = 0
  b.threads = threads;
  if (forward) {
    while (int64_t(b.split) * 2 <= steps && int64_t(b.split) * 2 * tiles <= threads) b.split *= 2;
  }
  return b;
}

// Whether the products of a plan for this device and dtype run on the
// tensor cores: 16-bit dtypes from compute capability 8.0 on (mma.sync
// m16n8k16 in bf16 and fp16), and float32 there where the call allows TF32
// (`tf32`; mma.sync m16n8k8 .tf32).
inline bool tensor_core_products(int element_size, int major, bool tf32 = false) {
  return (element_size == 2 || (element_size == 4 && tf32)) && major >= 8;
}

// The plan for `blocks` x `groups` blocks of the given mode; its split
// halved while its shared memory exceeds `shared_limit` (bytes), which it may
// still exceed.
inline SequencePlan plan_of(SequencePass pass, SequencePath path, int element_size, int64_t batch,
                            int64_t state, int blocks, int64_t group_rows, int64_t shared_limit,
                            bool tensor_cores, bool h_from_global = false) {
  SequencePlan p;
  p.units = plan_ceil_div(state, blocks);
  p.blocks = static_cast<int>(plan_ceil_div(state, p.units));
  p.group_rows = group_rows;
  p.groups = static_cast<int>(plan_ceil_div(batch, group_rows));
  const BlockShape shape =
      block_shape(pass, element_size, state, p.units, group_rows, tensor_cores);
  p.threads = shape.threads;
  p.split = shape.split;
  p.tile_rows = shape.tile_rows;
  p.tf32 = tensor_cores && element_size == 4;
  p.pitch = shared_pitch(state, element_size);
  p.path = path;
  p.h_from_global = h_from_global;
  for (;;) {
    p.layout = shared_layout(pass, path, element_size, state, p.blocks, p.units, group_rows,
                             p.split, tensor_cores, h_from_global);
    p.shared_bytes = p.layout.total;
    if (p.shared_bytes <= shared_limit || p.split == 1) break;
    p.split /= 2;
  }
  return p;
}

inline std::string count(int64_t n, const char* one, const char* many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

inline std::string kib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f KiB", bytes / 1024.0);
  return text;
}

// For one mode, the plan with the most blocks (at most one per
// multiprocessor, all of them running at once: `fits` asks the occupancy
// calculator), ties broken by fewer blocks along the state where
// `prefer_fewer` (cooperative: h goes through global memory, P times a step)
// and by more otherwise (clusters: the slice of W_h a block reads every step
// is smaller). Candidates for P: `sizes`. `h_from_global`: plans whose
// forward reads h in global memory.
template <typename Fits>
SequencePlan best_plan(SequencePass pass, SequencePath path, int element_size, int64_t batch,
                       int64_t state, const DeviceLimits& device, const int* sizes, int count,
                       bool prefer_fewer, bool h_from_global, bool tensor_cores, const Fits& fits) {
  SequencePlan best;
  int64_t tried[32] = {};
  int tried_count = 0;
  for (int i = 0; i < count; ++i) {
    // P blocks of U units; fewer blocks where U units each cover the state.
    const int64_t blocks = plan_ceil_div(state, plan_ceil_div(state, sizes[i]));
    if (blocks > device.multiprocessors ||
        std::find(tried, tried + tried_count, blocks) != tried + tried_count) {
      continue;
    }
    tried[tried_count++] = blocks;
    const int64_t most_groups =
        std::min<int64_t>(batch, std::max<int64_t>(1, device.multiprocessors / blocks));
    // The fewest rows a group can have, then more (fewer groups) until the
    // plan fits: the first that fits has the most blocks for this P.
    for (int64_t rows = plan_ceil_div(batch, most_groups); rows <= batch; ++rows) {
      if (rows > 1 && plan_ceil_div(batch, rows) == plan_ceil_div(batch, rows - 1)) continue;
      const SequencePlan p =
          plan_of(pass, path, element_size, batch, state, static_cast<int>(blocks), rows,
                  device.shared_per_block, tensor_cores, h_from_global);
      if (p.threads == 0) break;                            // more rows: more pairs
      if (p.shared_bytes > device.shared_per_block) break;  // more rows need more
      if (!fits(p)) continue;
      const int64_t total = int64_t(p.blocks) * p.groups;
      const int64_t best_total = int64_t(best.blocks) * best.groups;
      if (!best.persistent() || total > best_total ||
          (total == best_total &&
           (prefer_fewer ? p.blocks < best.blocks : p.blocks > best.blocks))) {
        best = p;
      }
      break;
    }
  }
  return best;
}

// The start of the reason where no plan fits.
constexpr const char* kNothingFits = "no split fits on chip with every block running at once";

// The rule for the whole batch in one launch. `enabled` is false where
// LLTM_CUDA_PERSISTENT=0; `forced` restricts the modes and products tried;
// `tf32`: the call allows float32's products in TF32.
inline SequencePlan plan_one_wave(SequencePass pass, int element_size, int64_t batch, int64_t state,
                                  const DeviceLimits& device, const Occupancy& occupancy,
                                  bool enabled, const ForcedPlan& forced = {}, bool tf32 = false) {
  SequencePlan none;
  if (!enabled) {
    none.reason = "LLTM_CUDA_PERSISTENT=0";
    return none;
  }
  if (forced.mode == ForcedMode::kPerStep) {
    none.reason = forced.setting;
    return none;
  }
  if (!persistent_element_size(element_size)) {
    none.reason = "elements of " + std::to_string(element_size) + " bytes";
    return none;
  }
  if (batch <= 0 || state <= 0) {
    none.reason = "nothing to run (empty batch or state)";
    return none;
  }
  if (device.multiprocessors <= 0) {
    none.reason = "the device reports no multiprocessor";
    return none;
  }
  const bool tensor_cores =
      tensor_core_products(element_size, device.major, tf32) && !forced.cuda_cores;
  const bool has_clusters = device.clusters && device.major >= 9;
  const bool try_clusters =
      forced.mode == ForcedMode::kRule || forced.mode == ForcedMode::kClusters;
  const bool try_cooperative = forced.mode != ForcedMode::kClusters;
  // Clusters: sm_90 and later, P up to 8 (16 where the calculator takes it),
  // every group's cluster running at once.
  if (has_clusters && try_clusters) {
    static constexpr int kSizes[] = {16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1};
    SequencePlan p = best_plan(
        pass, SequencePath::kCluster, element_size, batch, state, device, kSizes, 16,
        /*prefer_fewer=*/false, /*h_from_global=*/false, tensor_cores,
        [&](const SequencePlan& plan) {
          return occupancy.active_clusters(pass, plan.tile_rows, plan.blocks, plan.groups,
                                           plan.threads, plan.shared_bytes) >= plan.groups;
        });
    if (p.persistent()) return p;
  }
  // A cooperative grid: every block running at once; in the forward, where
  // no block holds both its slice of W_h and the group's h, with h read in
  // global memory.
  if (device.cooperative && try_cooperative) {
    static constexpr int kSizes[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
    const auto fits = [&](const SequencePlan& plan) {
      const int per_multiprocessor = occupancy.blocks_per_multiprocessor(
          pass, plan.tile_rows, plan.threads, plan.shared_bytes);
      return int64_t(per_multiprocessor) * device.multiprocessors >=
             int64_t(plan.blocks) * plan.groups;
    };
    for (const bool h_from_global : {false, true}) {
      if (h_from_global && pass != SequencePass::kForward) break;
      // Forced: h in shared memory (cooperative; and the backward, which
      // never copies h), or read in global memory (the forward only).
      if (forced.mode == ForcedMode::kCooperative && h_from_global) break;
      if (forced.mode == ForcedMode::kCooperativeGlobalH && pass == SequencePass::kForward &&
          !h_from_global) {
        continue;
      }
      SequencePlan p =
          best_plan(pass, SequencePath::kCooperative, element_size, batch, state, device, kSizes,
                    11, /*prefer_fewer=*/true, h_from_global, tensor_cores, fits);
      if (p.persistent()) return p;
    }
  }
  if (!device.cooperative && !has_clusters) {
    none.reason = "the device has neither cooperative nor cluster launches";
    return none;
  }
  if (try_clusters && !try_cooperative && !has_clusters) {
    none.reason = "the device has no cluster launches (they need compute capability 9.0, it has " +
                  std::to_string(device.major) + "." + std::to_string(device.minor) + ")";
    return none;
  }
  if (try_cooperative && !try_clusters && !device.cooperative) {
    none.reason = "the device has no cooperative launches";
    return none;
  }
  // Why nothing fits: the smallest slice of W_h a block could hold.
  const int64_t most_blocks = std::min<int64_t>(state, device.multiprocessors);
  const int64_t units = plan_ceil_div(state, most_blocks);
  const int64_t weights = 3 * units * shared_pitch(state, element_size) * element_size;
  none.reason = std::string(kNothingFits) + " (W_h across " + std::to_string(most_blocks) +
                " blocks: " + kib(weights) + " a block, of " + kib(device.shared_per_block) +
                " of shared memory; the state of at most " +
                std::to_string(kPersistentPairs * kPersistentMaxThreads) +
                " (row, unit) pairs a block)";
  return none;
}

// The rule: the whole batch in one launch where a plan fits it, else in the
// fewest waves (up to kMaxWaves) whose rows a plan fits, else per step (the
// one-launch rule's reason).
inline SequencePlan plan_sequence(SequencePass pass, int element_size, int64_t batch, int64_t state,
                                  const DeviceLimits& device, const Occupancy& occupancy,
                                  bool enabled = true, const ForcedPlan& forced = {},
                                  bool tf32 = false) {
  if (forced.waves > 0 && batch > 0) {
    // Forced waves: that many launches, each of as many rows.
    const int64_t rows = plan_ceil_div(batch, forced.waves);
    SequencePlan part =
        plan_one_wave(pass, element_size, rows, state, device, occupancy, enabled, forced, tf32);
    part.wave_rows = rows;
    if (part.persistent()) {
      part.waves = static_cast<int>(plan_ceil_div(batch, rows));
    } else if (part.reason.rfind(kNothingFits, 0) == 0) {
      part.reason.insert(std::string(kNothingFits).size(),
                         ", " + count(plan_ceil_div(batch, rows), "wave", "waves") + " of " +
                             count(rows, "batch row", "batch rows"));
    }
    return part;
  }
  SequencePlan whole =
      plan_one_wave(pass, element_size, batch, state, device, occupancy, enabled, forced, tf32);
  whole.wave_rows = batch;
  if (whole.persistent() || whole.reason.rfind(kNothingFits, 0) != 0) return whole;
  int64_t tried_rows = batch;
  for (int waves = 2; waves <= kMaxWaves; ++waves) {
    const int64_t rows = plan_ceil_div(batch, waves);
    if (rows == tried_rows) continue;
    tried_rows = rows;
    SequencePlan part =
        plan_one_wave(pass, element_size, rows, state, device, occupancy, enabled, forced, tf32);
    if (!part.persistent()) continue;
    part.waves = static_cast<int>(plan_ceil_div(batch, rows));
    part.wave_rows = rows;
    return part;
  }
  whole.reason.insert(std::string(kNothingFits).size(),
                      ", the batch whole or in up to " + std::to_string(kMaxWaves) + " waves");
  return whole;
}

// The plan with LLTM_CUDA_PLAN's `forced` (nothing forced: plan_sequence).
// A forced plan that does not fit gives way to the rule's, which then
// carries why (`fallback`); LLTM_CUDA_PERSISTENT=0 comes first.
inline SequencePlan plan_forced(SequencePass pass, int element_size, int64_t batch, int64_t state,
                                const DeviceLimits& device, const Occupancy& occupancy,
                                bool enabled, const ForcedPlan& forced, bool tf32 = false) {
  if (!forced.forced() || !enabled) {
    return plan_sequence(pass, element_size, batch, state, device, occupancy, enabled, {}, tf32);
  }
  SequencePlan plan =
      plan_sequence(pass, element_size, batch, state, device, occupancy, enabled, forced, tf32);
  if (forced.mode == ForcedMode::kPerStep) return plan;  // its reason says so
  if (plan.persistent()) {
    plan.forced_by = forced.setting;
    return plan;
  }
  SequencePlan rule =
      plan_sequence(pass, element_size, batch, state, device, occupancy, enabled, {}, tf32);
  // Reasons that no plan can escape (an empty batch) are the rule's own.
  if (!rule.persistent() && rule.reason == plan.reason) return rule;
  rule.fallback = forced.setting + " does not fit: " + plan.reason;
  return rule;
}

inline std::string describe_plan(const SequencePlan& p) {
  if (!p.persistent()) return "per-step (" + p.reason + ")";
  return std::string(p.path == SequencePath::kCluster ? "persistent, clusters: "
                                                      : "persistent, cooperative grid: ") +
         count(p.groups, "group", "groups") + " x " + count(p.blocks, "block", "blocks") + " (" +
         count(p.units, "state unit", "state units") + ", " +
         count(p.group_rows, "batch row", "batch rows") + " a block), " +
         count(p.threads, "thread", "threads") + ", " + kib(p.shared_bytes) + " shared memory" +
         (p.tile_rows == kTensorCoreTileRows ? (p.tf32 ? ", 3xTF32 tensor cores" : ", tensor cores")
                                             : "") +
         (p.h_from_global ? ", h read from global memory" : "") +
         (p.waves > 1 ? ", " + std::to_string(p.waves) + " waves of " +
                            count(p.wave_rows, "batch row", "batch rows")
                      : "") +
         (p.forced_by.empty() ? "" : " (forced by " + p.forced_by + ")");
}

// One line: how a call runs.
inline std::string describe(const SequencePlan& p) {
  const std::string plan = describe_plan(p);
  return p.fallback.empty() ? plan : p.fallback + "; the rule's plan: " + plan;
}

}  // namespace lltm::cuda
