// Small TCP socket helpers for the bootstrap.
//
// Every blocking operation takes a Wait: a deadline plus up to two abort flags.
// The helpers only ever sleep in poll() slices of kPollSliceMs, so a deadline or
// an abort is noticed within that time even when the peer is silent. All sockets
// are non-blocking, close-on-exec, TCP_NODELAY, and sends use MSG_NOSIGNAL so a
// vanished peer gives an error instead of SIGPIPE.
//
// The helpers do not call setError: the caller knows which rank is on the other
// end and writes a message that names it. They report an IoResult instead.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace ep {

// How long one poll() may sleep before flags and deadline are checked again.
constexpr int kPollSliceMs = 50;

// Owns one file descriptor and closes it on destruction. Move-only.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// An IPv4 or IPv6 address with a port (family AF_UNSPEC when empty).
struct SocketAddress {
  sockaddr_storage storage;

  SocketAddress();
  int family() const { return storage.ss_family; }
  socklen_t length() const;  // 0 when the family is neither AF_INET nor AF_INET6
  uint16_t port() const;
  void setPort(uint16_t port);
  bool isLoopback() const;
  bool isWildcard() const;  // 0.0.0.0 or ::
  sockaddr* sa() { return reinterpret_cast<sockaddr*>(&storage); }
  const sockaddr* sa() const { return reinterpret_cast<const sockaddr*>(&storage); }
  // "1.2.3.4:5678" or "[::1]:5678".
  std::string toString() const;
};

// Fixed 20-byte wire form of a SocketAddress (unique id and bootstrap messages);
// sockaddr_storage itself is as large as the whole unique id.
struct PackedAddress {
  uint8_t family;    // 4, 6, or 0 for none
  uint8_t reserved;
  uint8_t port[2];   // network byte order
  uint8_t addr[16];  // IPv4 uses the first 4 bytes
};
static_assert(sizeof(PackedAddress) == 20, "PackedAddress is a wire format");

void packAddress(const SocketAddress& addr, PackedAddress* packed);
// False when packed holds no valid family.
bool unpackAddress(const PackedAddress& packed, SocketAddress* addr);

// A deadline and abort flags that bound one blocking operation.
struct Wait {
  using Clock = std::chrono::steady_clock;

  Clock::time_point deadline = Clock::time_point::max();  // max: no deadline
  // Any set flag ends the wait (NULL entries are skipped); the third is left
  // for a caller's own (bootstrap: a root of this process that failed).
  const std::atomic<int>* abort_flags[3] = {nullptr, nullptr, nullptr};

  // timeout_ms <= 0 means no deadline. Flags may be NULL.
  static Wait afterMs(int64_t timeout_ms, const std::atomic<int>* abort_a = nullptr,
                      const std::atomic<int>* abort_b = nullptr);
  // The same flags with the deadline moved later by extra_ms (no deadline stays none).
  Wait extendedBy(int64_t extra_ms) const;
  bool aborted() const;
  bool expired() const;
  // Milliseconds left, rounded up; -1 when there is no deadline.
  int64_t remainingMs() const;
  // How long the next poll() may sleep: at most kPollSliceMs and the time left.
  int sliceMs() const;
};

enum class IoStatus {
  kOk,
  kTimeout,  // the deadline passed
  kAborted,  // an abort flag was set
  kClosed,   // the peer closed or reset the connection
  kError     // any other system error (sys_errno)
};

struct IoResult {
  IoStatus status = IoStatus::kOk;
  int sys_errno = 0;  // the errno behind kError, or the last retried error of a connect
  bool ok() const { return status == IoStatus::kOk; }
  // A few words for messages: "timed out", "connection closed", strerror, ...
  std::string describe() const;
};

// AF_INET, AF_INET6 or AF_UNSPEC from EP_SOCKET_FAMILY (warns once on junk).
int socketFamilyFromParam();

// Parses "host:port" or "[ipv6]:port"; host may be a name. family restricts the
// resolution (AF_UNSPEC: any). A bare IPv6 address without brackets is refused
// because its last colon is ambiguous.
bool parseSocketAddress(const char* text, int family, SocketAddress* out, std::string* error);

// True when interface `name` passes the EP_SOCKET_IFNAME-style spec: a comma
// list of prefixes; "=" makes them exact names; a leading "^" excludes them.
// An empty spec matches every name (loopback handling is up to the caller).
bool interfaceNameMatches(const char* spec, const char* name);

// Picks a local address (port 0) per spec (see interfaceNameMatches) and family.
// Without an explicit include list, non-loopback interfaces win over loopback;
// IPv4 wins over IPv6 when family is AF_UNSPEC. IPv6 link-local addresses are
// skipped because a scope id means nothing on another host.
bool findInterfaceAddress(const char* spec, int family, SocketAddress* out, std::string* ifname,
                          std::string* error);

// Binds (SO_REUSEADDR) and listens on bind_addr; *bound gets the real port.
bool listenSocket(const SocketAddress& bind_addr, Fd* out, SocketAddress* bound, std::string* error);
// The local address of a socket.
bool localAddress(int fd, SocketAddress* out);

// Connects to addr, retrying refused/unreachable attempts until the deadline
// (the peer may not listen yet). On kTimeout, sys_errno holds the last error;
// an error that is not retried is kError with its errno in sys_errno.
// retry_refused false (a peer known to listen already): a refusal
// (ECONNREFUSED) is returned so at once; the other retryable errors are still
// retried until the deadline.
IoResult connectWithRetry(const SocketAddress& addr, const Wait& wait, Fd* out, bool retry_refused = true);
// Accepts one connection from a non-blocking listening socket.
IoResult acceptConnection(int listen_fd, const Wait& wait, Fd* out, SocketAddress* peer);

// Send / receive exactly len bytes.
IoResult sendExact(int fd, const void* buf, size_t len, const Wait& wait);
IoResult recvExact(int fd, void* buf, size_t len, const Wait& wait);
// Both at once. Ring neighbours all send before they receive; doing the two in
// one poll loop keeps large transfers from deadlocking on full socket buffers.
// *send_side tells which direction failed (on timeout: the receive when it is
// incomplete, since a silent sender is the likelier culprit). A send side
// closed by the peer does not end the call: the receive goes on to its end
// (the other neighbour may bring the reason), then the send's kClosed is
// returned with *send_side; a receive that fails meanwhile is returned instead.
// *sent_out (may be NULL) gets the bytes of send_buf sent, on every return: a
// failed receive can leave the send incomplete, and the peer is still owed the rest.
IoResult sendRecvExact(int send_fd, const void* send_buf, size_t send_len, int recv_fd,
                       void* recv_buf, size_t recv_len, const Wait& wait, bool* send_side,
                       size_t* sent_out = nullptr);

}  // namespace ep
