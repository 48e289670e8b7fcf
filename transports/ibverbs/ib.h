// The ibverbs transport's objects and the functions its files share.
//
//   ibverbs.cc   the epTransport_v2 table: init, comm_open / comm_close,
//                endpoint / connect dispatch, registration, errors
//   device.cc    NIC, port and GID choice
//   qp_setup.cc  RC queue pairs and their connection by endpoint exchange
//   rdma_cm.cc   the same connection through rdma_cm (EP_IB_CM=rdma_cm)
//   data_path.cc put (RDMA WRITE, then the signal), completions, keepalive
//   wake.cc      the completion channel: signals that wake a rank asleep in wait
//   fault.cc     EP_IB_FAULT: faults made to happen on a live connection
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "moeep_transport.h"
#include "verbs_api.h"

namespace ibv {

constexpr const char* kName = "ibverbs";
constexpr int kMaxQpsPerConn = 16;   // EP_IB_QPS_PER_PEER's range
constexpr uint32_t kSendDepth = 128;  // work requests per QP's send queue
constexpr uint32_t kSignalEvery = 16;  // a completion asked for every so many requests
constexpr uint32_t kInlineWanted = 128;  // bytes asked of max_inline_data
constexpr size_t kStripeMin = 256 * 1024;  // puts at least this long use every QP of a connection
constexpr int kKeepaliveMs = 200;      // an idle connection's liveness write, while progress is called
constexpr int kHousekeepingMs = 50;    // device events, rdma_cm events, keepalives: at least this often
constexpr uint8_t kMinRnrTimer = 12;   // 0.64 ms between a peer's retries when no receive is posted here
// What a closing rank writes last into its peer's keepalive word: the peer
// then takes the connection's end for a close, not a failure.
constexpr uint64_t kClosedMark = ~uint64_t(0);

enum class Fault { kNone, kQpError, kCqeError, kBadRkey, kDeviceLost, kPortDown };

// Process-wide state: the bound libraries and what init found.
struct Context {
  const epTransportEnv_v1_t* env = nullptr;
  Verbs v{};
  Rdmacm cm{};
  bool have_cm = false;
  std::string cm_why;  // why librdmacm is unusable, when it is
  Fault fault = Fault::kNone;
  uint64_t fault_after = 8;  // the fault comes at this put of a communicator
};

// The NIC port a communicator uses.
struct Port {
  std::string device;            // "mlx5_0", "rxe0"
  int port = 1;
  struct ibv_context* ctx = nullptr;
  bool ctx_owned = false;        // false: rdma_cm's context (never closed here)
  struct ibv_pd* pd = nullptr;
  struct ibv_port_attr attr{};
  struct ibv_device_attr dev_attr{};
  bool roce = false;             // link layer Ethernet
  int gid_index = -1;            // -1: none needed (InfiniBand without GRH)
  union ibv_gid gid{};
  std::string gid_kind;          // "RoCE v2", "RoCE v1", "IB"
  uint32_t ipv4 = 0;             // the GID's IPv4 address (network order), RoCE v2 only
};

struct Comm;

struct Qp {
  struct ibv_qp* qp = nullptr;
  struct rdma_cm_id* id = nullptr;   // rdma_cm only
  uint32_t psn = 0;
  uint32_t remote_qpn = 0;
  uint64_t posted = 0;     // work requests posted
  uint64_t completed = 0;  // ... of which known complete (in order, selective signalling)
  uint32_t unsignalled = 0;  // posted since the last one that asks for a completion
  uint64_t signalled = 0;    // 1 + the index of the last request that asks for one
  bool established = false;  // rdma_cm: ESTABLISHED seen
  bool fault_cqe = false;    // EP_IB_FAULT=cqe_error: the next completion reads as an error
  uint64_t fault_wr = 0;
};

// A signal that waits for its put's data on the connection's other QPs
// (puts striped over several QPs): posted on QP 0, in put order.
struct PendingSignal {
  uint64_t need[kMaxQpsPerConn] = {};  // completed count each QP must reach
  uint64_t addr = 0;
  uint32_t rkey = 0;
  uint64_t value = 0;
};

// A put whose caller wants to test it.
struct Request {
  uint64_t id = 0;
  uint64_t need[kMaxQpsPerConn] = {};
};

// One connection: (peer, traffic class), with its QPs and completion queue.
struct Conn {
  Comm* comm = nullptr;
  int peer = -1;
  epTrafficClass_t cls = epTrafficThroughput;
  struct ibv_cq* cq = nullptr;
  std::vector<Qp> qps;
  uint32_t depth = kSendDepth;
  uint32_t max_inline = 0;
  bool connected = false;
  bool closing = false;
  bool peer_closed = false;  // the peer wrote kClosedMark, then went
  bool peer_wakes = false;   // the peer takes signals as WRITE WITH IMMEDIATE (kEndpointWakes)
  bool peer_sends_imm = false;  // ... and sends its own so (kEndpointSendsImm): they wake this side
  // Small registered memory of this side: [0, 64) the word peers' keepalives
  // land on; then one 8-byte signal source per send-queue slot of QP 0, used
  // where the NIC cannot send 8 bytes inline.
  std::vector<uint64_t> aux;
  struct ibv_mr* aux_mr = nullptr;
  uint64_t peer_ka_addr = 0;  // the peer's keepalive word
  uint32_t peer_ka_rkey = 0;
  uint32_t peer_mtu = 0;
  std::deque<PendingSignal> pending;
  std::deque<Request> requests;
  uint64_t next_request = 1;
  int64_t last_post_ms = 0;
  char remote_desc[96] = "";  // the peer's GID or LID, for errors and conn_info
};

struct Mem {
  Comm* comm = nullptr;
  struct ibv_mr* mr = nullptr;
  void* ptr = nullptr;
  size_t bytes = 0;
  int kind = EP_TRANSPORT_MEM_HOST;
};

// What mem_handle writes: where a peer puts, and with which key.
struct WireMem {
  uint32_t magic;
  uint32_t rkey;
  uint64_t addr;
  uint64_t bytes;
};
constexpr uint32_t kMemMagic = 0x65704d48u;  // 'epMH'

struct Comm {
  Context* ctx = nullptr;
  epTransportCommInfo_v2_t info{};
  Port port;
  bool use_cm = false;
  int nqps = 1;  // ib_qps_per_peer: QPs of a throughput or low-latency connection
  // Control traffic (credits, flags, small counts) needs no striping: one QP.
  int qpsOf(epTrafficClass_t cls) const { return cls == epTrafficControl ? 1 : nqps; }
  std::vector<std::unique_ptr<Conn>> conns;  // every connection, owned; [peer * 3 + cls]
  uint64_t puts = 0;                         // for the fault's trigger
  bool fault_done = false;
  // The completion channel (wake.cc): peers' signals come as WRITE WITH
  // IMMEDIATE, each taking a receive of srq and raising a completion on
  // wake_cq; wake_cq and the connections' CQs report to comp_channel, on which
  // wait sleeps. wake false: none (EP_IB_COMPLETION_CHANNEL=0, or the device
  // has no shared receive queue): waits nap.
  bool wake = false;
  struct ibv_comp_channel* comp_channel = nullptr;
  struct ibv_cq* wake_cq = nullptr;
  struct ibv_srq* srq = nullptr;
  uint32_t srq_depth = 0;
  uint64_t activity = 0;  // completions seen, sends and receives: what wait looks for
  int64_t housekeeping_ms = 0;  // when progress last looked at events and keepalives
  bool events_pending = false;  // wait saw the device's (or rdma_cm's) event descriptor readable
  bool srq_rearm = false;       // the shared receives' limit event came: arm it again after reposting
  // What the waits did (logged at comm_close): returned at once (something
  // had come), slept and woken by the channel, by a device event, by the timeout.
  uint64_t waits_at_once = 0, waits_woken = 0, waits_event = 0, waits_timed_out = 0;
  // rdma_cm (use_cm): the event channel and this rank's listener.
  struct rdma_event_channel* channel = nullptr;
  struct rdma_cm_id* listener = nullptr;
  uint16_t listen_port = 0;  // network order
  // The first error: any thread may read it (last_error).
  mutable std::mutex err_mu;
  epResult_t err = epSuccess;
  int err_peer = -1;
  std::string err_msg;

  Conn* conn(int peer, epTrafficClass_t cls) const {
    const size_t i = size_t(peer) * EP_TRAFFIC_CLASSES + size_t(cls);
    return i < conns.size() ? conns[i].get() : nullptr;
  }
  bool failed() const {
    std::lock_guard<std::mutex> lock(err_mu);
    return err != epSuccess;
  }
};

// Logging through the core's logger (transports never print).
void logf(const Context* c, epTransportLogLevel_t level, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
// Records the communicator's first error (later ones are logged only) and
// returns res. peer -1: none in particular.
epResult_t fail(Comm* comm, epResult_t res, int peer, const char* fmt, ...) __attribute__((format(printf, 4, 5)));
// The first error, as epRemoteError (or what it was) for a caller that goes on.
epResult_t failedResult(const Comm* comm);
int64_t nowMs();
const char* className(epTrafficClass_t cls);

// Live verbs objects of this process (QPs, CQs, MRs, PDs, contexts, cm ids):
// comm_close must bring it back to where it was.
extern std::atomic<long> g_live_objects;

// device.cc: the port (EP_IB_HCA or info->device, else the first active
// port), opened, with its PD and GID. Fails naming the device.
epResult_t openPort(Comm* comm);
void closePort(Comm* comm);
// Whether any device has an active port (init), with the reason if not.
bool anyActivePort(Context* c, std::string* why);

// qp_setup.cc
epResult_t createConn(Comm* comm, int peer, epTrafficClass_t cls, Conn** out);
void destroyConn(Conn* conn);
epResult_t makeEndpoint(Conn* conn, void* buf, size_t* bytes);
epResult_t connectExchange(Conn* conn, const void* blob, size_t bytes);
struct WireEndpoint;
// Reads and checks the peer's endpoint blob (made by it, for this rank and
// class, in the same setup mode); records what the data path needs of it.
epResult_t checkEndpoint(Conn* conn, const void* blob, size_t bytes, WireEndpoint* w);
// ib_retry_cnt as the device should get it.
int retryCount(Comm* comm);
// QP attributes common to both setups.
struct ibv_qp_init_attr qpInitAttr(Conn* conn);

// rdma_cm.cc
epResult_t cmOpen(Comm* comm);
void cmClose(Comm* comm);
epResult_t cmConnect(Conn* conn, const void* blob, size_t bytes);
// Connection events while the communicator runs (a peer's disconnect).
epResult_t cmPoll(Comm* comm);

// data_path.cc
epResult_t put(Conn* conn, Mem* mem, size_t offset, const void* remote_handle, size_t remote_offset, size_t bytes,
               size_t signal_offset, uint64_t signal_value, unsigned flags, uint64_t* request);
epResult_t test(Conn* conn, uint64_t request, int* done);
epResult_t progress(Comm* comm);
epResult_t pollConn(Conn* conn);
// Asynchronous device events, read without blocking (errors name the peer).
epResult_t asyncEvents(Comm* comm);
// Writes kClosedMark to the peer and waits (at most ms) for the
// connection's writes to be acknowledged, so that last signals reach it.
void drainConn(Conn* conn, int ms);
// How long close waits for a connection's writes to be acknowledged: the
// QPs' own retry window (4.096 us x 2^ib_timeout per try, ib_retry_cnt + 1
// tries) and a margin, at most the communicator's timeout. A write still
// unacknowledged when the QP goes would be lost to a peer that waits for it
// (and with rdma_cm, the disconnect could overtake it and the closing mark).
int drainBoundMs(const Comm* comm);
// Whether the peer's closing mark is in this side's keepalive word.
bool peerMarkedClosed(const Conn* conn);

// wake.cc
// Makes the channel, the shared receive queue and its completion queue, or
// leaves comm->wake false (logging why). Before any connection.
void openWake(Comm* comm);
// After every connection was destroyed.
void closeWake(Comm* comm);
// Takes the receive completions (peers' signals) and posts the receives again.
epResult_t drainWake(Comm* comm);
// The table's wait: progress, then sleep on the channel until a signal or an
// awaited completion comes, or timeout_us.
epResult_t waitComm(Comm* comm, int timeout_us);

// fault.cc
void parseFault(Context* c, const char* spec);
// Called at each put: makes the configured fault happen at the chosen put.
// *rkey may be spoiled (bad_rkey); *force_signal asks that the put's last
// request be signalled (cqe_error).
void faultAtPut(Conn* conn, uint32_t* rkey, bool* force_signal);
const char* faultName(Fault f);
// The post / poll wrappers of a lost device.
bool deviceLost();

}  // namespace ibv
