#include "recovery/agreement.h"

#include <algorithm>

namespace ep {
namespace recovery {

Agreement::Agreement(int rank, const std::vector<bool>& members, uint32_t epoch, const std::vector<int>& suspects,
                     uint64_t counter)
    : rank_(rank),
      nranks_(int(members.size())),
      members_(members),
      epoch_(epoch),
      dead_(members.size(), false),
      counter_(counter) {
  for (int r = 0; r < nranks_; r++)
    if (!members_[size_t(r)]) dead_[size_t(r)] = true;  // gone before: not asked again
  for (int r : suspects)
    if (r >= 0 && r < nranks_ && r != rank_) dead_[size_t(r)] = true;
}

AgreeMessage Agreement::outgoing() const {
  AgreeMessage m;
  m.epoch = epoch_;
  m.round = state_ == State::kDecided ? 0 : round_;
  m.dead = dead_;
  m.counter = counter_;
  m.changed = grew_;
  m.decide = state_ == State::kDecided;
  return m;
}

std::vector<int> Agreement::waitingFor() const {
  std::vector<int> out;
  if (state_ != State::kRunning) return out;
  auto it = inbox_.find(round_);
  for (int r = 0; r < nranks_; r++) {
    if (r == rank_ || dead_[size_t(r)]) continue;
    if (it == inbox_.end() || it->second.count(r) == 0) out.push_back(r);
  }
  return out;
}

void Agreement::suspect(int r) {
  if (r < 0 || r >= nranks_ || r == rank_ || dead_[size_t(r)]) return;
  dead_[size_t(r)] = true;
  grew_ = true;
}

void Agreement::adopt(const AgreeMessage& m) {
  dead_ = m.dead;
  counter_ = m.counter;
  state_ = dead_[size_t(rank_)] ? State::kExcluded : State::kDecided;
  inbox_.clear();
}

void Agreement::receive(int from, const AgreeMessage& m) {
  if (from < 0 || from >= nranks_ || from == rank_ || m.dead.size() != size_t(nranks_)) return;
  if (!members_[size_t(from)]) return;  // removed by an earlier shrink: alive or not, it has no say
  if (m.epoch < epoch_) return;  // an older shrink's
  if (m.epoch > epoch_) {
    if (state_ == State::kRunning) state_ = State::kSuperseded;
    return;
  }
  if (state_ != State::kRunning) return;
  if (m.decide) {  // a survivor decided: its set is everyone's (later suspicions wait for the next epoch)
    adopt(m);
    return;
  }
  if (dead_[size_t(from)]) return;  // counted as dead here: what it says no longer counts
  if (m.dead[size_t(rank_)]) {
    state_ = State::kExcluded;
    return;
  }
  if (m.round < round_) {  // late, from a round this rank left: its news still counts
    for (int r = 0; r < nranks_; r++)
      if (m.dead[size_t(r)]) suspect(r);
    if (m.counter > counter_) counter_ = m.counter, grew_ = true;
    return;
  }
  inbox_[m.round][from] = m;
}

void Agreement::silent(int from) {
  if (state_ == State::kRunning) suspect(from);
}

bool Agreement::majority() const {
  int total = 0, alive = 0, lowest = -1;
  for (int r = 0; r < nranks_; r++) {
    if (!members_[size_t(r)]) continue;
    total++;
    if (lowest < 0) lowest = r;
    if (!dead_[size_t(r)]) alive++;
  }
  if (2 * alive > total) return true;
  return 2 * alive == total && lowest >= 0 && !dead_[size_t(lowest)];
}

bool Agreement::step() {
  if (state_ != State::kRunning) return false;
  if (!majority()) {  // sets only grow: this side can never decide
    state_ = State::kMinority;
    return true;
  }
  if (!waitingFor().empty()) return false;
  std::map<int, AgreeMessage>& got = inbox_[round_];
  bool settled = !grew_;
  for (int r = 0; r < nranks_; r++) {
    if (r == rank_ || dead_[size_t(r)]) continue;
    const AgreeMessage& m = got[r];
    if (m.dead != dead_ || m.counter != counter_ || m.changed) settled = false;
  }
  if (settled) {
    state_ = State::kDecided;
    inbox_.clear();
    return true;
  }
  // Merge what this round brought, then the next round.
  bool grew = false;
  for (auto& [r, m] : got) {
    if (dead_[size_t(r)]) continue;  // found silent or dead after it sent
    for (int q = 0; q < nranks_; q++)
      if (m.dead[size_t(q)] && !dead_[size_t(q)] && q != rank_) dead_[size_t(q)] = true, grew = true;
    if (m.counter > counter_) counter_ = m.counter, grew = true;
  }
  inbox_.erase(inbox_.begin(), inbox_.upper_bound(round_));
  round_++;
  grew_ = grew;
  if (!majority()) state_ = State::kMinority;
  return true;
}

}  // namespace recovery
}  // namespace ep
