#include "node_map.h"

#include <cstdint>
#include <utility>

#include "debug.h"

namespace ep {

epResult_t buildNodeMap(const std::vector<epPeerInfo_v1_t>& peers, int node_size, NodeMap* out) {
  const int R = int(peers.size());
  NodeMap m;
  m.node_of_rank.assign(R, -1);
  m.local_rank.assign(R, 0);
  if (node_size > 0) {
    if (R % node_size != 0)
      return setError(nullptr, epInvalidArgument, "EP_NODE_SIZE = %d does not divide the %d ranks",
                      node_size, R);
    for (int r = 0; r < R; r++) m.node_of_rank[r] = r / node_size;
    m.num_nodes = R / node_size;
  } else {
    std::vector<uint64_t> hosts;
    for (int r = 0; r < R; r++) {
      int n = 0;
      while (n < int(hosts.size()) && hosts[n] != peers[r].host_hash) n++;
      if (n == int(hosts.size())) hosts.push_back(peers[r].host_hash);
      m.node_of_rank[r] = n;
    }
    m.num_nodes = int(hosts.size());
  }
  m.node_size.assign(m.num_nodes, 0);
  m.node_first.assign(m.num_nodes, -1);
  m.node_ranks.assign(m.num_nodes, {});
  for (int r = 0; r < R; r++) {
    int n = m.node_of_rank[r];
    m.local_rank[r] = m.node_size[n]++;
    if (m.node_first[n] < 0) m.node_first[n] = r;
    m.node_ranks[n].push_back(r);
  }
  *out = std::move(m);
  return epSuccess;
}

}  // namespace ep
