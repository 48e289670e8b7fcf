// Routing math shared by every backend: which rank each token goes to, how
// many rows each rank receives, where they land. Pure functions, unit tested.
#pragma once

#include <cstdint>
#include <vector>

#include "moeep.h"
#include "sizes.h"

namespace ep {

// Expert placement: contiguous blocks of experts_per_rank experts per rank.
struct Placement {
  int num_experts = 0;
  int nranks = 0;
  int experts_per_rank = 0;
  int owner(int64_t expert) const { return int(expert / experts_per_rank); }
  int firstExpert(int rank) const { return rank * experts_per_rank; }
};

// Reads element i of a topk index array of type epInt64 or epInt32.
inline int64_t topkAt(const void* idx, epDataType_t type, size_t i) {
  return type == epInt32 ? int64_t(static_cast<const int32_t*>(idx)[i])
                         : static_cast<const int64_t*>(idx)[i];
}

// Checks every entry of topk_idx is -1 or in [0, E). On failure *bad_index is
// the flat index of the first bad entry.
bool topkValid(const void* topk_idx, epDataType_t type, int num_tokens, int num_topk,
               int num_experts, size_t* bad_index);

// Layout of one rank's tokens (docs/SEMANTICS.md). Any output may be NULL.
// node_of_rank has R entries; tokens_per_node has num_nodes entries.
void computeLayout(const Placement& pl, const void* topk_idx, epDataType_t type, int num_tokens,
                   int num_topk, const int* node_of_rank, int num_nodes, int* tokens_per_rank,
                   int* tokens_per_node, int* tokens_per_expert, uint8_t* is_token_in_rank);

// Largest number of distinct nodes any token selects (for node-limited routing).
int maxNodesPerToken(const Placement& pl, const void* topk_idx, epDataType_t type, int num_tokens,
                     int num_topk, const int* node_of_rank, int num_nodes, int* worst_token);

struct Routing {
  int nranks = 0;
  int num_tokens = 0;
  int num_topk = 0;
  // Send side: tokens of this rank to each destination, ascending token index.
  std::vector<int> send_offset;  // [R+1]
  std::vector<int> send_tokens;  // [send_offset[R]]
  // Receive side (known after the count exchange).
  std::vector<int> recv_count;       // [R] rows from each source rank
  std::vector<int64_t> recv_offset;  // [R+1] first row of each source in recv_x
  int64_t num_recv = 0;
  // Rows received per local expert (unaligned), from the first dispatch.
  std::vector<int> recv_per_expert;
  int sendCount(int dst) const { return send_offset[dst + 1] - send_offset[dst]; }
};

// Fills the send side of r from topk_idx.
void buildSendSide(const Placement& pl, const void* topk_idx, epDataType_t type, int num_tokens,
                   int num_topk, Routing* r);
// Fills the receive side from recv_count (one entry per source rank).
void buildRecvSide(const std::vector<int>& recv_count, Routing* r);

// Rewrites a token's global expert ids to the local ids of rank `rank` (-1 for
// experts elsewhere) and zeroes the weights of those; weights may be NULL.
void localizeTopk(const Placement& pl, int rank, const void* topk_idx, epDataType_t type,
                  const float* weights, int token, int num_topk, int64_t* out_idx,
                  float* out_weights);

// Rounds up each count to alignment (alignment <= 1: unchanged).
inline int alignUp(int count, int alignment) {
  return alignment > 1 ? int(roundUp(size_t(count), size_t(alignment))) : count;
}

}  // namespace ep
