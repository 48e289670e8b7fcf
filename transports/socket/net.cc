#include "net.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/ip.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

namespace epsock {

int msLeft(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left < 0 ? 0 : left > (1 << 30) ? (1 << 30) : int(left);
}

uint16_t Address::port() const {
  if (family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&ss)->sin_port);
  if (family() == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_port);
  return 0;
}

void Address::setPort(uint16_t port) {
  if (family() == AF_INET) reinterpret_cast<sockaddr_in*>(&ss)->sin_port = htons(port);
  if (family() == AF_INET6) reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port = htons(port);
}

std::string Address::str() const {
  char host[INET6_ADDRSTRLEN] = "?";
  if (family() == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&ss)->sin_addr, host, sizeof(host));
    return std::string(host) + ":" + std::to_string(port());
  }
  if (family() == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_addr, host, sizeof(host));
    return "[" + std::string(host) + "]:" + std::to_string(port());
  }
  return "(no address)";
}

bool Address::pack(uint8_t* fam, uint8_t addr[16]) const {
  memset(addr, 0, 16);
  if (family() == AF_INET) {
    *fam = 4;
    memcpy(addr, &reinterpret_cast<const sockaddr_in*>(&ss)->sin_addr, 4);
    return true;
  }
  if (family() == AF_INET6) {
    *fam = 6;
    memcpy(addr, &reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_addr, 16);
    return true;
  }
  return false;
}

bool Address::unpack(uint8_t fam, const uint8_t addr[16], uint16_t p) {
  ss = sockaddr_storage{};
  if (fam == 4) {
    auto* in = reinterpret_cast<sockaddr_in*>(&ss);
    in->sin_family = AF_INET;
    memcpy(&in->sin_addr, addr, 4);
    len = sizeof(sockaddr_in);
  } else if (fam == 6) {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&ss);
    in6->sin6_family = AF_INET6;
    memcpy(&in6->sin6_addr, addr, 16);
    len = sizeof(sockaddr_in6);
  } else {
    len = 0;
    return false;
  }
  setPort(p);
  return true;
}

bool interfaceMatches(const char* spec, const char* name) {
  if (spec == nullptr || *spec == '\0') return true;
  const bool exclude = *spec == '^';
  if (exclude) spec++;
  const bool exact = *spec == '=';
  if (exact) spec++;
  bool listed = false;
  for (const char* p = spec; *p && !listed;) {
    const char* comma = strchr(p, ',');
    const size_t n = comma ? size_t(comma - p) : strlen(p);
    if (n > 0) listed = exact ? (strlen(name) == n && strncmp(name, p, n) == 0) : strncmp(name, p, n) == 0;
    p += n + (comma ? 1 : 0);
  }
  return exclude ? !listed : listed;
}

bool chooseAddress(const char* spec, Address* out, std::string* ifname, std::string* err) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) {
    *err = std::string("getifaddrs: ") + strerror(errno);
    return false;
  }
  // An include list may name loopback on purpose ("lo" for tests); without
  // one, loopback is only the last resort.
  const bool included = spec != nullptr && *spec != '\0' && *spec != '^';
  bool found = false;
  for (int pass = 0; pass < 4 && !found; pass++) {
    const bool want_loopback = pass >= 2;
    const int want_family = pass % 2 == 0 ? AF_INET : AF_INET6;
    for (ifaddrs* i = list; i != nullptr && !found; i = i->ifa_next) {
      if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != want_family) continue;
      if (!(i->ifa_flags & IFF_UP)) continue;
      const bool loopback = (i->ifa_flags & IFF_LOOPBACK) != 0;
      if (!included && loopback != want_loopback) continue;
      if (included && want_loopback) continue;  // one pass per family is enough
      if (!interfaceMatches(spec, i->ifa_name)) continue;
      if (want_family == AF_INET6 &&
          IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr))
        continue;  // a scope id means nothing on another host
      out->ss = sockaddr_storage{};
      out->len = want_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
      memcpy(&out->ss, i->ifa_addr, out->len);
      out->setPort(0);
      *ifname = i->ifa_name;
      found = true;
    }
  }
  freeifaddrs(list);
  if (!found)
    *err = std::string("no up interface matches \"") + (spec && *spec ? spec : "(any)") + "\"";
  return found;
}

namespace {
int newSocket(int family, std::string* err) {
  const int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) *err = std::string("socket: ") + strerror(errno);
  return fd;
}
}  // namespace

bool listenOn(const Address& addr, int* fd, uint16_t* port, std::string* err) {
  *fd = newSocket(addr.family(), err);
  if (*fd < 0) return false;
  const int one = 1;
  setsockopt(*fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  Address bound = addr;
  socklen_t len = sizeof(bound.ss);
  if (bind(*fd, reinterpret_cast<const sockaddr*>(&addr.ss), addr.len) != 0 || listen(*fd, SOMAXCONN) != 0 ||
      getsockname(*fd, reinterpret_cast<sockaddr*>(&bound.ss), &len) != 0) {
    *err = "cannot listen on " + addr.str() + ": " + strerror(errno);
    closeFd(fd);
    return false;
  }
  *port = bound.port();
  return true;
}

void tuneStream(int fd, int user_timeout_ms, int tos) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (user_timeout_ms > 0) {
    const unsigned ms = unsigned(user_timeout_ms);
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, sizeof(ms));
  }
  if (tos > 0) {
    const int value = tos & 0xfc;  // the ECN bits are the kernel's
    setsockopt(fd, IPPROTO_IP, IP_TOS, &value, sizeof(value));
    setsockopt(fd, IPPROTO_IPV6, IPV6_TCLASS, &value, sizeof(value));
  }
}

int dial(const Address& addr, int tos, int user_timeout_ms, Clock::time_point deadline, std::string* err) {
  int last_errno = 0;
  int delay_ms = 5;
  for (;;) {
    int fd = newSocket(addr.family(), err);
    if (fd < 0) return -1;
    tuneStream(fd, user_timeout_ms, tos);  // before connect: the handshake carries the TOS too
    int rc = connect(fd, reinterpret_cast<const sockaddr*>(&addr.ss), addr.len);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p = {fd, POLLOUT, 0};
      rc = poll(&p, 1, msLeft(deadline));
      if (rc == 1) {
        int so_error = 0;
        socklen_t len = sizeof(so_error);
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len);
        rc = so_error == 0 ? 0 : -1;
        errno = so_error;
      } else {
        errno = rc == 0 ? ETIMEDOUT : errno;
        rc = -1;
      }
    }
    if (rc == 0) return fd;
    last_errno = errno;
    close(fd);
    // A peer that does not listen yet, or a route still coming up, may
    // succeed later; anything else will not.
    const bool retry = last_errno == ECONNREFUSED || last_errno == ETIMEDOUT || last_errno == EHOSTUNREACH ||
                       last_errno == ENETUNREACH || last_errno == ECONNRESET || last_errno == EAGAIN;
    if (!retry || msLeft(deadline) == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(delay_ms, msLeft(deadline))));
    delay_ms = std::min(delay_ms * 2, 200);
  }
  *err = strerror(last_errno);
  return -1;
}

int acceptOne(int listen_fd, Address* peer, std::string* err) {
  err->clear();
  socklen_t len = sizeof(peer->ss);
  const int fd = accept4(listen_fd, reinterpret_cast<sockaddr*>(&peer->ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd >= 0) {
    peer->len = len;
    return fd;
  }
  if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
    *err = std::string("accept: ") + strerror(errno);
  return -1;
}

bool sendAll(int fd, const void* buf, size_t len, Clock::time_point deadline, std::string* err) {
  const char* p = static_cast<const char*>(buf);
  while (len > 0) {
    const ssize_t n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= size_t(n);
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      *err = strerror(errno);
      return false;
    }
    pollfd pfd = {fd, POLLOUT, 0};
    if (msLeft(deadline) == 0 || poll(&pfd, 1, std::min(msLeft(deadline), 100)) < 0) {
      if (msLeft(deadline) == 0) {
        *err = "timed out";
        return false;
      }
    }
  }
  return true;
}

int recvSome(int fd, void* buf, size_t len, size_t* got, std::string* err) {
  while (*got < len) {
    const ssize_t n = recv(fd, static_cast<char*>(buf) + *got, len - *got, MSG_DONTWAIT);
    if (n > 0) {
      *got += size_t(n);
      continue;
    }
    if (n == 0) {
      *err = "connection closed";
      return -1;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
    *err = strerror(errno);
    return -1;
  }
  return 1;
}

void closeFd(int* fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

}  // namespace epsock
