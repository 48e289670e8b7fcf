// What a rank heard of a shrink another rank began (docs/SHRINK.md, "The
// notice"): the recovery link's thread records the first message of each
// newer epoch; a rank waiting inside a call reads it to fail that call at
// once, naming who began the shrink and whom it counts as dead, so that the
// error says which rank died even where this rank had not seen it yet.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace ep {
namespace recovery {

class ShrinkNotice {
 public:
  // The newest epoch any recovery message carried (0: none).
  uint32_t epoch() const { return epoch_.load(); }

  // A message of `epoch` from rank `from`, whose sender counts `dead` as dead.
  void record(uint32_t epoch, int from, const std::vector<bool>& dead) {
    std::lock_guard<std::mutex> lock(mu_);
    if (epoch <= epoch_.load()) return;  // the first message of an epoch is the notice
    from_ = from;
    dead_ = dead;
    epoch_.store(epoch);
  }

  // "rank 2 began epCommShrink (epoch 1), counting rank 1 dead"
  std::string describe() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::string list;
    int n = 0;
    for (size_t r = 0; r < dead_.size(); r++)
      if (dead_[r]) list += std::string(n++ ? ", " : "") + std::to_string(r);
    std::string out = "rank " + std::to_string(from_) + " began epCommShrink (epoch " +
                      std::to_string(epoch_.load()) + ")";
    if (n > 0) out += std::string(", counting rank") + (n > 1 ? "s " : " ") + list + " dead";
    return out;
  }

 private:
  mutable std::mutex mu_;
  std::atomic<uint32_t> epoch_{0};
  int from_ = -1;
  std::vector<bool> dead_;
};

}  // namespace recovery
}  // namespace ep
