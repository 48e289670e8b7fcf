#include "socket.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <memory>
#include <vector>


namespace ep {

// ---- Fd / SocketAddress --------------------------------------------------

void Fd::reset(int fd) {
  // close() is not retried on EINTR: on Linux the descriptor is gone either way.
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

SocketAddress::SocketAddress() { memset(&storage, 0, sizeof(storage)); }

socklen_t SocketAddress::length() const {
  if (family() == AF_INET) return sizeof(sockaddr_in);
  if (family() == AF_INET6) return sizeof(sockaddr_in6);
  return 0;
}

uint16_t SocketAddress::port() const {
  if (family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
  if (family() == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
  return 0;
}

void SocketAddress::setPort(uint16_t port) {
  if (family() == AF_INET) reinterpret_cast<sockaddr_in*>(&storage)->sin_port = htons(port);
  if (family() == AF_INET6) reinterpret_cast<sockaddr_in6*>(&storage)->sin6_port = htons(port);
}

bool SocketAddress::isLoopback() const {
  if (family() == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr.s_addr) >> 24) == 127;
  if (family() == AF_INET6)
    return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr);
  return false;
}

bool SocketAddress::isWildcard() const {
  if (family() == AF_INET)
    return reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr.s_addr == htonl(INADDR_ANY);
  if (family() == AF_INET6)
    return IN6_IS_ADDR_UNSPECIFIED(&reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr);
  return false;
}

std::string SocketAddress::toString() const {
  char host[INET6_ADDRSTRLEN] = "";
  if (family() == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr, host, sizeof(host));
    return std::string(host) + ":" + std::to_string(port());
  }
  if (family() == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr, host,
              sizeof(host));
    return "[" + std::string(host) + "]:" + std::to_string(port());
  }
  return "<no address>";
}

void packAddress(const SocketAddress& addr, PackedAddress* packed) {
  memset(packed, 0, sizeof(*packed));
  uint16_t port_be = htons(addr.port());
  memcpy(packed->port, &port_be, 2);
  if (addr.family() == AF_INET) {
    packed->family = 4;
    memcpy(packed->addr, &reinterpret_cast<const sockaddr_in*>(&addr.storage)->sin_addr, 4);
  } else if (addr.family() == AF_INET6) {
    packed->family = 6;
    memcpy(packed->addr, &reinterpret_cast<const sockaddr_in6*>(&addr.storage)->sin6_addr, 16);
  }
}

bool unpackAddress(const PackedAddress& packed, SocketAddress* addr) {
  *addr = SocketAddress();
  uint16_t port_be;
  memcpy(&port_be, packed.port, 2);
  if (packed.family == 4) {
    auto* in = reinterpret_cast<sockaddr_in*>(&addr->storage);
    in->sin_family = AF_INET;
    in->sin_port = port_be;
    memcpy(&in->sin_addr, packed.addr, 4);
    return true;
  }
  if (packed.family == 6) {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&addr->storage);
    in6->sin6_family = AF_INET6;
    in6->sin6_port = port_be;
    memcpy(&in6->sin6_addr, packed.addr, 16);
    return true;
  }
  return false;
}

// ---- Wait ----------------------------------------------------------------

Wait Wait::afterMs(int64_t timeout_ms, const std::atomic<int>* abort_a, const std::atomic<int>* abort_b) {
  Wait w;
  if (timeout_ms > 0) w.deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  w.abort_flags[0] = abort_a;
  w.abort_flags[1] = abort_b;
  return w;
}

Wait Wait::extendedBy(int64_t extra_ms) const {
  Wait w = *this;
  if (deadline != Clock::time_point::max()) w.deadline += std::chrono::milliseconds(extra_ms);
  return w;
}

bool Wait::aborted() const {
  for (const std::atomic<int>* flag : abort_flags)
    if (flag != nullptr && flag->load(std::memory_order_acquire) != 0) return true;
  return false;
}

bool Wait::expired() const {
  return deadline != Clock::time_point::max() && Clock::now() >= deadline;
}

int64_t Wait::remainingMs() const {
  if (deadline == Clock::time_point::max()) return -1;
  auto left = deadline - Clock::now();
  if (left <= Clock::duration::zero()) return 0;
  return std::chrono::ceil<std::chrono::milliseconds>(left).count();
}

int Wait::sliceMs() const {
  int64_t left = remainingMs();
  if (left < 0) return kPollSliceMs;
  return int(std::min<int64_t>(left, kPollSliceMs));
}

// ---- IoResult --------------------------------------------------------------

namespace {

IoResult ioResult(IoStatus status, int err = 0) {
  IoResult r;
  r.status = status;
  r.sys_errno = err;
  return r;
}

// A reset or broken pipe is the peer leaving, not a local failure.
IoResult fromErrno(int err) {
  if (err == ECONNRESET || err == EPIPE || err == ECONNABORTED) return ioResult(IoStatus::kClosed, err);
  return ioResult(IoStatus::kError, err);
}

}  // namespace

std::string IoResult::describe() const {
  switch (status) {
    case IoStatus::kOk: return "ok";
    case IoStatus::kTimeout:
      return sys_errno != 0 ? std::string("timed out, last error: ") + strerror(sys_errno)
                            : std::string("timed out");
    case IoStatus::kAborted: return "aborted";
    case IoStatus::kClosed: return "connection closed by the peer";
    case IoStatus::kError: return strerror(sys_errno);
  }
  return "unknown";
}

// ---- Parsing, interfaces -------------------------------------------------------

bool parseSocketAddress(const char* text, int family, SocketAddress* out, std::string* error) {
  std::string s = text != nullptr ? text : "";
  // Surrounding blanks come from hand-written environment variables.
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.pop_back();
  size_t first = s.find_first_not_of(" \t");
  s = first == std::string::npos ? "" : s.substr(first);

  std::string host, port_text;
  bool bracketed = false;
  if (!s.empty() && s[0] == '[') {
    size_t close = s.find(']');
    if (close == std::string::npos || close + 1 >= s.size() || s[close + 1] != ':') {
      *error = "\"" + s + "\" is not [ipv6]:port";
      return false;
    }
    host = s.substr(1, close - 1);
    port_text = s.substr(close + 2);
    bracketed = true;
  } else {
    size_t colon = s.rfind(':');
    if (colon == std::string::npos) {
      *error = "\"" + s + "\" has no :port";
      return false;
    }
    if (s.find(':') != colon) {
      *error = "\"" + s + "\" looks like a bare IPv6 address; write it as [addr]:port";
      return false;
    }
    host = s.substr(0, colon);
    port_text = s.substr(colon + 1);
  }
  if (host.empty()) {
    *error = "\"" + s + "\" has no host";
    return false;
  }
  // A scope (fe80::1%eth0) names an interface of one host and would be lost
  // on the way to the other ranks, which dial the address from theirs.
  if (host.find('%') != std::string::npos) {
    *error = "\"" + s + "\" has an IPv6 scope (%" + host.substr(host.find('%') + 1) +
             "): link-local addresses cannot be reached from other hosts; give a global or unique-local "
             "address, or a host name";
    return false;
  }
  if (port_text.empty() || port_text.size() > 5 ||
      port_text.find_first_not_of("0123456789") != std::string::npos || std::stoi(port_text) > 65535) {
    *error = "\"" + s + "\" has no valid port (0..65535)";
    return false;
  }

  addrinfo hints;
  memset(&hints, 0, sizeof(hints));
  hints.ai_family = family;
  hints.ai_socktype = SOCK_STREAM;
  if (bracketed) hints.ai_flags = AI_NUMERICHOST;
  addrinfo* list = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &list);
  if (rc != 0) {
    *error = "cannot resolve \"" + host + "\"" +
             (family == AF_INET ? " as IPv4" : family == AF_INET6 ? " as IPv6" : "") + ": " +
             gai_strerror(rc);
    return false;
  }
  bool found = false;
  for (addrinfo* ai = list; ai != nullptr && !found; ai = ai->ai_next) {
    if ((ai->ai_family != AF_INET && ai->ai_family != AF_INET6) ||
        ai->ai_addrlen > sizeof(out->storage))
      continue;
    *out = SocketAddress();
    memcpy(&out->storage, ai->ai_addr, ai->ai_addrlen);
    out->setPort(uint16_t(std::stoi(port_text)));
    found = true;
  }
  freeaddrinfo(list);
  if (!found) *error = "\"" + host + "\" has no IPv4 or IPv6 address";
  return found;
}

bool interfaceNameMatches(const char* spec, const char* name) {
  if (spec == nullptr || *spec == '\0') return true;
  bool exclude = false, exact = false;
  if (*spec == '^') { exclude = true; spec++; }
  if (*spec == '=') { exact = true; spec++; }
  bool listed = false;
  std::string items(spec);
  size_t pos = 0;
  while (pos <= items.size() && !listed) {
    size_t comma = items.find(',', pos);
    if (comma == std::string::npos) comma = items.size();
    std::string item = items.substr(pos, comma - pos);
    if (!item.empty())
      listed = exact ? item == name : strncmp(name, item.c_str(), item.size()) == 0;
    pos = comma + 1;
  }
  return exclude ? !listed : listed;
}

bool findInterfaceAddress(const char* spec, int family, SocketAddress* out, std::string* ifname,
                          std::string* error) {
  if (spec == nullptr) spec = "";
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) {
    *error = std::string("getifaddrs failed: ") + strerror(errno);
    return false;
  }
  // Freed on every way out: the strings below may throw std::bad_alloc.
  const std::unique_ptr<ifaddrs, void (*)(ifaddrs*)> owned(list, freeifaddrs);
  // An explicit include list ("eth", "=lo") may name loopback on purpose, so all
  // its matches rank equally; the default and exclude lists take a real
  // interface over loopback. Within a rank, IPv4 goes first unless forced.
  const bool explicit_include = *spec != '\0' && *spec != '^';
  std::vector<int> families;
  if (family == AF_UNSPEC) families = {AF_INET, AF_INET6};
  else families = {family};
  // Pass 0 takes non-loopback interfaces, pass 1 loopback; an explicit include
  // list needs one pass that takes both.
  const int passes = explicit_include ? 1 : 2;

  bool found = false;
  for (int pass = 0; pass < passes && !found; pass++) {
    for (int fam : families) {
      for (ifaddrs* ifa = list; ifa != nullptr && !found; ifa = ifa->ifa_next) {
        if (ifa->ifa_addr == nullptr || ifa->ifa_addr->sa_family != fam) continue;
        if ((ifa->ifa_flags & IFF_UP) == 0) continue;
        if (fam == AF_INET6 &&
            IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<const sockaddr_in6*>(ifa->ifa_addr)->sin6_addr))
          continue;
        bool loopback = (ifa->ifa_flags & IFF_LOOPBACK) != 0;
        if (!explicit_include && loopback != (pass == 1)) continue;
        if (!interfaceNameMatches(spec, ifa->ifa_name)) continue;
        *out = SocketAddress();
        memcpy(&out->storage, ifa->ifa_addr,
               fam == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
        out->setPort(0);
        if (ifname != nullptr) *ifname = ifa->ifa_name;
        found = true;
      }
      if (found) break;
    }
  }
  if (!found) {
    // Name the candidates so that a typo in EP_SOCKET_IFNAME is obvious.
    std::string names;
    for (ifaddrs* ifa = list; ifa != nullptr; ifa = ifa->ifa_next) {
      if ((ifa->ifa_flags & IFF_UP) == 0) continue;
      std::string name = ifa->ifa_name;
      if ((" " + names + " ").find(" " + name + " ") == std::string::npos)
        names += (names.empty() ? "" : " ") + name;
    }
    *error = std::string("no usable ") +
             (family == AF_INET ? "IPv4 " : family == AF_INET6 ? "IPv6 " : "") +
             "interface matches EP_SOCKET_IFNAME=\"" + spec + "\" (interfaces up: " + names + ")";
  }
  return found;
}

// ---- Socket setup ----------------------------------------------------------

namespace {

void setNoDelay(int fd) {
  // The bootstrap sends small request/reply messages; Nagle would add 40 ms each.
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// Sleeps in poll() slices until the next event of interest on fd, the deadline or an abort.
// Returns kOk when poll saw the fd ready (or a slice ended); the caller retries its call.
IoResult pollOnce(pollfd* fds, nfds_t count, const Wait& wait) {
  if (wait.aborted()) return ioResult(IoStatus::kAborted);
  if (wait.expired()) return ioResult(IoStatus::kTimeout);
  int rc = ::poll(fds, count, wait.sliceMs());
  if (rc < 0 && errno != EINTR) return ioResult(IoStatus::kError, errno);
  return ioResult(IoStatus::kOk);
}

bool retryableConnectError(int err) {
  switch (err) {
    case ECONNREFUSED:   // nobody listens yet
    case ETIMEDOUT:
    case ENETUNREACH:    // route not up yet
    case EHOSTUNREACH:
    case ECONNRESET:
    case ECONNABORTED:
    case EAGAIN:         // no free local port right now
    case EADDRNOTAVAIL:
    case EINTR:
      return true;
    default:
      return false;
  }
}

}  // namespace

bool listenSocket(const SocketAddress& bind_addr, Fd* out, SocketAddress* bound, std::string* error) {
  Fd fd(::socket(bind_addr.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) {
    *error = std::string("socket() failed: ") + strerror(errno);
    return false;
  }
  // A fixed EP_COMM_ID port must be reusable right after the previous job left TIME_WAIT behind.
  int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd.get(), bind_addr.sa(), bind_addr.length()) != 0) {
    *error = "bind to " + bind_addr.toString() + " failed: " + strerror(errno);
    return false;
  }
  if (::listen(fd.get(), SOMAXCONN) != 0) {
    *error = "listen on " + bind_addr.toString() + " failed: " + strerror(errno);
    return false;
  }
  if (!localAddress(fd.get(), bound)) {
    *error = std::string("getsockname failed: ") + strerror(errno);
    return false;
  }
  *out = std::move(fd);
  return true;
}

bool localAddress(int fd, SocketAddress* out) {
  *out = SocketAddress();
  socklen_t len = sizeof(out->storage);
  return ::getsockname(fd, out->sa(), &len) == 0;
}

IoResult connectWithRetry(const SocketAddress& addr, const Wait& wait, Fd* out, bool retry_refused) {
  constexpr int kRetryDelayMs = 50;
  int last_err = 0;
  for (;;) {
    if (wait.aborted()) return ioResult(IoStatus::kAborted, last_err);
    if (wait.expired()) return ioResult(IoStatus::kTimeout, last_err);
    Fd fd(::socket(addr.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd.valid()) return ioResult(IoStatus::kError, errno);
    int err = ::connect(fd.get(), addr.sa(), addr.length()) == 0 ? 0 : errno;
    if (err == EINPROGRESS || err == EINTR) {
      // EINTR on a non-blocking connect also leaves it completing in the background.
      for (;;) {
        pollfd pfd = {fd.get(), POLLOUT, 0};
        IoResult r = pollOnce(&pfd, 1, wait);
        if (!r.ok()) {
          if (r.status == IoStatus::kTimeout || r.status == IoStatus::kAborted) r.sys_errno = last_err;
          return r;
        }
        if (pfd.revents != 0) break;
      }
      socklen_t len = sizeof(err);
      if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    }
    if (err == 0) {
      setNoDelay(fd.get());
      *out = std::move(fd);
      return ioResult(IoStatus::kOk);
    }
    last_err = err;
    if (!retryableConnectError(err)) return ioResult(IoStatus::kError, err);
    // The caller knows the peer listened already: a refusal is final.
    if (err == ECONNREFUSED && !retry_refused) return ioResult(IoStatus::kError, err);
    // Pause before the next attempt, still watching the flags and the deadline.
    auto retry_at = Wait::Clock::now() + std::chrono::milliseconds(kRetryDelayMs);
    while (Wait::Clock::now() < retry_at) {
      IoResult r = pollOnce(nullptr, 0, wait);
      if (!r.ok()) {
        r.sys_errno = last_err;
        return r;
      }
    }
  }
}

IoResult acceptConnection(int listen_fd, const Wait& wait, Fd* out, SocketAddress* peer) {
  for (;;) {
    if (wait.aborted()) return ioResult(IoStatus::kAborted);
    SocketAddress from;
    socklen_t len = sizeof(from.storage);
    int fd = ::accept4(listen_fd, from.sa(), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      setNoDelay(fd);
      out->reset(fd);
      if (peer != nullptr) *peer = from;
      return ioResult(IoStatus::kOk);
    }
    int err = errno;
    switch (err) {
      case EAGAIN: {
        pollfd pfd = {listen_fd, POLLIN, 0};
        IoResult r = pollOnce(&pfd, 1, wait);
        if (!r.ok()) return r;
        break;
      }
      // A connection that died in the backlog, or a network hiccup: accept the next one.
      case EINTR:
      case ECONNABORTED:
      case EPROTO:
      case ENETDOWN:
      case ENOPROTOOPT:
      case EHOSTDOWN:
      case ENONET:
      case EHOSTUNREACH:
      case ENETUNREACH:
        break;
      default:
        return ioResult(IoStatus::kError, err);
    }
  }
}

// ---- Data ------------------------------------------------------------------

namespace {

// One non-blocking step of a transfer: >0 bytes moved, 0 would block, <0 failed (*r set).
ssize_t sendSome(int fd, const char* buf, size_t len, IoResult* r) {
  for (;;) {
    ssize_t n = ::send(fd, buf, len, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n >= 0) return n;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    *r = fromErrno(errno);
    return -1;
  }
}

ssize_t recvSome(int fd, char* buf, size_t len, IoResult* r) {
  for (;;) {
    ssize_t n = ::recv(fd, buf, len, MSG_DONTWAIT);
    if (n > 0) return n;
    if (n == 0) {
      *r = ioResult(IoStatus::kClosed);
      return -1;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    *r = fromErrno(errno);
    return -1;
  }
}

}  // namespace

IoResult sendExact(int fd, const void* buf, size_t len, const Wait& wait) {
  bool send_side;
  return sendRecvExact(fd, buf, len, -1, nullptr, 0, wait, &send_side);
}

IoResult recvExact(int fd, void* buf, size_t len, const Wait& wait) {
  bool send_side;
  return sendRecvExact(-1, nullptr, 0, fd, buf, len, wait, &send_side);
}

IoResult sendRecvExact(int send_fd, const void* send_buf, size_t send_len, int recv_fd,
                       void* recv_buf, size_t recv_len, const Wait& wait, bool* send_side,
                       size_t* sent_out) {
  const char* sp = static_cast<const char*>(send_buf);
  char* rp = static_cast<char*>(recv_buf);
  size_t sent = 0, received = 0;
  *send_side = false;
  struct SentOut {  // reports `sent` on every return
    size_t* out;
    const size_t& sent;
    ~SentOut() {
      if (out != nullptr) *out = sent;
    }
  } report{sent_out, sent};
  IoResult send_closed;  // kClosed once the peer closed the send side
  while ((sent < send_len && send_closed.ok()) || received < recv_len) {
    if (wait.aborted()) return ioResult(IoStatus::kAborted);
    bool progress = false;
    IoResult r;
    if (sent < send_len && send_closed.ok()) {
      ssize_t n = sendSome(send_fd, sp + sent, send_len - sent, &r);
      if (n < 0 && r.status != IoStatus::kClosed) {
        *send_side = true;
        return r;
      }
      if (n < 0) send_closed = r;  // the receive goes on
      sent += size_t(n > 0 ? n : 0);
      progress |= n > 0;
    }
    if (received < recv_len) {
      ssize_t n = recvSome(recv_fd, rp + received, recv_len - received, &r);
      if (n < 0) return r;
      received += size_t(n);
      progress |= n > 0;
    }
    if (progress) continue;
    pollfd fds[2];
    nfds_t count = 0;
    if (sent < send_len && send_closed.ok()) fds[count++] = {send_fd, POLLOUT, 0};
    if (received < recv_len) fds[count++] = {recv_fd, POLLIN, 0};
    r = pollOnce(fds, count, wait);
    if (!r.ok()) {
      *send_side = received >= recv_len;
      return r;
    }
  }
  if (!send_closed.ok()) {
    *send_side = true;
    return send_closed;
  }
  return ioResult(IoStatus::kOk);
}

}  // namespace ep
