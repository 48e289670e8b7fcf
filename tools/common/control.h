// A control channel between the ranks of a tool, made of the public API alone.
//
// The API has no barrier, gather or broadcast, and the tools run with or
// without MPI, so they build these from a small host-backend communicator of
// their own (E = R experts, one per rank, K = 1):
//   gather to rank 0: every rank dispatches one token to expert 0; rank 0
//     receives the rows in source-rank order (docs/SEMANTICS.md: by source rank, then token);
//   broadcast from rank 0: rank 0 dispatches R tokens, token r to expert r;
//   barrier: a dispatch prepare of zero tokens, whose count exchange cannot
//     finish on any rank before every rank has entered it.
// Payloads travel as the raw bytes of an fp32 row, which dispatch copies as is.
// Like any collective, every rank must make the same calls in the same order.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "moeep.h"

namespace tools {

class ControlChannel {
 public:
  static constexpr size_t kPayloadBytes = 1024;

  ControlChannel() = default;
  ~ControlChannel();
  ControlChannel(const ControlChannel&) = delete;
  ControlChannel& operator=(const ControlChannel&) = delete;

  // Collective over nranks. timeout_ms: how long to wait for a peer (0: EP_TIMEOUT_MS).
  epResult_t init(const epUniqueId& id, int rank, int nranks, int timeout_ms);
  int rank() const { return rank_; }
  int nranks() const { return nranks_; }

  epResult_t barrier();
  // Each rank gives `bytes` (<= kPayloadBytes); on rank 0, `all` receives
  // nranks * bytes in rank order (`all` is not touched elsewhere and may be NULL).
  epResult_t gather(const void* mine, size_t bytes, void* all);
  // Rank 0's `bytes` of data (<= kPayloadBytes) replace data on every rank.
  epResult_t broadcast(void* data, size_t bytes);
  // What went wrong in the last failed call, for a person.
  const std::string& error() const { return error_; }

 private:
  // One dispatch of rows_out rows (row r to expert experts[r]); received rows land in recv_.
  epResult_t route(int rows_out, const int64_t* experts, int64_t expect_rows, const char* what);
  epResult_t fail(const char* what, epResult_t res);  // a library call failed
  epResult_t misuse(const char* what, size_t bytes);  // a call this class refuses

  epComm_t comm_ = nullptr;
  int rank_ = 0, nranks_ = 0;
  std::vector<float> send_, recv_;  // rows of kPayloadBytes
  std::string error_;
};

}  // namespace tools
