// The bootstrap root (bootstrap_root.cc) and what the ranks (bootstrap.cc)
// exchange with it. Private to those two files.
//
// A rank dials the root and opens the connection with the authenticated hello
// of src/handshake.h (purpose kPurposeRoot), its payload a RootHelloBody. Once
// all ranks are there, the root answers each with a signed reply: success
// with the PackedAddress of its ring successor, or an error with the reason.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "bootstrap_auth.h"
#include "moeep.h"
#include "socket.h"

namespace ep {

struct RootHelloBody {
  int32_t rank;
  int32_t nranks;
  int32_t timeout_ms;    // for the message: what the rank was configured with
  int32_t remaining_ms;  // what is left of it on arrival (-1: no deadline)
  PackedAddress listen;  // where the ring predecessor connects
  uint32_t reserved;
};
static_assert(sizeof(RootHelloBody) == 40, "wire format");

// The root's refusal of a rank whose hello is of another job (same key).
extern const char* const kRootOtherJobText;

// Roots started in this process, by job nonce. A root whose thread fails
// closes its listener, and a rank dialling it would retry "connection
// refused" until its timeout (the root may simply not have started yet,
// elsewhere): a rank of this process reads here that its root failed, and
// stops at once. Fixed slots of atomics: no lock or allocation, nothing a
// fork could leave held (a forked child sees its parent's slots as they
// were, and dials on).
struct RootSlot {
  std::atomic<uint64_t> nonce{0};
  std::atomic<int> failed{0};
};
RootSlot* findRootSlot(uint64_t nonce);

// Listens at bind_addr and serves the ranks of job `nonce`, which must prove
// that they hold `key`, from a detached thread. *advertised_out (may be NULL)
// gets the address other hosts dial.
epResult_t startRoot(const SocketAddress& bind_addr, uint64_t nonce, const BootstrapKey& key,
                     SocketAddress* advertised_out);

}  // namespace ep
