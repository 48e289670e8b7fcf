// The rank side of the bootstrap that the join (bootstrap.cc) and the ring
// collectives (bootstrap_ring.cc) share: a rank's ring and the collectives'
// wire format. Private to those two files.
#pragma once

#include <atomic>
#include <cstdint>

#include "bootstrap_auth.h"
#include "socket.h"

struct epComm;

namespace ep {

struct Bootstrap {
  int rank = 0;
  int nranks = 1;
  int timeout_ms = 0;  // per operation, <= 0: none
  uint64_t nonce = 0;
  // The job's key, for the listeners that transports open later (bootstrapListenerOptions).
  BootstrapKey key;
  const std::atomic<int>* user_abort = nullptr;
  std::atomic<int> internal_abort{0};
  epComm* comm = nullptr;
  Fd next_fd;  // to (rank + 1) % nranks
  Fd prev_fd;  // from (rank - 1 + nranks) % nranks
  uint64_t op_seq = 0;
  // An operation failed half way: the ring's byte streams are out of step.
  bool broken = false;

  ~Bootstrap() { secureZero(key.bytes, sizeof(key.bytes)); }
  int next() const { return (rank + 1) % nranks; }
  int prev() const { return (rank - 1 + nranks) % nranks; }
  Wait opWait() const { return Wait::afterMs(timeout_ms, user_abort, &internal_abort); }
  bool aborted() const {
    return internal_abort.load(std::memory_order_acquire) != 0 ||
           (user_abort != nullptr && user_abort->load(std::memory_order_acquire) != 0);
  }
};

namespace ring {

constexpr uint32_t kOpMagic = 0x65704f70u;  // 'epOp'

// kOpNotice: no operation, a failure notice follows (see forwardNotice).
enum OpKind : uint32_t { kOpAllGather = 1, kOpBarrier = 2, kOpNotice = 3 };

struct OpHeader {
  uint32_t magic;
  uint32_t kind;
  uint64_t seq;
  uint64_t bytes_per_rank;
};

inline const char* opName(uint32_t kind) { return kind == kOpBarrier ? "barrier" : "allgather"; }

}  // namespace ring

}  // namespace ep
