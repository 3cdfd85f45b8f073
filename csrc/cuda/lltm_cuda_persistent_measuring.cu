// Measured plans (lltm_cuda_persistent_measuring.h): the benchmark flag, the
// candidates of a call, the remembered choices, the plan imposed on this
// thread, and the timing by CUDA events.
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <list>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "lltm_cuda_persistent_launch.cuh"
#include "lltm_cuda_persistent_measuring.h"

namespace lltm::cuda {
namespace {

std::atomic<bool> benchmark{false};

// The plan imposed on this thread, and whether a launch of it was refused.
struct Imposed {
  const SequencePlan* plan = nullptr;
  SequencePass pass = SequencePass::kForward;
  bool refused = false;
};
thread_local Imposed imposed;

// The bound on remembered choices: LLTM_CUDA_MEASURED_PLANS where it is a
// positive number, else kMeasuredPlans. Read at every choice (a process may
// change it, as LLTM_CUDA_PLAN).
size_t measured_capacity() {
  const char* value = std::getenv(kMeasuredPlansVariable);
  if (value == nullptr || value[0] == '\0') return kMeasuredPlans;
  char* end = nullptr;
  const long long parsed = std::strtoll(value, &end, 10);
  if (*end != '\0' || parsed <= 0) {
    fail_argument(std::string(kMeasuredPlansVariable) + "=" + value +
                  " is not a number of measured plans to remember; use a positive whole number, "
                  "or unset it for " +
                  std::to_string(kMeasuredPlans));
  }
  return static_cast<size_t>(parsed);
}

const char* pass_name(MeasuredPass pass) {
  switch (pass) {
    case MeasuredPass::kInference:
      return "inference";
    case MeasuredPass::kBackward:
      return "backward";
    default:
      return "forward";
  }
}

using Key = std::tuple<int, uint64_t, int, std::string, bool, int64_t, int64_t, bool, bool,
                       std::vector<int64_t>>;

Key key_of(const MeasuredCall& c) {
  return Key{device_slot(c.device),
             device_epoch(),
             static_cast<int>(c.pass),
             c.dtype,
             c.tf32,
             c.batch,
             c.state,
             c.packed,
             c.reverse,
             c.schedule};
}

struct Measured {
  MeasuredCall call;
  SequencePlan chosen;
  std::vector<SequencePlan> candidates;
  std::vector<double> ms;
};

// The remembered choices, most recently used at the front.
struct Remembered {
  std::mutex mutex;
  std::list<std::pair<Key, Measured>> order;
  std::map<Key, std::list<std::pair<Key, Measured>>::iterator> index;
  uint64_t epoch = 0;

  // Forgets the choices of an older epoch (lltm_cuda_runtime.h): in the
  // host build, a test that changes the emulated GPU has another GPU, whose
  // choices are not the old one's. A GPU's epoch never changes.
  void follow_epoch() {
    if (epoch == device_epoch()) return;
    order.clear();
    index.clear();
    epoch = device_epoch();
  }

  void trim(size_t capacity) {
    while (order.size() > capacity) {
      index.erase(order.back().first);
      order.pop_back();
    }
  }
};

Remembered& remembered() {
  static Remembered r;
  return r;
}

bool same_plan(const SequencePlan& a, const SequencePlan& b) {
  return a.path == b.path && a.blocks == b.blocks && a.groups == b.groups && a.units == b.units &&
         a.group_rows == b.group_rows && a.threads == b.threads && a.split == b.split &&
         a.tile_rows == b.tile_rows && a.h_from_global == b.h_from_global && a.waves == b.waves &&
         a.wave_rows == b.wave_rows && a.shared_bytes == b.shared_bytes;
}

// What the per-step path's candidate says of itself.
constexpr const char* kMeasuredReason = "measured the fastest: torch.backends.cudnn.benchmark";

// Every plan such a call can take: the per-step path first, then each mode
// (the forward's cooperative mode with h in shared memory or read in global
// memory), in 1 to kMaxWaves waves, with 16-bit products on the tensor
// cores and on the CUDA cores where both exist; each distinct plan once.
std::vector<SequencePlan> candidate_plans(SequencePass pass, int device, int element_size,
                                          int64_t batch, int64_t state, bool tf32) {
  std::vector<SequencePlan> plans(1);
  plans[0].reason = kMeasuredReason;
  if (batch <= 0 || state <= 0 || !persistent_element_size(element_size)) return plans;
  const bool both_products = tensor_core_products(element_size, device_limits(device).major, tf32);
  for (const ForcedMode mode :
       {ForcedMode::kClusters, ForcedMode::kCooperative, ForcedMode::kCooperativeGlobalH}) {
    if (mode == ForcedMode::kCooperativeGlobalH && pass != SequencePass::kForward) continue;
    for (const bool cuda_cores : {false, true}) {
      if (cuda_cores && !both_products) continue;
      for (int waves = 1; waves <= kMaxWaves; ++waves) {
        ForcedPlan forced;
        forced.mode = mode;
        forced.waves = waves;
        forced.cuda_cores = cuda_cores;
        SequencePlan plan = plan_with(pass, device, element_size, batch, state, forced, tf32);
        if (!plan.persistent()) continue;
        plan.forced_by.clear();
        plan.fallback.clear();
        bool known = false;
        for (const SequencePlan& p : plans) known = known || same_plan(p, plan);
        if (!known) plans.push_back(plan);
      }
    }
  }
  return plans;
}

// Whether work queued on the current stream of `device` is being captured
// into a CUDA graph (recorded, not run: no time to measure).
bool capturing(int device) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaError_t error = cudaStreamIsCapturing(current_stream(device), &status);
  if (error != cudaSuccess) fail_cuda("asking whether the stream is being captured", error);
  return status != cudaStreamCaptureStatusNone;
}

std::string describe_candidate(const SequencePlan& plan) {
  return plan.persistent() ? describe_plan(plan) : "per-step";
}

std::string schedule_text(const MeasuredCall& c) {
  if (!c.packed) return std::to_string(c.schedule.empty() ? 0 : c.schedule[0]) + " steps";
  std::string text = "packed, " + std::to_string(c.schedule.size()) + " steps";
  return c.reverse ? text + ", reverse" : text;
}

}  // namespace

void set_measuring(bool on) { benchmark.store(on, std::memory_order_relaxed); }
bool measuring() { return benchmark.load(std::memory_order_relaxed); }

MeasuredCall measured_call(MeasuredPass pass, const torch::stable::Tensor& like,
                           const SequenceSizes& n, const Schedule& schedule, bool tf32) {
  MeasuredCall c;
  c.pass = pass;
  c.device = like.get_device_index();
  switch (like.scalar_type()) {
    case torch::headeronly::ScalarType::Double:
      c.dtype = "float64";
      break;
    case torch::headeronly::ScalarType::Half:
      c.dtype = "float16";
      break;
    case torch::headeronly::ScalarType::BFloat16:
      c.dtype = "bfloat16";
      break;
    default:
      c.dtype = "float32";
  }
  c.element_size = element_size_of(like);
  c.tf32 = tf32;
  c.batch = n.batch;
  c.state = n.state;
  c.packed = n.packed;
  // A padded batch runs the same launches in either direction.
  c.reverse = n.packed && schedule.reverse;
  c.schedule = n.packed ? schedule.sizes : std::vector<int64_t>{n.steps};
  return c;
}

MeasuredChoice measured_choice(const MeasuredCall& call) {
  MeasuredChoice choice;
  if (!plans_measurable() || device_slot(call.device) < 0) return choice;
  const Key key = key_of(call);
  Remembered& r = remembered();
  {
    const std::lock_guard<std::mutex> lock(r.mutex);
    r.follow_epoch();
    const auto found = r.index.find(key);
    if (found != r.index.end()) {
      r.order.splice(r.order.begin(), r.order, found->second);
      choice.kind = MeasuredChoice::Kind::kRemembered;
      choice.plan = found->second->second.chosen;
      return choice;
    }
  }
  if (capturing(call.device)) return choice;
  (void)measured_capacity();  // an invalid bound raises before anything is measured
  choice.candidates = candidate_plans(sequence_pass(call.pass), call.device, call.element_size,
                                      call.batch, call.state, call.tf32);
  // One candidate (the per-step path): nothing to choose between.
  if (choice.candidates.size() > 1) choice.kind = MeasuredChoice::Kind::kMeasure;
  return choice;
}

void remember_measured(const MeasuredCall& call, const std::vector<SequencePlan>& candidates,
                       const std::vector<double>& ms, size_t chosen) {
  const Key key = key_of(call);
  const size_t capacity = measured_capacity();
  Remembered& r = remembered();
  const std::lock_guard<std::mutex> lock(r.mutex);
  r.follow_epoch();
  const auto found = r.index.find(key);
  if (found != r.index.end()) {  // another thread measured it meanwhile: this answer stays
    r.order.erase(found->second);
    r.index.erase(found);
  }
  r.order.emplace_front(key, Measured{call, candidates[chosen], candidates, ms});
  r.index[key] = r.order.begin();
  r.trim(capacity);
}

std::string measured_plans_text() {
  Remembered& r = remembered();
  const std::lock_guard<std::mutex> lock(r.mutex);
  r.follow_epoch();
  std::string text;
  for (const auto& [key, m] : r.order) {
    const MeasuredCall& c = m.call;
    text += std::string("plan\t") + pass_name(c.pass) + "\t" + c.dtype + "\t" +
            (c.tf32 ? "1" : "0") + "\t" + std::to_string(c.batch) + "\t" + std::to_string(c.state) +
            "\t" + schedule_text(c) + "\t" + describe_candidate(m.chosen) + "\n";
    for (size_t i = 0; i < m.candidates.size(); ++i) {
      char time[32] = "refused";
      if (std::isfinite(m.ms[i])) std::snprintf(time, sizeof time, "%.6f", m.ms[i]);
      text += std::string("candidate\t") + time + "\t" + describe_candidate(m.candidates[i]) + "\n";
    }
  }
  return text;
}

const SequencePlan* imposed_plan(SequencePass pass) {
  return imposed.plan != nullptr && imposed.pass == pass ? imposed.plan : nullptr;
}

void imposed_launch_refused() {
  if (imposed.plan != nullptr) imposed.refused = true;
}

ImposedPlan::ImposedPlan(SequencePass pass, const SequencePlan& plan) {
  imposed = Imposed{&plan, pass, false};
}

ImposedPlan::~ImposedPlan() { imposed = Imposed{}; }

bool ImposedPlan::refused() const {
  const bool was = imposed.refused;
  imposed.refused = false;  // the next run of the candidate is asked afresh
  return was;
}

StreamTimer::StreamTimer(int device) : device_(device) {
  cudaEvent_t events[2] = {nullptr, nullptr};
  for (cudaEvent_t& event : events) {
    const cudaError_t error = cudaEventCreate(&event);
    if (error != cudaSuccess) {
      if (events[0] != nullptr) (void)cudaEventDestroy(events[0]);
      fail_cuda("creating a CUDA event to time the sequence plans", error);
    }
  }
  start_ = events[0];
  stop_ = events[1];
}

StreamTimer::~StreamTimer() {
  (void)cudaEventDestroy(static_cast<cudaEvent_t>(start_));
  (void)cudaEventDestroy(static_cast<cudaEvent_t>(stop_));
}

void StreamTimer::start() {
  const cudaError_t error =
      cudaEventRecord(static_cast<cudaEvent_t>(start_), current_stream(device_));
  if (error != cudaSuccess) fail_cuda("recording a CUDA event", error);
}

double StreamTimer::stop() {
  const auto stop = static_cast<cudaEvent_t>(stop_);
  cudaError_t error = cudaEventRecord(stop, current_stream(device_));
  if (error == cudaSuccess) error = cudaEventSynchronize(stop);
  float ms = 0;
  if (error == cudaSuccess) {
    error = cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start_), stop);
  }
  if (error != cudaSuccess) fail_cuda("timing a sequence plan with CUDA events", error);
  return ms;
}

}  // namespace lltm::cuda
