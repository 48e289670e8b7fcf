// Sizes of the low-latency buffers, shared by every backend so that
// epLowLatencyBufferBytes reports what a communicator registers.
//
// Per buffer set (two sets alternate between calls):
//   dispatch landing  R * M records: a token row (BF16, the larger wire type),
//                     its FP8 scales, index, K expert ids and K weights
//   combine landing   R * M rows of float32 partial sums
//   signals           one 64-byte line per (source rank, set)
#pragma once

#include <cstddef>

namespace ep {

inline size_t llAlign(size_t v, size_t a) { return (v + a - 1) / a * a; }

inline size_t llDispatchRecordBytes(int hidden, int max_topk) {
  const size_t scales = size_t((hidden + 127) / 128) * 4;
  return llAlign(size_t(hidden) * 2 + scales + 16 + size_t(max_topk) * 8, 16);
}

inline size_t llCombineRowBytes(int hidden) { return llAlign(size_t(hidden) * 4, 16); }

inline size_t llSetBytes(int nranks, int max_tokens, int hidden, int max_topk) {
  const size_t rows = size_t(nranks) * size_t(max_tokens);
  return llAlign(rows * llDispatchRecordBytes(hidden, max_topk), 4096) +
         llAlign(rows * llCombineRowBytes(hidden), 4096) + llAlign(size_t(nranks) * 4 * 64, 4096);
}

inline size_t llBufferBytes(int nranks, int max_tokens, int hidden, int max_topk) {
  return 2 * llSetBytes(nranks, max_tokens, hidden, max_topk);
}

}  // namespace ep
