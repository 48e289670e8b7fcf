// The low-latency mode of the CUDA backend: shared by ll_engine.cc (g++) and
// ll_dispatch.cu / ll_combine.cu (nvcc).
//
// Each rank registers one LL buffer (size: src/ll_layout.h), mapped by all
// peers of the node:
//   LLCtrl                     signal counters, written by peers
//   set 0, set 1               dispatch landing [R][M] records, combine landing
//                              [R][M] rows, counts [R][local experts]
// A dispatch and its combine form a "pair" p (device counter, bumped by the
// dispatch send kernel); pair p uses set p & 1. Every LL kernel runs G blocks
// (G agreed by all ranks at init), and every block of a sending kernel adds 1
// to a counter in every rank's LLCtrl with a release reduction once its
// stores are issued: after pair p a counter of set p & 1 has reached
// (p / 2 + 1) * G. A receiver waits for that value; no block waits for the
// others of its own grid before signalling.
//
// Who writes what, and what orders it:
//   dispatch send (rank s)   writes token t's record (header: ids, weights; row)
//                            into landing[s][t] of every destination; numbers,
//                            for every expert e, the tokens that chose it (once
//                            each) in token order and writes each number into the
//                            record's slot fields, and the count into
//                            counts[s][local e] of e's rank; block 0 writes
//                            ntok[set][s] = T_s; then dsig[set][s] += 1 per block
//   dispatch recv (rank d)   waits dsig of all sources; per record and local
//                            expert, slot = counts of the earlier sources + the
//                            number; copies the row to every slot and rewrites
//                            the slot field with the absolute slot (own memory)
//   combine send (rank d)    for every record that arrived, the weighted sum of
//                            its local experts' rows of y -> float32 row in the
//                            home rank's combine landing[d][t] (more than two
//                            ranks, and d holds one of the token's experts: its
//                            weight and BF16 row instead, llSingles); then
//                            cdone[set][d] += 1 per block in every rank (also
//                            "d no longer reads its dispatch landing set")
//   combine recv (rank s)    waits cdone of all ranks, sums the rows of the ranks
//                            its token went to in ascending order -> BF16; then
//                            cfree[set][s] += 1 per block in every rank
// A dispatch send of pair p waits cdone[set][r] of pair p - 2 from every peer
// r before its first store, a combine send waits cfree likewise: two pairs
// can be in flight, a third waits for the first.
//
// Every kernel spreads its work over all blocks in (row, 16-byte piece) units
// (the dispatch send gives the numbering blocks of its own, beside the rows)
// and issues the loads a step needs before it stores anything, so that a call
// of one token costs a few memory round trips, not one per piece of a row.
#pragma once

#include <cstddef>
#include <cstdint>

#include "../ll_layout.h"
#include "cuda_common.h"

namespace ep {
namespace cuda {

struct LLCtrl {
  uint64_t dsig[2][kMaxRanks];   // [set][source]: blocks of the source's dispatch sends
  uint64_t cdone[2][kMaxRanks];  // [set][rank]: blocks of the rank's combine sends
  uint64_t cfree[2][kMaxRanks];  // [set][rank]: blocks of the rank's combine receives
  uint64_t ntok[2][kMaxRanks];   // [set][source]: llNtokWord of the source's latest dispatch
};
static_assert(offsetof(LLCtrl, dsig) == 0 && offsetof(LLCtrl, cfree) == 4 * kMaxRanks * sizeof(uint64_t),
              "FamilyWatch::ll_counters reads dsig, cdone, cfree as [kind][set][rank]");
// The wire type rides in ntok, which every receiving block reads anyway: a
// receiver finds a source of the other type without loading anything more.
constexpr uint32_t kLLNtokFp8 = 1u << 31;
// The source sent flagged records (ll_flagged.cuh): no dispatch signal to wait
// for, its records come with their tags.
constexpr uint32_t kLLNtokFlagged = 1u << 30;
constexpr uint32_t kLLNtokCount = kLLNtokFlagged - 1u;  // the tokens field
// ntok word of a dispatch: the pair's record tag (high half), then its tokens
// | kLLNtokFp8 for FP8 rows. With the tag a receiver may load the word before
// its wait for the source's signal: when the tag is this pair's, the word is
// this pair's (each pair writes it once), and the record loads after the wait
// need no second dependent load.
inline __host__ __device__ uint64_t llNtokWord(uint32_t tag, int tokens, bool fp8, bool flagged = false) {
  return (uint64_t(tag) << 32) | uint32_t(tokens) | (fp8 ? kLLNtokFp8 : 0u) | (flagged ? kLLNtokFlagged : 0u);
}

// What a low-latency kernel was doing when it reported an error
// (ErrorInfo::what; the host names it in the message).
enum LLWhat {
  kLLWhatFree = 20,
  kLLWhatDispatch = 21,
  kLLWhatCombine = 22,
  kLLWhatBadTopk = 23,
  kLLWhatWire = 24,
  kLLWhatNodeLimit = 25  // a: the token, b: its nodes (nodeLimitKernel, layout.cu)
};

// This rank's own device words (in its mapped LL buffer, kLLLocalOffset: a
// peer writes only gone[], see below).
struct LLLocal {
  uint64_t pairs;           // dispatch sends issued (64 bits: the signal targets grow with it and never wrap)
  int err_claim;
  int timed_out;            // as DevLocal::timed_out
  alignas(8) uint8_t gone[kMaxRanks];  // as DevLocal::gone; also set by a peer that found this rank in a
                                       // low-latency call while it was in a high-throughput one (FamilyWatch)
  int fail_claim;           // as DevLocal::fail_claim
  uint32_t dead;            // ranks an epCommShrink removed (bit r), written by the host in the shrink
                            // (docs/SHRINK.md, "GPUs"); read by the shrink build (ll_variant.h)
};
// LLLocal lies in the control area of the rank's LL buffer, which the peers
// map, so that they can set its gone bytes.
constexpr size_t kLLLocalOffset = 2048;
static_assert(sizeof(LLCtrl) <= kLLLocalOffset && kLLLocalOffset + sizeof(LLLocal) <= kLLCtrlBytes,
              "LLLocal in the LL control area");

// Kernel times (EP_CUDA_LL_TIMING): per pair slot and kernel kind, the
// earliest block start and the latest block end (globaltimer, ns).
enum LLKernelKind { kLLKindDispatch = 0, kLLKindDispatchRecv = 1, kLLKindCombine = 2, kLLKindCombineRecv = 3 };
constexpr int kLLKinds = 4;
constexpr int kLLTimingSlots = 256;
// Phase marks per kernel kind (llMark): when the latest block passed
//   dispatch send: 0 numbered (the numbering blocks), 1 rows stored, 2 signalled;
//   dispatch receive (either kind): 4 arrived, 5 bases staged, 6 slots of the
//     first record group, 7 rows copied;
//   combine send: 0 first headers read, 1 first group listed, 2 sums stored,
//     3 signalled; combine receive (either kind): 4 arrived, 5 sums written,
//     6 signalled.
constexpr int kLLMarks = 8;
struct LLTiming {
  unsigned long long start[kLLTimingSlots][kLLKinds];
  unsigned long long end[kLLTimingSlots][kLLKinds];
  unsigned long long mark[kLLTimingSlots][kLLKinds][kLLMarks];  // latest block to pass each mark
};

// Device state of one LL handle.
struct LLHandleDev {
  uint64_t pair;
  int num_tokens;
  int src_base[kMaxRanks + 1];  // records that arrived here: source s owns [src_base[s], src_base[s + 1])
  uint8_t mask[1];              // [max_tokens]: destination ranks of each token (bit r),
                                // then [max_tokens]: the ranks holding exactly one of its
                                // experts (llSingles), whose combine rows are BF16 (more than
                                // two ranks, see ll_combine.cu)
};

struct LLView {
  int rank, nranks, max_tokens, hidden, max_topk, local_experts, first_expert, num_experts;
  char* bufs[kMaxRanks];   // every rank's LL buffer as mapped here
  size_t set_bytes;        // one set
  size_t comb_off;         // combine landing within a set
  size_t cnt_off;          // counts [R][local_experts] within a set
  size_t rec_bytes;        // dispatch record
  size_t hdr_bytes;        // record header (row follows)
  size_t crow_bytes;       // combine row
  size_t flag_off;         // flagged records [R][kLLFlagTokens] within a set
  size_t flag_rec_bytes;   // flagged record
  size_t flag_hdr_bytes;   // its header words (the row's pieces follow)
  LLLocal* local;
  ErrorInfo* err;
  unsigned long long timeout_ns;
  LLTiming* timing;        // null unless EP_CUDA_LL_TIMING
};

// Offsets inside a record header.
struct LLRecordHeader {
  uint32_t tag;
  int32_t token;
  uint32_t num_topk;  // K of the source's call
  uint32_t slice_readers;  // receive slices that read the header (ll_dispatch_small.cu); 0 between calls
  // int32 ids[K]; float weights[K]; int32 slots[K]
};

struct LLDispatchParams {
  LLView v;
  LLHandleDev* hd;
  const uint16_t* x;
  const void* topk;
  int idx64;
  const float* weights;
  int num_tokens, num_topk;
  int fp8, pow2;
  int flagged;  // this call sends flagged records (num_tokens within EP_CUDA_LL_FLAGGED and llFlagTokensFit)
  int flag_cap;  // the most tokens any rank sends as flagged records (0: no rank does; agreed at init)
  // receive half
  uint8_t* recv_x;
  float* recv_scales;
  int* recv_count;
  int* recv_src;
};

struct LLCombineParams {
  LLView v;
  LLHandleDev* hd;
  const uint16_t* y;
  uint16_t* out;
};

// Every LL kernel runs one block per SM of the budget (all resident: the fused
// kernels wait inside for blocks of the same grid).
inline int llGrid(int sms) { return sms < 1 ? 1 : sms; }

// How a call's kernel is launched: llGrid(sms) blocks; slices as
// EP_CUDA_LL_SLICES (-1 auto, 0 never, 1 always; dispatch only); pdl: with
// programmatic dependent launch (EP_CUDA_LL_PDL), the kernel may be placed
// on the GPU while the previous kernel on the stream finishes, and waits for
// it in llEnter before it reads anything.
struct LLLaunch {
  int sms;
  int slices;
  bool pdl;
  void* stream;
};

// Each build of the kernels (ll_variant.h) has its own launches:
// ll_plain (config.enable_shrink off), ll_shrink (on).
namespace ll_plain {
#include "ll_launches.inc"
}  // namespace ll_plain
namespace ll_shrink {
#include "ll_launches.inc"
}  // namespace ll_shrink

}  // namespace cuda
}  // namespace ep
