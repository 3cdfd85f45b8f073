// Measured plans: where torch.backends.cudnn.benchmark is set (mirrored in
// by lltm's Python side, set_measuring below), the first sequence call of a
// kind (device, dtype, precision, batch, state, schedule, pass) times every
// plan that fits (the per-step path, each mode, wave count and kind of
// product that lltm_cuda_persistent_plan.h's rule considers) on the current
// stream and keeps the fastest for the calls after it. The rule is
// arithmetic on the device's limits and can guess wrong on a GPU it was
// never measured on; timing the candidates once per shape is what cuDNN's
// benchmark mode does for the same reason.
//
// A call runs its op body (the whole of it: every candidate returns the
// same results, and each run allocates its own outputs, so none disturbs
// another) once per candidate with that candidate's plan imposed on
// plan_for (ImposedPlan), then once more with the winner's: what the call
// returns is a complete run of the chosen plan. A forced plan
// (LLTM_CUDA_PLAN) or LLTM_CUDA_PERSISTENT=0 wins over measuring; a stream
// being captured into a CUDA graph is never measured on (its launches would
// be recorded, not run): there the remembered choice applies, else the rule.
//
// The choices are remembered for the most recent kMeasuredPlans kinds of
// call (LLTM_CUDA_MEASURED_PLANS sets another bound), least recently used
// first out; thread-safe (two threads may both measure a kind the first
// time, and the later answer stays).
#pragma once

#include <torch/csrc/stable/tensor.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "../lltm_sequence.h"
#include "../lltm_sequence_checks.h"
#include "lltm_cuda_persistent_plan.h"

namespace lltm::cuda {

constexpr int kMeasuredPlans = 256;
constexpr const char* kMeasuredPlansVariable = "LLTM_CUDA_MEASURED_PLANS";
// Runs of a candidate after its first (which warms it: kernel attributes,
// the allocator's blocks, the caches); its time is the least of these.
constexpr int kTimedRuns = 2;

// torch.backends.cudnn.benchmark as lltm's Python side last saw it (the
// stable ABI offers no way to ask torch from here).
void set_measuring(bool on);
bool measuring();

// The remembered choices, most recently used first, as lines of tab-separated
// fields that lltm's Python side formats (lltm/_backends.py):
// "plan <pass> <dtype> <tf32: 0|1> <batch> <state> <schedule> <chosen plan>",
// each followed by one line per candidate, "candidate <milliseconds, or
// "refused"> <plan>".
std::string measured_plans_text();

enum class MeasuredPass { kForward, kInference, kBackward };

// What a choice is remembered by.
struct MeasuredCall {
  MeasuredPass pass = MeasuredPass::kForward;
  int device = 0;
  std::string dtype;  // "float32", ...: float16 and bfloat16 have kernels of their own
  int element_size = 0;
  // Float32 products on TF32 tensor cores (another kernel, another time).
  bool tf32 = false;
  int64_t batch = 0, state = 0;
  // Padded: {steps}; packed: every step's batch size, and the direction
  // (the order the kernels walk them in).
  bool packed = false, reverse = false;
  std::vector<int64_t> schedule;
};

MeasuredCall measured_call(MeasuredPass pass, const torch::stable::Tensor& like,
                           const SequenceSizes& n, const Schedule& schedule, bool tf32);

// What a call runs with: the rule (nothing imposed), a remembered plan, or
// the candidates to measure (the per-step path first).
struct MeasuredChoice {
  enum class Kind { kRule, kRemembered, kMeasure } kind = Kind::kRule;
  SequencePlan plan;
  std::vector<SequencePlan> candidates;
};

MeasuredChoice measured_choice(const MeasuredCall& call);

// Remembers candidates[chosen]; `ms` holds each candidate's time (infinite:
// the GPU refused its launch).
void remember_measured(const MeasuredCall& call, const std::vector<SequencePlan>& candidates,
                       const std::vector<double>& ms, size_t chosen);

// The plan imposed on this thread's plan_for calls of `pass`, or nullptr.
const SequencePlan* imposed_plan(SequencePass pass);
// A persistent launch refused by the GPU (launch_unavailable) while a plan
// is imposed: the call fell back to the per-step path, and its time is not
// the candidate's.
void imposed_launch_refused();

// `plan` imposed on plan_for of `pass` on this thread while it lives.
class ImposedPlan {
 public:
  ImposedPlan(SequencePass pass, const SequencePlan& plan);
  ~ImposedPlan();
  ImposedPlan(const ImposedPlan&) = delete;
  ImposedPlan& operator=(const ImposedPlan&) = delete;
  // Whether the GPU refused a launch of the plan since the last time asked.
  bool refused() const;
};

// Milliseconds of the work queued on the current stream of `device` between
// start() and stop(), from a pair of CUDA events (stop() waits for it).
class StreamTimer {
 public:
  explicit StreamTimer(int device);
  ~StreamTimer();
  StreamTimer(const StreamTimer&) = delete;
  StreamTimer& operator=(const StreamTimer&) = delete;
  void start();
  double stop();

 private:
  int device_;
  void* start_ = nullptr;
  void* stop_ = nullptr;
};

// lltm_cuda_persistent_planning.cu: whether measuring may replace the rule
// (LLTM_CUDA_PERSISTENT and LLTM_CUDA_PLAN leave it the choice), and the
// plan `forced` gives such a call on `device`, not remembered.
bool plans_measurable();
SequencePlan plan_with(SequencePass pass, int device, int element_size, int64_t batch,
                       int64_t state, const ForcedPlan& forced, bool tf32);

inline SequencePass sequence_pass(MeasuredPass pass) {
  return pass == MeasuredPass::kBackward ? SequencePass::kBackward : SequencePass::kForward;
}

// run() (an op's body, which returns its results) under the measured plan
// of `call`: measured now where nothing is remembered yet; plain run() where
// benchmark mode is off.
template <typename Run>
auto with_measured_plan(const MeasuredCall& call, const Run& run) -> decltype(run()) {
  if (!measuring()) return run();
  const MeasuredChoice choice = measured_choice(call);
  const SequencePass pass = sequence_pass(call.pass);
  if (choice.kind == MeasuredChoice::Kind::kRule) return run();
  if (choice.kind == MeasuredChoice::Kind::kRemembered) {
    const ImposedPlan imposed(pass, choice.plan);
    return run();
  }
  const std::vector<SequencePlan>& candidates = choice.candidates;
  std::vector<double> ms(candidates.size(), std::numeric_limits<double>::infinity());
  StreamTimer timer(call.device);
  for (size_t i = 0; i < candidates.size(); ++i) {
    const ImposedPlan imposed(pass, candidates[i]);
    for (int r = 0; r <= kTimedRuns; ++r) {
      timer.start();
      run();
      const double taken = timer.stop();
      if (imposed.refused()) {
        ms[i] = std::numeric_limits<double>::infinity();
        break;
      }
      if (r > 0) ms[i] = std::min(ms[i], taken);
    }
  }
  size_t chosen = 0;  // the per-step path where every persistent launch was refused
  for (size_t i = 1; i < candidates.size(); ++i) {
    if (ms[i] < ms[chosen]) chosen = i;
  }
  remember_measured(call, candidates, ms, chosen);
  const ImposedPlan imposed(pass, candidates[chosen]);
  return run();
}

}  // namespace lltm::cuda
