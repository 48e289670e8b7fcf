// The proxy's host code (src/proxy): a producer thread writes commands into
// the ring as a kernel will, the proxy posts them on a fake transport (an
// in-process PutSink whose queue, completions and failures the test drives)
// and answers through host flags. Checked: puts posted in ring order with
// their data and signals, the ring's credits (a full ring holds the
// producer, no slot overwritten), the cap of puts in flight per peer, a
// flush done only after the puts before it, the first error naming its peer
// (put, completion, progress), a stopped proxy seen by a waiter through its
// heartbeat, signal words mirrored into flags, bad commands and options.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common.h"
#include "proxy/proxy.h"

using namespace ep::proxy;

namespace {

constexpr int kRanks = 4;         // this rank is 0; puts go to 1..3
constexpr size_t kSegment = 1 << 16;

// A transport in one process: each rank's segment is a byte array; a put is
// queued and lands (data, then the signal word) on a later progress, in order
// per peer; it completes a number of progress calls after it landed.
class FakeSink : public PutSink {
 public:
  FakeSink() : segments_(kRanks, std::vector<uint8_t>(kSegment, 0)) {}

  std::vector<std::vector<uint8_t>> segments_;  // [rank]
  std::atomic<int> queue_cap{8};                // puts not yet completed, beyond which put says epInProgress
  std::atomic<bool> paused{false};              // put says epInProgress while set
  std::atomic<bool> hold_completions{false};    // nothing completes while set
  std::atomic<int> fail_put_at{-1};             // the n-th put (0-based) fails with epRemoteError
  std::atomic<int> fail_progress_at{-1};        // the n-th progress fails, naming rank 2
  std::atomic<int> fail_test_peer{-1};          // test of a put to this peer fails

  std::mutex mu;
  std::vector<std::pair<int, uint64_t>> order;  // (peer, signal value) of each put, as posted

  epResult_t put(int peer, size_t local, size_t remote, size_t bytes, size_t sig, uint64_t value,
                 uint64_t* request) override {
    if (paused) return epInProgress;
    if (int(queue_.size()) >= queue_cap) return epInProgress;
    if (puts_++ == fail_put_at) return epRemoteError;
    std::vector<uint8_t> data(segments_[0].begin() + long(local), segments_[0].begin() + long(local + bytes));
    queue_.push_back({peer, remote, std::move(data), sig, value, ++requests_, false, 0});
    *request = requests_;
    std::lock_guard<std::mutex> lock(mu);
    order.push_back({peer, value});
    return epSuccess;
  }
  epResult_t test(int peer, uint64_t request, int* done) override {
    if (peer == fail_test_peer) return epRemoteError;
    *done = request <= done_upto_;
    return epSuccess;
  }
  epResult_t progress(int* peer, std::string* why) override {
    if (progresses_++ == fail_progress_at) {
      *peer = 2;
      *why = "connection reset by the fake";
      return epRemoteError;
    }
    // Land the oldest queued put (in order), then complete what landed a while ago.
    for (Queued& q : queue_)
      if (!q.landed) {
        uint8_t* seg = segments_[size_t(q.peer)].data();
        if (!q.data.empty()) memcpy(seg + q.remote, q.data.data(), q.data.size());
        __atomic_store_n(reinterpret_cast<uint64_t*>(seg + q.sig), q.value, __ATOMIC_RELEASE);
        q.landed = true;
        q.landed_at = progresses_;
        break;
      }
    while (!hold_completions && !queue_.empty() && queue_.front().landed &&
           progresses_ - queue_.front().landed_at >= 3) {
      done_upto_ = queue_.front().request;
      queue_.pop_front();
    }
    return epSuccess;
  }
  uint64_t word(int rank, size_t offset) const {
    return __atomic_load_n(reinterpret_cast<const uint64_t*>(segments_[size_t(rank)].data() + offset),
                           __ATOMIC_ACQUIRE);
  }

 private:
  struct Queued {
    int peer;
    size_t remote;
    std::vector<uint8_t> data;
    size_t sig;
    uint64_t value, request;
    bool landed;
    int landed_at;
  };
  std::deque<Queued> queue_;
  uint64_t requests_ = 0, done_upto_ = 0;
  int puts_ = 0, progresses_ = 0;
};

// The ring, the flags and the proxy of one test.
struct Rig {
  std::vector<Command> slots;
  Ring ring;
  uint64_t flags[16] = {};
  HostFlags writer{flags};
  FakeSink sink;
  uint64_t head = 0;
  std::unique_ptr<Proxy> proxy;

  explicit Rig(uint32_t nslots, int cap = 32) : slots(nslots) {
    ring.slots = slots.data();
    ring.nslots = nslots;
    ProxyOptions o;
    o.nranks = kRanks;
    o.max_in_flight_per_peer = cap;
    o.heartbeat_ms = 5;
    proxy = std::make_unique<Proxy>(ring, &sink, &writer, o);
  }
  uint64_t flag(int f) const { return __atomic_load_n(&flags[f], __ATOMIC_ACQUIRE); }
  // Pushes c, waiting for room (the producer's side of the credits).
  bool push(const Command& c, int timeout_ms = 10000) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (!tryPush(ring, &head, flag(kFlagConsumed), c)) {
      if (std::chrono::steady_clock::now() > end || flag(kFlagError)) return false;
      std::this_thread::yield();
    }
    return true;
  }
  epResult_t wait(int f, uint64_t target, int* peer, bool* stalled, int timeout_ms = 10000) {
    return waitFlag(flags, f, target, timeout_ms, 2000, peer, stalled);
  }
};

Command put(int peer, size_t local, size_t remote, size_t bytes, size_t sig, uint64_t value) {
  Command c{};
  c.op = kOpPut;
  c.peer = peer;
  c.local_offset = local;
  c.remote_offset = remote;
  c.bytes = bytes;
  c.signal_offset = sig;
  c.signal_value = value;
  return c;
}

Command flush(uint64_t id) {
  Command c{};
  c.op = kOpFlush;
  c.signal_value = id;
  return c;
}

// 1000 puts of random sizes to 3 peers through a ring of 16 slots, at most 4
// in flight per peer: posted in ring order, each peer's last bytes and signal
// in place, every counter at 1000.
void puts_land_in_ring_order(void**) {
  Rig rig(16, 4);
  assert_int_equal(rig.proxy->start(), epSuccess);
  std::mt19937 rng(7);
  constexpr int kPuts = 1000;
  std::vector<Command> sent;
  for (int i = 0; i < kPuts; i++) {
    const int peer = 1 + int(rng() % 3);
    const size_t bytes = rng() % 2 == 0 ? 0 : 1 + rng() % 4000;
    const size_t local = (size_t(i) % 8) * 4096;
    // The source bytes are the producer's: written before the command.
    for (size_t k = 0; k < bytes; k++) rig.sink.segments_[0][local + k] = uint8_t(i * 31 + int(k));
    const Command c = put(peer, local, 8192 + size_t(peer) * 4096, bytes, 64 + 8 * size_t(peer), uint64_t(i + 1));
    assert_true(rig.push(c));
    sent.push_back(c);
    // Reusing a source buffer needs its put completed: wait, as a kernel would.
    if (i % 8 == 7) {
      int p;
      bool s;
      assert_int_equal(rig.wait(kFlagCompleted, uint64_t(i + 1), &p, &s), epSuccess);
    }
  }
  int p;
  bool stalled;
  assert_int_equal(rig.wait(kFlagCompleted, kPuts, &p, &stalled), epSuccess);
  assert_int_equal(rig.flag(kFlagConsumed), kPuts);
  {
    std::lock_guard<std::mutex> lock(rig.sink.mu);
    assert_int_equal(rig.sink.order.size(), kPuts);
    for (int i = 0; i < kPuts; i++) {
      assert_int_equal(rig.sink.order[size_t(i)].first, sent[size_t(i)].peer);
      assert_int_equal(rig.sink.order[size_t(i)].second, uint64_t(i + 1));
    }
  }
  for (int peer = 1; peer < kRanks; peer++) {
    int last = -1;
    for (int i = 0; i < kPuts; i++)
      if (sent[size_t(i)].peer == peer) last = i;
    assert_int_equal(rig.sink.word(peer, 64 + 8 * size_t(peer)), uint64_t(last + 1));
    // The last put's bytes, from its source slot, at its destination.
    const uint8_t* got = rig.sink.segments_[size_t(peer)].data() + 8192 + size_t(peer) * 4096;
    for (size_t k = 0; k < sent[size_t(last)].bytes; k++) assert_int_equal(got[k], uint8_t(last * 31 + int(k)));
    assert_true(rig.proxy->maxInFlight(peer) <= 4);
    assert_true(rig.proxy->maxInFlight(peer) >= 1);
  }
  assert_int_equal(rig.flag(kFlagError), 0);
}

// A transport that takes nothing: the ring of 4 fills, the producer is held
// (tryPush false) and no slot is overwritten; once it takes, all 40 go, in order.
void a_full_ring_holds_the_producer(void**) {
  Rig rig(4);
  rig.sink.paused = true;
  assert_int_equal(rig.proxy->start(), epSuccess);
  int pushed = 0;
  while (pushed < 40 && tryPush(rig.ring, &rig.head, rig.flag(kFlagConsumed), put(1, 0, 0, 8, 0, uint64_t(pushed + 1))))
    pushed++;
  // The proxy may hold one command it could not post; the ring holds 4.
  usleep(50 * 1000);
  while (tryPush(rig.ring, &rig.head, rig.flag(kFlagConsumed), put(1, 0, 0, 8, 0, uint64_t(pushed + 1)))) pushed++;
  assert_true(pushed >= 4 && pushed <= 5);
  assert_true(rig.flag(kFlagConsumed) <= 1);
  rig.sink.paused = false;
  for (int i = pushed; i < 40; i++) assert_true(rig.push(put(1, 0, 0, 8, 0, uint64_t(i + 1))));
  int p;
  bool s;
  assert_int_equal(rig.wait(kFlagCompleted, 40, &p, &s), epSuccess);
  std::lock_guard<std::mutex> lock(rig.sink.mu);
  for (size_t i = 0; i < 40; i++) assert_int_equal(rig.sink.order[i].second, i + 1);
}

// A flush is done when the puts before it completed, not before.
void a_flush_waits_for_the_puts_before_it(void**) {
  Rig rig(16);
  rig.sink.hold_completions = true;
  assert_int_equal(rig.proxy->start(), epSuccess);
  for (int i = 0; i < 5; i++) assert_true(rig.push(put(2, 0, 0, 16, 8, uint64_t(i + 1))));
  assert_true(rig.push(flush(9)));
  int p;
  bool s;
  assert_int_equal(rig.wait(kFlagConsumed, 6, &p, &s), epSuccess);
  usleep(50 * 1000);
  assert_int_equal(rig.flag(kFlagFlushed), 0);
  assert_int_equal(rig.flag(kFlagCompleted), 0);
  rig.sink.hold_completions = false;
  assert_int_equal(rig.wait(kFlagFlushed, 9, &p, &s), epSuccess);
  assert_int_equal(rig.flag(kFlagCompleted), 5);
  // A flush with nothing before it is done at once.
  assert_true(rig.push(flush(10)));
  assert_int_equal(rig.wait(kFlagFlushed, 10, &p, &s), epSuccess);
}

// The first error stops the proxy and names its peer to every waiter.
void a_failed_put_names_its_peer(void**) {
  Rig rig(16);
  rig.sink.fail_put_at = 5;
  assert_int_equal(rig.proxy->start(), epSuccess);
  for (int i = 0; i < 10; i++) rig.push(put(1 + i % 3, 0, 0, 8, 0, uint64_t(i + 1)), 2000);
  int peer = -1;
  bool stalled = false;
  assert_int_equal(rig.wait(kFlagCompleted, 10, &peer, &stalled), epRemoteError);
  assert_int_equal(peer, 1 + 5 % 3);
  assert_false(stalled);
  assert_true(rig.flag(kFlagConsumed) <= 5);
  assert_contains(rig.proxy->error().c_str(), "to rank 3 failed");
}

void a_failed_completion_names_its_peer(void**) {
  Rig rig(16);
  rig.sink.fail_test_peer = 3;
  assert_int_equal(rig.proxy->start(), epSuccess);
  assert_true(rig.push(put(1, 0, 0, 8, 0, 1)));
  assert_true(rig.push(put(3, 0, 0, 8, 0, 2)));
  int peer = -1;
  bool stalled = false;
  assert_int_equal(rig.wait(kFlagCompleted, 2, &peer, &stalled), epRemoteError);
  assert_int_equal(peer, 3);
}

void a_transport_error_names_its_peer(void**) {
  Rig rig(16);
  rig.sink.fail_progress_at = 50;
  assert_int_equal(rig.proxy->start(), epSuccess);
  int peer = -1;
  bool stalled = false;
  assert_int_equal(rig.wait(kFlagCompleted, 1, &peer, &stalled), epRemoteError);
  assert_int_equal(peer, 2);
  assert_contains(rig.proxy->error().c_str(), "connection reset by the fake");
}

// A proxy that stopped: its heartbeat stands still and the waiter says so
// within its stall bound, not at its timeout.
void a_stopped_proxy_is_seen_by_its_heartbeat(void**) {
  Rig rig(16);
  assert_int_equal(rig.proxy->start(), epSuccess);
  usleep(20 * 1000);
  rig.proxy->stop();
  assert_true(rig.push(put(1, 0, 0, 8, 0, 1)));
  const auto t0 = std::chrono::steady_clock::now();
  int peer = -1;
  bool stalled = false;
  assert_int_equal(waitFlag(rig.flags, kFlagCompleted, 1, 30000, 200, &peer, &stalled), epTimeout);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  assert_true(stalled);
  assert_true(s < 2.0);
}

// A live proxy with nothing to do keeps its heartbeat: a wait that cannot
// be met ends at its own timeout, never as a stall.
void an_idle_proxy_is_not_taken_for_stopped(void**) {
  Rig rig(16);
  assert_int_equal(rig.proxy->start(), epSuccess);
  // Idle well past the stall bound below. The bound is long enough that a
  // proxy thread starved by a loaded machine (2 cores under the sanitizers)
  // still beats within it: a failed assert here leaves the thread running
  // over a Rig that is gone.
  usleep(1200 * 1000);
  int peer = -1;
  bool stalled = true;
  assert_int_equal(waitFlag(rig.flags, kFlagCompleted, 1, 1500, 1000, &peer, &stalled), epTimeout);
  assert_false(stalled);
  assert_true(rig.flag(kFlagHeartbeat) > 10);
  assert_int_equal(rig.proxy->start(), epInvalidUsage);  // once
  uint64_t word = 0;
  assert_int_equal(rig.proxy->watch(&word), -1);  // not after start
}

// A signal word in this rank's memory (where peers' puts land) is mirrored
// into its flag as it changes.
void signal_words_are_mirrored(void**) {
  Rig rig(16);
  uint64_t word = 0;
  const int index = rig.proxy->watch(&word);
  assert_int_equal(index, 0);
  assert_int_equal(rig.proxy->start(), epSuccess);
  for (uint64_t v = 1; v <= 5; v++) {
    __atomic_store_n(&word, v, __ATOMIC_RELEASE);
    int peer;
    bool stalled;
    assert_int_equal(rig.wait(kFlagMirrorFirst + index, v, &peer, &stalled), epSuccess);
  }
}

void bad_commands_and_options_are_refused(void**) {
  {
    Rig rig(16);
    assert_int_equal(rig.proxy->start(), epSuccess);
    assert_true(rig.push(put(kRanks, 0, 0, 8, 0, 1)));
    int peer;
    bool stalled;
    assert_int_equal(rig.wait(kFlagCompleted, 1, &peer, &stalled), epInvalidArgument);
    assert_contains(rig.proxy->error().c_str(), "a put to rank 4, outside [0, 4)");
  }
  {
    Rig rig(16);
    assert_int_equal(rig.proxy->start(), epSuccess);
    Command c{};
    c.op = 77;
    assert_true(rig.push(c));
    int peer;
    bool stalled;
    assert_int_equal(rig.wait(kFlagCompleted, 1, &peer, &stalled), epInvalidArgument);
    assert_contains(rig.proxy->error().c_str(), "unknown operation 77");
  }
  {
    Rig rig(12);  // not a power of two
    assert_int_equal(rig.proxy->start(), epInvalidArgument);
  }
  assert_int_equal(errorPeer(errorWord(epRemoteError, -1)), -1);
  assert_int_equal(errorResult(errorWord(epRemoteError, 31)), epRemoteError);
  assert_int_equal(errorPeer(errorWord(epTimeout, 31)), 31);
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(puts_land_in_ring_order),
      cmocka_unit_test(a_full_ring_holds_the_producer),
      cmocka_unit_test(a_flush_waits_for_the_puts_before_it),
      cmocka_unit_test(a_failed_put_names_its_peer),
      cmocka_unit_test(a_failed_completion_names_its_peer),
      cmocka_unit_test(a_transport_error_names_its_peer),
      cmocka_unit_test(a_stopped_proxy_is_seen_by_its_heartbeat),
      cmocka_unit_test(an_idle_proxy_is_not_taken_for_stopped),
      cmocka_unit_test(signal_words_are_mirrored),
      cmocka_unit_test(bad_commands_and_options_are_refused),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
