// The socket transport's state: a communicator context (Comm) and one Conn
// per (peer, traffic class). Design, in short:
//
// - Streams are one-way. Each rank dials its peer's listener for the streams
//   it sends on and accepts the peer's dials for the streams it receives on,
//   so connecting never depends on which side dials, and a stream's bytes are
//   all frames of one sender.
// - A put is cut into frames of at most kPartBytes. Frames of a connection
//   are numbered; frame n goes on stream n % streams, and the receiver takes
//   frames strictly in number order. So puts land in the order they were
//   posted (as the ABI promises for one connection) even with several
//   streams, and a put's signal, carried by its last frame, is stored only
//   after every part of that put and of every earlier put has landed.
// - The sending side writes from the caller's registered memory (no copy);
//   put writes what the sockets take at once, and a thread per communicator
//   writes the rest and receives: it reads frame data straight into the
//   registered memory and stores each signal with release order.
// - close says goodbye in a last frame: a peer that got it drops later puts
//   to this rank instead of failing; a connection that ends without it is an
//   error naming the peer.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "moeep_transport.h"
#include "net.h"
#include "wire.h"

namespace epsock {

constexpr const char* kName = "socket";
constexpr size_t kPartBytes = size_t(1) << 20;  // data of one frame at most
constexpr size_t kMaxPutsInFlight = 4096;       // per connection; past it put says epInProgress
constexpr size_t kStageBytes = size_t(64) << 10; // per receiving stream: headers and small frames
constexpr int kMaxStreams = 16;
constexpr int kDefaultStreams = 2;
constexpr size_t kMaxPendingHellos = 256;
constexpr unsigned kRefusalsLogged = 16;
constexpr int kHelloMs = 5000;  // an accepted connection that sends no hello within this is dropped
constexpr int kBrokenSendGraceMs = 2000;  // a failed send waits this long for the peer's goodbye

struct Module {
  const epTransportEnv_v1_t* env;
};

struct Mem {
  void* ptr;
  size_t bytes;
  uint32_t id;
  uint64_t nonce;  // the communicator's
};

// One frame waiting on its stream; data points into the caller's memory.
struct Frame {
  WireFrame hdr;
  const uint8_t* data;
  uint64_t put_id;  // kNoPut for the goodbye
  size_t sent;      // bytes of header and data written
};
constexpr uint64_t kNoPut = ~uint64_t(0);

struct TxStream {
  int fd = -1;
  std::deque<Frame> queue;
};

struct RxStream {
  int fd = -1;
  std::vector<uint8_t> stage;  // bytes read ahead: [pos, end)
  size_t pos = 0, end = 0;
  bool large = false;    // the last frame was larger than the stage
  bool drained = false;  // a read of this receive round came back short
};

struct Comm;

struct Conn {
  Comm* comm = nullptr;
  int peer = -1;
  epTrafficClass_t cls = epTrafficThroughput;
  Address peer_addr;        // where the peer listens
  uint64_t peer_nonce = 0;  // its communicator's, which its memory handles carry
  std::string where;        // "rank 3 (10.0.0.2:4567)" for messages

  // Sending side, under comm->send_mu.
  std::vector<TxStream> tx;
  uint64_t tx_seq = 0;
  uint64_t first_put = 0;      // id of puts.front()
  std::deque<uint32_t> puts;   // frames still unwritten of each put in flight
  bool tx_broken = false;      // a send failed; waits for the peer's goodbye or the grace
  Clock::time_point tx_broken_at;
  std::string tx_error;

  // Receiving side, under comm->recv_mu.
  std::vector<RxStream> rx;
  uint64_t rx_seq = 0;
  WireFrame cur{};
  bool have_header = false;
  uint64_t cur_got = 0;  // data bytes of cur landed
  bool rx_done = false;  // goodbye read, or failed
  bool rx_more = false;  // stopped with bytes left to take: look again without waiting

  std::atomic<bool> goodbye{false};  // the peer closed in order: puts to it are dropped
  std::atomic<bool> failed{false};
  bool closing = false;  // under both mutexes
};

struct Comm {
  Module* mod = nullptr;
  int rank = 0, nranks = 0, timeout_ms = 60000, nstreams = kDefaultStreams;
  // The core's abort (epTransportCommInfo_v2_t.aborted): ends a connect's waits.
  int (*aborted_fn)(void*) = nullptr;
  void* aborted_arg = nullptr;
  bool aborted() const { return aborted_fn != nullptr && aborted_fn(aborted_arg) != 0; }
  epTransportClass_v2_t classes[EP_TRAFFIC_CLASSES] = {};
  Address local;
  std::string ifname;
  int listen_fd = -1;
  uint64_t nonce = 0;

  // Accepted streams whose hello named (peer, class, stream), before the
  // connect for that peer takes them. The caller's thread only.
  struct Parked {
    int fd;
    int nstreams;
  };
  std::map<std::tuple<int, int, int>, Parked> parked;
  // Accepted connections whose hello is still coming (caller's thread only):
  // kept across connects, since a peer may dial while this rank connects
  // to another.
  struct PendingHello {
    int fd;
    Address from;
    WireHello hello;
    size_t got;
    Clock::time_point deadline;
  };
  std::vector<PendingHello> hellos;
  unsigned refused = 0;  // connections refused (logged up to kRefusalsLogged)

  // Lock order: recv_mu, then send_mu.
  std::mutex recv_mu;  // receive state, mems, conns (changed under both)
  std::mutex send_mu;  // send state
  std::vector<Mem*> mems;  // by id - 1; null once deregistered
  std::vector<Conn*> conns;

  std::thread io;
  int wake_fd = -1;
  bool stop = false;     // under recv_mu
  uint64_t gen = 0;      // bumped under recv_mu when a conn leaves the thread's set
  uint64_t io_gen = 0;   // the gen the thread's current round was built from
  std::condition_variable io_cv;

  // wait: the thread counts its rounds that moved something (a frame
  // received, written, a failure); a caller sleeps until the count moves.
  std::atomic<uint64_t> events{0};
  std::atomic<int> sleepers{0};
  std::mutex wait_mu;
  std::condition_variable wait_cv;
  uint64_t wait_seen = 0;  // the count when the caller's last wait returned (caller's thread)

  std::mutex err_mu;
  std::string err_msg;   // the first error
  int err_peer = -1;
  bool broken = false;   // a connection failed: progress reports it

  void log(epTransportLogLevel_t level, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
  // Records the first error (peer -1: none in particular), logs it, returns res.
  epResult_t fail(epResult_t res, int peer, const char* fmt, ...) __attribute__((format(printf, 4, 5)));
};

// io.cc
epResult_t startIo(Comm* c);
void stopIo(Comm* c);
void addConn(Comm* c, Conn* k);
// Sends what is queued and the goodbye (bounded by the timeout), then takes
// k out of the thread's set and frees it.
void closeConn(Comm* c, Conn* k);
// Marks k failed and the communicator broken (under whichever mutex).
void failConn(Conn* k, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

epResult_t put(void* conn, void* mem, size_t offset, const void* remote_handle, size_t remote_offset, size_t bytes,
               size_t signal_offset, uint64_t signal_value, unsigned flags, uint64_t* request);
epResult_t test(void* conn, uint64_t request, int* done);
epResult_t progress(void* comm);
// Sleeps until the thread moved something since the last wait returned, or
// timeout_us passed; then progress.
epResult_t wait(void* comm, int timeout_us);
// After a shrink: forgets the errors of peer, whose connections the core closed.
epResult_t dropPeer(void* comm, int peer);

}  // namespace epsock
