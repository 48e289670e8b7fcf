// What a rank heard of a shrink other ranks began (docs/SHRINK.md, "What is
// built"): the recovery link's thread records the messages of the newest
// epoch. A rank waiting inside a call fails it where it can no longer
// complete (src/host/exchange.cc): soon where it waits for a rank involved
// in that shrink (one that sent a message of it, so left its calls, or one
// a message counts as dead), later where it waits only for ranks still in
// their calls. The error names who began the shrink, whom the messages
// count as dead, and the rank the call waited for.
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
    if (epoch < epoch_.load() || from < 0 || size_t(from) >= dead.size()) return;
    if (size_t(from) < removed_.size() && removed_[size_t(from)]) return;  // a rank a shrink removed
    if (epoch > epoch_.load()) {  // the first message of a newer epoch
      from_ = from;
      dead_.assign(dead.size(), false);
      involved_.assign(dead.size(), false);
    }
    if (involved_.size() != dead.size()) return;
    involved_[size_t(from)] = true;
    for (size_t r = 0; r < dead.size(); r++)
      if (dead[r]) involved_[r] = dead_[r] = true;
    epoch_.store(epoch);
  }

  // A shrink completed without these ranks: their messages count no more.
  void removed(const std::vector<bool>& dead) {
    std::lock_guard<std::mutex> lock(mu_);
    removed_ = dead;
  }

  // The lowest rank r involved in the newest epoch's shrink for which
  // waiting_on(r) holds; -1: none.
  template <typename Pred>
  int blocks(Pred waiting_on) const {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t r = 0; r < involved_.size(); r++)
      if (involved_[r] && waiting_on(int(r))) return int(r);
    return -1;
  }

  // "rank 2 began epCommShrink (epoch 1), counting rank 1 dead": the ranks
  // its messages so far count dead, beyond those removed before.
  std::string describe() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::string list;
    int n = 0;
    for (size_t r = 0; r < dead_.size(); r++)
      if (dead_[r] && !(r < removed_.size() && removed_[r])) list += std::string(n++ ? ", " : "") + std::to_string(r);
    std::string out = "rank " + std::to_string(from_) + " began epCommShrink (epoch " +
                      std::to_string(epoch_.load()) + ")";
    if (n > 0) out += std::string(", counting rank") + (n > 1 ? "s " : " ") + list + " dead";
    return out;
  }

 private:
  mutable std::mutex mu_;
  std::atomic<uint32_t> epoch_{0};
  int from_ = -1;                // the sender of the newest epoch's first message
  std::vector<bool> dead_;      // [R] the ranks the newest epoch's messages count dead
  std::vector<bool> involved_;  // [R] those, and the senders of the newest epoch's messages
  std::vector<bool> removed_;   // [R] the ranks completed shrinks removed
};

}  // namespace recovery
}  // namespace ep
