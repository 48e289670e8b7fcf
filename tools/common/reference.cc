#include "reference.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>

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

}  // namespace tools
