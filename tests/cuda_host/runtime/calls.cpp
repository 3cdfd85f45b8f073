// The counts of calls.h.
#include "calls.h"

#include <mutex>
#include <utility>

namespace lltm::cuda_host {
namespace {

struct Counts {
  std::mutex mutex;
  std::map<std::string, int64_t> by_name;
  std::vector<Allocation> allocations;
  std::map<std::string, double> costs;  // microseconds, by name
  double clock = 0;
};

constexpr size_t kMaxAllocations = 65536;

Counts& counts() {
  static Counts state;
  return state;
}

}  // namespace

void count_call(const std::string& name) {
  Counts& c = counts();
  const std::lock_guard<std::mutex> lock(c.mutex);
  ++c.by_name[name];
  const auto cost = c.costs.find(name);
  if (cost != c.costs.end()) c.clock += cost->second;
}

void charge(const std::string& name) {
  Counts& c = counts();
  const std::lock_guard<std::mutex> lock(c.mutex);
  const auto cost = c.costs.find(name);
  if (cost != c.costs.end()) c.clock += cost->second;
}

double clock_us() {
  Counts& c = counts();
  const std::lock_guard<std::mutex> lock(c.mutex);
  return c.clock;
}

void set_costs(std::map<std::string, double> costs) {
  Counts& c = counts();
  const std::lock_guard<std::mutex> lock(c.mutex);
  c.costs = std::move(costs);
}

std::map<std::string, int64_t> calls() {
  Counts& c = counts();
  const std::lock_guard<std::mutex> lock(c.mutex);
  return c.by_name;
}

void record_allocation(int64_t ndim, const int64_t* sizes, int32_t dtype) {
  Counts& c = counts();
  const std::lock_guard<std::mutex> lock(c.mutex);
  if (c.allocations.size() >= kMaxAllocations) c.allocations.clear();
  c.allocations.push_back({std::vector<int64_t>(sizes, sizes + ndim), dtype});
}

std::vector<Allocation> take_allocations() {
  Counts& c = counts();
  const std::lock_guard<std::mutex> lock(c.mutex);
  std::vector<Allocation> taken;
  taken.swap(c.allocations);
  return taken;
}

}  // namespace lltm::cuda_host
