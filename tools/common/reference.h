// Deterministic inputs of dispatch and combine, and an independent reference
// of what the library must return, for the checks of ep_bench (and tests).
//
// Every value is a pure function of (seed, rank, token, column): a counter-
// based generator instead of a sequential one, so that any rank can rebuild
// any other rank's token without generating (or storing) the tokens before it.
// That is what lets each rank check its received rows against the sources.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moeep.h"

namespace tools {

// What a problem looks like on every rank.
struct ProblemSpec {
  uint64_t seed = 1;
  int nranks = 1;
  int hidden = 0;                  // H
  int topk = 0;                    // K
  int experts = 0;                 // E (global)
  int tokens = 0;                  // T per rank
  bool zero_rank0 = false;         // rank 0 has no tokens
  epDataType_t type = epBfloat16;  // dispatch type

  int tokensOf(int rank) const { return zero_rank0 && rank == 0 ? 0 : tokens; }
  int localExperts() const { return experts / nranks; }
  int ownerOf(int64_t expert) const { return int(expert / localExperts()); }
  int scaleBlocks() const { return (hidden + 127) / 128; }  // FP8 scales per row
  size_t rowBytes() const;
};

// The inputs of one rank. `generation` picks new x (and scales) with the same
// routing: generation 1 is what a cached re-dispatch sends.
class RankInputs {
 public:
  RankInputs(const ProblemSpec& spec, int rank, unsigned generation = 0);

  int rank() const { return rank_; }
  int numTokens() const { return spec_.tokensOf(rank_); }
  // Token t's K global expert ids: distinct, some -1 for about 5% of tokens.
  void topk(int t, int64_t* ids) const;
  // Token t's K weights, in (0, 1].
  void weights(int t, float* w) const;
  // Token t's row as raw bits of spec.type (rowBytes() bytes), and its scales (FP8).
  void row(int t, void* out) const;
  void scales(int t, float* out) const;
  // Token t's row as the numbers it stands for (FP8: times its block scale).
  void rowValues(int t, float* out) const;

  // Whole arrays, for the caller's input buffers: x [T, H], scales [T, H/128],
  // topk_idx [T, K] int64, weights [T, K].
  void fill(void* x, float* x_scales, int64_t* topk_idx, float* topk_weights) const;

 private:
  ProblemSpec spec_;
  int rank_;
  uint64_t topk_key_, weight_key_, x_key_, scale_key_;
};

// A row's elements as the numbers they stand for (FP8: times the block's
// scale). The reference and the benchmark's expert both go through this one
// function, so their floats agree bit for bit.
void rowToValues(const ProblemSpec& spec, const void* row, const float* scales, float* out);

// The expert of the benchmark: y row of rank r = the received row's values *
// (1 + 0.25 r), rounded to bf16. Deterministic, and different on each rank, so
// that a combine that mixes up ranks or rows gives a wrong sum.
float expertFactor(int rank);
// values: H floats of a received row; y: H bf16 values.
void expertRow(const float* values, int hidden, int rank, uint16_t* y);

// Counts wrong elements and keeps the first one, described for a person.
class MismatchLog {
 public:
  explicit MismatchLog(int rank) : rank_(rank) {}
  // what: the output ("recv_x"); row/col: where (-1: not applicable).
  void add(const char* what, int64_t row, int64_t col, const std::string& expected, const std::string& got);
  int64_t count() const { return count_; }
  const std::string& first() const { return first_; }

 private:
  int rank_;
  int64_t count_ = 0;
  std::string first_;
};

// What dispatch wrote on one rank, as host-readable pointers.
struct DispatchOutputs {
  const void* recv_x = nullptr;                 // [capacity, H] of spec.type
  const float* recv_scales = nullptr;           // [capacity, H/128] (FP8)
  const int64_t* recv_topk_idx = nullptr;       // [capacity, K], optional
  const float* recv_topk_weights = nullptr;     // [capacity, K], optional
  const int* recv_tokens_per_expert = nullptr;  // [local experts], optional
  int64_t num_recv = 0;                         // what the library reported
  int64_t capacity = 0;                         // rows the buffers hold
  bool unused_rows_marked = false;              // capacity sizing: rows past num_recv must have idx -1
};

// Checks every element of rank `rank`'s dispatch outputs against the rows the
// reference says it must receive: by source rank, then source token. Returns
// the number of rows expected.
int64_t checkDispatch(const ProblemSpec& spec, int rank, unsigned generation, const DispatchOutputs& got,
                      MismatchLog* log);

// Checks rank `rank`'s combine output: out [T, H] bf16 must be the sum over the
// ranks r that received token t, in ascending r, of expertRow(x_t, r), summed in
// float32 and rounded to bf16; out_topk_weights [T, K] (optional) the token's
// weights where its expert id is not -1, else 0.
void checkCombine(const ProblemSpec& spec, int rank, const uint16_t* out, const float* out_topk_weights,
                  MismatchLog* log);

// ---- Low-latency mode (epLowLatencyDispatch / epLowLatencyCombine) ----------
// x is BF16 (spec.type == epBfloat16: RankInputs makes the rows); spec.tokens
// is config.max_tokens_per_rank (M). Outputs are expert-major, R * M rows per
// local expert (include/moeep.h).

// The wire of a low-latency dispatch.
struct LLWire {
  epDataType_t type = epFloat8E4M3;  // epFloat8E4M3 or epBfloat16
  bool pow2_scales = false;          // EP_LL_ROUND_SCALE_POW2
};

// The FP8 scale of a block of 128 (or fewer) values whose largest magnitude is
// amax: max(amax, 1e-4) / 448, rounded up to a power of two with pow2_scales.
float llBlockScale(float amax, bool pow2_scales);

// The values the experts receive for a BF16 row x of H values: x itself on a
// BF16 wire; on FP8, x quantised as SEMANTICS.md says (q = e4m3(x * (1 /
// scale))) and scaled back (q * scale).
void llWireValues(const ProblemSpec& spec, const LLWire& wire, const uint16_t* x, float* out);

// What a low-latency dispatch wrote on one rank, as host-readable pointers.
struct LLDispatchOutputs {
  const void* recv_x = nullptr;        // [L, R * M, H] of the wire type
  const float* recv_scales = nullptr;  // [L, ceil(H/128), R * M] (FP8)
  const int* recv_count = nullptr;     // [L]
  const int* recv_src = nullptr;       // [L, R * M]
};

// Checks rank `rank`'s low-latency dispatch: recv_count of every local expert
// and recv_src of every row exactly (within an expert by source rank, then
// source token), and every received row: bit for bit on a BF16 wire; on FP8
// the scale exactly and each value within E4M3's rounding of it (as
// tests/mp/mp_lowlat.cc: 2^-4 relative, 2^-10 of the scale absolute). Returns
// the number of (token, local expert) rows expected.
int64_t checkLowLatencyDispatch(const ProblemSpec& spec, int rank, const LLWire& wire,
                                const LLDispatchOutputs& got, MismatchLog* log);

// Checks rank `rank`'s low-latency combine output out [T, H] bf16, with the
// experts of the benchmark (y = expertRow of the received values on rank r):
// out = bf16(sum over ranks r ascending of partial_r), partial_r = the float32
// fma chain, k ascending, of weight_k * y over the token's experts on r.
void checkLowLatencyCombine(const ProblemSpec& spec, int rank, const LLWire& wire, const uint16_t* out,
                            MismatchLog* log);

}  // namespace tools
