#include "reference.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <utility>

#include "numeric.h"

namespace tools {

namespace {

// splitmix64's finaliser: a good 64-bit mix, cheap enough per element.
inline uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// One key per (seed, rank, purpose): the streams never overlap.
uint64_t streamKey(uint64_t seed, int rank, uint64_t purpose) {
  return mix64(mix64(mix64(seed) ^ uint64_t(uint32_t(rank))) ^ purpose);
}

// The random bits of cell (a, b) of a stream: counter-based, any order.
inline uint64_t cellBits(uint64_t key, uint64_t a, uint64_t b) { return mix64(key ^ mix64((a << 32) ^ b)); }

enum Purpose : uint64_t { kTopk = 1, kWeight = 2, kX = 0x100, kScale = 0x200 };

// A value whose bits fit every 16- and 32-bit float type exactly: sign,
// exponent in [-6, 0], random mantissa. Never zero, never inf or NaN.
uint32_t randomElement(uint64_t r, epDataType_t type) {
  const uint32_t sign = uint32_t(r & 1u);
  const int exp = -int((r >> 1) % 7u);
  const uint32_t man = uint32_t(r >> 8);
  switch (type) {
    case epBfloat16:
      return sign << 15 | uint32_t(127 + exp) << 7 | (man & 0x7fu);
    case epFloat16:
      return sign << 15 | uint32_t(15 + exp) << 10 | (man & 0x3ffu);
    case epFloat8E4M3: {
      uint32_t b = uint32_t(r & 0xffu);
      return (b & 0x7fu) == 0x7fu ? b ^ 1u : b;  // S.1111.111 is NaN: use 448 instead
    }
    default:
      return sign << 31 | uint32_t(127 + exp) << 23 | (man & 0x7fffffu);
  }
}

std::string hexValue(uint32_t bits, epDataType_t type) {
  char buf[64];
  int digits = int(elementBytes(type) * 2);
  snprintf(buf, sizeof(buf), "0x%0*x (%.9g)", digits, bits, double(bitsToValue(bits, type)));
  return buf;
}

std::string floatText(float f) {
  char buf[48];
  snprintf(buf, sizeof(buf), "%.9g", double(f));
  return buf;
}

bool sameBits(float a, float b) { return floatToBits(a) == floatToBits(b); }

// Element-wise comparison of one row, entered only when memcmp found a difference.
void compareRow(const void* want, const void* got, int hidden, epDataType_t type, const char* what,
                int64_t row, MismatchLog* log) {
  for (int j = 0; j < hidden; j++) {
    uint32_t w = loadBits(want, type, size_t(j)), g = loadBits(got, type, size_t(j));
    if (w != g) log->add(what, row, j, hexValue(w, type), hexValue(g, type));
  }
}

}  // namespace

size_t ProblemSpec::rowBytes() const { return size_t(hidden) * elementBytes(type); }

RankInputs::RankInputs(const ProblemSpec& spec, int rank, unsigned generation) : spec_(spec), rank_(rank) {
  // Routing and weights do not depend on the generation: a cached
  // re-dispatch sends new rows along the same routes.
  topk_key_ = streamKey(spec.seed, rank, kTopk);
  weight_key_ = streamKey(spec.seed, rank, kWeight);
  x_key_ = streamKey(spec.seed, rank, kX + generation);
  scale_key_ = streamKey(spec.seed, rank, kScale + generation);
}

void RankInputs::topk(int t, int64_t* ids) const {
  const int K = spec_.topk, E = spec_.experts;
  uint64_t state = cellBits(topk_key_, uint64_t(t), 0);
  auto next = [&state] { return mix64(state++); };
  for (int k = 0; k < K; k++) {
    bool fresh;
    do {  // K <= E, so this ends; K distinct experts per token as a router picks them
      ids[k] = int64_t(next() % uint64_t(E));
      fresh = true;
      for (int q = 0; q < k; q++) fresh = fresh && ids[q] != ids[k];
    } while (!fresh);
  }
  // About 5% of tokens have some slots unused (-1), a few of them all K.
  if (next() % 100u < 5u) {
    int holes = 1 + int(next() % uint64_t(K));
    for (int i = 0; i < holes; i++) ids[next() % uint64_t(K)] = -1;
  }
}

void RankInputs::weights(int t, float* w) const {
  for (int k = 0; k < spec_.topk; k++) {
    uint64_t r = cellBits(weight_key_, uint64_t(t), uint64_t(k));
    w[k] = float((r >> 41) + 1) * (1.0f / 8388608.0f);  // (0, 1], exact in float
  }
}

void RankInputs::row(int t, void* out) const {
  for (int j = 0; j < spec_.hidden; j++)
    storeBits(out, spec_.type, size_t(j),
              randomElement(cellBits(x_key_, uint64_t(t), uint64_t(j)), spec_.type));
}

void RankInputs::scales(int t, float* out) const {
  for (int b = 0; b < spec_.scaleBlocks(); b++) {
    uint64_t r = cellBits(scale_key_, uint64_t(t), uint64_t(b));
    // A power of two in [1/4, 4] times 1 + k/256: exact, and far from 1.
    out[b] = std::ldexp(1.0f + float((r >> 8) & 0xffu) / 256.0f, int(r % 5u) - 2);
  }
}

void RankInputs::rowValues(int t, float* out) const {
  std::vector<uint8_t> bits(spec_.rowBytes());
  std::vector<float> sc(static_cast<size_t>(spec_.scaleBlocks()));
  row(t, bits.data());
  if (spec_.type == epFloat8E4M3) scales(t, sc.data());
  rowToValues(spec_, bits.data(), sc.data(), out);
}

void RankInputs::fill(void* x, float* x_scales, int64_t* topk_idx, float* topk_weights) const {
  const int T = numTokens();
  const size_t rb = spec_.rowBytes();
  const int nb = spec_.scaleBlocks(), K = spec_.topk;
  for (int t = 0; t < T; t++) {
    if (x) row(t, static_cast<uint8_t*>(x) + size_t(t) * rb);
    if (x_scales && spec_.type == epFloat8E4M3) scales(t, x_scales + size_t(t) * nb);
    if (topk_idx) topk(t, topk_idx + size_t(t) * K);
    if (topk_weights) weights(t, topk_weights + size_t(t) * K);
  }
}

void rowToValues(const ProblemSpec& spec, const void* row, const float* scales, float* out) {
  const bool fp8 = spec.type == epFloat8E4M3;
  for (int j = 0; j < spec.hidden; j++) {
    float v = bitsToValue(loadBits(row, spec.type, size_t(j)), spec.type);
    out[j] = fp8 ? v * scales[j / 128] : v;
  }
}

float expertFactor(int rank) { return 1.0f + 0.25f * float(rank); }

void expertRow(const float* values, int hidden, int rank, uint16_t* y) {
  const float f = expertFactor(rank);
  for (int j = 0; j < hidden; j++) y[j] = floatToBf16(values[j] * f);
}

void MismatchLog::add(const char* what, int64_t row, int64_t col, const std::string& expected,
                      const std::string& got) {
  if (count_++ > 0) return;
  char where[160];
  if (row >= 0 && col >= 0)
    snprintf(where, sizeof(where), "rank %d %s row %" PRId64 " element %" PRId64, rank_, what, row, col);
  else if (row >= 0)
    snprintf(where, sizeof(where), "rank %d %s row %" PRId64, rank_, what, row);
  else
    snprintf(where, sizeof(where), "rank %d %s", rank_, what);
  first_ = std::string(where) + ": expected " + expected + ", got " + got;
}

int64_t checkDispatch(const ProblemSpec& spec, int me, unsigned generation, const DispatchOutputs& got,
                      MismatchLog* log) {
  const int K = spec.topk, H = spec.hidden, nb = spec.scaleBlocks(), L = spec.localExperts();
  const int64_t first_expert = int64_t(me) * L;
  const size_t rb = spec.rowBytes();
  const bool fp8 = spec.type == epFloat8E4M3;
  std::vector<uint8_t> want_row(rb);
  std::vector<float> want_scales(static_cast<size_t>(nb));
  std::vector<int64_t> ids(static_cast<size_t>(K));
  std::vector<float> w(static_cast<size_t>(K));
  std::vector<int> per_expert(static_cast<size_t>(L), 0);
  // Rows the library wrote that we can compare: within both its count and the buffers.
  const int64_t readable = std::min(got.num_recv, got.capacity);

  int64_t row = 0;
  for (int s = 0; s < spec.nranks; s++) {
    RankInputs src(spec, s, generation);
    for (int t = 0; t < src.numTokens(); t++) {
      src.topk(t, ids.data());
      bool to_me = false;
      for (int k = 0; k < K; k++) to_me = to_me || (ids[k] >= 0 && spec.ownerOf(ids[k]) == me);
      if (!to_me) continue;
      const int64_t r = row++;
      for (int k = 0; k < K; k++)
        if (ids[k] >= 0 && spec.ownerOf(ids[k]) == me) per_expert[size_t(ids[k] - first_expert)]++;
      if (r >= readable) continue;  // the count check below reports it

      src.row(t, want_row.data());
      const uint8_t* got_row = static_cast<const uint8_t*>(got.recv_x) + size_t(r) * rb;
      if (memcmp(want_row.data(), got_row, rb) != 0)
        compareRow(want_row.data(), got_row, H, spec.type, "recv_x", r, log);
      if (fp8 && got.recv_scales) {
        src.scales(t, want_scales.data());
        for (int b = 0; b < nb; b++) {
          float g = got.recv_scales[size_t(r) * nb + b];
          if (!sameBits(g, want_scales[b]))
            log->add("recv_scales", r, b, floatText(want_scales[b]), floatText(g));
        }
      }
      src.weights(t, w.data());
      for (int k = 0; k < K; k++) {
        const bool mine = ids[k] >= 0 && spec.ownerOf(ids[k]) == me;
        if (got.recv_topk_idx) {
          int64_t want = mine ? ids[k] - first_expert : -1;
          int64_t g = got.recv_topk_idx[size_t(r) * K + k];
          if (g != want) log->add("recv_topk_idx", r, k, std::to_string(want), std::to_string(g));
        }
        if (got.recv_topk_weights) {
          float want = mine ? w[k] : 0.0f;
          float g = got.recv_topk_weights[size_t(r) * K + k];
          if (!sameBits(g, want)) log->add("recv_topk_weights", r, k, floatText(want), floatText(g));
        }
      }
    }
  }
  if (got.num_recv != row) log->add("num_recv", -1, -1, std::to_string(row), std::to_string(got.num_recv));
  if (got.unused_rows_marked && got.recv_topk_idx) {
    for (int64_t r = row; r < got.capacity; r++)
      for (int k = 0; k < K; k++) {
        int64_t g = got.recv_topk_idx[size_t(r) * K + k];
        if (g != -1) log->add("recv_topk_idx (unused row)", r, k, "-1", std::to_string(g));
      }
  }
  if (got.recv_tokens_per_expert) {
    for (int e = 0; e < L; e++)
      if (got.recv_tokens_per_expert[e] != per_expert[size_t(e)])
        log->add("recv_tokens_per_expert", e, -1, std::to_string(per_expert[size_t(e)]),
                 std::to_string(got.recv_tokens_per_expert[e]));
  }
  return row;
}

void checkCombine(const ProblemSpec& spec, int me, const uint16_t* out, const float* out_topk_weights,
                  MismatchLog* log) {
  const int K = spec.topk, H = spec.hidden, R = spec.nranks;
  RankInputs mine(spec, me, 0);
  std::vector<int64_t> ids(static_cast<size_t>(K));
  std::vector<float> w(static_cast<size_t>(K)), values(static_cast<size_t>(H)), acc(static_cast<size_t>(H));
  std::vector<uint16_t> y(static_cast<size_t>(H));
  std::vector<char> received(static_cast<size_t>(R));
  for (int t = 0; t < mine.numTokens(); t++) {
    mine.topk(t, ids.data());
    std::fill(received.begin(), received.end(), 0);
    for (int k = 0; k < K; k++)
      if (ids[k] >= 0) received[size_t(spec.ownerOf(ids[k]))] = 1;
    mine.rowValues(t, values.data());
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int r = 0; r < R; r++) {  // ascending rank: the deterministic order
      if (!received[size_t(r)]) continue;
      expertRow(values.data(), H, r, y.data());
      for (int j = 0; j < H; j++) acc[size_t(j)] += bf16ToFloat(y[size_t(j)]);
    }
    const uint16_t* got = out + size_t(t) * H;
    for (int j = 0; j < H; j++) {
      uint16_t want = floatToBf16(acc[size_t(j)]);
      if (got[j] != want)
        log->add("combine out", t, j, hexValue(want, epBfloat16), hexValue(got[j], epBfloat16));
    }
    if (out_topk_weights == nullptr) continue;
    mine.weights(t, w.data());
    for (int k = 0; k < K; k++) {
      float want = ids[k] >= 0 ? w[k] : 0.0f;
      float g = out_topk_weights[size_t(t) * K + k];
      if (!sameBits(g, want)) log->add("combine out_topk_weights", t, k, floatText(want), floatText(g));
    }
  }
}

// ---- Low-latency mode ---------------------------------------------------------

float llBlockScale(float amax, bool pow2_scales) {
  const float scale = std::fmax(amax, 1e-4f) / 448.0f;
  if (!pow2_scales) return scale;
  int exp = 0;
  const float m = std::frexp(scale, &exp);  // scale = m * 2^exp, m in [0.5, 1)
  return m == 0.5f ? scale : std::ldexp(1.0f, exp);
}

namespace {

// Largest magnitude of the BF16 values x[lo, hi).
float blockAmax(const uint16_t* x, int lo, int hi) {
  float amax = 0.0f;
  for (int j = lo; j < hi; j++) amax = std::fmax(amax, std::fabs(bf16ToFloat(x[j])));
  return amax;
}

// Checks one FP8 row of local expert e's slot against the BF16 row x it came from.
void checkFp8Row(const ProblemSpec& spec, const LLWire& wire, const uint16_t* x, const uint8_t* row,
                 const float* scales, size_t scale_stride, const std::string& expert, int64_t slot,
                 MismatchLog* log) {
  const int H = spec.hidden;
  for (int b = 0; b < spec.scaleBlocks(); b++) {
    const int lo = b * 128, hi = std::min(H, lo + 128);
    const float scale = llBlockScale(blockAmax(x, lo, hi), wire.pow2_scales);
    const float got_scale = scales[size_t(b) * scale_stride];
    if (!sameBits(got_scale, scale))
      log->add(("recv_scales" + expert).c_str(), slot, b, floatText(scale), floatText(got_scale));
    for (int j = lo; j < hi; j++) {
      // Within E4M3's rounding: 2^-4 relative, 2^-10 of the scale absolute.
      const float want = bf16ToFloat(x[j]), back = fp8e4m3ToFloat(row[j]) * scale;
      const float tol = std::fmax(std::fabs(want) / 16.0f, scale / 1024.0f) * 1.001f;
      if (!(std::fabs(back - want) <= tol))
        log->add(("recv_x" + expert).c_str(), slot, j, floatText(want) + " +- " + floatText(tol),
                 hexValue(row[j], epFloat8E4M3) + " * scale = " + floatText(back));
    }
  }
}

}  // namespace

void llWireValues(const ProblemSpec& spec, const LLWire& wire, const uint16_t* x, float* out) {
  ProblemSpec on_wire = spec;
  on_wire.type = wire.type;
  if (wire.type != epFloat8E4M3) {
    rowToValues(on_wire, x, nullptr, out);
    return;
  }
  const int H = spec.hidden;
  std::vector<uint8_t> q(static_cast<size_t>(H));
  std::vector<float> scales(static_cast<size_t>(spec.scaleBlocks()));
  for (int b = 0; b < spec.scaleBlocks(); b++) {
    const int lo = b * 128, hi = std::min(H, lo + 128);
    scales[size_t(b)] = llBlockScale(blockAmax(x, lo, hi), wire.pow2_scales);
    const float inverse = 1.0f / scales[size_t(b)];
    for (int j = lo; j < hi; j++) q[size_t(j)] = floatToFp8e4m3(bf16ToFloat(x[j]) * inverse);
  }
  rowToValues(on_wire, q.data(), scales.data(), out);
}

int64_t checkLowLatencyDispatch(const ProblemSpec& spec, int me, const LLWire& wire,
                                const LLDispatchOutputs& got, MismatchLog* log) {
  const int K = spec.topk, H = spec.hidden, L = spec.localExperts(), R = spec.nranks, M = spec.tokens;
  const int64_t cap = int64_t(R) * M, first_expert = int64_t(me) * L;
  const bool fp8 = wire.type == epFloat8E4M3;
  const size_t rb = size_t(H) * elementBytes(wire.type);

  // The rows each local expert must receive, in order: (source rank, source token).
  std::vector<std::vector<std::pair<int, int>>> want(static_cast<size_t>(L));
  std::vector<RankInputs> sources;
  std::vector<int64_t> ids(static_cast<size_t>(K));
  for (int s = 0; s < R; s++) {
    sources.emplace_back(spec, s);
    for (int t = 0; t < sources.back().numTokens(); t++) {
      sources.back().topk(t, ids.data());
      for (int k = 0; k < K; k++)
        if (ids[k] >= 0 && spec.ownerOf(ids[k]) == me) want[size_t(ids[k] - first_expert)].push_back({s, t});
    }
  }

  std::vector<uint16_t> x(static_cast<size_t>(H));
  int64_t rows = 0;
  for (int e = 0; e < L; e++) {
    const std::string expert = " of local expert " + std::to_string(e);
    const int64_t n_want = int64_t(want[size_t(e)].size()), n_got = got.recv_count[e];
    rows += n_want;
    if (n_got != n_want)
      log->add(("recv_count" + expert).c_str(), -1, -1, std::to_string(n_want), std::to_string(n_got));
    // Rows the library wrote that we can compare: within both counts (the count check reports the rest).
    const int64_t n = std::min(n_want, std::max<int64_t>(n_got, 0));
    for (int64_t slot = 0; slot < n; slot++) {
      const int s = want[size_t(e)][size_t(slot)].first, t = want[size_t(e)][size_t(slot)].second;
      const size_t at = size_t(e) * size_t(cap) + size_t(slot);
      if (got.recv_src != nullptr && got.recv_src[at] != s * M + t)
        log->add(
            ("recv_src" + expert).c_str(), slot, -1,
            std::to_string(s * M + t) + " (rank " + std::to_string(s) + " token " + std::to_string(t) + ")",
            std::to_string(got.recv_src[at]));
      sources[size_t(s)].row(t, x.data());
      const uint8_t* row = static_cast<const uint8_t*>(got.recv_x) + at * rb;
      if (fp8)
        checkFp8Row(spec, wire, x.data(), row, got.recv_scales + size_t(e) * spec.scaleBlocks() * cap + slot,
                    size_t(cap), expert, slot, log);
      else if (memcmp(x.data(), row, rb) != 0)
        compareRow(x.data(), row, H, epBfloat16, ("recv_x" + expert).c_str(), slot, log);
    }
  }
  return rows;
}

void checkLowLatencyCombine(const ProblemSpec& spec, int me, const LLWire& wire, const uint16_t* out,
                            MismatchLog* log) {
  const int K = spec.topk, H = spec.hidden, R = spec.nranks;
  RankInputs mine(spec, me);
  std::vector<int64_t> ids(static_cast<size_t>(K));
  std::vector<float> w(static_cast<size_t>(K)), values(static_cast<size_t>(H)), acc(static_cast<size_t>(H)),
      partial(static_cast<size_t>(H));
  std::vector<uint16_t> x(static_cast<size_t>(H)), y(static_cast<size_t>(H));
  for (int t = 0; t < mine.numTokens(); t++) {
    mine.topk(t, ids.data());
    mine.weights(t, w.data());
    mine.row(t, x.data());
    llWireValues(spec, wire, x.data(), values.data());
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int r = 0; r < R; r++) {  // ascending rank, as the home rank sums the partial rows
      bool any = false;
      for (int k = 0; k < K; k++) {  // k ascending, as rank r forms its partial row
        if (ids[k] < 0 || spec.ownerOf(ids[k]) != r) continue;
        if (!any) {
          std::fill(partial.begin(), partial.end(), 0.0f);
          expertRow(values.data(), H, r, y.data());  // every expert of rank r returns the same row
          any = true;
        }
        for (int j = 0; j < H; j++)
          partial[size_t(j)] = std::fma(w[k], bf16ToFloat(y[size_t(j)]), partial[size_t(j)]);
      }
      if (any)
        for (int j = 0; j < H; j++) acc[size_t(j)] += partial[size_t(j)];
    }
    const uint16_t* got = out + size_t(t) * H;
    for (int j = 0; j < H; j++) {
      const uint16_t want = floatToBf16(acc[size_t(j)]);
      if (got[j] != want)
        log->add("combine out", t, j, hexValue(want, epBfloat16), hexValue(got[j], epBfloat16));
    }
  }
}

}  // namespace tools
