// Ranks grouped into nodes: ranks of one machine (the same host hash) share a
// node, unless EP_NODE_SIZE cuts the ranks into blocks of that many.
#pragma once

#include <vector>

#include "moeep_transport.h"

namespace ep {

struct NodeMap {
  int num_nodes = 1;
  std::vector<int> node_of_rank;   // [R]
  std::vector<int> local_rank;     // [R] index within its node
  std::vector<int> node_size;      // [N]
  std::vector<int> node_first;     // [N] first rank of the node (ranks of a node are listed)
  std::vector<std::vector<int>> node_ranks;  // [N] ranks of each node, ascending
};

// Groups ranks by host hash (ascending first rank decides node order), or into
// consecutive blocks of node_size when node_size > 0.
epResult_t buildNodeMap(const std::vector<epPeerInfo_v1_t>& peers, int node_size, NodeMap* out);

}  // namespace ep
