// The low-latency mode of the CUDA backend: shared by ll_engine.cc (g++) and
// ll_dispatch.cu / ll_combine.cu (nvcc).
//
// Each rank registers one LL buffer (size: src/ll_layout.h), mapped by all
// peers of the node:
//   LLCtrl                     signal words, written by peers
//   set 0, set 1               dispatch landing [R][M] records, combine landing [R][M] rows
// A dispatch and its combine form a "pair" p (device counter, bumped by the
// dispatch send kernel); pair p uses set p & 1 and tags its signals p + 1.
//
// Who writes what, and what orders it:
//   dispatch send (rank s)   writes token t's record into landing[s][t] of every
//                            destination, then (fence, last block) ddone[set][s]
//                            = tag | T_s in every rank's LLCtrl
//   dispatch recv (rank d)   waits ddone of all sources, expands records into the
//                            caller's expert-major outputs, writes each record's
//                            slots (own memory)
//   combine send (rank d)    for every record that arrived, the weighted sum of
//                            its local experts' rows of y -> float32 row in the
//                            home rank's combine landing[d][t]; then cdone[set][d]
//                            in every rank, and dfree[set][d] (d no longer reads
//                            its dispatch landing set) in every rank
//   combine recv (rank s)    waits cdone of all ranks, sums the rows of the ranks
//                            its token went to in ascending order -> BF16; then
//                            cfree[set][s] in every rank
// A dispatch send of pair p waits dfree[set][r] >= p - 1 of every peer r (pair
// p - 2 no longer read), a combine send waits cfree likewise: two pairs can be in
// flight, a third waits for the first.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda_common.h"

namespace ep {
namespace cuda {

struct LLCtrl {
  uint64_t ddone[2][kMaxRanks];  // [set][source] = tag << 32 | tokens of the source
  uint64_t cdone[2][kMaxRanks];  // [set][rank] = tag << 32
  uint64_t dfree[2][kMaxRanks];  // [set][peer] = last tag whose dispatch landing the peer released
  uint64_t cfree[2][kMaxRanks];  // [set][peer] = last tag whose combine landing the peer released
};

// Rank-private device counters.
struct LLLocal {
  uint32_t pairs;           // dispatch sends issued
  uint32_t blocks_done[4];  // last-block detection, one per kernel kind
  int err_claim;
  int timed_out;
};

// Device state of one LL handle.
struct LLHandleDev {
  uint32_t pair;
  int num_tokens;
  uint8_t mask[1];  // [max_tokens]: destination ranks of each token (bit r)
};

struct LLView {
  int rank, nranks, max_tokens, hidden, max_topk, local_experts, first_expert, num_experts;
  char* bufs[kMaxRanks];   // every rank's LL buffer as mapped here
  size_t set_bytes;        // one set
  size_t comb_off;         // combine landing within a set
  size_t rec_bytes;        // dispatch record
  size_t hdr_bytes;        // record header (row follows)
  size_t crow_bytes;       // combine row
  LLLocal* local;
  ErrorInfo* err;
  unsigned long long timeout_ns;
};

// Offsets inside a record header.
struct LLRecordHeader {
  uint32_t tag;
  int32_t token;
  uint32_t pad[2];
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
  int num_topk;
};

int launchLLDispatchSend(const LLDispatchParams& p, int sms, void* stream);
int launchLLDispatch(const LLDispatchParams& p, int sms, void* stream);  // both halves, one kernel
int launchLLDispatchRecv(const LLDispatchParams& p, int sms, void* stream);
int launchLLCombineSend(const LLCombineParams& p, int sms, void* stream);
int launchLLCombine(const LLCombineParams& p, int sms, void* stream);  // both halves, one kernel
int launchLLCombineRecv(const LLCombineParams& p, int sms, void* stream);

}  // namespace cuda
}  // namespace ep
