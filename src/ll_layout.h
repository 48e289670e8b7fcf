// Sizes of the low-latency buffers of the CUDA backend, which
// epLowLatencyBufferBytes reports (the host backend's rings carry records of
// their own: host::llRecordBytes).
//
// Per buffer set (two sets alternate between calls):
//   dispatch landing  R * M records: a header (tag, token index, K expert ids,
//                     K weights, K slots filled on arrival), the token row (BF16,
//                     the larger wire type) and its FP8 scales
//   combine landing   R * M rows of float32 partial sums (or, on GPUs with more
//                     than two ranks, a weight and one expert's BF16 row)
//   counts            [R][E / R] int32: rows each source sends to each local
//                     expert (the receiver's slot bases)
//   flagged records   [R][kLLFlagTokens]: the records of calls of at most
//                     kLLFlagTokens tokens, every 4 bytes of payload in an
//                     8-byte word whose other half is the call's tag, so that
//                     a receiver sees each word arrive without a signal
//                     (src/cuda/ll_flagged.cuh)
// before the two sets: a 4096-byte control area of signal words (and the
// CUDA backend's rank-private counters, which peers may flag: LLLocal).
#pragma once

#include <cstddef>

#include "sizes.h"

namespace ep {

inline size_t llRecordHeaderBytes(int max_topk) { return roundUp(16 + size_t(max_topk) * 12, 16); }

inline size_t llDispatchRecordBytes(int hidden, int max_topk) {
  const size_t scales = size_t(fp8ScaleBlocks(hidden)) * 4;
  return roundUp(llRecordHeaderBytes(max_topk) + size_t(hidden) * 2 + scales, 16);
}

inline size_t llCombineRowBytes(int hidden) { return roundUp(size_t(hidden) * 4, 16); }

constexpr size_t kLLCtrlBytes = 4096;  // the signal words, before the two sets

// Offsets inside one set.
inline size_t llCombineOffset(int nranks, int max_tokens, int hidden, int max_topk) {
  return roundUp(size_t(nranks) * size_t(max_tokens) * llDispatchRecordBytes(hidden, max_topk), 4096);
}
inline size_t llCountsOffset(int nranks, int max_tokens, int hidden, int max_topk) {
  return llCombineOffset(nranks, max_tokens, hidden, max_topk) +
         roundUp(size_t(nranks) * size_t(max_tokens) * llCombineRowBytes(hidden), 4096);
}

// Tokens a call may send as flagged records (the CUDA backend sends calls of
// at most this many tokens that way, EP_CUDA_LL_FLAGGED).
constexpr int kLLFlagTokens = 16;

// Ints of shared memory a receiving block of the CUDA backend stages the
// flagged records' K and expert ids in (the whole-row receive lends its
// record descriptions): R * tcap * (1 + max_topk) of them for calls of at
// most tcap flagged tokens per source. Flagged records go only in calls of
// at most this many tokens (also bounded by kLLFlagTokens and the parameter).
constexpr int kLLFlagStageInts = 1024;
inline int llFlagTokensFit(int nranks, int max_topk) {
  const int fit = kLLFlagStageInts / (nranks * (1 + max_topk));
  return fit < kLLFlagTokens ? fit : kLLFlagTokens;
}

// A flagged record: the header words (K, then max_topk ids, then max_topk
// weights), the row in 8-byte pieces (room for BF16), the FP8 scales; every
// 4-byte value in an 8-byte word.
inline size_t llFlagHeaderBytes(int max_topk) { return roundUp(8 * (1 + 2 * size_t(max_topk)), 16); }
inline size_t llFlagRecordBytes(int hidden, int max_topk) {
  return llFlagHeaderBytes(max_topk) + size_t(hidden) * 2 * 2 + roundUp(size_t(fp8ScaleBlocks(hidden)) * 8, 16);
}

inline size_t llFlagOffset(int nranks, int max_tokens, int hidden, int max_topk, int num_experts) {
  return llCountsOffset(nranks, max_tokens, hidden, max_topk) + roundUp(size_t(num_experts) * 4, 4096);
}

inline size_t llSetBytes(int nranks, int max_tokens, int hidden, int max_topk, int num_experts) {
  return llFlagOffset(nranks, max_tokens, hidden, max_topk, num_experts) +
         roundUp(size_t(nranks) * kLLFlagTokens * llFlagRecordBytes(hidden, max_topk), 4096);
}

inline size_t llBufferBytes(int nranks, int max_tokens, int hidden, int max_topk, int num_experts) {
  return kLLCtrlBytes + 2 * llSetBytes(nranks, max_tokens, hidden, max_topk, num_experts);
}

}  // namespace ep
