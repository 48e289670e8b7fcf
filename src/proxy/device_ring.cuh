// The kernel's side of the proxy protocol (docs/PROXY.md): one thread pushes
// commands into the host-mapped command ring and waits on flags the proxy
// writes into device memory (src/cuda/stream_flags.h). No wait spins for ever: each
// returns on the proxy's error flag, on a heartbeat that stood still for the
// stall bound (the proxy stopped), or at its timeout.
#pragma once

#include <cstdint>

#include "proxy/command_ring.h"
#include "proxy/proxy.h"

namespace ep {
namespace proxy {

enum DeviceWait : int {
  kWaitDone = 0,
  kWaitProxyError = 1,  // *error_word: the proxy's error flag (errorResult / errorPeer)
  kWaitStalled = 2,     // the heartbeat did not move for the stall bound
  kWaitTimeout = 3,
};

__device__ inline uint64_t deviceNowNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// A flag as the proxy's stream last wrote it (device memory, not cached in L1).
__device__ inline uint64_t loadFlag(const uint64_t* flags, int flag) {
  return *reinterpret_cast<const volatile uint64_t*>(flags + flag);
}

// Waits until flags[flag] >= target.
__device__ inline int waitFlagDevice(const uint64_t* flags, int flag, uint64_t target, uint64_t timeout_ns,
                                     uint64_t stall_ns, uint64_t* error_word) {
  const uint64_t start = deviceNowNs();
  uint64_t beat = loadFlag(flags, kFlagHeartbeat), beat_seen = start;
  for (;;) {
    if (loadFlag(flags, flag) >= target) return kWaitDone;
    const uint64_t err = loadFlag(flags, kFlagError);
    if (err != 0) {
      *error_word = err;
      return kWaitProxyError;
    }
    const uint64_t now = deviceNowNs(), b = loadFlag(flags, kFlagHeartbeat);
    if (b != beat) {
      beat = b;
      beat_seen = now;
    } else if (now - beat_seen > stall_ns) {
      return kWaitStalled;
    }
    if (now - start > timeout_ns) return kWaitTimeout;
    __nanosleep(100);
  }
}

// Pushes command number *head into the ring (slots: the device's pointer to
// the host-mapped slots), waiting for a free slot through kFlagConsumed;
// what the wait returned otherwise. Every field, then a system-scope fence,
// then seq: the proxy's acquire load of seq sees the fields, and the bytes
// the command points at that this thread wrote before the call.
__device__ inline int pushCommand(Command* slots, uint32_t nslots, uint64_t* head, const uint64_t* flags,
                                  const Command& c, uint64_t timeout_ns, uint64_t stall_ns, uint64_t* error_word) {
  if (*head - loadFlag(flags, kFlagConsumed) >= nslots) {
    const int w = waitFlagDevice(flags, kFlagConsumed, *head - nslots + 1, timeout_ns, stall_ns, error_word);
    if (w != kWaitDone) return w;
  }
  volatile Command* slot = slots + (*head & (nslots - 1));
  slot->op = c.op;
  slot->peer = c.peer;
  slot->local_offset = c.local_offset;
  slot->remote_offset = c.remote_offset;
  slot->bytes = c.bytes;
  slot->signal_offset = c.signal_offset;
  slot->signal_value = c.signal_value;
  slot->reserved = 0;
  __threadfence_system();
  slot->seq = *head + 1;
  ++*head;
  return kWaitDone;
}

}  // namespace proxy
}  // namespace ep
