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
#include <functional>
#include <string>

#include "../../src/socket.h"

namespace epsock {

using Clock = std::chrono::steady_clock;

// Milliseconds left until deadline, at least 0.
int msLeft(Clock::time_point deadline);

// Addresses, interface choice and listening are the bootstrap's
// (src/socket.cc, compiled into this module too): EP_SOCKET_IFNAME reads the
// same for both.
using Address = ep::SocketAddress;

// The endpoint's fixed form of an address (family 4 or 6, 16 address bytes)
// and back; false: no such family.
bool packEndpointAddress(const Address& a, uint8_t* family, uint8_t addr[16]);
bool unpackEndpointAddress(uint8_t family, const uint8_t addr[16], uint16_t port, Address* out);

// Options of a connected stream: no Nagle delay (signals are small), and
// unacknowledged data past user_timeout_ms ends the connection (a host that
// vanished is found without waiting for the kernel's default of minutes).
// tos > 0: the IP type of service / traffic class of what this socket sends.
void tuneStream(int fd, int user_timeout_ms, int tos);

// Connects to addr, retrying while the peer refuses or cannot be reached yet,
// until deadline. Returns the socket, or -1 with *err saying why.
// stop (may be empty): true ends the retries at once ("aborted").
int dial(const Address& addr, int tos, int user_timeout_ms, Clock::time_point deadline, std::string* err,
         const std::function<bool()>& stop = {});

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
