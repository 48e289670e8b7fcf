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

bool packEndpointAddress(const Address& a, uint8_t* family, uint8_t addr[16]) {
  ep::PackedAddress packed;
  ep::packAddress(a, &packed);
  *family = packed.family;
  memcpy(addr, packed.addr, sizeof(packed.addr));
  return packed.family == 4 || packed.family == 6;
}

bool unpackEndpointAddress(uint8_t family, const uint8_t addr[16], uint16_t port, Address* out) {
  ep::PackedAddress packed{};
  packed.family = family;
  memcpy(packed.addr, addr, sizeof(packed.addr));
  if (!ep::unpackAddress(packed, out)) return false;
  out->setPort(port);
  return true;
}

namespace {
int newSocket(int family, std::string* err) {
  const int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) *err = std::string("socket: ") + strerror(errno);
  return fd;
}
}  // namespace

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

int dial(const Address& addr, int tos, int user_timeout_ms, Clock::time_point deadline, std::string* err,
         const std::function<bool()>& stop) {
  int last_errno = 0;
  int delay_ms = 5;
  for (;;) {
    int fd = newSocket(addr.family(), err);
    if (fd < 0) return -1;
    tuneStream(fd, user_timeout_ms, tos);  // before connect: the handshake carries the TOS too
    int rc = connect(fd, addr.sa(), addr.length());
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
    if (stop && stop()) {
      *err = "aborted";
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(delay_ms, msLeft(deadline))));
    delay_ms = std::min(delay_ms * 2, 200);
  }
  *err = strerror(last_errno);
  return -1;
}

int acceptOne(int listen_fd, Address* peer, std::string* err) {
  err->clear();
  socklen_t len = sizeof(peer->storage);
  const int fd = accept4(listen_fd, peer->sa(), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd >= 0) return fd;
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
