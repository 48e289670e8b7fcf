#include "proxy/proxy.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

namespace ep {
namespace proxy {

namespace {

int64_t nowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Commands taken per round at most, so that completions and mirrors are
// looked at between bursts.
constexpr int kBatch = 64;

}  // namespace

Proxy::Proxy(const Ring& ring, PutSink* sink, FlagWriter* flags, const ProxyOptions& options)
    : ring_(ring), sink_(sink), flags_(flags), opt_(options) {}

Proxy::~Proxy() { stop(); }

int Proxy::watch(const uint64_t* word) {
  if (started_) return -1;  // its thread reads the list without a lock
  watched_.push_back(word);
  last_seen_.push_back(__atomic_load_n(word, __ATOMIC_ACQUIRE));
  return int(watched_.size()) - 1;
}

epResult_t Proxy::start() {
  if (started_) return epInvalidUsage;  // once: a stopped proxy's counts are not for a second run
  if (ring_.slots == nullptr || !isPowerOfTwo(ring_.nslots) || sink_ == nullptr || flags_ == nullptr ||
      opt_.nranks < 1 || opt_.max_in_flight_per_peer < 1 || opt_.heartbeat_ms < 1)
    return epInvalidArgument;
  in_flight_per_peer_.assign(size_t(opt_.nranks), 0);
  max_in_flight_.assign(size_t(opt_.nranks), 0);
  for (size_t i = 0; i < watched_.size(); i++) flags_->write(kFlagMirrorFirst + int(i), last_seen_[i]);
  flags_->write(kFlagHeartbeat, ++beats_);
  last_beat_us_ = nowUs();
  stop_ = false;
  started_ = true;
  thread_ = std::thread([this] { run(); });
  return epSuccess;
}

void Proxy::stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

std::string Proxy::error() const {
  std::lock_guard<std::mutex> lock(err_mu_);
  return error_;
}

void Proxy::failWith(epResult_t res, int peer, const std::string& why) {
  if (failed_) return;
  failed_ = true;
  {
    std::lock_guard<std::mutex> lock(err_mu_);
    error_ = why;
  }
  flags_->write(kFlagError, errorWord(res, peer));
}

void Proxy::run() {
  int idle = 0;
  while (!stop_.load(std::memory_order_relaxed) && !failed_) {
    if (step()) {
      idle = 0;
    } else if (++idle > opt_.idle_spins) {
      std::this_thread::sleep_for(std::chrono::microseconds(opt_.idle_sleep_us));
    }
    const int64_t now = nowUs();
    if (!failed_ && now - last_beat_us_ >= int64_t(opt_.heartbeat_ms) * 1000) {
      flags_->write(kFlagHeartbeat, ++beats_);
      last_beat_us_ = now;
    }
  }
}

bool Proxy::step() {
  int peer = -1;
  std::string why;
  const epResult_t res = sink_->progress(&peer, &why);
  if (res != epSuccess) {
    failWith(res, peer, "the transport failed" + (peer >= 0 ? " toward rank " + std::to_string(peer) : std::string()) +
                        ": " + why);
    return false;
  }
  bool did = retire();
  if (!failed_) did |= consume();
  if (!failed_) did |= retire();
  did |= mirror();
  return did;
}

// Puts complete in posting order as far as the counter goes: a later put
// done before an earlier one waits for it to be counted.
bool Proxy::retire() {
  bool did = false;
  while (!in_flight_.empty()) {
    const Posted& p = in_flight_.front();
    int done = 0;
    const epResult_t res = sink_->test(p.peer, p.request, &done);
    if (res != epSuccess) {
      failWith(res, p.peer, "put " + std::to_string(completed_) + " to rank " + std::to_string(p.peer) + " failed");
      return did;
    }
    if (!done) break;
    in_flight_per_peer_[size_t(p.peer)]--;
    in_flight_.pop_front();
    completed_++;
    did = true;
  }
  if (did) flags_->write(kFlagCompleted, completed_);
  while (!flushes_.empty() && flushes_.front().after <= completed_) {
    flags_->write(kFlagFlushed, flushes_.front().id);
    flushes_.pop_front();
    did = true;
  }
  return did;
}

bool Proxy::consume() {
  bool did = false;
  Command c;
  for (int i = 0; i < kBatch && tryTake(ring_, next_, &c); i++) {
    if (c.op == kOpPut) {
      if (c.peer < 0 || c.peer >= opt_.nranks) {
        failWith(epInvalidArgument, -1, "command " + std::to_string(next_) + ": a put to rank " + std::to_string(c.peer) +
                                        ", outside [0, " + std::to_string(opt_.nranks) + ")");
        break;
      }
      int& flight = in_flight_per_peer_[size_t(c.peer)];
      if (flight >= opt_.max_in_flight_per_peer) break;  // credits toward that peer: wait for completions
      uint64_t request = 0;
      const epResult_t res =
          sink_->put(c.peer, c.local_offset, c.remote_offset, c.bytes, c.signal_offset, c.signal_value, &request);
      if (res == epInProgress) break;  // the connection's queue is full: progress, then again
      if (res != epSuccess) {
        failWith(res, c.peer, "command " + std::to_string(next_) + ": the put of " + std::to_string(c.bytes) +
                              " bytes to rank " + std::to_string(c.peer) + " failed");
        break;
      }
      in_flight_.push_back({c.peer, request});
      flight++;
      max_in_flight_[size_t(c.peer)] = std::max(max_in_flight_[size_t(c.peer)], flight);
      posted_++;
    } else if (c.op == kOpFlush) {
      flushes_.push_back({c.signal_value, posted_});
    } else {
      failWith(epInvalidArgument, -1, "command " + std::to_string(next_) + ": unknown operation " + std::to_string(c.op));
      break;
    }
    next_++;
    did = true;
  }
  if (did) flags_->write(kFlagConsumed, next_);
  return did;
}

bool Proxy::mirror() {
  bool did = false;
  for (size_t i = 0; i < watched_.size(); i++) {
    const uint64_t v = __atomic_load_n(watched_[i], __ATOMIC_ACQUIRE);
    if (v == last_seen_[i]) continue;
    last_seen_[i] = v;
    flags_->write(kFlagMirrorFirst + int(i), v);
    did = true;
  }
  return did;
}

epResult_t waitFlag(const uint64_t* flags, int flag, uint64_t target, int timeout_ms, int stall_ms, int* peer,
                    bool* stalled) {
  *peer = -1;
  *stalled = false;
  const int64_t start = nowUs();
  uint64_t beat = __atomic_load_n(&flags[kFlagHeartbeat], __ATOMIC_ACQUIRE);
  int64_t beat_seen = start;
  for (;;) {
    if (__atomic_load_n(&flags[flag], __ATOMIC_ACQUIRE) >= target) return epSuccess;
    const uint64_t err = __atomic_load_n(&flags[kFlagError], __ATOMIC_ACQUIRE);
    if (err != 0) {
      *peer = errorPeer(err);
      return errorResult(err);
    }
    const int64_t now = nowUs();
    const uint64_t b = __atomic_load_n(&flags[kFlagHeartbeat], __ATOMIC_ACQUIRE);
    if (b != beat) {
      beat = b;
      beat_seen = now;
    } else if (now - beat_seen > int64_t(stall_ms) * 1000) {
      *stalled = true;
      return epTimeout;
    }
    if (now - start > int64_t(timeout_ms) * 1000) return epTimeout;
    std::this_thread::yield();
  }
}

}  // namespace proxy
}  // namespace ep
