// Random cases for `gpu_test --random` and `gpu_ll_test --random`: shapes and
// options drawn from everything the API accepts, not from a list, so that a
// combination no hand-written case names (a hidden size, a top-k, an expert
// count, a rank count, a batch per rank, a sizing option) is still compared
// with the host backend. Sizes are bounded so that the host reference stays
// quick: on one H200 with 16 cores a case took 0.15-0.25 s in all, setup included.
#pragma once

#include <algorithm>
#include <cmath>
#include <random>
#include <string>

#include "gpu/gpu_common.h"

namespace random_cases {

inline int uniformInt(std::mt19937_64& g, int lo, int hi) {  // lo..hi inclusive
  return lo + int(g() % uint64_t(hi - lo + 1));
}

inline bool chance(std::mt19937_64& g, double p) { return std::uniform_real_distribution<double>(0, 1)(g) < p; }

// The arguments of --random: N [SEED [--first I]], cases I .. I + N - 1 of
// SEED (default 1, first 0). Case i is drawn from caseSeed(i) alone, so one
// case can be drawn again by itself.
struct Run {
  int count = 0, first = 0;
  uint64_t seed = 1;
  uint64_t caseSeed(int i) const { return seed * 1000003 + uint64_t(i); }
};

// Reads argv[2..] (argv[1] is --random); false, after a message, when they
// are not of that form.
inline bool parseRun(int argc, char** argv, const char* prog, Run* run) {
  const bool form = argc == 3 || argc == 4 || (argc == 6 && std::string(argv[4]) == "--first");
  if (form) {
    run->count = atoi(argv[2]);
    if (argc >= 4) run->seed = strtoull(argv[3], nullptr, 0);
    if (argc == 6) run->first = atoi(argv[5]);
  }
  const bool ok = form && run->count >= 1 && run->first >= 0;
  if (!ok) fprintf(stderr, "%s: --random takes N [SEED [--first I]], N >= 1, I >= 0\n", prog);
  else printf("%s --random %d %llu --first %d\n", prog, run->count, (unsigned long long)run->seed, run->first);
  return ok;
}

// After a failed case: the command that draws it alone.
inline void printDrawAgain(const char* prog, const Run& run, int i) {
  printf("  (case %d of seed %llu: %s --random 1 %llu --first %d)\n", i, (unsigned long long)run.seed, prog,
         (unsigned long long)run.seed, i);
}

// 1..hi, small values as likely as large ones on a log scale (1, 2-3, 4-7, ...).
inline int logUniform(std::mt19937_64& g, int hi) {
  const double v = std::exp(std::uniform_real_distribution<double>(0, std::log(double(hi) + 1))(g));
  return std::min(hi, std::max(1, int(v)));
}

// Ranks: 1 to 4 mostly, 5 to 8 a fifth of the time (ranks beyond the
// visible GPUs share them, each with its share of the SMs).
inline int ranksOf(std::mt19937_64& g) { return chance(g, 0.8) ? uniformInt(g, 1, 4) : uniformInt(g, 5, 8); }

// A hidden size that is a multiple of `unit` elements: small (up to 256),
// medium (up to 2048) or model-sized (up to 8192), each a third of the time.
inline int hiddenOf(std::mt19937_64& g, int unit) {
  const int tops[] = {256, 2048, 8192};
  const int top = tops[g() % 3];
  return unit * uniformInt(g, 1, top / unit);
}

// Tokens per rank: equal on every rank, or drawn per rank, with ranks of
// none (a rank of none on every rank is allowed) a fifth of the time.
inline std::vector<int> tokensOf(std::mt19937_64& g, int R, int max_tokens) {
  std::vector<int> T(R);
  const bool equal = chance(g, 0.4);
  for (int r = 0; r < R; r++) {
    T[r] = equal && r > 0 ? T[0] : uniformInt(g, 0, max_tokens);
    if (!equal && chance(g, 0.2)) T[r] = 0;
  }
  return T;
}

inline const char* typeName(epDataType_t t) {
  switch (t) {
    case epBfloat16: return "bf16";
    case epFloat16: return "fp16";
    case epFloat32: return "fp32";
    case epFloat8E4M3: return "fp8";
    default: return "?";
  }
}

// High throughput: R ranks (they share the visible GPUs where there are
// fewer), every option of ht::Case that makes sense for any R.
inline ht::Case htCase(std::mt19937_64& g, int R, int index) {
  ht::Case c;
  c.R = R;
  const epDataType_t dtypes[] = {epBfloat16, epBfloat16, epFloat8E4M3, epFloat8E4M3, epFloat16, epFloat32};
  const epDataType_t ctypes[] = {epBfloat16, epBfloat16, epBfloat16, epFloat16, epFloat32};
  c.dt = dtypes[g() % 6];
  c.ct = ctypes[g() % 5];
  // Rows of both types a multiple of 16 bytes.
  const int unit = 16 / int(std::min(typeSize(c.dt), typeSize(c.ct)));
  c.H = hiddenOf(g, unit);
  c.K = chance(g, 0.7) ? uniformInt(g, 1, 9) : uniformInt(g, 10, 32);
  const int local = chance(g, 0.8) ? uniformInt(g, 1, 64) : uniformInt(g, 65, 300);
  c.E = R * local;  // may be fewer than K: the rest of each token's entries are -1
  // The reference stays small: at most ~4M elements sent per rank.
  const int max_tokens = std::max(1, std::min(logUniform(g, 4096), int(4000000 / c.H)));
  c.T = tokensOf(g, R, max_tokens);
  if (*std::max_element(c.T.begin(), c.T.end()) == 0) c.T[g() % R] = 1;  // config needs max_tokens >= 1
  const int aligns[] = {0, 0, 0, 1, 2, 4, 16, 128};
  c.align = aligns[g() % 8];
  const double negs[] = {0, 0, 0.1, 0.5};
  c.neg = negs[g() % 4];
  c.idx32 = chance(g, 0.3);
  c.weights = chance(g, 0.8);
  c.bias = chance(g, 0.4);
  c.transposed_scales = c.dt == epFloat8E4M3 && chance(g, 0.4);
  c.num_sms = chance(g, 0.5) ? 0 : uniformInt(g, 1, 24);
  // Calls with fewer columns than config.max_topk (K), the same on every
  // rank: a sender may not pass more columns than its receivers.
  if (chance(g, 0.25)) c.Kr.assign(R, uniformInt(g, 1, c.K));
  c.repeats = c.kOf(0) >= 2 && chance(g, 0.15);
  if (chance(g, 0.1)) c.only_rank = int(g() % R);
  c.null_topk_if_empty = chance(g, 0.3);
  if (chance(g, 0.15)) c.cached_without_ids = int(g() % R);
  c.row_pad = chance(g, 0.2) ? 16 * uniformInt(g, 1, 4) : 0;
  c.fewer_outputs = chance(g, 0.2);
  c.deterministic = chance(g, 0.3);
  c.name = "random " + std::to_string(index) + " EP" + std::to_string(R) + " " + typeName(c.dt) + "/" +
           typeName(c.ct) + " h" + std::to_string(c.H) + " k" + std::to_string(c.K) +
           (c.Kr.empty() ? "" : " num_topk" + std::to_string(c.kOf(0))) + " e" +
           std::to_string(c.E) + " align" + std::to_string(c.align) + " sms" + std::to_string(c.num_sms) +
           (c.idx32 ? " idx32" : "") + (c.weights ? "" : " no-weights") + (c.bias ? " bias" : "") +
           (c.transposed_scales ? " transposed" : "") + (c.repeats ? " repeats" : "") +
           (c.only_rank >= 0 ? " all-to-" + std::to_string(c.only_rank) : "") +
           (c.null_topk_if_empty ? " null-ids-if-empty" : "") +
           (c.cached_without_ids >= 0 ? " cached-without-ids-" + std::to_string(c.cached_without_ids) : "") +
           (c.row_pad ? " pad" + std::to_string(c.row_pad) : "") + (c.fewer_outputs ? " fewer-outputs" : "") +
           (c.deterministic ? " deterministic" : "");
  return c;
}

// Low latency: a shape for R ranks. The expert-major output and y hold
// experts x max_tokens x hidden elements per rank, bounded here.
inline ll::Shape llShape(std::mt19937_64& g, int R) {
  ll::Shape s;
  s.fp8 = chance(g, 0.5);
  s.pow2 = s.fp8 && chance(g, 0.5);
  s.split = chance(g, 0.5);
  s.hidden = hiddenOf(g, s.fp8 ? 16 : 8);  // wire rows a multiple of 16 bytes
  s.topk = chance(g, 0.7) ? uniformInt(g, 1, 9) : uniformInt(g, 10, 32);
  const int local = chance(g, 0.8) ? uniformInt(g, 1, 48) : uniformInt(g, 49, 160);
  s.experts = R * local;
  // Decode batches: a third of the shapes at most 16 tokens per rank (the
  // flagged records of small calls), the rest up to 1024.
  s.max_tokens = chance(g, 0.35) ? uniformInt(g, 1, 16) : logUniform(g, 1024);
  while (s.max_tokens > 1 && double(s.experts) * s.max_tokens * s.hidden > 48e6) s.max_tokens /= 2;
  s.tokens = tokensOf(g, R, s.max_tokens);
  // Calls with fewer columns than config.max_topk: every rank alike, or a
  // num_topk per rank (ranks may differ in low-latency mode).
  if (chance(g, 0.3)) {
    s.config_topk = uniformInt(g, s.topk, 32);
    if (chance(g, 0.5)) {
      s.topk_of.resize(R);
      for (int r = 0; r < R; r++) s.topk_of[r] = uniformInt(g, 1, s.config_topk);
    }
  }
  s.idx32 = chance(g, 0.3);
  s.no_weights = chance(g, 0.15);
  s.no_src = chance(g, 0.15);
  s.repeats = s.experts >= 2 && s.topk >= 2 && chance(g, 0.15);
  return s;
}

}  // namespace random_cases
