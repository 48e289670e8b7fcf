// The proxy: a thread that takes the commands a producer (a GPU kernel, in
// time; a test thread today) writes into a command ring, posts them on a
// network transport with a cap of puts in flight per peer, and answers
// through flags the producer waits on: commands consumed (the ring's
// credits), puts completed, flushes done, the first error, a heartbeat, and
// the values of signal words that peers' puts change in this rank's memory.
// docs/PROXY.md has the protocol; src/proxy/command_ring.h the ring.
//
// What the proxy posts through (PutSink) and where its flags go
// (FlagWriter) are interfaces: the network transports' connections
// (src/host/net_links.h) and host words today, a CUDA stream's writes to
// device memory on the GPU path.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "moeep.h"
#include "proxy/command_ring.h"

namespace ep {
namespace proxy {

// The flags, by index.
enum Flag : int {
  kFlagConsumed = 0,   // commands taken from the ring (their slots are free again)
  kFlagCompleted = 1,  // puts whose local bytes may be reused
  kFlagFlushed = 2,    // the id of the last flush done
  kFlagError = 3,      // 0, or errorWord(result, peer) of the first error; the proxy then stops
  kFlagHeartbeat = 4,  // counts up while the proxy runs
  kFlagMirrorFirst = 5 // then one per watched signal word (watch())
};

// The error flag: bit 63 set, the epResult_t in bits 32..62, the peer + 1 in
// bits 0..31 (0: no peer in particular).
inline uint64_t errorWord(epResult_t res, int peer) {
  return (uint64_t(1) << 63) | (uint64_t(uint32_t(res) & 0x7fffffffu) << 32) | uint64_t(uint32_t(peer + 1));
}
inline epResult_t errorResult(uint64_t word) { return epResult_t(int((word >> 32) & 0x7fffffffu)); }
inline int errorPeer(uint64_t word) { return int(uint32_t(word & 0xffffffffu)) - 1; }

class PutSink {
 public:
  virtual ~PutSink() = default;
  // A put with a signal, as epTransport_v2_t::put: epSuccess with *request,
  // epInProgress when the connection's queue is full, else an error.
  virtual epResult_t put(int peer, size_t local_offset, size_t remote_offset, size_t bytes, size_t signal_offset,
                         uint64_t value, uint64_t* request) = 0;
  // *done = 1 once the put's local bytes may be reused.
  virtual epResult_t test(int peer, uint64_t request, int* done) = 0;
  // Moves data; on an error, which peer (-1: none) and why.
  virtual epResult_t progress(int* peer, std::string* why) = 0;
};

class FlagWriter {
 public:
  virtual ~FlagWriter() = default;
  virtual void write(int flag, uint64_t value) = 0;
};

// FlagWriter into an array of host words (release stores).
class HostFlags : public FlagWriter {
 public:
  explicit HostFlags(uint64_t* words) : words_(words) {}
  void write(int flag, uint64_t value) override { __atomic_store_n(&words_[flag], value, __ATOMIC_RELEASE); }

 private:
  uint64_t* words_;
};

struct ProxyOptions {
  int nranks = 0;
  int max_in_flight_per_peer = 32;  // puts posted and not yet completed, per peer
  int heartbeat_ms = 10;            // kFlagHeartbeat counts up at least this often
  int idle_spins = 2000;            // empty rounds before the thread sleeps between looks
  int idle_sleep_us = 20;
};

class Proxy {
 public:
  // ring and flags must outlive the proxy; sink is used by its thread only.
  Proxy(const Ring& ring, PutSink* sink, FlagWriter* flags, const ProxyOptions& options);
  ~Proxy();  // stops the thread
  Proxy(const Proxy&) = delete;
  Proxy& operator=(const Proxy&) = delete;

  // Before start: mirror the 8-byte word at *word (where peers' signals
  // land) into flag kFlagMirrorFirst + the returned index whenever it
  // changes. -1 after start.
  int watch(const uint64_t* word);
  // Starts the thread, once (epInvalidUsage after); epInvalidArgument for a
  // ring or options it cannot use.
  epResult_t start();
  // Stops the thread (it finishes no command it has not posted); its flags
  // stop changing, the heartbeat included.
  void stop();

  // The first error, for the host's own reports ("" when none).
  std::string error() const;
  // Puts in flight to peer, most ever seen (tests).
  int maxInFlight(int peer) const { return max_in_flight_[size_t(peer)]; }

 private:
  struct Posted {
    int peer;
    uint64_t request;
  };
  struct PendingFlush {
    uint64_t id;
    uint64_t after;  // puts posted before it
  };
  void run();
  bool step();  // one round; true when something happened
  bool consume();
  bool retire();
  bool mirror();
  void failWith(epResult_t res, int peer, const std::string& why);

  Ring ring_;
  PutSink* sink_;
  FlagWriter* flags_;
  ProxyOptions opt_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  bool started_ = false;
  bool failed_ = false;
  mutable std::mutex err_mu_;
  std::string error_;

  uint64_t next_ = 0;      // the next command number to take
  uint64_t posted_ = 0;    // puts posted
  uint64_t completed_ = 0; // puts completed (in posting order)
  std::deque<Posted> in_flight_;
  std::deque<PendingFlush> flushes_;
  std::vector<int> in_flight_per_peer_, max_in_flight_;
  std::vector<const uint64_t*> watched_;
  std::vector<uint64_t> last_seen_;
  uint64_t beats_ = 0;
  int64_t last_beat_us_ = 0;
};

// What a producer's wait does (a kernel's, later; tests' today): waits until
// flags[flag] >= target. Returns the proxy's error when its error flag is set
// (*peer: the peer it names), epTimeout when timeout_ms passed, or when the
// heartbeat did not move for stall_ms (*stalled = true: the proxy stopped).
epResult_t waitFlag(const uint64_t* flags, int flag, uint64_t target, int timeout_ms, int stall_ms, int* peer,
                    bool* stalled);

}  // namespace proxy
}  // namespace ep
