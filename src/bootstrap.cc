// Bootstrap: root rendezvous, then a TCP ring for allgather and barrier.
//
// Protocol (all structs are fixed-size, host byte order: every rank of a job
// runs the same build on the same architecture):
//   rank -> root : RootHello  {magic, nonce, rank, nranks, timeout, time left, listen address}
//   root -> rank : RootReply  {status, magic, address of rank (rank+1)%nranks, message}
//   rank -> next : RingHello  {magic, nonce, rank, nranks}      (on the ring connection)
//   each collective: OpHeader exchanged with the neighbours first, so that ranks
//   that call different collectives or sizes fail with a message instead of hanging.
#include "bootstrap.h"
#include "bootstrap_ring.h"
#include "checks.h"

#include <poll.h>
#include <pthread.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "debug.h"
#include "params.h"
#include "socket.h"

namespace ep {

namespace {

using Clock = std::chrono::steady_clock;

constexpr char kIdMagic[8] = {'m', 'o', 'e', 'e', 'p', 'B', 'S', '1'};
constexpr uint64_t kRootHelloMagic = 0x6570426f6f74486cull;  // "epBootHl"
constexpr uint64_t kRingHelloMagic = 0x6570426f6f745267ull;  // "epBootRg"
constexpr int32_t kRootReplyMagic = 0x65705252;               // 'epRR'
// How much longer a rank waits for the root's reply than its own timeout: the
// root times out at the same moment and its reply (naming the missing ranks) is
// far more useful than "the root did not answer".
constexpr int kRootReplyGraceMs = 1000;
// Upper bound on sending the final replies, so one stuck rank cannot hold the root.
constexpr int kRootReplySendMs = 5000;
// A connection to the root that has not sent its hello by then is dropped.
constexpr int kRootHelloIdleMs = 30000;
// After a failed accept (out of descriptors) the root leaves its listener
// alone this long: the connection stays in the backlog, and polling the
// listener again at once would spin.
constexpr int kAcceptBackoffMs = 100;
// Descriptors the root wants free beyond one per rank still to come (the
// process's other files come and go).
constexpr rlim_t kFdMargin = 32;

// The unique id's content; the rest of the 128 bytes is zero.
struct IdLayout {
  char magic[8];
  uint64_t nonce;
  PackedAddress root;
  // 1: made from EP_COMM_ID on every rank; no root runs yet and rank 0 starts
  // it in bootstrapInit (how mpirun jobs share an id without MPI calls).
  uint32_t root_by_rank0;
};
static_assert(sizeof(IdLayout) <= EP_UNIQUE_ID_BYTES, "unique id layout too large");

struct RootHello {
  uint64_t magic;
  uint64_t nonce;
  int32_t rank;
  int32_t nranks;
  int32_t timeout_ms;    // for the message: what the rank was configured with
  int32_t remaining_ms;  // what is left of it on arrival (-1: no deadline)
  PackedAddress listen;  // where the ring predecessor connects
  uint32_t reserved;
};
static_assert(sizeof(RootHello) == 56, "wire format");

struct RootReply {
  int32_t status;  // epResult_t
  int32_t magic;   // kRootReplyMagic: tells the root from another program on its port
  PackedAddress next;
  char message[488];
};
static_assert(sizeof(RootReply) == 516, "wire format");

struct RingHello {
  uint64_t magic;
  uint64_t nonce;
  int32_t rank;
  int32_t nranks;
};


int clampMs(int64_t ms) { return int(std::min<int64_t>(std::max<int64_t>(ms, 0), INT_MAX)); }

// Timeout of one operation: the caller's, else EP_TIMEOUT_MS (<= 0: none).
int effectiveTimeoutMs(int timeout_ms) {
  return timeout_ms > 0 ? timeout_ms : clampMs(param::TIMEOUT_MS());
}

uint64_t freshNonce() {
  uint64_t nonce = 0;
  if (getrandom(&nonce, sizeof(nonce), GRND_NONBLOCK) != ssize_t(sizeof(nonce))) {
    // No entropy yet (early boot): time and pid still tell two jobs apart.
    nonce = uint64_t(Clock::now().time_since_epoch().count()) * 0x9e3779b97f4a7c15ull ^
            (uint64_t(getpid()) << 32);
  }
  return nonce != 0 ? nonce : 1;
}

// "2,3,7" with at most a few dozen entries listed.
std::string rankList(const std::vector<int>& ranks) {
  constexpr size_t kMaxListed = 32;
  std::string s;
  for (size_t i = 0; i < ranks.size() && i < kMaxListed; i++)
    s += (i ? "," : "") + std::to_string(ranks[i]);
  if (ranks.size() > kMaxListed) s += ",... (" + std::to_string(ranks.size()) + " in all)";
  return s;
}

// Raises the soft limit on open files to at least `want`, as far as the hard
// limit allows: the root holds one socket per rank until all arrived, and
// distributions default to a soft limit (1024) far below the hard one.
// True when the limit rose.
bool raiseFdLimit(rlim_t want) {
  rlimit lim;
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur >= want || lim.rlim_cur >= lim.rlim_max)
    return false;
  const rlim_t old = lim.rlim_cur;
  lim.rlim_cur = std::min(want, lim.rlim_max);
  if (setrlimit(RLIMIT_NOFILE, &lim) != 0) return false;
  EP_INFO(kSubsysBootstrap, "bootstrap root: raised the limit on open files from %llu to %llu",
          (unsigned long long)old, (unsigned long long)lim.rlim_cur);
  return true;
}

// The soft limit on open files; RLIM_INFINITY when unknown.
rlim_t softFdLimit() {
  rlimit lim;
  return getrlimit(RLIMIT_NOFILE, &lim) == 0 ? lim.rlim_cur : RLIM_INFINITY;
}

// "1024, hard limit 4096", for messages.
std::string fdLimitText() {
  rlimit lim;
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return "unknown";
  const auto text = [](rlim_t v) {
    return v == RLIM_INFINITY ? std::string("unlimited") : std::to_string(v);
  };
  return text(lim.rlim_cur) + ", hard limit " + text(lim.rlim_max);
}

// ---- Root descriptors across fork ------------------------------------------
//
// A child forked after epGetUniqueId (a launcher's rank) inherits the root's
// sockets: close-on-exec covers exec only, and the root thread does not exist
// in the child. Its copy of the listener would keep the port open after the
// root exited, and a late rank would wait there for an answer that never
// comes. A pthread_atfork handler closes them in the child. Every root
// descriptor is opened and closed under the registry's mutex, which the fork
// handlers hold across fork(): the child sees exactly the open ones, and never
// closes a number that another thread got back from the kernel meanwhile.

struct RootFdRegistry {
  std::mutex mu;
  std::vector<int> fds;
};

void lockRootFds();
void unlockRootFds();
void closeRootFdsInChild();

// Never destroyed: a detached root thread may still close its sockets while
// the process runs its static destructors.
RootFdRegistry& rootFds() {
  static RootFdRegistry* registry = [] {
    auto* r = new RootFdRegistry;
    pthread_atfork(lockRootFds, unlockRootFds, closeRootFdsInChild);
    return r;
  }();
  return *registry;
}

void lockRootFds() { rootFds().mu.lock(); }
void unlockRootFds() { rootFds().mu.unlock(); }
void closeRootFdsInChild() {
  RootFdRegistry& r = rootFds();
  for (int fd : r.fds) ::close(fd);
  r.fds.clear();
  r.mu.unlock();
}

// One descriptor of the root, registered while it is open. Move-only.
class RootFd {
 public:
  RootFd() = default;
  RootFd(RootFd&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  RootFd& operator=(RootFd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = other.fd_;
      other.fd_ = -1;
    }
    return *this;
  }
  RootFd(const RootFd&) = delete;
  RootFd& operator=(const RootFd&) = delete;
  ~RootFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void reset() {
    if (fd_ < 0) return;
    RootFdRegistry& r = rootFds();
    std::lock_guard<std::mutex> lock(r.mu);
    r.fds.erase(std::remove(r.fds.begin(), r.fds.end(), fd_), r.fds.end());
    ::close(fd_);
    fd_ = -1;
  }

  // Runs open(Fd*) (a socket call that fills it) and registers what it made,
  // both under the registry's lock; returns what open returned.
  template <typename Open>
  auto open(Open open) -> decltype(open(static_cast<Fd*>(nullptr))) {
    reset();
    RootFdRegistry& r = rootFds();
    std::lock_guard<std::mutex> lock(r.mu);
    r.fds.reserve(r.fds.size() + 1);  // a throw here leaves fd to close itself
    Fd fd;
    auto result = open(&fd);
    if (fd.valid()) {
      r.fds.push_back(fd.get());
      fd_ = fd.release();
    }
    return result;
  }

 private:
  int fd_ = -1;
};

// ---- Root ------------------------------------------------------------------

class Root {
 public:
  Root(RootFd listen_fd, uint64_t nonce, SocketAddress addr)
      : listen_fd_(std::move(listen_fd)), nonce_(nonce), addr_(addr) {}

  // Set once the thread is in its wait loop (see startRoot).
  std::atomic<int>* ready = nullptr;

  void run() {
    // Clamped as the ranks' timeout is: milliseconds beyond ~2^43 overflow the clock's nanoseconds.
    const int64_t fallback_ms = clampMs(param::TIMEOUT_MS());
    fallback_deadline_ = fallback_ms > 0 ? Clock::now() + std::chrono::milliseconds(fallback_ms)
                                         : Clock::time_point::max();
    if (ready != nullptr) ready->store(1, std::memory_order_release);
    for (;;) {
      // The listener is closed before any rank hears the outcome: a rank may
      // retry with the same EP_COMM_ID at once, and its bind needs the port.
      if (nranks_ > 0 && arrived_ == nranks_) {
        listen_fd_.reset();
        replySuccess();
        return;
      }
      if (Clock::now() >= deadline()) {
        listen_fd_.reset();
        replyTimeout();
        return;
      }
      pollOnce();
    }
  }

 private:
  struct Pending {
    RootFd fd;
    SocketAddress peer;
    RootHello hello;
    size_t got = 0;
    Clock::time_point since;
  };
  struct Arrived {
    RootFd fd;
    SocketAddress peer;
    RootHello hello;
    Clock::time_point deadline;
  };

  // The earliest deadline of the ranks that are here; before any came (or after
  // all left), EP_TIMEOUT_MS from the start, so the thread never lingers forever.
  Clock::time_point deadline() const {
    if (arrived_ == 0) return last_deadline_ != Clock::time_point::max() ? last_deadline_ : fallback_deadline_;
    Clock::time_point d = Clock::time_point::max();
    for (const Arrived& a : ranks_)
      if (a.fd.valid()) d = std::min(d, a.deadline);
    return d;
  }

  void pollOnce() {
    std::vector<pollfd> fds;
    // poll() skips a negative descriptor: the listener while accepting is paused.
    fds.push_back({Clock::now() < accept_paused_until_ ? -1 : listen_fd_.get(), POLLIN, 0});
    for (const Pending& p : pending_) fds.push_back({p.fd.get(), POLLIN, 0});
    // Watching the arrived ranks shows when one gives up (closes) while waiting.
    std::vector<int> arrived_index;
    for (size_t r = 0; r < ranks_.size(); r++)
      if (ranks_[r].fd.valid()) {
        fds.push_back({ranks_[r].fd.get(), POLLIN, 0});
        arrived_index.push_back(int(r));
      }
    auto d = deadline();
    int slice = 100;
    if (d != Clock::time_point::max())
      slice = int(std::min<int64_t>(
          100, std::max<int64_t>(0, std::chrono::ceil<std::chrono::milliseconds>(d - Clock::now()).count())));
    int rc = ::poll(fds.data(), fds.size(), slice);
    if (rc <= 0) {
      dropIdlePending();
      return;
    }
    // Arrived ranks first: the indices below refer to this poll's fds.
    for (size_t i = 0; i < arrived_index.size(); i++)
      if (fds[1 + pending_.size() + i].revents != 0) checkArrived(arrived_index[i]);
    std::vector<Pending> still_pending;
    for (size_t i = 0; i < pending_.size(); i++) {
      Pending& p = pending_[i];
      if (fds[1 + i].revents != 0 && !readHello(&p)) continue;  // dropped or promoted
      if (p.fd.valid()) still_pending.push_back(std::move(p));
    }
    pending_ = std::move(still_pending);
    if (fds[0].revents != 0) acceptAll();
    dropIdlePending();
  }

  void acceptAll() {
    for (;;) {
      RootFd fd;
      SocketAddress peer;
      // A zero timeout: take what is in the backlog now, never block the loop.
      Wait now_only;
      now_only.deadline = Clock::now();
      IoResult r = fd.open([&](Fd* out) { return acceptConnection(listen_fd_.get(), now_only, out, &peer); });
      if (r.status == IoStatus::kError && acceptFailed(r)) continue;
      if (!r.ok()) return;
      Pending p;
      memset(&p.hello, 0, sizeof(p.hello));  // filled as the bytes arrive
      p.fd = std::move(fd);
      p.peer = peer;
      p.since = Clock::now();
      EP_TRACE(kSubsysBootstrap, "bootstrap root: connection from %s", peer.toString().c_str());
      pending_.push_back(std::move(p));
    }
  }

  // True to retry at once (the limit on open files was raised); otherwise the
  // listener is left alone for kAcceptBackoffMs, since what failed stays in
  // the backlog, and running out of descriptors is kept for the ranks' message.
  bool acceptFailed(const IoResult& r) {
    const bool out_of_fds = r.sys_errno == EMFILE || r.sys_errno == ENFILE;
    // Every descriptor below the soft limit is in use: room for the ranks still to come.
    const rlim_t soft = softFdLimit(), to_come = rlim_t(nranks_ > 0 ? nranks_ - arrived_ : 1);
    if (r.sys_errno == EMFILE && soft != RLIM_INFINITY && raiseFdLimit(soft + to_come + kFdMargin))
      return true;
    if (!out_of_fds || fd_errno_ == 0)  // said once, not at every retry
      EP_WARN(kSubsysBootstrap, "bootstrap root %s: accept failed: %s%s%s", addr_.toString().c_str(),
              r.describe().c_str(), out_of_fds ? "; open files limit: " : "",
              out_of_fds ? fdLimitText().c_str() : "");
    if (out_of_fds) fd_errno_ = r.sys_errno;
    accept_paused_until_ = Clock::now() + std::chrono::milliseconds(kAcceptBackoffMs);
    return false;
  }

  void dropIdlePending() {
    auto now = Clock::now();
    for (Pending& p : pending_)
      if (p.fd.valid() && now - p.since > std::chrono::milliseconds(kRootHelloIdleMs)) {
        EP_WARN(kSubsysBootstrap, "bootstrap root: %s connected but sent no hello, dropped",
                p.peer.toString().c_str());
        p.fd.reset();
      }
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                  [](const Pending& p) { return !p.fd.valid(); }),
                   pending_.end());
  }

  // Reads what is there of p's hello. False when p was consumed (moved to the
  // arrived ranks, rejected or closed); p.fd is then invalid.
  bool readHello(Pending* p) {
    char* buf = reinterpret_cast<char*>(&p->hello);
    for (;;) {
      ssize_t n = ::recv(p->fd.get(), buf + p->got, sizeof(RootHello) - p->got, MSG_DONTWAIT);
      if (n > 0) {
        p->got += size_t(n);
        if (p->got == sizeof(RootHello)) break;
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      p->fd.reset();  // closed before the hello was complete
      return false;
    }
    admit(p);
    return false;
  }

  void reject(Pending* p, epResult_t status, const std::string& why) {
    EP_WARN(kSubsysBootstrap, "bootstrap root %s: rejected %s: %s", addr_.toString().c_str(),
            p->peer.toString().c_str(), why.c_str());
    sendReply(p->fd.get(), status, nullptr, why, Wait::afterMs(1000));
    p->fd.reset();
  }

  void admit(Pending* p) {
    const RootHello& h = p->hello;
    if (h.magic != kRootHelloMagic) return reject(p, epInvalidArgument, "not a moeep bootstrap hello");
    if (h.nonce != nonce_)
      return reject(p, epInvalidArgument,
                    "the unique id does not belong to this root (a stale id from another run, or another "
                    "launcher job on the same EP_COMM_ID? every rank must spell EP_COMM_ID identically: a "
                    "host name and its address count as different)");
    if (h.nranks < 1)
      return reject(p, epInvalidArgument, "nranks " + std::to_string(h.nranks) + " is not positive");
    if (nranks_ > 0 && h.nranks != nranks_)
      return reject(p, epInvalidUsage,
                    "rank " + std::to_string(h.rank) + " says nranks is " + std::to_string(h.nranks) +
                        " but the ranks already here say " + std::to_string(nranks_));
    if (h.rank < 0 || h.rank >= h.nranks)
      return reject(p, epInvalidArgument,
                    "rank " + std::to_string(h.rank) + " is out of range for " +
                        std::to_string(h.nranks) + " ranks");
    if (nranks_ < 0) {
      nranks_ = h.nranks;
      ranks_.clear();
      ranks_.resize(size_t(nranks_));
      // Room for a socket per rank from the start: p's descriptor is about
      // the lowest free one, the number of files open besides.
      raiseFdLimit(rlim_t(p->fd.get()) + 1 + rlim_t(nranks_) + kFdMargin);
    }
    Arrived& slot = ranks_[size_t(h.rank)];
    if (slot.fd.valid())
      return reject(p, epInvalidUsage,
                    "rank " + std::to_string(h.rank) + " of " + std::to_string(nranks_) +
                        " arrived twice (first from " + slot.peer.toString() + ", again from " +
                        p->peer.toString() + ")");
    slot.fd = std::move(p->fd);
    slot.peer = p->peer;
    slot.hello = h;
    slot.deadline = h.remaining_ms >= 0 ? Clock::now() + std::chrono::milliseconds(h.remaining_ms)
                                        : Clock::time_point::max();
    arrived_++;
    EP_TRACE(kSubsysBootstrap, "bootstrap root: rank %d/%d arrived from %s (%d/%d here)", h.rank,
             nranks_, slot.peer.toString().c_str(), arrived_, nranks_);
  }

  // A waiting rank's socket became readable: it closed (gave up or was
  // aborted), or it broke the protocol. Either way it no longer counts.
  void checkArrived(int r) {
    Arrived& a = ranks_[size_t(r)];
    char byte;
    ssize_t n = ::recv(a.fd.get(), &byte, 1, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    EP_INFO(kSubsysBootstrap, "bootstrap root: rank %d left before all ranks arrived", r);
    last_deadline_ = deadline();
    a.fd.reset();
    arrived_--;
    if (arrived_ == 0) nranks_ = -1;  // nobody is left to hold the job size
  }

  static void sendReply(int fd, epResult_t status, const PackedAddress* next, const std::string& msg,
                        const Wait& wait) {
    RootReply reply;
    memset(&reply, 0, sizeof(reply));
    reply.status = status;
    reply.magic = kRootReplyMagic;
    if (next != nullptr) reply.next = *next;
    snprintf(reply.message, sizeof(reply.message), "%s", msg.c_str());
    // Best effort: a rank that is gone cannot be told anything anyway.
    sendExact(fd, &reply, sizeof(reply), wait);
  }

  void replySuccess() {
    Wait wait = Wait::afterMs(kRootReplySendMs);
    for (int r = 0; r < nranks_; r++) {
      const PackedAddress& next = ranks_[size_t((r + 1) % nranks_)].hello.listen;
      sendReply(ranks_[size_t(r)].fd.get(), epSuccess, &next, "", wait);
    }
    EP_INFO(kSubsysBootstrap, "bootstrap root %s: all %d ranks arrived", addr_.toString().c_str(),
            nranks_);
  }

  void replyTimeout() {
    if (arrived_ == 0) {
      EP_INFO(kSubsysBootstrap, "bootstrap root %s: no rank arrived in time, closing",
              addr_.toString().c_str());
      return;
    }
    std::vector<int> missing;
    int timeout_ms = INT_MAX;
    for (int r = 0; r < nranks_; r++) {
      const Arrived& a = ranks_[size_t(r)];
      if (!a.fd.valid()) missing.push_back(r);
      else if (a.hello.timeout_ms > 0) timeout_ms = std::min(timeout_ms, int(a.hello.timeout_ms));
    }
    std::string msg = std::string(missing.size() == 1 ? "rank " : "ranks ") + rankList(missing) +
                      " of " + std::to_string(nranks_) + " did not arrive";
    if (timeout_ms != INT_MAX) msg += " within " + std::to_string(timeout_ms) + " ms";
    // The missing ranks may well have dialled: their connections waited in
    // the backlog for a descriptor the root never had.
    if (fd_errno_ != 0)
      msg += std::string("; the root ran out of file descriptors (") + strerror(fd_errno_) +
             ") and could not take every rank's connection: raise ulimit -n where the root runs (pid " +
             std::to_string(getpid()) + ", open files limit " + fdLimitText() + ")";
    EP_WARN(kSubsysBootstrap, "bootstrap root %s: %s", addr_.toString().c_str(), msg.c_str());
    Wait wait = Wait::afterMs(kRootReplySendMs);
    for (const Arrived& a : ranks_)
      if (a.fd.valid()) sendReply(a.fd.get(), epTimeout, nullptr, msg, wait);
  }

  RootFd listen_fd_;
  const uint64_t nonce_;
  const SocketAddress addr_;
  Clock::time_point fallback_deadline_ = Clock::time_point::max();
  Clock::time_point last_deadline_ = Clock::time_point::max();
  int nranks_ = -1;  // set by the first admitted rank
  int arrived_ = 0;
  Clock::time_point accept_paused_until_ = Clock::time_point::min();
  int fd_errno_ = 0;  // EMFILE or ENFILE once an accept ran out of descriptors
  std::vector<Pending> pending_;
  std::vector<Arrived> ranks_;
};

// Roots started in this process, by nonce. A root whose thread fails closes
// its listener, and a rank dialling it would retry "connection refused"
// until its timeout (the root may simply not have started yet, elsewhere):
// a rank of this process reads here that its root failed, and stops at once.
// Fixed slots of atomics: no lock or allocation, nothing a fork could leave
// held (a forked child sees its parent's slots as they were, and dials on).
struct RootSlot {
  std::atomic<uint64_t> nonce{0};
  std::atomic<int> failed{0};
};
constexpr unsigned kRootSlots = 64;
RootSlot g_root_slots[kRootSlots];
std::atomic<unsigned> g_root_next{0};

RootSlot* claimRootSlot(uint64_t nonce) {
  for (RootSlot& s : g_root_slots) {  // an earlier root of the same nonce (EP_COMM_ID) is over
    uint64_t same = nonce;
    s.nonce.compare_exchange_strong(same, 0, std::memory_order_acq_rel);
  }
  RootSlot* slot = &g_root_slots[g_root_next.fetch_add(1, std::memory_order_relaxed) % kRootSlots];
  slot->failed.store(0, std::memory_order_relaxed);
  slot->nonce.store(nonce, std::memory_order_release);
  return slot;
}

RootSlot* findRootSlot(uint64_t nonce) {
  for (RootSlot& s : g_root_slots)
    if (s.nonce.load(std::memory_order_acquire) == nonce) return &s;
  return nullptr;
}

void rootThreadMain(Root* root, RootSlot* slot, uint64_t nonce) {
  // Nothing may escape a detached thread; the worst case is a rank timing out.
  bool failed = true;
  try {
    root->run();
    failed = false;
  } catch (const std::exception& e) {
    EP_WARN(kSubsysBootstrap, "bootstrap root failed: %s", e.what());
  } catch (...) {
    EP_WARN(kSubsysBootstrap, "bootstrap root failed");
  }
  delete root;  // closes the listening socket and every connection
  if (failed && slot->nonce.load(std::memory_order_acquire) == nonce) slot->failed.store(1, std::memory_order_release);
}

}  // namespace

// ---- Rank side ---------------------------------------------------------------


namespace {

// The same nonce on every rank that reads the same EP_COMM_ID in the same
// launcher job: the job id the launcher gives its ranks (Open MPI, PMIx,
// Slurm) is mixed in, so that the ranks of another job started on the same
// address by mistake are refused by the root instead of joining this job.
// The text is hashed without the blanks around it, which parseSocketAddress
// ignores too; names are not resolved (a name may resolve differently on
// another host), so every rank must write the address the same way.
uint64_t nonceOfCommId(const char* comm_id) {
  uint64_t h = 1469598103934665603ull;
  const auto mix = [&h](const std::string& text) {
    for (char c : text) h = (h ^ uint8_t(c)) * 1099511628211ull;
    h = (h ^ 0xffu) * 1099511628211ull;  // separator
  };
  std::string id = comm_id;
  const size_t first = id.find_first_not_of(" \t"), last = id.find_last_not_of(" \t");
  mix(first == std::string::npos ? "" : id.substr(first, last - first + 1));
  for (const char* var : {"OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "SLURM_JOB_ID"}) {
    const char* job = getenv(var);
    if (job != nullptr && *job != '\0') {
      mix(var);
      mix(job);
    }
  }
  return h != 0 ? h : 1;
}

// Listens at bind_addr and serves the ranks of `nonce` from a detached thread.
epResult_t startRoot(const SocketAddress& bind_addr, uint64_t nonce, SocketAddress* advertised_out) {
  std::string error, ifname;
  RootFd listen_fd;
  SocketAddress bound;
  if (!listen_fd.open([&](Fd* out) { return listenSocket(bind_addr, out, &bound, &error); }))
    return setError(nullptr, epSystemError, "bootstrap: root: %s", error.c_str());
  // A wildcard EP_COMM_ID (0.0.0.0:port) listens everywhere, but the id must
  // carry an address other hosts can dial: that of the chosen interface.
  SocketAddress advertised = bound;
  if (bound.isWildcard()) {
    if (!findInterfaceAddress(param::SOCKET_IFNAME(), bound.family(), &advertised, &ifname, &error))
      return setError(nullptr, epSystemError, "bootstrap: %s", error.c_str());
    advertised.setPort(bound.port());
  }
  // Owned here until its thread has started (an allocation below may throw).
  std::unique_ptr<Root> root(new (std::nothrow) Root(std::move(listen_fd), nonce, advertised));
  if (root == nullptr) return setError(nullptr, epOutOfMemory, "bootstrap: cannot allocate the root");
  // Return only once the root waits in poll(), holding no lock: a process may
  // fork its ranks right after epGetUniqueId, and a child forked while this
  // thread held a lock (an allocator's, a static's init guard) could hang.
  // The statics the thread reads are initialised here, by the caller.
  (void)param::TIMEOUT_MS();
  auto ready = std::make_shared<std::atomic<int>>(0);
  root->ready = ready.get();
  RootSlot* slot = claimRootSlot(nonce);
  Root* serving = root.get();
  try {
    std::thread([serving, ready, slot, nonce] { rootThreadMain(serving, slot, nonce); }).detach();
    root.release();  // the thread deletes it
  } catch (const std::exception& e) {
    return setError(nullptr, epSystemError, "bootstrap: cannot start the root thread: %s", e.what());
  }
  for (int i = 0; i < 5000 && ready->load(std::memory_order_acquire) == 0; i++)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EP_INFO(kSubsysBootstrap, "bootstrap root listening on %s%s%s", advertised.toString().c_str(),
          ifname.empty() ? "" : " via ", ifname.c_str());
  if (advertised_out) *advertised_out = advertised;
  return epSuccess;
}

}  // namespace

epResult_t bootstrapGetUniqueId(epUniqueId* id, bool honour_comm_id) {
  if (id == nullptr) return setError(nullptr, epInvalidArgument, "bootstrap: unique id pointer is NULL");
  const int family = socketFamilyFromParam();
  const char* comm_id = honour_comm_id ? param::COMM_ID() : nullptr;
  SocketAddress bind_addr;
  std::string error, ifname;
  IdLayout layout;
  memset(&layout, 0, sizeof(layout));
  memcpy(layout.magic, kIdMagic, sizeof(kIdMagic));
  if (comm_id != nullptr && *comm_id != '\0') {
    // Every rank derives the same id from EP_COMM_ID; rank 0 serves the root
    // there when it joins (bootstrapInit), so no rank needs to send the id.
    if (!parseSocketAddress(comm_id, family, &bind_addr, &error))
      return setError(nullptr, epInvalidArgument, "bootstrap: EP_COMM_ID: %s", error.c_str());
    if (bind_addr.isWildcard() || bind_addr.port() == 0)
      return setError(nullptr, epInvalidArgument,
                      "bootstrap: EP_COMM_ID=%s must name the address and port of rank 0's host", comm_id);
    layout.nonce = nonceOfCommId(comm_id);
    layout.root_by_rank0 = 1;
    packAddress(bind_addr, &layout.root);
  } else {
    if (!findInterfaceAddress(param::SOCKET_IFNAME(), family, &bind_addr, &ifname, &error))
      return setError(nullptr, epSystemError, "bootstrap: %s", error.c_str());
    layout.nonce = freshNonce();
    SocketAddress advertised;
    EPCHECK(startRoot(bind_addr, layout.nonce, &advertised));
    packAddress(advertised, &layout.root);
  }
  memset(id, 0, sizeof(*id));
  memcpy(id->internal, &layout, sizeof(layout));
  return epSuccess;
}

bool bootstrapIdValid(const epUniqueId& id) {
  IdLayout layout;
  memcpy(&layout, id.internal, sizeof(layout));
  SocketAddress root;
  return memcmp(layout.magic, kIdMagic, sizeof(kIdMagic)) == 0 && layout.nonce != 0 &&
         unpackAddress(layout.root, &root) && root.port() != 0;
}

namespace {

// The listening address of this rank: where the root connection left from,
// unless EP_SOCKET_IFNAME picks an interface explicitly.
bool chooseRankListenAddress(int root_fd, int root_family, SocketAddress* out, std::string* error) {
  const char* spec = param::SOCKET_IFNAME();
  if (spec != nullptr && *spec != '\0') {
    int family = socketFamilyFromParam();
    return findInterfaceAddress(spec, family != AF_UNSPEC ? family : root_family, out, nullptr, error);
  }
  if (!localAddress(root_fd, out)) {
    *error = std::string("getsockname failed: ") + strerror(errno);
    return false;
  }
  out->setPort(0);
  return true;
}

// A failed step of bootstrapInit; `what` names the step and the peer.
epResult_t ioFailure(epComm* comm, const IoResult& r, int rank, const std::string& what,
                     int timeout_ms) {
  switch (r.status) {
    case IoStatus::kOk: return epSuccess;
    case IoStatus::kTimeout:
      return setError(comm, epTimeout, "bootstrap: rank %d: %s within %d ms", rank, what.c_str(),
                      timeout_ms);
    case IoStatus::kAborted:
      return setError(comm, epAborted, "bootstrap: rank %d: aborted (%s)", rank, what.c_str());
    case IoStatus::kClosed:
      return setError(comm, epRemoteError, "bootstrap: rank %d: %s: %s", rank, what.c_str(),
                      r.describe().c_str());
    case IoStatus::kError:
      return setError(comm, epSystemError, "bootstrap: rank %d: %s: %s", rank, what.c_str(),
                      r.describe().c_str());
  }
  return epInternalError;
}

std::string rankText(int rank, const char* rest) { return "rank " + std::to_string(rank) + rest; }

// Connects to the ring successor and accepts the predecessor.
epResult_t joinRing(Bootstrap* b, int listen_fd, const SocketAddress& next_addr, const Wait& wait) {
  const int timeout = b->timeout_ms;
  IoResult r = connectWithRetry(next_addr, wait, &b->next_fd);
  if (!r.ok()) {
    return ioFailure(b->comm, r, b->rank,
                     "could not connect to " + rankText(b->next(), " (ring successor at ") +
                         next_addr.toString() + ", " + r.describe() + ")",
                     timeout);
  }
  RingHello hello;
  memset(&hello, 0, sizeof(hello));
  hello.magic = kRingHelloMagic;
  hello.nonce = b->nonce;
  hello.rank = b->rank;
  hello.nranks = b->nranks;
  r = sendExact(b->next_fd.get(), &hello, sizeof(hello), wait);
  if (!r.ok()) return ioFailure(b->comm, r, b->rank, "sending the ring hello to " + rankText(b->next(), ""), timeout);

  // Anything else that dials our port (a stale rank of an earlier run, a port
  // scanner) is closed and we keep waiting for the real predecessor.
  for (;;) {
    Fd fd;
    SocketAddress peer;
    r = acceptConnection(listen_fd, wait, &fd, &peer);
    if (!r.ok())
      return ioFailure(b->comm, r, b->rank, rankText(b->prev(), " (ring predecessor) did not connect"),
                       timeout);
    RingHello got;
    r = recvExact(fd.get(), &got, sizeof(got), wait);
    if (r.status == IoStatus::kTimeout || r.status == IoStatus::kAborted)
      return ioFailure(b->comm, r, b->rank, rankText(b->prev(), " (ring predecessor) did not say hello"),
                       timeout);
    if (r.ok() && got.magic == kRingHelloMagic && got.nonce == b->nonce && got.rank == b->prev() &&
        got.nranks == b->nranks) {
      b->prev_fd = std::move(fd);
      return epSuccess;
    }
    EP_WARN(kSubsysBootstrap,
            "bootstrap: rank %d: ignored a connection from %s that is not rank %d of this job",
            b->rank, peer.toString().c_str(), b->prev());
  }
}

}  // namespace

epResult_t bootstrapInit(const epUniqueId& id, int rank, int nranks, int timeout_ms,
                         const std::atomic<int>* abort_flag, epComm* comm, Bootstrap** out,
                         const std::atomic<int>* init_abort) {
  if (out == nullptr) return setError(comm, epInvalidArgument, "bootstrap: output pointer is NULL");
  *out = nullptr;
  if (nranks < 1) return setError(comm, epInvalidArgument, "bootstrap: nranks %d is not positive", nranks);
  if (rank < 0 || rank >= nranks)
    return setError(comm, epInvalidArgument, "bootstrap: rank %d is out of range [0, %d)", rank, nranks);
  if (!bootstrapIdValid(id))
    return setError(comm, epInvalidArgument,
                    "bootstrap: the unique id is not one made by epGetUniqueId (bad magic or address)");
  IdLayout layout;
  memcpy(&layout, id.internal, sizeof(layout));
  SocketAddress root_addr;
  unpackAddress(layout.root, &root_addr);

  const int timeout = effectiveTimeoutMs(timeout_ms);
  const Wait wait = Wait::afterMs(timeout, abort_flag, init_abort);
  const std::string root_text = root_addr.toString();
  if (layout.root_by_rank0 && rank == 0) EPCHECK(startRoot(root_addr, layout.nonce, nullptr));

  // 1. Reach the root; it may not listen yet when EP_COMM_ID names another host.
  //    A root of this process that failed is not waited for.
  const RootSlot* local_root = findRootSlot(layout.nonce);
  const std::atomic<int>* root_failed = local_root != nullptr ? &local_root->failed : nullptr;
  Fd root_fd;
  Wait connect_wait = wait;
  connect_wait.abort_flags[2] = root_failed;
  IoResult r = connectWithRetry(root_addr, connect_wait, &root_fd);
  if (r.status == IoStatus::kAborted && root_failed != nullptr && root_failed->load() != 0 &&
      local_root->nonce.load() == layout.nonce)
    return setError(comm, epRemoteError,
                    "bootstrap: rank %d: the root at %s, in this process, failed before this rank reached it "
                    "(see its warning)",
                    rank, root_text.c_str());
  // A root serves one communicator and then exits: a late rank, or a second
  // init with the same id, finds nobody there.
  if (r.status == IoStatus::kTimeout)
    return setError(comm, epTimeout,
                    "bootstrap: rank %d could not reach the root at %s within %d ms (%s; the id may be "
                    "spent: its communicator was already created, or the root's process is gone or has not "
                    "started)",
                    rank, root_text.c_str(), timeout, r.describe().c_str());
  if (r.status == IoStatus::kAborted)
    return setError(comm, epAborted, "bootstrap: rank %d: aborted while connecting to the root at %s",
                    rank, root_text.c_str());
  if (!r.ok())
    return setError(comm, epSystemError, "bootstrap: rank %d: connecting to the root at %s failed: %s",
                    rank, root_text.c_str(), r.describe().c_str());

  // 2. Our own listener exists before the root learns its address, so the
  //    predecessor's connect can never race ahead of it. One rank needs no ring.
  Fd listen_fd;
  SocketAddress listen_addr;
  if (nranks > 1) {
    std::string error;
    SocketAddress bind_addr;
    if (!chooseRankListenAddress(root_fd.get(), root_addr.family(), &bind_addr, &error) ||
        !listenSocket(bind_addr, &listen_fd, &listen_addr, &error))
      return setError(comm, epSystemError, "bootstrap: rank %d: %s", rank, error.c_str());
  }

  // 3. Hello to the root, then wait until it has heard from everybody.
  RootHello hello;
  memset(&hello, 0, sizeof(hello));
  hello.magic = kRootHelloMagic;
  hello.nonce = layout.nonce;
  hello.rank = rank;
  hello.nranks = nranks;
  hello.timeout_ms = timeout;
  hello.remaining_ms = int32_t(std::min<int64_t>(wait.remainingMs(), INT32_MAX));
  packAddress(listen_addr, &hello.listen);
  r = sendExact(root_fd.get(), &hello, sizeof(hello), wait);
  if (!r.ok())
    return ioFailure(comm, r, rank, "sending the hello to the root at " + root_text, timeout);

  RootReply reply;
  r = recvExact(root_fd.get(), &reply, sizeof(reply), wait.extendedBy(kRootReplyGraceMs));
  if (r.status == IoStatus::kTimeout)
    return setError(comm, epTimeout,
                    "bootstrap: rank %d: the root at %s did not answer within %d ms (the id may be spent: "
                    "its communicator was already created, or the root's process is gone)",
                    rank, root_text.c_str(), timeout);
  // A connection still in the root's backlog when it gives up is reset: the
  // root never had a descriptor for it, so it could not say why.
  if (r.status == IoStatus::kClosed)
    return setError(comm, epRemoteError,
                    "bootstrap: rank %d: the root at %s closed the connection without an answer (it gave "
                    "up, or could not take this rank's connection, e.g. out of file descriptors: see the "
                    "warnings of the root's process)",
                    rank, root_text.c_str());
  if (!r.ok())
    return ioFailure(comm, r, rank, "waiting for the root at " + root_text, timeout);
  root_fd.reset();
  if (reply.magic != kRootReplyMagic)
    return setError(comm, epRemoteError,
                    "bootstrap: rank %d: %s answered with something that is not a moeep bootstrap reply (another "
                    "program on that port?)",
                    rank, root_text.c_str());
  reply.message[sizeof(reply.message) - 1] = '\0';
  if (reply.status != epSuccess) {
    epResult_t status = reply.status >= int(epUnhandledCudaError) && reply.status <= int(epOutOfMemory)
                            ? epResult_t(reply.status)
                            : epInternalError;
    return setError(comm, status, "bootstrap: rank %d of %d: %s", rank, nranks, reply.message);
  }

  Bootstrap* b = new (std::nothrow) Bootstrap;
  if (b == nullptr) return setError(comm, epOutOfMemory, "bootstrap: cannot allocate the bootstrap state");
  b->rank = rank;
  b->nranks = nranks;
  b->timeout_ms = timeout;
  b->nonce = layout.nonce;
  b->user_abort = abort_flag;
  b->comm = comm;

  // 4. The ring.
  if (nranks > 1) {
    SocketAddress next_addr;
    epResult_t res = unpackAddress(reply.next, &next_addr)
                         ? joinRing(b, listen_fd.get(), next_addr, wait)
                         : setError(comm, epInternalError,
                                    "bootstrap: rank %d: the root sent no address for rank %d", rank,
                                    (rank + 1) % nranks);
    if (res != epSuccess) {
      delete b;
      return res;
    }
  }
  EP_INFO(kSubsysBootstrap, "bootstrap: rank %d of %d joined (root %s, listen %s)", rank, nranks,
          root_text.c_str(), nranks > 1 ? listen_addr.toString().c_str() : "-");
  *out = b;
  return epSuccess;
}

}  // namespace ep
