// The counts of calls.h.
#include "calls.h"

#include <mutex>

namespace lltm::cuda_host {
namespace {

struct Counts {
  std::mutex mutex;
  std::map<std::string, int64_t> by_name;
  std::vector<Allocation> allocations;
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
