// The routing handle (epHandle_t): what one dispatch learned about where its
// tokens go, kept for its combine and for cached re-dispatches. The core
// checks and links handles (api*.cc, comm.cc); a backend fills the routing
// and keeps its own state per handle (backend_state).
#pragma once

#include <cstdint>
#include <vector>

#include "routing.h"

struct epComm;

namespace ep {

constexpr uint32_t kHandleMagic = 0x65704864u;  // 'epHd'
constexpr uint32_t kDeadMagic = 0xdeadbeefu;    // a destroyed communicator or handle

}  // namespace ep

struct epHandle {
  uint32_t magic = ep::kHandleMagic;
  epComm* comm = nullptr;
  bool low_latency = false;  // made by epLowLatencyDispatch
  // Low latency: the op whose receive half epLowLatencyComplete still owes.
  enum class Pending { kNone, kDispatch, kCombine } pending = Pending::kNone;
  ep::Routing routing;  // host view of where every token goes and comes from
  bool counts_known = false;
  bool dispatched = false;  // a dispatch ran: combine and cached re-dispatch are allowed
  bool ll_combined = false;  // low latency: each dispatch is combined once
  int ll_set = 0;            // low latency: the buffer set of its pair (epComm::ll_uncombined)
  void* backend_state = nullptr;
  uint32_t epoch = 0;  // the communicator's shrinks before it was made: one made before a shrink is refused
  // The call's expert ids with the dead ranks' experts -1 (after a shrink,
  // host backend): what the handle's calls read in place of the caller's.
  std::vector<int64_t> masked_ids;
  // Host backend across nodes (src/host/hier.h): tokens each source forwards
  // to this rank (its rail peer on this node), and, once dispatched, each
  // forwarded token's mask of this node's ranks (local indices) that take it.
  std::vector<int> fwd_count;                        // [R]
  std::vector<std::vector<uint64_t>> fwd_masks;      // [R]
};
