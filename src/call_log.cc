#include "call_log.h"

#include <algorithm>
#include <atomic>

namespace ep {

// One rank's log. Slot c % kSlots holds call c as its low 24 bits << 8 |
// kind, so that a reader knows a slot that was already reused for a later
// call (a reader 2^24 calls behind, the only way to mistake one, would be
// tens of seconds late). `issued` is stored (release) after the slot, so
// calls below it can be read (acquire). A low-latency dispatch's kind byte
// carries its llDispatchNote; `ll_latest` repeats the latest such slot (on a
// cache line of its own, away from `issued`). The choice of records reads
// both relaxed: read late, it only makes a call mixed, which every receive
// handles. `closed` is written once, when the rank leaves its communicator.
struct CallLog::Shared {
  std::atomic<uint64_t> issued;
  std::atomic<uint64_t> captured_from;  // the first call logged into a graph capture (kNever: none)
  alignas(64) std::atomic<uint32_t> ll_latest;
  alignas(64) std::atomic<uint32_t> closed;  // a CloseKind
  alignas(64) std::atomic<uint32_t> slots[kSlots];
};

namespace {
constexpr uint64_t kNever = ~uint64_t(0);
constexpr uint32_t kEmpty = ~uint32_t(0);  // no call yet (kind 0x3f is no kind)
static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free,
              "the logs are shared between processes");
constexpr uint32_t kKindMask = 0x3f;  // the kind in a slot's low byte (the rest: llDispatchNote)
static_assert((kKindMask & (kCallLLLarge | kCallLLPlain)) == 0, "the note's bits are not the kind's");
uint32_t slotOf(uint64_t call, CallKind kind, uint8_t note) { return uint32_t(call << 8) | kind | note; }
bool holds(uint32_t slot, uint64_t call) { return slot != kEmpty && slot >> 8 == uint32_t(call & 0xffffff); }
}  // namespace

const char* callKindName(int kind) {
  switch (kind) {
    case kCallRouting: return "the routing of a dispatch (epDispatch with new ids, or epDispatchPrepare)";
    case kCallDispatch: return "a dispatch (epDispatch)";
    case kCallCombine: return "a combine (epCombine)";
    case kCallLLDispatch: return "a low-latency dispatch (epLowLatencyDispatch)";
    case kCallLLCombine: return "a low-latency combine (epLowLatencyCombine)";
    default: return "no call";
  }
}

size_t callLogBytes() { return sizeof(CallLog::Shared); }

void callLogFormat(void* mem) {
  auto* s = static_cast<CallLog::Shared*>(mem);
  s->issued.store(0, std::memory_order_relaxed);
  s->ll_latest.store(kEmpty, std::memory_order_relaxed);
  s->closed.store(kOpen, std::memory_order_relaxed);
  for (auto& slot : s->slots) slot.store(kEmpty, std::memory_order_relaxed);
  s->captured_from.store(kNever, std::memory_order_release);
}

CallLog::CallLog(void* own, int rank, int nranks)
    : own_(static_cast<Shared*>(own)), rank_(rank), peers_(size_t(nranks), nullptr), checked_(size_t(nranks), 0) {}

void CallLog::setPeer(int r, const void* log) {
  if (r != rank_) peers_[size_t(r)] = static_cast<const Shared*>(log);
}

bool CallLog::comparesAny() const {
  return std::any_of(peers_.begin(), peers_.end(), [](const Shared* p) { return p != nullptr; });
}

void CallLog::record(CallKind kind, bool capturing, uint8_t note) {
  const uint64_t c = own_->issued.load(std::memory_order_relaxed);
  const uint32_t slot = slotOf(c, kind, note);
  own_->slots[c % kSlots].store(slot, std::memory_order_relaxed);
  if (kind == kCallLLDispatch) own_->ll_latest.store(slot, std::memory_order_relaxed);
  if (capturing && own_->captured_from.load(std::memory_order_relaxed) == kNever)
    own_->captured_from.store(c, std::memory_order_relaxed);
  own_->issued.store(c + 1, std::memory_order_release);
}

// The first small peer to log the dispatch decides for the small ones after
// it, so that ranks whose hosts run at different distances ahead still send
// alike: a host ahead of a peer reads that peer's previous low-latency
// dispatch as a prediction; the peer, coming later, reads the choice itself.
// Two small ranks that choose at the same moment may still differ (a mixed
// call).
bool CallLog::chooseLLRecords(bool small, bool follow_peers, int* peer) const {
  *peer = -1;
  if (!small || !follow_peers) return small;
  const uint64_t n = own_->issued.load(std::memory_order_relaxed);  // the call about to be logged
  int adopted = -1, decided_large = -1, predicted_large = -1;  // adopted: 0 flagged, 1 plain
  for (size_t r = 0; r < peers_.size(); r++) {
    const Shared* p = peers_[r];
    if (p == nullptr) continue;
    const uint32_t d = p->slots[n % kSlots].load(std::memory_order_relaxed);
    if (holds(d, n) && (d & kKindMask) == kCallLLDispatch) {  // logged this call already
      if (d & kCallLLLarge) {
        if (decided_large < 0) decided_large = int(r);
      } else if (d & kCallLLPlain) {
        if (adopted != 1) *peer = int(r);
        adopted = 1;
      } else if (adopted < 0) {
        adopted = 0;
      }
      continue;
    }
    const uint32_t latest = p->ll_latest.load(std::memory_order_relaxed);
    if (latest != kEmpty && (latest & kCallLLLarge) && predicted_large < 0) predicted_large = int(r);
  }
  if (adopted >= 0) return adopted == 0;
  *peer = decided_large >= 0 ? decided_large : predicted_large;
  return *peer < 0;
}

bool CallLog::progress(int r, uint64_t* mine, uint64_t* theirs) const {
  if (r < 0 || size_t(r) >= peers_.size() || peers_[size_t(r)] == nullptr) return false;
  const Shared* p = peers_[size_t(r)];
  if (own_->captured_from.load(std::memory_order_acquire) != kNever ||
      p->captured_from.load(std::memory_order_acquire) != kNever)
    return false;
  *mine = own_->issued.load(std::memory_order_acquire);
  *theirs = p->issued.load(std::memory_order_acquire);
  return true;
}

void CallLog::announceClosed(CloseKind how) {
  uint32_t open = kOpen;
  own_->closed.compare_exchange_strong(open, how, std::memory_order_release, std::memory_order_relaxed);
}

CloseKind CallLog::peerClosed(int r) const {
  if (r < 0 || size_t(r) >= peers_.size() || peers_[size_t(r)] == nullptr) return kOpen;
  const uint32_t how = peers_[size_t(r)]->closed.load(std::memory_order_acquire);
  return how == kClosedDestroyed || how == kClosedAborted ? CloseKind(how) : kOpen;
}

bool CallLog::findMismatch(CallMismatch* out) {
  // issued first: the calls below it, and where captures began among them, are in.
  const uint64_t mine = own_->issued.load(std::memory_order_acquire);
  const uint64_t my_capture = own_->captured_from.load(std::memory_order_acquire);
  for (size_t r = 0; r < peers_.size(); r++) {
    const Shared* p = peers_[r];
    if (p == nullptr) continue;
    uint64_t hi = std::min(mine, p->issued.load(std::memory_order_acquire));
    hi = std::min({hi, my_capture, p->captured_from.load(std::memory_order_acquire)});
    const uint64_t lo = std::max(checked_[r], hi > uint64_t(kSlots) ? hi - kSlots : 0);
    for (uint64_t c = lo; c < hi; c++) {
      const uint32_t a = own_->slots[c % kSlots].load(std::memory_order_relaxed);
      const uint32_t b = p->slots[c % kSlots].load(std::memory_order_acquire);
      if (!holds(a, c) || !holds(b, c)) continue;  // reused for a later call since: not compared
      if ((a & kKindMask) != (b & kKindMask)) {
        checked_[r] = c + 1;
        *out = CallMismatch{int(r), c, int(a & kKindMask), int(b & kKindMask)};
        return true;
      }
    }
    checked_[r] = std::max(checked_[r], hi);
  }
  return false;
}

}  // namespace ep
