// The bootstrap root: a detached thread of the process that made the unique
// id (rank 0's with EP_COMM_ID). It serves one communicator: it admits each
// rank whose authenticated hello arrives on its guarded listener, and once
// all are there it tells every rank the address of its ring successor.
#include "bootstrap_root.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "debug.h"
#include "guarded_listener.h"
#include "handshake.h"
#include "params.h"

namespace ep {

const char* const kRootOtherJobText =
    "the unique id does not belong to this root (a stale id from another run, or another launcher job on the same "
    "EP_COMM_ID? every rank must spell EP_COMM_ID identically: a host name and its address count as different)";

namespace {

using Clock = std::chrono::steady_clock;

// Upper bound on sending the final replies, so one stuck rank cannot hold the
// root. A reply fits any socket's buffer, so it is reached only by a rank
// whose connection stalls at the TCP level.
constexpr int kRootReplySendMs = 5000;
// Descriptors the root wants free beyond the ranks and the pending set (the
// process's other files come and go).
constexpr rlim_t kFdMargin = 32;

int clampMs(int64_t ms) { return int(std::min<int64_t>(std::max<int64_t>(ms, 0), INT_MAX)); }

// "2,3,7" with at most a few dozen entries listed.
std::string rankList(const std::vector<int>& ranks) {
  constexpr size_t kMaxListed = 32;
  std::string s;
  for (size_t i = 0; i < ranks.size() && i < kMaxListed; i++) s += (i ? "," : "") + std::to_string(ranks[i]);
  if (ranks.size() > kMaxListed) s += ",... (" + std::to_string(ranks.size()) + " in all)";
  return s;
}

// The root thread tells its starter that it runs (startRoot waits for it).
struct Ready {
  std::mutex mu;
  std::condition_variable cv;
  bool ready = false;
  void tell() {
    std::lock_guard<std::mutex> lock(mu);
    ready = true;
    cv.notify_all();
  }
  bool waitFor(std::chrono::milliseconds limit) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, limit, [this] { return ready; });
  }
};

class Root {
 public:
  Root(std::unique_ptr<GuardedListener> listener, SocketAddress addr)
      : listener_(std::move(listener)), addr_(addr) {}

  // Told once the thread is in its wait loop (see startRoot).
  std::shared_ptr<Ready> ready;

  void run() {
    // Clamped as the ranks' timeout is: milliseconds beyond ~2^43 overflow the clock's nanoseconds.
    const int64_t fallback_ms = clampMs(param::TIMEOUT_MS());
    fallback_deadline_ = fallback_ms > 0 ? Clock::now() + std::chrono::milliseconds(fallback_ms)
                                         : Clock::time_point::max();
    if (ready != nullptr) ready->tell();
    for (;;) {
      // The listener is closed before any rank hears the outcome: a rank may
      // retry with the same EP_COMM_ID at once, and its bind needs the port.
      if (nranks_ > 0 && arrived_ == nranks_) {
        listener_->close();
        replySuccess();
        return;
      }
      if (Clock::now() >= deadline()) {
        listener_->close();
        replyTimeout();
        return;
      }
      pollOnce();
    }
  }

 private:
  struct Arrived {
    VerifiedPeer peer;
    RootHelloBody hello;
    Clock::time_point deadline;
  };

  // The earliest deadline of the ranks that are here; before any came (or after
  // all left), EP_TIMEOUT_MS from the start, so the thread never lingers forever.
  Clock::time_point deadline() const {
    if (arrived_ == 0) return last_deadline_ != Clock::time_point::max() ? last_deadline_ : fallback_deadline_;
    Clock::time_point d = Clock::time_point::max();
    for (const Arrived& a : ranks_)
      if (a.peer.fd.valid()) d = std::min(d, a.deadline);
    return d;
  }

  void pollOnce() {
    fds_.clear();
    listener_->addPollFds(&fds_);
    const size_t first_arrived = fds_.size();
    // Watching the arrived ranks shows when one gives up (closes) while waiting.
    std::vector<int> arrived_index;
    for (size_t r = 0; r < ranks_.size(); r++)
      if (ranks_[r].peer.fd.valid()) {
        fds_.push_back({ranks_[r].peer.fd.get(), POLLIN, 0});
        arrived_index.push_back(int(r));
      }
    int slice = 100;
    const Clock::time_point d = deadline();
    if (d != Clock::time_point::max())
      slice = int(std::min<int64_t>(
          slice, std::max<int64_t>(0, std::chrono::ceil<std::chrono::milliseconds>(d - Clock::now()).count())));
    if (::poll(fds_.data(), fds_.size(), listener_->pollTimeoutMs(slice)) < 0)
      for (pollfd& p : fds_) p.revents = 0;  // EINTR: nothing to handle, deadlines still pass below
    for (size_t i = 0; i < arrived_index.size(); i++)
      if (fds_[first_arrived + i].revents != 0) checkArrived(arrived_index[i]);
    listener_->handlePollFds(fds_.data());
    VerifiedPeer peer;
    while (listener_->takeVerified(&peer)) admit(&peer);
  }

  // A rank whose hello verified: it proved it holds the job's key, so what it
  // says is taken; the checks below catch ranks that disagree with each other.
  void admit(VerifiedPeer* p) {
    if (p->payload.size() != sizeof(RootHelloBody))
      return listener_->refuse(p, epInvalidArgument, "a root hello of " + std::to_string(p->payload.size()) +
                                                         " bytes, not " + std::to_string(sizeof(RootHelloBody)));
    RootHelloBody h;
    memcpy(&h, p->payload.data(), sizeof(h));
    if (h.nranks < 1)
      return listener_->refuse(p, epInvalidArgument, "nranks " + std::to_string(h.nranks) + " is not positive");
    if (nranks_ > 0 && h.nranks != nranks_)
      return listener_->refuse(p, epInvalidUsage,
                               "rank " + std::to_string(h.rank) + " says nranks is " + std::to_string(h.nranks) +
                                   " but the ranks already here say " + std::to_string(nranks_));
    if (h.rank < 0 || h.rank >= h.nranks)
      return listener_->refuse(p, epInvalidArgument,
                               "rank " + std::to_string(h.rank) + " is out of range for " +
                                   std::to_string(h.nranks) + " ranks");
    if (nranks_ < 0) {
      nranks_ = h.nranks;
      ranks_.clear();
      ranks_.resize(size_t(nranks_));
      // Room for a socket per rank from the start: p's descriptor is about
      // the lowest free one, the number of files open besides.
      raiseFdLimit(rlim_t(p->fd.get()) + 1 + rlim_t(nranks_) + GuardedListener::kMaxPending + kFdMargin);
    }
    Arrived& slot = ranks_[size_t(h.rank)];
    if (slot.peer.fd.valid())
      return listener_->refuse(p, epInvalidUsage,
                               "rank " + std::to_string(h.rank) + " of " + std::to_string(nranks_) +
                                   " arrived twice (first from " + slot.peer.addr.toString() + ", again from " +
                                   p->addr.toString() + ")");
    slot.peer = std::move(*p);
    slot.hello = h;
    slot.deadline = h.remaining_ms >= 0 ? Clock::now() + std::chrono::milliseconds(h.remaining_ms)
                                        : Clock::time_point::max();
    arrived_++;
    listener_->setFdsWanted(rlim_t(nranks_ - arrived_));
    EP_TRACE(kSubsysBootstrap, "bootstrap root: rank %d/%d arrived from %s (%d/%d here)", h.rank, nranks_,
             slot.peer.addr.toString().c_str(), arrived_, nranks_);
  }

  // A waiting rank's socket became readable: it closed (gave up or was
  // aborted), or it broke the protocol. Either way it no longer counts.
  void checkArrived(int r) {
    Arrived& a = ranks_[size_t(r)];
    char byte;
    ssize_t n = ::recv(a.peer.fd.get(), &byte, 1, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    EP_INFO(kSubsysBootstrap, "bootstrap root: rank %d left before all ranks arrived", r);
    last_deadline_ = deadline();
    a.peer.fd.reset();
    arrived_--;
    if (arrived_ == 0) nranks_ = -1;  // nobody is left to hold the job size
  }

  void replySuccess() {
    const Wait wait = Wait::afterMs(kRootReplySendMs);
    for (int r = 0; r < nranks_; r++) {
      const PackedAddress& next = ranks_[size_t((r + 1) % nranks_)].hello.listen;
      // Best effort: a rank that is gone cannot be told anything anyway.
      (void)listener_->reply(ranks_[size_t(r)].peer, epSuccess, &next, sizeof(next), wait);
    }
    EP_INFO(kSubsysBootstrap, "bootstrap root %s: all %d ranks arrived", addr_.toString().c_str(), nranks_);
  }

  void replyTimeout() {
    if (arrived_ == 0) {
      EP_INFO(kSubsysBootstrap, "bootstrap root %s: no rank arrived in time, closing", addr_.toString().c_str());
      return;
    }
    std::vector<int> missing;
    int timeout_ms = INT_MAX;
    for (int r = 0; r < nranks_; r++) {
      const Arrived& a = ranks_[size_t(r)];
      if (!a.peer.fd.valid()) missing.push_back(r);
      else if (a.hello.timeout_ms > 0) timeout_ms = std::min(timeout_ms, int(a.hello.timeout_ms));
    }
    std::string msg = std::string(missing.size() == 1 ? "rank " : "ranks ") + rankList(missing) + " of " +
                      std::to_string(nranks_) + " did not arrive";
    if (timeout_ms != INT_MAX) msg += " within " + std::to_string(timeout_ms) + " ms";
    // The missing ranks may well have dialled: their connections waited in
    // the backlog for a descriptor the root never had.
    if (listener_->outOfFdsErrno() != 0)
      msg += std::string("; the root ran out of file descriptors (") + strerror(listener_->outOfFdsErrno()) +
             ") and could not take every rank's connection: raise ulimit -n where the root runs (pid " +
             std::to_string(getpid()) + ", open files limit " + fdLimitText() + ")";
    EP_WARN(kSubsysBootstrap, "bootstrap root %s: %s", addr_.toString().c_str(), msg.c_str());
    const Wait wait = Wait::afterMs(kRootReplySendMs);
    for (const Arrived& a : ranks_)
      if (a.peer.fd.valid())
        (void)listener_->reply(a.peer, epTimeout, msg.data(), std::min(msg.size(), hs::kMaxPayload), wait);
  }

  std::unique_ptr<GuardedListener> listener_;
  const SocketAddress addr_;
  Clock::time_point fallback_deadline_ = Clock::time_point::max();
  Clock::time_point last_deadline_ = Clock::time_point::max();
  int nranks_ = -1;  // set by the first admitted rank
  int arrived_ = 0;
  std::vector<Arrived> ranks_;
  std::vector<pollfd> fds_;
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

RootSlot* findRootSlot(uint64_t nonce) {
  for (RootSlot& s : g_root_slots)
    if (s.nonce.load(std::memory_order_acquire) == nonce) return &s;
  return nullptr;
}

epResult_t startRoot(const SocketAddress& bind_addr, uint64_t nonce, const BootstrapKey& key,
                     SocketAddress* advertised_out) {
  std::string error, ifname;
  ListenerOptions options;
  options.name = "bootstrap root";
  options.key = key;
  options.job = nonce;
  options.purpose = hs::kPurposeRoot;
  options.max_payload = sizeof(RootHelloBody);
  options.hello_ms = helloTimeoutMs();
  options.other_job_text = kRootOtherJobText;
  auto listener = std::unique_ptr<GuardedListener>(new (std::nothrow) GuardedListener(std::move(options)));
  if (listener == nullptr) return setError(nullptr, epOutOfMemory, "bootstrap: cannot allocate the root's listener");
  SocketAddress bound;
  if (!listener->listen(bind_addr, &bound, &error))
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
  std::unique_ptr<Root> root(new (std::nothrow) Root(std::move(listener), advertised));
  if (root == nullptr) return setError(nullptr, epOutOfMemory, "bootstrap: cannot allocate the root");
  // Return only once the root waits in poll(), holding no lock: a process may
  // fork its ranks right after epGetUniqueId, and a child forked while this
  // thread held a lock (an allocator's, a static's init guard) could hang.
  // The statics the thread reads are initialised here, by the caller.
  (void)param::TIMEOUT_MS();
  auto ready = std::make_shared<Ready>();
  root->ready = ready;
  RootSlot* slot = claimRootSlot(nonce);
  Root* serving = root.get();
  try {
    std::thread([serving, slot, nonce] { rootThreadMain(serving, slot, nonce); }).detach();
    root.release();  // the thread deletes it
  } catch (const std::exception& e) {
    return setError(nullptr, epSystemError, "bootstrap: cannot start the root thread: %s", e.what());
  }
  // Told, not polled for: rank 0 of an EP_COMM_ID job waits here in its init.
  // A thread that does not run within the bound is not waited for further.
  (void)ready->waitFor(std::chrono::milliseconds(5000));
  EP_INFO(kSubsysBootstrap, "bootstrap root listening on %s%s%s (%s)", advertised.toString().c_str(),
          ifname.empty() ? "" : " via ", ifname.c_str(),
          key.authenticated ? "ranks must prove they hold the job's secret"
                            : "UNAUTHENTICATED: EP_COMM_ID without EP_COMM_SECRET; anyone who reaches this port "
                              "can join or disturb the job");
  if (advertised_out) *advertised_out = advertised;
  return epSuccess;
}

}  // namespace ep
