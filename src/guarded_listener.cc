#include "guarded_listener.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "debug.h"
#include "params.h"

namespace ep {

namespace {

// Descriptors wanted beyond the pending set and the owner's (the process's
// other files come and go).
constexpr rlim_t kFdMargin = 32;
constexpr int64_t kMinHelloMs = 10, kMaxHelloMs = 600000;

int msUntil(std::chrono::steady_clock::time_point t, std::chrono::steady_clock::time_point now) {
  if (t <= now) return 0;
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(t - now).count();
  return ms > 1000000 ? 1000000 : int(ms);
}

void randomNonce(uint8_t nonce[hs::kNonceBytes]) {
  std::string ignored;
  if (osRandomBytes(nonce, hs::kNonceBytes, &ignored)) return;
  // A challenge must never repeat; it need not be secret (a tag needs the key).
  static std::atomic<uint64_t> counter{0};
  const uint64_t v[2] = {uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()),
                         counter.fetch_add(1) ^ (uint64_t(getpid()) << 32)};
  memcpy(nonce, v, hs::kNonceBytes);
}

}  // namespace

bool raiseFdLimit(rlim_t want) {
  rlimit lim;
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur >= want || lim.rlim_cur >= lim.rlim_max)
    return false;
  const rlim_t old = lim.rlim_cur;
  lim.rlim_cur = std::min(want, lim.rlim_max);
  if (setrlimit(RLIMIT_NOFILE, &lim) != 0) return false;
  EP_INFO(kSubsysBootstrap, "bootstrap: raised the limit on open files from %llu to %llu",
          (unsigned long long)old, (unsigned long long)lim.rlim_cur);
  return true;
}

rlim_t softFdLimit() {
  rlimit lim;
  return getrlimit(RLIMIT_NOFILE, &lim) == 0 ? lim.rlim_cur : RLIM_INFINITY;
}

std::string fdLimitText() {
  rlimit lim;
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return "unknown";
  const auto text = [](rlim_t v) {
    return v == RLIM_INFINITY ? std::string("unlimited") : std::to_string(v);
  };
  return text(lim.rlim_cur) + ", hard limit " + text(lim.rlim_max);
}

int helloTimeoutMs() {
  return int(std::min(std::max(param::BOOTSTRAP_HELLO_MS(), kMinHelloMs), kMaxHelloMs));
}

GuardedListener::GuardedListener(ListenerOptions options) : options_(std::move(options)) {}

GuardedListener::~GuardedListener() { close(); }

bool GuardedListener::listen(const SocketAddress& bind_addr, SocketAddress* bound, std::string* error) {
  const bool ok = listen_fd_.open([&](Fd* out) { return listenSocket(bind_addr, out, &address_, error); });
  if (ok && bound != nullptr) *bound = address_;
  return ok;
}

void GuardedListener::close() {
  listen_fd_.reset();
  // Strangers still waiting are refused now; a real peer among them (it
  // would have answered by now) is told nothing it could act on.
  for (Pending& p : pending_)
    if (p.fd.valid()) logRefusal(p.addr, "the listener closed before its hello was complete (" +
                                             std::to_string(p.in.size()) + " bytes received)");
  pending_.clear();
  verified_.clear();
  if (refusals_unlogged_ > 0) {
    EP_WARN(kSubsysBootstrap, "%s %s: %ld more connections were refused, not logged one by one",
            options_.name.c_str(), address_.toString().c_str(), refusals_unlogged_);
    refusals_unlogged_ = 0;
  }
}

void GuardedListener::logRefusal(const SocketAddress& addr, const std::string& why) {
  // A flood of strangers must not flood the log as well.
  if (refusals_logged_ >= kLoggedRefusals) {
    refusals_unlogged_++;
    return;
  }
  refusals_logged_++;
  EP_WARN(kSubsysBootstrap, "%s %s: refused a connection from %s: %s%s", options_.name.c_str(),
          address_.toString().c_str(), addr.toString().c_str(), why.c_str(),
          refusals_logged_ == kLoggedRefusals ? " (further refusals are counted, not logged)" : "");
}

size_t GuardedListener::addPollFds(std::vector<pollfd>* fds) {
  const Clock::time_point now = Clock::now();
  // poll() skips a negative descriptor: the listener while accepting is paused.
  polled_listener_ = listen_fd_.valid() && now >= accept_paused_until_ &&
                     (pending_.size() < kMaxPending ||
                      now - pending_.front().accepted >= std::chrono::milliseconds(kEvictGraceMs));
  fds->push_back({polled_listener_ ? listen_fd_.get() : -1, POLLIN, 0});
  for (const Pending& p : pending_) fds->push_back({p.fd.get(), POLLIN, 0});
  polled_pending_ = pending_.size();
  return 1 + polled_pending_;
}

void GuardedListener::handlePollFds(const pollfd* fds) {
  for (size_t i = 0; i < polled_pending_ && i < pending_.size(); i++)
    if (fds[1 + i].revents != 0 && pending_[i].fd.valid()) readHello(&pending_[i]);
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(), [](const Pending& p) { return !p.fd.valid(); }),
                 pending_.end());
  polled_pending_ = 0;
  if (polled_listener_ && fds[0].revents != 0) acceptBurst();
  polled_listener_ = false;
  expire(Clock::now());
}

int GuardedListener::pollTimeoutMs(int cap_ms) const {
  const Clock::time_point now = Clock::now();
  int ms = cap_ms;
  const auto hello = std::chrono::milliseconds(options_.hello_ms);
  for (const Pending& p : pending_) ms = std::min(ms, msUntil(p.accepted + hello, now));
  if (listen_fd_.valid() && accept_paused_until_ > now) ms = std::min(ms, msUntil(accept_paused_until_, now));
  if (pending_.size() >= kMaxPending)
    ms = std::min(ms, msUntil(pending_.front().accepted + std::chrono::milliseconds(kEvictGraceMs), now));
  return std::max(ms, 0);
}

bool GuardedListener::takeVerified(VerifiedPeer* out) {
  if (verified_.empty()) return false;
  *out = std::move(verified_.front());
  verified_.pop_front();
  return true;
}

// Pending connections are kept in the order of their accept: the front is the oldest.
bool GuardedListener::makeRoom(Clock::time_point now) {
  if (pending_.size() < kMaxPending) return true;
  Pending& oldest = pending_.front();
  if (now - oldest.accepted < std::chrono::milliseconds(kEvictGraceMs)) return false;
  drop(&oldest, std::to_string(kMaxPending) + " connections were waiting for their hello; this one, the oldest, "
                "had not completed its own in " +
                    std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(now - oldest.accepted).count()) +
                    " ms",
       false);
  pending_.erase(pending_.begin());
  return true;
}

void GuardedListener::acceptBurst() {
  // A bounded burst, so that a flood of connections does not starve the
  // hellos already under way; what is left waits in the backlog for the
  // next turn of the loop.
  constexpr int kAcceptsPerTurn = 64;
  for (int n = 0; n < kAcceptsPerTurn && listen_fd_.valid(); n++) {
    const Clock::time_point now = Clock::now();
    if (!makeRoom(now)) return;
    Pending p;
    Wait now_only;  // a zero timeout: take what is in the backlog now
    now_only.deadline = now;
    IoResult r = p.fd.open([&](Fd* out) { return acceptConnection(listen_fd_.get(), now_only, out, &p.addr); });
    if (r.status == IoStatus::kError && acceptFailed(r)) continue;
    if (!r.ok()) return;
    p.accepted = now;
    randomNonce(p.nonce);
    const hs::Challenge c = hs::makeChallenge(options_.purpose, p.nonce);
    // A fresh socket's send buffer always holds the challenge.
    const ssize_t sent = ::send(p.fd.get(), &c, sizeof(c), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (sent != ssize_t(sizeof(c))) {
      logRefusal(p.addr, sent < 0 ? std::string("its challenge could not be sent: ") + strerror(errno)
                                  : std::string("its challenge could not be sent at once"));
      continue;
    }
    EP_TRACE(kSubsysBootstrap, "%s: connection from %s", options_.name.c_str(), p.addr.toString().c_str());
    pending_.push_back(std::move(p));
  }
}

// True to retry at once (the limit on open files was raised); otherwise the
// listener is left alone for kAcceptBackoffMs, since what failed stays in
// the backlog, and running out of descriptors is kept for the owner's message.
bool GuardedListener::acceptFailed(const IoResult& r) {
  const bool out_of_fds = r.sys_errno == EMFILE || r.sys_errno == ENFILE;
  const rlim_t soft = softFdLimit();
  if (r.sys_errno == EMFILE && soft != RLIM_INFINITY && raiseFdLimit(soft + fds_wanted_ + kMaxPending + kFdMargin))
    return true;
  if (!out_of_fds || fd_errno_ == 0)  // said once, not at every retry
    EP_WARN(kSubsysBootstrap, "%s %s: accept failed: %s%s%s", options_.name.c_str(), address_.toString().c_str(),
            r.describe().c_str(), out_of_fds ? "; open files limit: " : "", out_of_fds ? fdLimitText().c_str() : "");
  if (out_of_fds) fd_errno_ = r.sys_errno;
  accept_paused_until_ = Clock::now() + std::chrono::milliseconds(kAcceptBackoffMs);
  return false;
}

bool GuardedListener::readHello(Pending* p) {
  for (;;) {
    uint8_t buf[512];
    const size_t ask = std::min(sizeof(buf), p->want - p->in.size());
    const ssize_t n = ::recv(p->fd.get(), buf, ask, MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    if (n <= 0) {
      drop(p, n == 0 ? "it closed the connection after " + std::to_string(p->in.size()) +
                           " bytes, before its hello was complete"
                     : std::string("receive failed: ") + strerror(errno),
           false);
      return false;
    }
    p->in.insert(p->in.end(), buf, buf + n);
    if (!p->head_checked && !hs::helloStartMatches(p->in.data(), p->in.size())) {
      drop(p, "not a moeep hello (it began " + hs::sampleOf(p->in.data(), p->in.size()) + ")", false);
      return false;
    }
    if (p->in.size() < p->want) continue;
    if (!p->head_checked) {
      hs::HelloHead head;
      memcpy(&head, p->in.data(), sizeof(head));
      std::string why;
      if (!hs::checkHelloHead(head, options_.purpose, options_.max_payload, &why)) {
        // A moeep hello of another version or purpose comes from a rank
        // that should hear why; garbage is only closed.
        drop(p, why, hs::looksLikeHello(head));
        return false;
      }
      p->head_checked = true;
      p->want = sizeof(head) + head.payload_bytes + hs::kTagBytes;
      continue;
    }
    return finishHello(p);
  }
}

bool GuardedListener::finishHello(Pending* p) {
  switch (hs::verifyHello(options_.key, options_.job, p->nonce, p->in.data(), p->in.size())) {
    case hs::HelloVerdict::kValid: break;
    case hs::HelloVerdict::kReplayed:
      drop(p, "a replayed hello: it answers another challenge than this connection's", false);
      return false;
    case hs::HelloVerdict::kBadTag:
      drop(p,
           "authentication failed: its hello was not made with this job's key (an id of another job, or another "
           "EP_COMM_SECRET)",
           true);
      return false;
    case hs::HelloVerdict::kOtherJob:
      drop(p, options_.other_job_text, true);
      return false;
  }
  hs::HelloHead head;
  memcpy(&head, p->in.data(), sizeof(head));
  VerifiedPeer v;
  v.fd = std::move(p->fd);
  v.addr = p->addr;
  v.payload.assign(p->in.begin() + sizeof(head), p->in.begin() + sizeof(head) + head.payload_bytes);
  memcpy(v.server_nonce, p->nonce, sizeof(v.server_nonce));
  memcpy(v.client_nonce, head.client_nonce, sizeof(v.client_nonce));
  verified_.push_back(std::move(v));
  return false;
}

// tell: the peer spoke the protocol well enough to read a refusal (a rank
// of another job, or with another secret): it learns why instead of waiting
// for its timeout. The refusal is sent without waiting, or not at all.
void GuardedListener::drop(Pending* p, const std::string& why, bool tell) {
  logRefusal(p->addr, why);
  if (tell && p->in.size() >= sizeof(hs::HelloHead)) {
    hs::HelloHead head;
    memcpy(&head, p->in.data(), sizeof(head));
    const std::vector<uint8_t> reply =
        hs::sealReply(options_.key, p->nonce, head.client_nonce, epInvalidArgument, why.data(),
                      std::min(why.size(), hs::kMaxPayload));
    (void)!::send(p->fd.get(), reply.data(), reply.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  }
  p->fd.reset();
}

void GuardedListener::expire(Clock::time_point now) {
  const auto hello = std::chrono::milliseconds(options_.hello_ms);
  for (Pending& p : pending_)
    if (p.fd.valid() && now - p.accepted >= hello)
      drop(&p, "no complete hello within " + std::to_string(options_.hello_ms) + " ms (EP_BOOTSTRAP_HELLO_MS; " +
                   std::to_string(p.in.size()) + " bytes received)",
           false);
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(), [](const Pending& p) { return !p.fd.valid(); }),
                 pending_.end());
}

IoResult GuardedListener::acceptVerified(const Wait& wait, VerifiedPeer* out) {
  std::vector<pollfd> fds;
  for (;;) {
    if (takeVerified(out)) return IoResult();
    IoResult r;
    if (wait.aborted()) r.status = IoStatus::kAborted;
    else if (wait.expired()) r.status = IoStatus::kTimeout;
    else if (!listen_fd_.valid()) {
      r.status = IoStatus::kError;
      r.sys_errno = EBADF;
    }
    if (!r.ok()) return r;
    fds.clear();
    addPollFds(&fds);
    if (::poll(fds.data(), fds.size(), pollTimeoutMs(wait.sliceMs())) < 0 && errno != EINTR) {
      r.status = IoStatus::kError;
      r.sys_errno = errno;
      return r;
    }
    handlePollFds(fds.data());
  }
}

IoResult GuardedListener::reply(const VerifiedPeer& peer, epResult_t status, const void* payload, size_t len,
                                const Wait& wait) const {
  const std::vector<uint8_t> bytes =
      hs::sealReply(options_.key, peer.server_nonce, peer.client_nonce, int32_t(status), payload, len);
  return sendExact(peer.fd.get(), bytes.data(), bytes.size(), wait);
}

void GuardedListener::refuse(VerifiedPeer* peer, epResult_t status, const std::string& why) {
  logRefusal(peer->addr, why);
  // Best effort and brief: a peer that does not read is not waited for.
  (void)reply(*peer, status, why.data(), std::min(why.size(), hs::kMaxPayload), Wait::afterMs(100));
  peer->fd.reset();
}

}  // namespace ep
