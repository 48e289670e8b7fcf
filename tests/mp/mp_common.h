// Shared pieces of the multi-process tests: deterministic inputs that every
// rank can regenerate for every other rank, an independent reference of what
// dispatch and combine must produce, and a tiny pass/fail tally.
//
// The reference is written from docs/SEMANTICS.md alone (no library internals): a token
// goes once to each rank owning one of its experts; rows arrive by source rank
// then source token; combine sums in float32 in ascending rank order, then bias.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "moeep.h"

namespace mp {

// splitmix64: a fast, well-mixed generator; one stream per (seed, rank, purpose).
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed) {}
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  int below(int n) { return int(next() % uint64_t(n)); }
  float uniform() { return float(next() >> 40) / float(1u << 24); }  // [0, 1)
};

inline uint16_t toBf16(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  return uint16_t((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}
inline float fromBf16(uint16_t h) {
  uint32_t b = uint32_t(h) << 16;
  float f;
  memcpy(&f, &b, 4);
  return f;
}

struct Shape {
  int nranks, hidden, topk, experts;
  int tokens[16];  // per rank
  epDataType_t type;
  int alignment;
  bool minus_one;  // some -1 entries
  uint64_t seed;
};

// Bytes per element of the dispatch type.
inline size_t elemBytes(epDataType_t t) { return t == epFloat8E4M3 ? 1 : t == epFloat32 ? 4 : 2; }

// One rank's inputs, regenerated identically on every rank.
struct RankInput {
  int tokens = 0;
  std::vector<uint8_t> x;         // [T, H * elem]
  std::vector<float> scales;      // [T, ceil(H/128)] (FP8)
  std::vector<int64_t> topk;      // [T, K]
  std::vector<float> weights;     // [T, K]
};

inline RankInput makeInput(const Shape& s, int rank) {
  RankInput in;
  in.tokens = s.tokens[rank];
  Rng rng(s.seed * 1000003ull + uint64_t(rank) * 7919ull + 1);
  const size_t row = size_t(s.hidden) * elemBytes(s.type);
  in.x.resize(size_t(in.tokens) * row);
  for (size_t i = 0; i + 1 < in.x.size(); i += 2) {
    // Random finite values in every type: draw a float and store it in the type.
    if (s.type == epBfloat16) {
      uint16_t h = toBf16(rng.uniform() * 4.0f - 2.0f);
      memcpy(&in.x[i], &h, 2);
    } else if (s.type == epFloat16) {
      uint16_t h = uint16_t(rng.next() & 0xfbffu);  // exponent below 31: finite
      memcpy(&in.x[i], &h, 2);
    } else {  // fp32 and fp8 rows are carried as bytes: any pattern will do
      in.x[i] = uint8_t(rng.next());
      in.x[i + 1] = uint8_t(rng.next());
    }
  }
  const int nblocks = (s.hidden + 127) / 128;
  if (s.type == epFloat8E4M3) {
    in.scales.resize(size_t(in.tokens) * nblocks);
    for (float& f : in.scales) f = 0.5f + rng.uniform();
  }
  in.topk.assign(size_t(in.tokens) * s.topk, -1);
  in.weights.assign(size_t(in.tokens) * s.topk, 0.0f);
  for (int t = 0; t < in.tokens; t++) {
    for (int k = 0; k < s.topk; k++) {
      int64_t e;
      bool dup;
      do {  // distinct experts per token
        e = rng.below(s.experts);
        dup = false;
        for (int j = 0; j < k; j++) dup |= in.topk[size_t(t) * s.topk + j] == e;
      } while (dup);
      in.topk[size_t(t) * s.topk + k] = e;
      in.weights[size_t(t) * s.topk + k] = rng.uniform();
    }
    if (s.minus_one && rng.below(10) == 0) in.topk[size_t(t) * s.topk + rng.below(s.topk)] = -1;
    if (s.minus_one && rng.below(40) == 0)  // a token that goes nowhere
      for (int k = 0; k < s.topk; k++) in.topk[size_t(t) * s.topk + k] = -1;
  }
  return in;
}

// Which rank owns expert e with contiguous placement.
inline int ownerOf(const Shape& s, int64_t e) { return int(e / (s.experts / s.nranks)); }

inline bool goesTo(const Shape& s, const RankInput& in, int t, int rank) {
  for (int k = 0; k < s.topk; k++) {
    int64_t e = in.topk[size_t(t) * s.topk + k];
    if (e >= 0 && ownerOf(s, e) == rank) return true;
  }
  return false;
}

// The (source rank, source token) of every row `rank` must receive, in order.
struct RowSource {
  int src, token;
};
inline std::vector<RowSource> expectedRows(const Shape& s, const std::vector<RankInput>& all, int rank) {
  std::vector<RowSource> rows;
  for (int src = 0; src < s.nranks; src++)
    for (int t = 0; t < all[src].tokens; t++)
      if (goesTo(s, all[src], t, rank)) rows.push_back({src, t});
  return rows;
}

// The value rank r puts in its combine input for (source, token, element j):
// a pseudo-random bf16 so that sums have rounding to get right.
inline float combineValue(uint64_t seed, int r, int src, int token, int j) {
  Rng rng(seed ^ (uint64_t(r) << 48) ^ (uint64_t(src) << 40) ^ (uint64_t(token) << 16) ^ uint64_t(j));
  return fromBf16(toBf16(rng.uniform() * 2.0f - 1.0f));
}
inline float biasValue(uint64_t seed, int rank, int token, int j) {
  return fromBf16(toBf16(combineValue(seed + 17, rank, rank, token, j) * 0.5f));
}

struct Tally {
  int passed = 0, failed = 0;
  void check(bool ok, const char* what, int rank) {
    if (ok) {
      passed++;
    } else {
      failed++;
      fprintf(stderr, "FAIL rank %d: %s\n", rank, what);
    }
  }
};

}  // namespace mp
