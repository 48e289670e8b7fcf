// Connection setup: the listener's endpoint, dialling the peer's listener,
// and taking the peer's dials from this rank's listener. Each dialled
// stream opens with a hello that names the listener's communicator (its
// random nonce, from its endpoint) and the dialler's rank, class and stream;
// the listener answers with an ack. Connections that cannot say that (a port
// scanner, a rank of another job) are closed without an answer.
#include <poll.h>
#include <unistd.h>

#include <cstring>

#include "socket.h"

namespace epsock {

namespace {

struct Dialled {
  int fd;
  WireAck ack;
  size_t got;
  int redials;
};
constexpr int kRedials = 3;

// Why a complete hello is refused, or "" when it is taken. status: what the
// dialler is told (0: none, the connection just closes).
std::string checkHello(Comm* c, const WireHello& h, int* status) {
  *status = 0;
  if (h.magic != kHelloMagic || h.version != kWireVersion) return "not a socket transport hello";
  if (h.nonce != c->nonce) return "a hello for another communicator";
  *status = 1;
  if (h.to_rank != c->rank || h.from_rank < 0 || h.from_rank >= c->nranks || h.from_rank == c->rank)
    return "a hello from rank " + std::to_string(h.from_rank) + " to rank " + std::to_string(h.to_rank);
  if (h.cls < 0 || h.cls >= EP_TRAFFIC_CLASSES || h.nstreams < 1 || h.nstreams > kMaxStreams ||
      h.stream >= h.nstreams)
    return "a hello with class " + std::to_string(h.cls) + ", stream " + std::to_string(h.stream) + " of " +
           std::to_string(h.nstreams);
  if (c->parked.count({h.from_rank, h.cls, h.stream})) return "a second hello for the same stream";
  for (const Conn* k : c->conns)
    if (k->peer == h.from_rank && int(k->cls) == h.cls) return "a hello for a connection already made";
  return "";
}

// Reads the hellos that are there; parks the streams they name, refuses
// strangers. Runs inside any connect, whichever peer each hello is from.
void serveHellos(Comm* c) {
  for (size_t i = 0; i < c->hellos.size();) {
    Comm::PendingHello& p = c->hellos[i];
    std::string err;
    const int rc = recvSome(p.fd, &p.hello, sizeof(p.hello), &p.got, &err);
    std::string why;
    int status = 0;
    if (rc < 0) {
      why = "closed before its hello (" + err + ")";
    } else if (rc == 0 && msLeft(p.deadline) == 0) {
      why = "no hello within " + std::to_string(kHelloMs) + " ms";
    } else if (rc == 1) {
      why = checkHello(c, p.hello, &status);
      if (why.empty()) {
        const WireAck ack = {kAckMagic, 0};
        if (sendAll(p.fd, &ack, sizeof(ack), Clock::now() + std::chrono::milliseconds(kHelloMs), &err)) {
          c->parked[{p.hello.from_rank, p.hello.cls, p.hello.stream}] = {p.fd, p.hello.nstreams};
          c->hellos.erase(c->hellos.begin() + long(i));
          continue;
        }
        why = "cannot answer its hello (" + err + ")";
        status = 0;
      }
    } else {
      i++;
      continue;
    }
    if (status != 0) {
      const WireAck nack = {kAckMagic, status};
      ssize_t n = send(p.fd, &nack, sizeof(nack), MSG_NOSIGNAL | MSG_DONTWAIT);
      (void)n;
    }
    // A flood of strangers is told of in 16 lines, then counted.
    if (++c->refused <= kRefusalsLogged)
      c->log(epTransportLogWarn, "refused a connection from %s: %s%s", p.from.toString().c_str(), why.c_str(),
             c->refused == kRefusalsLogged ? " (further refusals are counted, not shown)" : "");
    close(p.fd);
    c->hellos.erase(c->hellos.begin() + long(i));
  }
}

// True once every stream the peer sends on in this class was parked; moves
// them into k.
bool takeParked(Comm* c, Conn* k) {
  auto first = c->parked.find({k->peer, int(k->cls), 0});
  if (first == c->parked.end()) return false;
  const int n = first->second.nstreams;
  for (int i = 0; i < n; i++) {
    auto it = c->parked.find({k->peer, int(k->cls), i});
    if (it == c->parked.end() || it->second.nstreams != n) return false;
  }
  k->rx.resize(size_t(n));
  for (int i = 0; i < n; i++) {
    auto it = c->parked.find({k->peer, int(k->cls), i});
    k->rx[size_t(i)].fd = it->second.fd;
    k->rx[size_t(i)].stage.resize(kStageBytes);
    c->parked.erase(it);
  }
  return true;
}

}  // namespace

epResult_t endpoint(void* comm, int peer, epTrafficClass_t cls, void* buf, size_t* bytes) {
  auto* c = static_cast<Comm*>(comm);
  if (c == nullptr || buf == nullptr || bytes == nullptr || *bytes < sizeof(WireEndpoint) || peer < 0 ||
      peer >= c->nranks || peer == c->rank || int(cls) < 0 || int(cls) >= EP_TRAFFIC_CLASSES)
    return epInvalidArgument;
  WireEndpoint e{};
  e.magic = kEndpointMagic;
  e.version = kWireVersion;
  e.owner_rank = c->rank;
  e.for_rank = peer;
  e.cls = int32_t(cls);
  e.port = c->local.port();
  e.nonce = c->nonce;
  packEndpointAddress(c->local, &e.family, e.addr);
  memcpy(buf, &e, sizeof(e));
  *bytes = sizeof(e);
  return epSuccess;
}

epResult_t connect(void* comm, int peer, epTrafficClass_t cls, const void* peer_endpoint, size_t bytes,
                   void** conn) {
  auto* c = static_cast<Comm*>(comm);
  if (c == nullptr || conn == nullptr || int(cls) < 0 || int(cls) >= EP_TRAFFIC_CLASSES) return epInvalidArgument;
  *conn = nullptr;
  WireEndpoint e{};
  if (peer_endpoint != nullptr && bytes == sizeof(e)) memcpy(&e, peer_endpoint, sizeof(e));
  Address addr;
  if (peer_endpoint == nullptr || bytes != sizeof(e) || e.magic != kEndpointMagic || e.version != kWireVersion ||
      !unpackEndpointAddress(e.family, e.addr, e.port, &addr) || e.port == 0)
    return c->fail(epInvalidArgument, peer,
                   "the endpoint given for rank %d is not a socket transport endpoint (%zu bytes, %zu expected)",
                   peer, bytes, sizeof(e));
  if (e.owner_rank != peer || e.for_rank != c->rank || e.cls != int32_t(cls))
    return c->fail(epInvalidArgument, peer,
                   "the endpoint given for rank %d, class %d was made by rank %d for rank %d, class %d", peer,
                   int(cls), e.owner_rank, e.for_rank, e.cls);
  for (const Conn* k : c->conns)
    if (k->peer == peer && k->cls == cls)
      return c->fail(epInvalidUsage, peer, "rank %d, class %d is already connected", peer, int(cls));

  const auto deadline = Clock::now() + std::chrono::milliseconds(c->timeout_ms);
  auto* k = new Conn;
  k->comm = c;
  k->peer = peer;
  k->cls = cls;
  k->peer_addr = addr;
  k->peer_nonce = e.nonce;
  k->where = "rank " + std::to_string(peer) + " (" + addr.toString() + ")";
  std::vector<Dialled> dialled;
  auto failWith = [&](epResult_t res, const std::string& why) {
    for (Dialled& d : dialled) closeFd(&d.fd);
    for (RxStream& s : k->rx) closeFd(&s.fd);
    const std::string where = k->where;
    delete k;
    return c->fail(res, peer, "connecting to %s: %s", where.c_str(), why.c_str());
  };

  // The streams this rank sends on, each opened by a hello.
  const int tos = c->classes[cls].traffic_class;
  auto dialStream = [&](int i, int* fd, std::string* err) {
    *fd = dial(addr, tos, c->timeout_ms, deadline, err, [c] { return c->aborted(); });
    if (*fd < 0) {
      *err = "no connection within " + std::to_string(c->timeout_ms) + " ms: " + *err;
      return false;
    }
    WireHello h{};
    h.magic = kHelloMagic;
    h.version = kWireVersion;
    h.stream = uint16_t(i);
    h.nonce = e.nonce;
    h.from_rank = c->rank;
    h.to_rank = peer;
    h.cls = int32_t(cls);
    h.nstreams = uint16_t(c->nstreams);
    if (sendAll(*fd, &h, sizeof(h), deadline, err)) return true;
    *err = "sending the hello: " + *err;
    return false;
  };
  for (int i = 0; i < c->nstreams; i++) {
    std::string err;
    dialled.push_back({-1, {}, 0, 0});
    if (!dialStream(i, &dialled.back().fd, &err)) return failWith(epRemoteError, err);
  }

  // Acks for those, and the peer's streams to this rank, meanwhile taking
  // (and parking) whatever other peers dial here.
  size_t acked = 0;
  bool received = takeParked(c, k);
  while (acked < dialled.size() || !received) {
    if (c->aborted()) return failWith(epAborted, "the communicator was aborted (epCommAbort) while connecting");
    if (msLeft(deadline) == 0) {
      std::string what = acked < dialled.size() ? "no answer to this rank's hello" : "";
      if (!received) what += std::string(what.empty() ? "" : "; ") + "it did not connect its streams to this rank";
      return failWith(epRemoteError, what + " within " + std::to_string(c->timeout_ms) + " ms");
    }
    std::vector<pollfd> fds;
    fds.push_back({c->listen_fd, POLLIN, 0});
    for (const Comm::PendingHello& p : c->hellos) fds.push_back({p.fd, POLLIN, 0});
    for (const Dialled& d : dialled)
      if (d.got < sizeof(d.ack)) fds.push_back({d.fd, POLLIN, 0});
    poll(fds.data(), fds.size(), std::min(msLeft(deadline), 50));
    for (;;) {
      Comm::PendingHello p{};
      std::string err;
      p.fd = acceptOne(c->listen_fd, &p.from, &err);
      if (p.fd < 0) break;
      tuneStream(p.fd, c->timeout_ms, 0);
      p.deadline = Clock::now() + std::chrono::milliseconds(kHelloMs);
      // Past kMaxPendingHellos the oldest goes: a flood costs a bounded
      // number of descriptors, and a peer dropped so dials again.
      if (c->hellos.size() >= kMaxPendingHellos) {
        close(c->hellos.front().fd);
        c->hellos.erase(c->hellos.begin());
        c->refused++;
      }
      c->hellos.push_back(p);
    }
    serveHellos(c);
    for (size_t i = 0; i < dialled.size(); i++) {
      Dialled& d = dialled[i];
      if (d.got == sizeof(d.ack)) continue;
      std::string err;
      const int rc = recvSome(d.fd, &d.ack, sizeof(d.ack), &d.got, &err);
      // Closed unanswered: a listener flooded by strangers drops its oldest
      // waiting connections, so dial again, a few times; a listener of
      // another communicator (a stale endpoint) closes every time.
      if (rc < 0 && d.redials < kRedials) {
        closeFd(&d.fd);
        d.got = 0;
        d.redials++;
        if (!dialStream(int(i), &d.fd, &err)) return failWith(epRemoteError, err);
        continue;
      }
      if (rc < 0)
        return failWith(epRemoteError, "it closed the connection before answering this rank's hello (" + err +
                                           "), " + std::to_string(kRedials + 1) +
                                           " times: is the endpoint stale, or of another job?");
      if (rc == 1 && (d.ack.magic != kAckMagic || d.ack.status != 0))
        return failWith(epRemoteError, "it refused this rank's hello (status " + std::to_string(d.ack.status) + ")");
      if (rc == 1) acked++;
    }
    if (!received) received = takeParked(c, k);
  }
  k->tx.resize(dialled.size());
  for (size_t i = 0; i < dialled.size(); i++) k->tx[i].fd = dialled[i].fd;
  addConn(c, k);
  c->log(epTransportLogInfo, "connected to %s, class %d: %zu streams out, %zu in", k->where.c_str(), int(cls),
         k->tx.size(), k->rx.size());
  *conn = k;
  return epSuccess;
}

}  // namespace epsock
