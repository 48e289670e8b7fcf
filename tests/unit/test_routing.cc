// Routing math (src/routing.h) on hand-made cases with known answers and on
// random cases checked against a brute-force recomputation written here; and
// the float <-> bf16 / fp16 conversions of src/host/convert.h.
#include <cmath>
#include <vector>

#include "common.h"
#include "host/convert.h"
#include "routing.h"

namespace {

using ep::Placement;
using ep::Routing;

Placement placement(int num_experts, int nranks) {
  Placement p;
  p.num_experts = num_experts;
  p.nranks = nranks;
  p.experts_per_rank = num_experts / nranks;
  return p;
}

// The hand-made case: E = 8 experts on R = 4 ranks (2 each), nodes {0,1} {2,3}.
//   token 0: experts 0, 1, 5  -> rank 0 (twice: counts once), rank 2
//   token 1: -1, 7, -1        -> rank 3
//   token 2: -1, -1, -1       -> nowhere
//   token 3: 6, 2, -1         -> ranks 3, 1
const int kT = 4, kK = 3;
const int64_t kTopk64[kT * kK] = {0, 1, 5, -1, 7, -1, -1, -1, -1, 6, 2, -1};
const int kNodeOfRank[4] = {0, 0, 1, 1};

std::vector<int32_t> to32(const int64_t* v, size_t n) { return std::vector<int32_t>(v, v + n); }

void checkHandLayout(const void* idx, epDataType_t type) {
  const Placement pl = placement(8, 4);
  int per_rank[4], per_node[2], per_expert[8];
  uint8_t in_rank[kT * 4];
  memset(per_rank, 0x7f, sizeof(per_rank));  // garbage: every entry must be written
  memset(per_node, 0x7f, sizeof(per_node));
  memset(per_expert, 0x7f, sizeof(per_expert));
  memset(in_rank, 0x7f, sizeof(in_rank));
  ep::computeLayout(pl, idx, type, kT, kK, kNodeOfRank, 2, per_rank, per_node, per_expert, in_rank);
  const int want_rank[4] = {1, 1, 1, 2};
  const int want_node[2] = {2, 3};  // t0: nodes 0,1; t1: node 1; t3: nodes 1,0
  const int want_expert[8] = {1, 1, 1, 0, 0, 1, 1, 1};
  const uint8_t want_in[kT * 4] = {1, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 1};
  assert_memory_equal(per_rank, want_rank, sizeof(want_rank));
  assert_memory_equal(per_node, want_node, sizeof(want_node));
  assert_memory_equal(per_expert, want_expert, sizeof(want_expert));
  assert_memory_equal(in_rank, want_in, sizeof(want_in));
}

// ---- Hand-made cases ---------------------------------------------------------------------

void layout_hand_case_int64(void**) { checkHandLayout(kTopk64, epInt64); }

void layout_hand_case_int32(void**) {
  std::vector<int32_t> idx = to32(kTopk64, kT * kK);
  checkHandLayout(idx.data(), epInt32);
}

void layout_token_with_several_experts_of_one_rank_counts_once(void**) {
  const Placement pl = placement(8, 2);  // experts 0..3 on rank 0
  const int64_t idx[4] = {0, 1, 2, 3};
  int per_rank[2], per_expert[8];
  uint8_t in_rank[2];
  ep::computeLayout(pl, idx, epInt64, 1, 4, nullptr, 0, per_rank, nullptr, per_expert, in_rank);
  assert_int_equal(per_rank[0], 1);
  assert_int_equal(per_rank[1], 0);
  assert_int_equal(in_rank[0], 1);
  assert_int_equal(in_rank[1], 0);
  for (int e = 0; e < 4; e++) assert_int_equal(per_expert[e], 1);
  for (int e = 4; e < 8; e++) assert_int_equal(per_expert[e], 0);
}

void layout_zero_tokens_zeroes_outputs(void**) {
  const Placement pl = placement(8, 4);
  int per_rank[4], per_node[2], per_expert[8];
  memset(per_rank, 0x55, sizeof(per_rank));
  memset(per_node, 0x55, sizeof(per_node));
  memset(per_expert, 0x55, sizeof(per_expert));
  ep::computeLayout(pl, nullptr, epInt64, 0, kK, kNodeOfRank, 2, per_rank, per_node, per_expert,
                    nullptr);
  for (int v : per_rank) assert_int_equal(v, 0);
  for (int v : per_node) assert_int_equal(v, 0);
  for (int v : per_expert) assert_int_equal(v, 0);
}

void layout_outputs_are_optional(void**) {
  const Placement pl = placement(8, 4);
  int per_expert[8];
  ep::computeLayout(pl, kTopk64, epInt64, kT, kK, nullptr, 0, nullptr, nullptr, per_expert, nullptr);
  assert_int_equal(per_expert[7], 1);
  assert_int_equal(per_expert[3], 0);
  int per_rank[4];
  ep::computeLayout(pl, kTopk64, epInt64, kT, kK, kNodeOfRank, 2, per_rank, nullptr, nullptr, nullptr);
  assert_int_equal(per_rank[3], 2);
}

void send_side_hand_case(void**) {
  for (epDataType_t type : {epInt64, epInt32}) {
    std::vector<int32_t> idx32 = to32(kTopk64, kT * kK);
    const void* idx = type == epInt64 ? static_cast<const void*>(kTopk64) : idx32.data();
    Routing r;
    ep::buildSendSide(placement(8, 4), idx, type, kT, kK, &r);
    assert_int_equal(r.nranks, 4);
    assert_int_equal(r.num_tokens, kT);
    assert_int_equal(r.num_topk, kK);
    assert_true((r.send_offset == std::vector<int>{0, 1, 2, 3, 5}));
    // rank 0: t0; rank 1: t3; rank 2: t0; rank 3: t1, t3 (ascending token index)
    assert_true((r.send_tokens == std::vector<int>{0, 3, 0, 1, 3}));
    assert_int_equal(r.sendCount(3), 2);
    assert_int_equal(r.sendCount(1), 1);
  }
}

void send_side_zero_tokens(void**) {
  Routing r;
  ep::buildSendSide(placement(8, 4), nullptr, epInt64, 0, 2, &r);
  assert_true((r.send_offset == std::vector<int>{0, 0, 0, 0, 0}));
  assert_true(r.send_tokens.empty());
  for (int d = 0; d < 4; d++) assert_int_equal(r.sendCount(d), 0);
}

void recv_side_offsets_and_total(void**) {
  Routing r;
  ep::buildRecvSide({3, 0, 2, 5}, &r);
  assert_true((r.recv_count == std::vector<int>{3, 0, 2, 5}));
  assert_true((r.recv_offset == std::vector<int64_t>{0, 3, 3, 5, 10}));
  assert_int_equal(r.num_recv, 10);
  ep::buildRecvSide({0, 0}, &r);  // rebuilt from scratch
  assert_true((r.recv_offset == std::vector<int64_t>{0, 0, 0}));
  assert_int_equal(r.num_recv, 0);
}

void localize_topk_hand_case(void**) {
  const Placement pl = placement(8, 4);
  const float w[kT * kK] = {0.5f, 0.25f, 0.125f, 1, 2, 3, 4, 5, 6, 0.75f, 0.0625f, 9};
  int64_t idx[kK];
  float ow[kK];
  ep::localizeTopk(pl, 2, kTopk64, epInt64, w, 0, kK, idx, ow);  // token 0 on rank 2: expert 5 -> 1
  assert_true(idx[0] == -1 && idx[1] == -1 && idx[2] == 1);
  assert_true(ow[0] == 0.0f && ow[1] == 0.0f && ow[2] == 0.125f);
  ep::localizeTopk(pl, 0, kTopk64, epInt64, w, 0, kK, idx, ow);  // token 0 on rank 0: 0, 1
  assert_true(idx[0] == 0 && idx[1] == 1 && idx[2] == -1);
  assert_true(ow[0] == 0.5f && ow[1] == 0.25f && ow[2] == 0.0f);
  std::vector<int32_t> idx32 = to32(kTopk64, kT * kK);
  ep::localizeTopk(pl, 3, idx32.data(), epInt32, w, 3, kK, idx, ow);  // token 3 on rank 3: 6 -> 0
  assert_true(idx[0] == 0 && idx[1] == -1 && idx[2] == -1);
  assert_true(ow[0] == 0.75f && ow[1] == 0.0f && ow[2] == 0.0f);
  ep::localizeTopk(pl, 3, kTopk64, epInt64, nullptr, 1, kK, idx, ow);  // no weights: zeros
  assert_true(idx[0] == -1 && idx[1] == 1 && idx[2] == -1);
  assert_true(ow[0] == 0.0f && ow[1] == 0.0f && ow[2] == 0.0f);
  ow[0] = 42.0f;
  ep::localizeTopk(pl, 1, kTopk64, epInt64, w, 3, kK, nullptr, ow);  // idx output optional
  assert_true(ow[0] == 0.0f && ow[1] == 0.0625f && ow[2] == 0.0f);
}

void topk_valid_accepts_minus_one_and_range(void**) {
  size_t bad = 12345;
  assert_true(ep::topkValid(kTopk64, epInt64, kT, kK, 8, &bad));
  assert_int_equal(bad, 12345);  // untouched when valid
  std::vector<int32_t> idx32 = to32(kTopk64, kT * kK);
  assert_true(ep::topkValid(idx32.data(), epInt32, kT, kK, 8, nullptr));
  assert_true(ep::topkValid(nullptr, epInt64, 0, kK, 8, &bad));  // zero tokens
  // Expert 7 is out of range with 7 experts: first bad entry is token 1, k 1 (flat 4).
  assert_false(ep::topkValid(kTopk64, epInt64, kT, kK, 7, &bad));
  assert_int_equal(bad, 4);
}

void topk_valid_reports_first_bad_entry(void**) {
  int64_t idx[6] = {0, 1, 2, -2, 9, 3};
  size_t bad = 0;
  assert_false(ep::topkValid(idx, epInt64, 3, 2, 8, &bad));
  assert_int_equal(bad, 3);  // -2 comes before 9
  idx[3] = 4;
  assert_false(ep::topkValid(idx, epInt64, 3, 2, 8, &bad));
  assert_int_equal(bad, 4);
  idx[4] = 8;  // == E
  assert_false(ep::topkValid(idx, epInt64, 3, 2, 8, &bad));
  assert_int_equal(bad, 4);
  idx[4] = 7;
  assert_true(ep::topkValid(idx, epInt64, 3, 2, 8, &bad));
  // Values past int32 in an int64 array are out of range, not truncated.
  idx[5] = (int64_t(1) << 32) + 1;
  assert_false(ep::topkValid(idx, epInt64, 3, 2, 8, &bad));
  assert_int_equal(bad, 5);
  int32_t idx32[3] = {0, INT32_MIN, 1};
  assert_false(ep::topkValid(idx32, epInt32, 3, 1, 8, &bad));
  assert_int_equal(bad, 1);
}

void max_nodes_per_token_hand_case(void**) {
  const Placement pl = placement(8, 4);
  int worst = 99;
  assert_int_equal(ep::maxNodesPerToken(pl, kTopk64, epInt64, kT, kK, kNodeOfRank, 2, &worst), 2);
  assert_int_equal(worst, 0);  // the first token that reaches the maximum
  const int one_node_each[4] = {0, 1, 2, 3};
  assert_int_equal(ep::maxNodesPerToken(pl, kTopk64, epInt64, kT, kK, one_node_each, 4, &worst), 2);
  const int all_one_node[4] = {0, 0, 0, 0};
  assert_int_equal(ep::maxNodesPerToken(pl, kTopk64, epInt64, kT, kK, all_one_node, 1, &worst), 1);
  assert_int_equal(worst, 0);
  // Only token 3 spans nodes when ranks 0, 2 and 3 share a node.
  const int split[4] = {0, 1, 0, 0};
  assert_int_equal(ep::maxNodesPerToken(pl, kTopk64, epInt64, kT, kK, split, 2, &worst), 2);
  assert_int_equal(worst, 3);
  assert_int_equal(ep::maxNodesPerToken(pl, nullptr, epInt64, 0, kK, split, 2, &worst), 0);
  assert_int_equal(worst, -1);
  const int64_t none[2] = {-1, -1};
  assert_int_equal(ep::maxNodesPerToken(pl, none, epInt64, 1, 2, split, 2, &worst), 0);
  assert_int_equal(worst, -1);
}

void align_up_values(void**) {
  assert_int_equal(ep::alignUp(0, 4), 0);
  assert_int_equal(ep::alignUp(1, 4), 4);
  assert_int_equal(ep::alignUp(4, 4), 4);
  assert_int_equal(ep::alignUp(5, 4), 8);
  assert_int_equal(ep::alignUp(127, 128), 128);
  assert_int_equal(ep::alignUp(129, 128), 256);
  assert_int_equal(ep::alignUp(7, 3), 9);
  assert_int_equal(ep::alignUp(5, 1), 5);
  assert_int_equal(ep::alignUp(5, 0), 5);
  assert_int_equal(ep::alignUp(5, -8), 5);
}

void placement_owner_and_first_expert(void**) {
  const Placement pl = placement(12, 4);
  assert_int_equal(pl.experts_per_rank, 3);
  assert_int_equal(pl.owner(0), 0);
  assert_int_equal(pl.owner(2), 0);
  assert_int_equal(pl.owner(3), 1);
  assert_int_equal(pl.owner(11), 3);
  assert_int_equal(pl.firstExpert(2), 6);
}

// ---- Random cases against brute force -------------------------------------------------------

struct RandomCase {
  int E, R, T, K, N;
  std::vector<int64_t> idx;   // [T, K], distinct experts per token, some -1
  std::vector<float> w;       // [T, K]
  std::vector<int> node_of;   // [R], every node used
};

RandomCase makeCase(eptest::Rng& rng) {
  RandomCase c;
  c.R = rng.uniform(1, 8);
  c.E = c.R * rng.uniform(1, 4);
  c.K = rng.uniform(1, std::min(8, c.E));
  c.T = rng.uniform(0, 48);
  c.N = rng.uniform(1, c.R);
  c.node_of.resize(c.R);
  for (int r = 0; r < c.R; r++) c.node_of[r] = r < c.N ? r : rng.uniform(0, c.N - 1);
  for (int r = c.R - 1; r > 0; r--) std::swap(c.node_of[r], c.node_of[rng.uniform(0, r)]);
  const int minus_one_pct = rng.uniform(0, 60);
  c.idx.assign(size_t(c.T) * c.K, -1);
  c.w.resize(size_t(c.T) * c.K);
  for (int t = 0; t < c.T; t++) {
    std::vector<int64_t> chosen;
    for (int k = 0; k < c.K; k++) {
      c.w[size_t(t) * c.K + k] = rng.real(0.0f, 1.0f);
      if (rng.uniform(0, 99) < minus_one_pct) continue;
      int64_t e;
      bool dup;
      do {
        e = rng.uniform(0, c.E - 1);
        dup = false;
        for (int64_t x : chosen) dup |= x == e;
      } while (dup);
      chosen.push_back(e);
      c.idx[size_t(t) * c.K + k] = e;
    }
  }
  return c;
}

bool tokenGoesTo(const RandomCase& c, int t, int rank) {
  for (int k = 0; k < c.K; k++) {
    int64_t e = c.idx[size_t(t) * c.K + k];
    if (e >= 0 && e / (c.E / c.R) == rank) return true;
  }
  return false;
}

void random_layout_matches_brute_force(void**) {
  eptest::Rng rng(20240601);
  for (int iter = 0; iter < 300; iter++) {
    RandomCase c = makeCase(rng);
    const Placement pl = placement(c.E, c.R);
    const bool use32 = iter % 2 == 1;
    std::vector<int32_t> idx32(c.idx.begin(), c.idx.end());
    const void* idx = use32 ? static_cast<const void*>(idx32.data()) : c.idx.data();
    const epDataType_t type = use32 ? epInt32 : epInt64;

    std::vector<int> per_rank(c.R, -7), per_node(c.N, -7), per_expert(c.E, -7);
    std::vector<uint8_t> in_rank(size_t(c.T) * c.R + 1, 0xee);
    ep::computeLayout(pl, idx, type, c.T, c.K, c.node_of.data(), c.N, per_rank.data(),
                      per_node.data(), per_expert.data(), in_rank.data());

    std::vector<int> want_rank(c.R, 0), want_node(c.N, 0), want_expert(c.E, 0);
    int want_max_nodes = 0, want_worst = -1;
    for (int t = 0; t < c.T; t++) {
      for (int k = 0; k < c.K; k++)
        if (c.idx[size_t(t) * c.K + k] >= 0) want_expert[c.idx[size_t(t) * c.K + k]]++;
      int nodes_of_t = 0;
      for (int n = 0; n < c.N; n++) {
        bool any = false;
        for (int r = 0; r < c.R; r++) any |= c.node_of[r] == n && tokenGoesTo(c, t, r);
        want_node[n] += any;
        nodes_of_t += any;
      }
      if (nodes_of_t > want_max_nodes) {
        want_max_nodes = nodes_of_t;
        want_worst = t;
      }
      for (int r = 0; r < c.R; r++) {
        bool goes = tokenGoesTo(c, t, r);
        want_rank[r] += goes;
        if (in_rank[size_t(t) * c.R + r] != uint8_t(goes))
          print_error("iter %d: is_token_in_rank[%d][%d] = %d\n", iter, t, r,
                      in_rank[size_t(t) * c.R + r]);
        assert_int_equal(in_rank[size_t(t) * c.R + r], uint8_t(goes));
      }
    }
    assert_int_equal(in_rank[size_t(c.T) * c.R], 0xee);  // nothing written past [T, R]
    if (per_rank != want_rank || per_node != want_node || per_expert != want_expert)
      print_error("iter %d (E %d R %d T %d K %d N %d): layout differs\n", iter, c.E, c.R, c.T, c.K, c.N);
    assert_true(per_rank == want_rank);
    assert_true(per_node == want_node);
    assert_true(per_expert == want_expert);

    int worst = 1234;
    int got_max = ep::maxNodesPerToken(pl, idx, type, c.T, c.K, c.node_of.data(), c.N, &worst);
    assert_int_equal(got_max, want_max_nodes);
    assert_int_equal(worst, want_worst);
    assert_true(ep::topkValid(idx, type, c.T, c.K, c.E, nullptr));
  }
}

void random_send_recv_and_localize_match_brute_force(void**) {
  eptest::Rng rng(7);
  for (int iter = 0; iter < 300; iter++) {
    RandomCase c = makeCase(rng);
    const Placement pl = placement(c.E, c.R);
    Routing r;
    ep::buildSendSide(pl, c.idx.data(), epInt64, c.T, c.K, &r);
    std::vector<int> want_offset(1, 0), want_tokens;
    for (int d = 0; d < c.R; d++) {
      for (int t = 0; t < c.T; t++)
        if (tokenGoesTo(c, t, d)) want_tokens.push_back(t);
      want_offset.push_back(int(want_tokens.size()));
    }
    if (r.send_offset != want_offset || r.send_tokens != want_tokens)
      print_error("iter %d (E %d R %d T %d K %d): send side differs\n", iter, c.E, c.R, c.T, c.K);
    assert_true(r.send_offset == want_offset);
    assert_true(r.send_tokens == want_tokens);

    std::vector<int> counts(c.R);
    for (int& n : counts) n = rng.uniform(0, 100);
    ep::buildRecvSide(counts, &r);
    int64_t sum = 0;
    for (int s = 0; s < c.R; s++) {
      assert_int_equal(r.recv_offset[s], sum);
      sum += counts[s];
    }
    assert_int_equal(r.recv_offset[c.R], sum);
    assert_int_equal(r.num_recv, sum);

    const int epr = c.E / c.R;
    std::vector<int64_t> out_idx(c.K);
    std::vector<float> out_w(c.K);
    for (int t = 0; t < c.T; t++) {
      const int rank = rng.uniform(0, c.R - 1);
      ep::localizeTopk(pl, rank, c.idx.data(), epInt64, c.w.data(), t, c.K, out_idx.data(),
                       out_w.data());
      for (int k = 0; k < c.K; k++) {
        int64_t e = c.idx[size_t(t) * c.K + k];
        bool mine = e >= 0 && e / epr == rank;
        assert_int_equal(out_idx[k], mine ? e - int64_t(rank) * epr : -1);
        assert_true(out_w[k] == (mine ? c.w[size_t(t) * c.K + k] : 0.0f));
        if (mine) assert_in_range(out_idx[k], 0, epr - 1);
      }
    }
  }
}

// ---- convert.h: hand-picked values ---------------------------------------------------------

float fromBits(uint32_t b) {
  float f;
  memcpy(&f, &b, 4);
  return f;
}
uint32_t toBits(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  return b;
}
bool bf16IsNaN(uint16_t h) { return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0; }
bool fp16IsNaN(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }

#define assert_bf16(f_bits, want)                                                             \
  do {                                                                                         \
    uint16_t got_ = ep::floatToBf16(fromBits(f_bits));                                         \
    if (got_ != (want)) print_error("floatToBf16(0x%08x) = 0x%04x, want 0x%04x\n", (unsigned)(f_bits), \
                                    got_, (unsigned)(want));                                   \
    assert_int_equal(got_, (want));                                                            \
  } while (0)

#define assert_fp16(f_bits, want)                                                             \
  do {                                                                                         \
    uint16_t got_ = ep::floatToFp16(fromBits(f_bits));                                         \
    if (got_ != (want)) print_error("floatToFp16(0x%08x) = 0x%04x, want 0x%04x\n", (unsigned)(f_bits), \
                                    got_, (unsigned)(want));                                   \
    assert_int_equal(got_, (want));                                                            \
  } while (0)

void bf16_rounds_to_nearest_even(void**) {
  assert_bf16(0x3f800000u, 0x3f80);  // 1.0 exact
  assert_bf16(0x3f808000u, 0x3f80);  // tie, 0x3f80 even: down
  assert_bf16(0x3f818000u, 0x3f82);  // tie, 0x3f81 odd: up
  assert_bf16(0x3f808001u, 0x3f81);  // just above the tie
  assert_bf16(0x3f807fffu, 0x3f80);  // just below the tie
  assert_bf16(0xbf808000u, 0xbf80);  // negative tie, even
  assert_bf16(0xbf818000u, 0xbf82);
  assert_bf16(0x3fffffffu, 0x4000);  // carry into the exponent
  assert_bf16(0x80000000u, 0x8000);  // -0 keeps its sign
  assert_bf16(0x00000000u, 0x0000);
}

void bf16_subnormals_overflow_and_specials(void**) {
  assert_bf16(0x00010000u, 0x0001);  // smallest bf16 subnormal, exact
  assert_bf16(0x00008000u, 0x0000);  // tie with 0 (even)
  assert_bf16(0x00018000u, 0x0002);  // tie, 0x0001 odd: up
  assert_bf16(0x00000001u, 0x0000);  // smallest float subnormal
  assert_bf16(0x007fffffu, 0x0080);  // largest float subnormal rounds to the smallest normal
  assert_bf16(0x7f7f0000u, 0x7f7f);  // largest finite bf16
  assert_bf16(0x7f7f7fffu, 0x7f7f);
  assert_bf16(0x7f7f8000u, 0x7f80);  // tie with odd 0x7f7f: up to inf
  assert_bf16(0x7f7fffffu, 0x7f80);  // FLT_MAX overflows to inf
  assert_bf16(0xff7fffffu, 0xff80);
  assert_bf16(0x7f800000u, 0x7f80);  // inf
  assert_bf16(0xff800000u, 0xff80);
  for (uint32_t nan : {0x7fc00000u, 0x7f800001u, 0x7f80ffffu, 0x7fffffffu, 0xffc00000u, 0xff800001u}) {
    uint16_t h = ep::floatToBf16(fromBits(nan));
    if (!bf16IsNaN(h)) print_error("floatToBf16(NaN 0x%08x) = 0x%04x\n", nan, h);
    assert_true(bf16IsNaN(h));
    assert_int_equal(h & 0x8000u, (nan >> 16) & 0x8000u);  // sign kept
    assert_true(std::isnan(ep::bf16ToFloat(h)));
  }
  assert_true(ep::bf16ToFloat(0x3f80) == 1.0f);
  assert_true(ep::bf16ToFloat(0xc000) == -2.0f);
  assert_true(ep::bf16ToFloat(0x0001) == fromBits(0x00010000u));
  assert_true(std::isinf(ep::bf16ToFloat(0x7f80)));
}

void fp16_rounds_to_nearest_even(void**) {
  assert_fp16(0x3f800000u, 0x3c00);  // 1.0
  assert_fp16(0x3f801000u, 0x3c00);  // 1 + 2^-11: tie, even down
  assert_fp16(0x3f803000u, 0x3c02);  // 1 + 3*2^-11: tie, odd up
  assert_fp16(0x3f801001u, 0x3c01);
  assert_fp16(0x3f800fffu, 0x3c00);
  assert_fp16(0xc0000000u, 0xc000);  // -2
  assert_fp16(0x3efff000u, 0x3800);  // 0.5 - 2^-13: tie, odd 0x37ff: up to 0.5
  assert_fp16(0x3effe000u, 0x37ff);  // 0.5 - 2^-12 exact
  assert_fp16(0x80000000u, 0x8000);
  assert_fp16(0x38800000u, 0x0400);  // 2^-14, smallest normal
  assert_fp16(0x477fe000u, 0x7bff);  // 65504, largest finite
  assert_fp16(0x477fefffu, 0x7bff);  // just below the tie with 65536
  assert_fp16(0x477ff000u, 0x7c00);  // 65520: tie with odd 0x7bff: inf
  assert_fp16(0x49742400u, 0x7c00);  // 1e6
  assert_fp16(0xc9742400u, 0xfc00);
  assert_fp16(0x7f800000u, 0x7c00);
  assert_fp16(0xff800000u, 0xfc00);
}

void fp16_subnormals_and_nan(void**) {
  assert_fp16(0x33800000u, 0x0001);  // 2^-24, smallest subnormal
  assert_fp16(0x33000000u, 0x0000);  // 2^-25: tie with 0, even
  assert_fp16(0x33000001u, 0x0001);  // just above
  assert_fp16(0x33400000u, 0x0001);  // 1.5 * 2^-25
  assert_fp16(0x33c00000u, 0x0002);  // 1.5 * 2^-24: tie, odd 1 -> 2
  assert_fp16(0x34200000u, 0x0002);  // 2.5 * 2^-24: tie, even 2
  assert_fp16(0x387fc000u, 0x03ff);  // 1023 * 2^-24, largest subnormal
  assert_fp16(0x387fe000u, 0x0400);  // 1023.5 * 2^-24: tie, odd -> smallest normal
  assert_fp16(0x32000000u, 0x0000);  // far below
  assert_fp16(0xb3800000u, 0x8001);
  assert_fp16(0x00000001u, 0x0000);
  for (uint32_t nan : {0x7fc00000u, 0x7f800001u, 0x7f801000u, 0xffc00000u}) {
    uint16_t h = ep::floatToFp16(fromBits(nan));
    if (!fp16IsNaN(h)) print_error("floatToFp16(NaN 0x%08x) = 0x%04x\n", nan, h);
    assert_true(fp16IsNaN(h));
    assert_true(std::isnan(ep::fp16ToFloat(h)));
  }
  assert_true(ep::fp16ToFloat(0x0001) == std::ldexp(1.0f, -24));
  assert_true(ep::fp16ToFloat(0x03ff) == std::ldexp(1023.0f, -24));
  assert_true(ep::fp16ToFloat(0x8000) == 0.0f && std::signbit(ep::fp16ToFloat(0x8000)));
  assert_true(std::isinf(ep::fp16ToFloat(0xfc00)) && ep::fp16ToFloat(0xfc00) < 0);
}

// ---- convert.h: exhaustive round trips and random cross-checks ---------------------------------

void bf16_round_trip_all_patterns(void**) {
  int mismatches = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    float f = ep::bf16ToFloat(uint16_t(h));
    assert_int_equal(toBits(f), h << 16);  // widening is exact
    uint16_t back = ep::floatToBf16(f);
    bool ok = bf16IsNaN(uint16_t(h)) ? bf16IsNaN(back) : back == h;
    if (!ok && mismatches++ < 5) print_error("bf16 0x%04x -> %g -> 0x%04x\n", h, double(f), back);
  }
  assert_int_equal(mismatches, 0);
}

double fp16Reference(uint16_t h) {
  int sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  double v = exp == 0 ? std::ldexp(double(man), -24) : std::ldexp(1.0 + man / 1024.0, exp - 15);
  return sign ? -v : v;
}

void fp16_round_trip_all_patterns(void**) {
  int mismatches = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    float f = ep::fp16ToFloat(uint16_t(h));
    uint16_t back = ep::floatToFp16(f);
    bool ok;
    if (fp16IsNaN(uint16_t(h))) {
      ok = std::isnan(f) && fp16IsNaN(back);
    } else if (((h >> 10) & 0x1f) == 0x1f) {
      ok = std::isinf(f) && back == h;
    } else {
      ok = double(f) == fp16Reference(uint16_t(h)) && back == h &&
           std::signbit(f) == ((h & 0x8000u) != 0);
    }
    if (!ok && mismatches++ < 5) print_error("fp16 0x%04x -> %g -> 0x%04x\n", h, double(f), back);
  }
  assert_int_equal(mismatches, 0);
}

// Nearest-even rounding of a finite float to bf16, by comparing the two candidates.
uint16_t bf16Reference(float f) {
  uint32_t bits = toBits(f);
  uint16_t lo = uint16_t(bits >> 16), hi = uint16_t(lo + 1);  // same sign, next magnitude
  auto value = [](uint16_t h) {
    if ((h & 0x7fffu) == 0x7f80u) return (h & 0x8000u) ? -std::ldexp(1.0, 128) : std::ldexp(1.0, 128);
    return double(ep::bf16ToFloat(h));
  };
  double dlo = std::fabs(double(f) - value(lo)), dhi = std::fabs(double(f) - value(hi));
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return (lo & 1u) ? hi : lo;
}

// Nearest-even rounding of a finite float to fp16, computed in double.
uint16_t fp16Reference(float f) {
  uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  double a = std::fabs(double(f));
  if (a >= 65520.0) return sign | 0x7c00;
  if (a == 0.0) return sign;
  int e = std::ilogb(a);
  int q_exp = std::max(e, -14) - 10;            // exponent of one unit in the last place
  double q = std::nearbyint(std::ldexp(a, -q_exp));  // default mode: ties to even
  if (e < -14) return uint16_t(sign | uint16_t(q));  // subnormal (1024 becomes the smallest normal)
  return uint16_t(sign | uint16_t(((e + 15) << 10) + (int(q) - 1024)));
}

void random_floats_round_like_reference(void**) {
  eptest::Rng rng(99);
  int bad_bf16 = 0, bad_fp16 = 0;
  for (int i = 0; i < 400000; i++) {
    uint32_t bits = rng.bits32();
    // Half the samples in fp16's range, where its rounding is interesting.
    if (i % 2) bits = (bits & 0x807fffffu) | (uint32_t(rng.uniform(100, 143)) << 23);
    float f = fromBits(bits);
    if (std::isnan(f) || std::isinf(f)) continue;
    uint16_t b = ep::floatToBf16(f), want_b = bf16Reference(f);
    if (b != want_b && bad_bf16++ < 5)
      print_error("floatToBf16(0x%08x) = 0x%04x, reference 0x%04x\n", bits, b, want_b);
    uint16_t h = ep::floatToFp16(f), want_h = fp16Reference(f);
    if (h != want_h && bad_fp16++ < 5)
      print_error("floatToFp16(0x%08x) = 0x%04x, reference 0x%04x\n", bits, h, want_h);
  }
  assert_int_equal(bad_bf16, 0);
  assert_int_equal(bad_fp16, 0);
}

void load_and_store_as_float_by_type(void**) {
  uint16_t row16[2] = {0x3f80, 0xc040};  // bf16 1, -3
  assert_true(ep::loadAsFloat(row16, epBfloat16, 1) == -3.0f);
  uint16_t rowh[2] = {0x3c00, 0x4200};  // fp16 1, 3
  assert_true(ep::loadAsFloat(rowh, epFloat16, 1) == 3.0f);
  float row32[2] = {0.0f, 2.5f};
  assert_true(ep::loadAsFloat(row32, epFloat32, 1) == 2.5f);
  ep::storeFromFloat(row16, epBfloat16, 0, 0.5f);
  assert_int_equal(row16[0], 0x3f00);
  assert_int_equal(row16[1], 0xc040);  // neighbour untouched
  ep::storeFromFloat(rowh, epFloat16, 1, -2.0f);
  assert_int_equal(rowh[1], 0xc000);
  assert_int_equal(rowh[0], 0x3c00);
  ep::storeFromFloat(row32, epFloat32, 0, 1.25f);
  assert_true(row32[0] == 1.25f && row32[1] == 2.5f);
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(layout_hand_case_int64),
      cmocka_unit_test(layout_hand_case_int32),
      cmocka_unit_test(layout_token_with_several_experts_of_one_rank_counts_once),
      cmocka_unit_test(layout_zero_tokens_zeroes_outputs),
      cmocka_unit_test(layout_outputs_are_optional),
      cmocka_unit_test(send_side_hand_case),
      cmocka_unit_test(send_side_zero_tokens),
      cmocka_unit_test(recv_side_offsets_and_total),
      cmocka_unit_test(localize_topk_hand_case),
      cmocka_unit_test(topk_valid_accepts_minus_one_and_range),
      cmocka_unit_test(topk_valid_reports_first_bad_entry),
      cmocka_unit_test(max_nodes_per_token_hand_case),
      cmocka_unit_test(align_up_values),
      cmocka_unit_test(placement_owner_and_first_expert),
      cmocka_unit_test(random_layout_matches_brute_force),
      cmocka_unit_test(random_send_recv_and_localize_match_brute_force),
      cmocka_unit_test(bf16_rounds_to_nearest_even),
      cmocka_unit_test(bf16_subnormals_overflow_and_specials),
      cmocka_unit_test(fp16_rounds_to_nearest_even),
      cmocka_unit_test(fp16_subnormals_and_nan),
      cmocka_unit_test(bf16_round_trip_all_patterns),
      cmocka_unit_test(fp16_round_trip_all_patterns),
      cmocka_unit_test(random_floats_round_like_reference),
      cmocka_unit_test(load_and_store_as_float_by_type),
  };
  return cmocka_run_group_tests_name("routing", tests, nullptr, nullptr);
}
