// The counts of calls.h.
#include "calls.h"

#include <mutex>

namespace lltm::cuda_host {
namespace {

struct Counts {
  std::mutex mutex;
  std::map<std::string, int64_t> by_name;
};

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

}  // namespace lltm::cuda_host
