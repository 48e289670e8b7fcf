// What the socket transport puts on the wire and in the blobs the core
// carries between ranks (endpoints, memory handles). Every field is in host
// byte order: the transport refuses to build for a big-endian host, so two
// ranks always agree. Each blob and frame starts with a magic number, so that
// bytes of anything else (a stray connection, a corrupt stream) are refused.
#pragma once

#include <cstddef>
#include <cstdint>

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the socket transport's wire format is little-endian");

namespace epsock {

constexpr uint16_t kWireVersion = 1;
constexpr uint32_t kEndpointMagic = 0x45505345;  // "ESPE"
constexpr uint32_t kHelloMagic = 0x45505348;     // "HSPE"
constexpr uint32_t kAckMagic = 0x45505341;       // "ASPE"
constexpr uint32_t kMemMagic = 0x4550534d;       // "MSPE"
constexpr uint32_t kFrameMagic = 0x45505346;     // "FSPE"

// endpoint(): where the owner listens, and for whom it made this.
struct WireEndpoint {
  uint32_t magic;
  uint16_t version;
  uint8_t family;    // 4 or 6
  uint8_t reserved;
  int32_t owner_rank;
  int32_t for_rank;
  int32_t cls;
  uint16_t port;     // host order
  uint8_t pad[2];
  uint8_t addr[16];  // IPv4 in the first 4 bytes
  uint64_t nonce;    // the owner communicator's random tag: a dialer must echo it
};

// First bytes a dialer sends on each stream it opens.
struct WireHello {
  uint32_t magic;
  uint16_t version;
  uint16_t stream;    // this stream's index, < nstreams
  uint64_t nonce;     // the listener's nonce, from its endpoint
  int32_t from_rank;
  int32_t to_rank;
  int32_t cls;
  uint16_t nstreams;  // streams the dialer sends on to this peer in this class
  uint16_t pad;
};

// The listener's answer to a hello; status 0: taken.
struct WireAck {
  uint32_t magic;
  int32_t status;
};

// mem_handle(): which registration of the owner a put names.
struct WireMemHandle {
  uint32_t magic;
  uint32_t mem_id;   // >= 1
  uint64_t bytes;
  uint64_t nonce;    // the owner communicator's nonce
};

enum FrameType : uint16_t { kFrameData = 1, kFrameGoodbye = 2 };
constexpr uint16_t kFrameSignal = 0x1;  // after the bytes, store signal_value at signal_offset

// Precedes each part of a put; bytes of data follow it on the same stream.
struct WireFrame {
  uint32_t magic;
  uint16_t type;
  uint16_t flags;
  uint64_t seq;  // per connection and direction, from 0: says which stream carries the next frame
  uint32_t mem_id;
  uint32_t pad;
  uint64_t offset;
  uint64_t bytes;
  uint64_t signal_offset;
  uint64_t signal_value;
};
static_assert(sizeof(WireFrame) == 56, "WireFrame is a wire format");
static_assert(sizeof(WireEndpoint) == 48, "WireEndpoint is a wire format");
static_assert(sizeof(WireHello) == 32, "WireHello is a wire format");

}  // namespace epsock
