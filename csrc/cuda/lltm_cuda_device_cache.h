// What lltm asks a GPU once and remembers: its attributes, the occupancy
// calculator's answers (through the plans they decide), the kernel
// attributes set on it. A training step at small sizes is bound by its host
// time, of which runtime queries would be a part at every call (the occupancy
// calculator is asked a few dozen times for a plan): a second call with the
// same sizes asks the GPU nothing.
//
// Remembered under the device's slot and epoch (lltm_cuda_runtime.h): on a
// GPU, devices 0 to kDeviceSlots - 1, for the whole process; in the host
// build, the emulated GPU until a test changes it. Thread-safe: a mutex
// guards each cache, never held while the GPU is asked (two threads may both
// ask the first time, and remember the same answer).
#pragma once

#include <cstdint>
#include <mutex>

#include "lltm_cuda_runtime.h"

namespace lltm::cuda {

template <typename Value>
class PerDevice {
 public:
  // The value remembered for `device`, else query()'s answer, remembered
  // where the device has a slot.
  template <typename Query>
  Value get(int device, const Query& query) {
    const int slot = device_slot(device);
    if (slot < 0) return query();
    const uint64_t epoch = device_epoch();
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      const Entry& entry = entries_[slot];
      if (entry.known && entry.epoch == epoch) return entry.value;
    }
    const Value value = query();
    const std::lock_guard<std::mutex> lock(mutex_);
    entries_[slot] = Entry{true, epoch, value};
    return value;
  }

 private:
  struct Entry {
    bool known = false;
    uint64_t epoch = 0;
    Value value{};
  };
  std::mutex mutex_;
  Entry entries_[kDeviceSlots];
};

}  // namespace lltm::cuda
