// Low-latency dispatch: what the send (ll_dispatch_send.cuh) and the two
// receives (ll_dispatch.cuh, ll_dispatch_recv_flagged.cuh) share: the block
// shape and the sizes of what a block keeps in registers and shared memory.
#pragma once

#include "ll_device.cuh"

namespace ep {
namespace cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// 16-byte loads in flight per thread. The receive loops unrolled over them
// leave at the first unit past the end (units grow with u): a check per
// iteration jumps over every later iteration's code, an instruction-cache
// miss each (profiled: a third of the receive kernel's warp stalls, more at
// one token). The send loops keep their checks: breaks there made the
// 128-token send half 0.3-0.6 us slower (one token 0.7-1.2 us faster), though
// later A/Bs found that send half bimodal and moved by unrelated changes
// (docs/BENCHMARKS.md), so that cost may not be the breaks' own.
constexpr int kInFlight = 8;
constexpr int kTokGroup = 32;           // tokens a sending block describes in shared memory at once
constexpr int kIdStage = 2048;          // expert ids staged per round for the numbering
constexpr int kBlockExperts = 64;       // experts a block numbers per batch
constexpr int kRecGroup = 32;           // records a receiving block describes in shared memory at once

constexpr int kHdrPerWarp = kTokGroup / kWarps;  // tokens (or records) a warp describes per group
constexpr int kIdRegs = kIdStage / kThreads;       // staged ids per thread per round
constexpr int kStagedBases = 4096;                 // slot bases a receiving block keeps in shared memory

// A removed source's ntok word (llDeadRanks), as the receives take it in
// place of the word in memory: a source of no tokens of this pair, of this
// call's wire type, plain. Nothing writes that word after the shrink (and
// the shrink zeroed it), so a load of it would have no order to wait on.
__device__ __forceinline__ uint64_t llDeadSourceWord(const LLDispatchParams& p, uint32_t tag) {
  return llNtokWord(tag, 0, p.fp8);
}

// Block 0's announcement of this dispatch to rank r (thread r): this rank's
// ntok word `word` in r's LLCtrl, stored by `store`; nothing for a rank a
// shrink removed (its receivers take its word as a source of no tokens
// without reading it: llDeadSourceWord).
template <typename Store>
__device__ __forceinline__ void llAnnounce(const LLDispatchParams& p, int set, int r, uint64_t word,
                                           Store store) {
  const LLView& v = p.v;
  if (!llIsDead(v, r)) store(&llCtrl(v, r)->ntok[set][v.rank], word);
}

}  // namespace
}  // namespace cuda
}  // namespace ep
