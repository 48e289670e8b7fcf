// ep_bench --mode ll: the low-latency calls (epLowLatencyDispatch /
// epLowLatencyCombine, and with --split their EP_LL_SEND_ONLY halves finished
// by epLowLatencyComplete), on a communicator of config.low_latency = 1 whose
// max_tokens_per_rank is the shape's T.
//
// Per shape, like --mode ht (ep_bench.cc):
//   1. a first, untimed pass: dispatch of this rank's T BF16 tokens (the
//      inputs of --mode ht: common/reference.h) on the wire of --type (FP8,
//      quantised by the library, or BF16); the "expert" on every received row
//      (y = row * (1 + 0.25 rank), rounded to bf16, written where the combine
//      reads it: y[local expert][slot]); combine. Under --check: recv_count
//      of every local expert and recv_src of every row exactly, every received
//      row (BF16 bit for bit; FP8 scale exact, values within E4M3's rounding),
//      and the combine output bit for bit against the tool's own reference
//      (common/reference.h, checkLowLatency*);
//   2. --warmup W untimed and --iters I timed iterations of dispatch + combine,
//      each call (with --split each half) preceded by a barrier of the control
//      channel. Each rank takes the median and the p99 (nearest rank) of its
//      timed calls; the result is the largest of each over ranks.
//
// Bandwidth, bytes per rank (mean over ranks) over the slowest rank's median:
//   DeepEP's accounting (its test_low_latency.py): the (token, expert) pairs a
//     rank sends, ids of -1 excluded, times the wire row plus its FP8 scales
//     for dispatch, times hidden * 2 (BF16) for combine;
//   physical: what crosses between ranks: one wire row plus scales per
//     (token, destination rank other than its own) for dispatch, one float32
//     partial row (hidden * 4) per (token, rank other than its home) for
//     combine, both counted from the routing on the tokens' home rank (as
//     tools/gpu/gpu_common.h counts them; the library's record headers are
//     left out).
#pragma once

#include "common/bench_common.h"

namespace tools {

// Median and p99 of the timed calls (us): a rank's own, or on rank 0 the
// largest of each over ranks. -1: not measured.
struct CallTimes {
  double median = -1, p99 = -1;
};

// One call's times: whole (with --split: send half + receive half of each
// iteration), and its halves (--split only).
struct LLCallTimes {
  CallTimes whole, send, recv;
};

struct LLShapeResult : ShapeStatus {
  BenchShape shape;
  double recv_rows = -1;          // (token, local expert) rows received in the first pass, mean over ranks
  LLCallTimes dispatch, combine;  // largest over ranks
  // Bytes per rank (mean over ranks) and GB/s at the median: DeepEP's accounting and physical.
  double dispatch_bytes = -1, combine_bytes = -1, dispatch_phys_bytes = -1, combine_phys_bytes = -1;
  double dispatch_gbps = -1, combine_gbps = -1, dispatch_phys_gbps = -1, combine_phys_gbps = -1;
  double buffer_bytes = -1;  // epLowLatencyBufferBytes of the shape's config
};

// Runs one shape on this rank (every rank calls it, in the same order); on
// rank 0 returns the result of all ranks, elsewhere this rank's own checks.
LLShapeResult runLowLatencyShape(const BenchOptions& opt, const BenchShape& shape, ControlChannel* ctl,
                                 BenchDevice* dev);

// The header lines of --mode ll's text output, and one result (a row, or with
// --json an object).
void printLowLatencyHeader(const BenchOptions& opt, const LaunchInfo& li, const char* backend);
void printLowLatencyResult(const BenchOptions& opt, const LLShapeResult& r, int nranks, const char* backend);

}  // namespace tools
