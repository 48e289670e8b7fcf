// Small TCP helpers of the socket transport: which address to advertise,
// listening, dialling with a bounded retry, exact sends and receives with a
// deadline. Every socket is non-blocking and close-on-exec; sends use
// MSG_NOSIGNAL, so a vanished peer is an error, never SIGPIPE.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace epsock {

using Clock = std::chrono::steady_clock;

// Milliseconds left until deadline, at least 0.
int msLeft(Clock::time_point deadline);

struct Address {
  sockaddr_storage ss{};
  socklen_t len = 0;
  int family() const { return ss.ss_family; }
  uint16_t port() const;
  void setPort(uint16_t port);
  // "1.2.3.4:5678" or "[::1]:5678".
  std::string str() const;
  // Fixed form for the endpoint (family 4 or 6, 16 address bytes); false: no such family.
  bool pack(uint8_t* family, uint8_t addr[16]) const;
  bool unpack(uint8_t family, const uint8_t addr[16], uint16_t port);
};

// True when interface name passes spec: a comma list of name prefixes, "="
// before the list makes them exact names, a leading "^" excludes them (the
// same reading as EP_SOCKET_IFNAME for the bootstrap).
bool interfaceMatches(const char* spec, const char* name);

// The address to listen on and advertise: the first up interface that spec
// allows (IPv4 before IPv6, link-local IPv6 skipped). Without an include list,
// an interface other than loopback wins over loopback.
bool chooseAddress(const char* spec, Address* out, std::string* ifname, std::string* err);

// Listens on addr (port 0: any); *port gets the port bound.
bool listenOn(const Address& addr, int* fd, uint16_t* port, std::string* err);

// Options of a connected stream: no Nagle delay (signals are small), and
// unacknowledged data past user_timeout_ms ends the connection (a host that
// vanished is found without waiting for the kernel's default of minutes).
// tos > 0: the IP type of service / traffic class of what this socket sends.
void tuneStream(int fd, int user_timeout_ms, int tos);

// Connects to addr, retrying while the peer refuses or cannot be reached yet,
// until deadline. Returns the socket, or -1 with *err saying why.
int dial(const Address& addr, int tos, int user_timeout_ms, Clock::time_point deadline, std::string* err);

// Accepts one pending connection of a non-blocking listener: the socket, -1
// when none is pending (*err empty) or on an error (*err says).
int acceptOne(int listen_fd, Address* peer, std::string* err);

// Sends all of buf before deadline. False with *err on error or timeout.
bool sendAll(int fd, const void* buf, size_t len, Clock::time_point deadline, std::string* err);

// Reads what is there into buf[*got, len) without waiting. 1: complete, 0:
// more to come, -1: closed or failed (*err says).
int recvSome(int fd, void* buf, size_t len, size_t* got, std::string* err);

void closeFd(int* fd);

}  // namespace epsock
