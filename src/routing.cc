#include "routing.h"

#include <algorithm>

namespace ep {

bool topkValid(const void* topk_idx, epDataType_t type, int num_tokens, int num_topk,
               int num_experts, size_t* bad_index) {
  size_t n = size_t(num_tokens) * size_t(num_topk);
  for (size_t i = 0; i < n; i++) {
    int64_t e = topkAt(topk_idx, type, i);
    if (e < -1 || e >= num_experts) {
      if (bad_index) *bad_index = i;
      return false;
    }
  }
  return true;
}

void computeLayout(const Placement& pl, const void* topk_idx, epDataType_t type, int num_tokens,
                   int num_topk, const int* node_of_rank, int num_nodes, int* tokens_per_rank,
                   int* tokens_per_node, int* tokens_per_expert, uint8_t* is_token_in_rank) {
  const int R = pl.nranks;
  if (tokens_per_rank) std::fill(tokens_per_rank, tokens_per_rank + R, 0);
  if (tokens_per_node) std::fill(tokens_per_node, tokens_per_node + num_nodes, 0);
  if (tokens_per_expert) std::fill(tokens_per_expert, tokens_per_expert + pl.num_experts, 0);
  std::vector<uint8_t> in_rank(R), in_node(num_nodes > 0 ? num_nodes : 1);
  for (int t = 0; t < num_tokens; t++) {
    std::fill(in_rank.begin(), in_rank.end(), 0);
    std::fill(in_node.begin(), in_node.end(), 0);
    for (int k = 0; k < num_topk; k++) {
      int64_t e = topkAt(topk_idx, type, size_t(t) * num_topk + k);
      if (e < 0) continue;
      if (tokens_per_expert) tokens_per_expert[e]++;
      int r = pl.owner(e);
      in_rank[r] = 1;
      if (node_of_rank) in_node[node_of_rank[r]] = 1;
    }
    for (int r = 0; r < R; r++) {
      if (tokens_per_rank) tokens_per_rank[r] += in_rank[r];
      if (is_token_in_rank) is_token_in_rank[size_t(t) * R + r] = in_rank[r];
    }
    if (tokens_per_node && node_of_rank)
      for (int n = 0; n < num_nodes; n++) tokens_per_node[n] += in_node[n];
  }
}

int maxNodesPerToken(const Placement& pl, const void* topk_idx, epDataType_t type, int num_tokens,
                     int num_topk, const int* node_of_rank, int num_nodes, int* worst_token) {
  std::vector<uint8_t> in_node(num_nodes > 0 ? num_nodes : 1);
  int worst = 0;
  if (worst_token) *worst_token = -1;
  for (int t = 0; t < num_tokens; t++) {
    std::fill(in_node.begin(), in_node.end(), 0);
    int n_nodes = 0;
    for (int k = 0; k < num_topk; k++) {
      int64_t e = topkAt(topk_idx, type, size_t(t) * num_topk + k);
      if (e < 0) continue;
      int n = node_of_rank[pl.owner(e)];
      if (!in_node[n]) { in_node[n] = 1; n_nodes++; }
    }
    if (n_nodes > worst) {
      worst = n_nodes;
      if (worst_token) *worst_token = t;
    }
  }
  return worst;
}

void buildSendSide(const Placement& pl, const void* topk_idx, epDataType_t type, int num_tokens,
                   int num_topk, Routing* r) {
  const int R = pl.nranks;
  r->nranks = R;
  r->num_tokens = num_tokens;
  r->num_topk = num_topk;
  // Two passes: count per destination, then place in ascending token order.
  std::vector<uint8_t> mask(size_t(num_tokens) * R, 0);
  std::vector<int> count(R, 0);
  for (int t = 0; t < num_tokens; t++)
    for (int k = 0; k < num_topk; k++) {
      int64_t e = topkAt(topk_idx, type, size_t(t) * num_topk + k);
      if (e < 0) continue;
      uint8_t& m = mask[size_t(t) * R + pl.owner(e)];
      if (!m) { m = 1; count[pl.owner(e)]++; }
    }
  r->send_offset.assign(R + 1, 0);
  for (int d = 0; d < R; d++) r->send_offset[d + 1] = r->send_offset[d] + count[d];
  r->send_tokens.assign(r->send_offset[R], 0);
  std::vector<int> fill(r->send_offset.begin(), r->send_offset.end() - 1);
  for (int t = 0; t < num_tokens; t++)
    for (int d = 0; d < R; d++)
      if (mask[size_t(t) * R + d]) r->send_tokens[fill[d]++] = t;
}

void buildRecvSide(const std::vector<int>& recv_count, Routing* r) {
  const int R = int(recv_count.size());
  r->recv_count = recv_count;
  r->recv_offset.assign(R + 1, 0);
  for (int s = 0; s < R; s++) r->recv_offset[s + 1] = r->recv_offset[s] + recv_count[s];
  r->num_recv = r->recv_offset[R];
}

void localizeTopk(const Placement& pl, int rank, const void* topk_idx, epDataType_t type,
                  const float* weights, int token, int num_topk, int64_t* out_idx,
                  float* out_weights) {
  const int64_t first = pl.firstExpert(rank);
  for (int k = 0; k < num_topk; k++) {
    size_t i = size_t(token) * num_topk + k;
    int64_t e = topkAt(topk_idx, type, i);
    bool mine = e >= 0 && pl.owner(e) == rank;
    if (out_idx) out_idx[k] = mine ? e - first : -1;
    if (out_weights) out_weights[k] = (mine && weights) ? weights[i] : 0.0f;
  }
}

}  // namespace ep
