// Sizes of the low-latency buffers, shared by every backend so that
// epLowLatencyBufferBytes reports what a communicator registers.
//
// Per buffer set (two sets alternate between calls):
//   dispatch landing  R * M records: a header (tag, token index, K expert ids,
//                     K weights, K slots filled on arrival), the token row (BF16,
//                     the larger wire type) and its FP8 scales
//   combine landing   R * M rows of float32 partial sums
//   signals           one 64-byte line per (source rank, set)
#pragma once

#include <cstddef>

namespace ep {

inline size_t llAlign(size_t v, size_t a) { return (v + a - 1) / a * a; }

inline size_t llRecordHeaderBytes(int max_topk) { return llAlign(16 + size_t(max_topk) * 12, 16); }

inline size_t llDispatchRecordBytes(int hidden, int max_topk) {
  const size_t scales = size_t((hidden + 127) / 128) * 4;
  return llAlign(llRecordHeaderBytes(max_topk) + size_t(hidden) * 2 + scales, 16);
}

inline size_t llCombineRowBytes(int hidden) { return llAlign(size_t(hidden) * 4, 16); }

constexpr size_t kLLCtrlBytes = 4096;  // the signal words, before the two sets

inline size_t llSetBytes(int nranks, int max_tokens, int hidden, int max_topk) {
  const size_t rows = size_t(nranks) * size_t(max_tokens);
  return llAlign(rows * llDispatchRecordBytes(hidden, max_topk), 4096) +
         llAlign(rows * llCombineRowBytes(hidden), 4096);
}

inline size_t llBufferBytes(int nranks, int max_tokens, int hidden, int max_topk) {
  return kLLCtrlBytes + 2 * llSetBytes(nranks, max_tokens, hidden, max_topk);
}

}  // namespace ep
