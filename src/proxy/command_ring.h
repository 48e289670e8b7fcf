// The command ring between a producer and the proxy thread that posts its
// commands on a network transport (docs/PROXY.md). The producer is a GPU
// kernel writing host-mapped memory, or a test thread; there is one producer
// and one consumer per ring.
//
// A slot is one 64-byte command. The producer writes every field but seq,
// then seq = (command number + 1) with a release store (a kernel: after
// __threadfence_system()); the proxy reads a slot once its seq says it holds
// the command it expects next, so a slot half written is never taken. The
// producer knows a slot is free again from the count of commands the proxy
// has consumed, which the proxy publishes as a flag (kFlagConsumed) in memory
// the producer reads cheaply (device memory for a kernel): the ring's credits.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ep {
namespace proxy {

enum Op : uint32_t {
  kOpPut = 1,    // bytes of this rank's segment to the peer's, then the signal word
  kOpFlush = 2,  // once every earlier put completed locally: kFlagFlushed = signal_value
};

struct alignas(64) Command {
  uint64_t seq;            // command number + 1 once written; 0: never written
  uint32_t op;             // Op
  int32_t peer;            // kOpPut: the destination rank
  uint64_t local_offset;   // kOpPut: in this rank's registered segment
  uint64_t remote_offset;  // kOpPut: in the peer's segment
  uint64_t bytes;          // kOpPut: 0 is a signal alone
  uint64_t signal_offset;  // kOpPut: the peer's 8-byte signal word
  uint64_t signal_value;   // kOpPut: stored there after the data; kOpFlush: the flush's id
  uint64_t reserved;
};
static_assert(sizeof(Command) == 64, "a command is one cache line");

// A ring of nslots commands (a power of two) in memory both sides see.
struct Ring {
  Command* slots = nullptr;
  uint32_t nslots = 0;
  Command& at(uint64_t n) const { return slots[n & (nslots - 1)]; }
};

inline bool isPowerOfTwo(uint32_t n) { return n != 0 && (n & (n - 1)) == 0; }

// Producer side, on the host (tests, and what a kernel does): command number
// *head goes into its slot unless the ring is full (consumed: the proxy's
// kFlagConsumed as last seen). False: full, nothing written.
inline bool tryPush(const Ring& ring, uint64_t* head, uint64_t consumed, Command c) {
  if (*head - consumed >= ring.nslots) return false;
  Command& slot = ring.at(*head);
  c.seq = 0;
  // Every field but seq, then seq last with a release: the proxy's acquire
  // load of seq makes the fields visible.
  slot.op = c.op;
  slot.peer = c.peer;
  slot.local_offset = c.local_offset;
  slot.remote_offset = c.remote_offset;
  slot.bytes = c.bytes;
  slot.signal_offset = c.signal_offset;
  slot.signal_value = c.signal_value;
  slot.reserved = 0;
  __atomic_store_n(&slot.seq, *head + 1, __ATOMIC_RELEASE);
  ++*head;
  return true;
}

// Consumer side: command number n when its slot holds it (copied out), else false.
inline bool tryTake(const Ring& ring, uint64_t n, Command* out) {
  const Command& slot = ring.at(n);
  if (__atomic_load_n(&slot.seq, __ATOMIC_ACQUIRE) != n + 1) return false;
  *out = slot;
  return true;
}

}  // namespace proxy
}  // namespace ep
