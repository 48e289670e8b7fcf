// config.max_nodes_per_token on the CUDA backend, host side: the bound its
// kernels check and the ranks of each node in the form they read.
#pragma once

#include "../backend_comm.h"
#include "cuda_common.h"

namespace ep {
namespace cuda {

// The bound to check, 0 where no token can exceed it: none declared, or no
// more nodes than the bound (every map of one node's GPUs, unless EP_NODE_SIZE
// or EP_HOST_ID says otherwise), so that the checks cost nothing there.
inline int nodeLimitToCheck(const BackendComm& comm) {
  const int m = comm.config().max_nodes_per_token;
  return m > 0 && comm.nodes().num_nodes > m ? m : 0;
}

// out[q]: bit r set when rank r is on node q (init refuses more than
// kMaxRanks ranks, so nodes and ranks fit).
inline void nodeRanks(const BackendComm& comm, unsigned (&out)[kMaxRanks]) {
  for (unsigned& m : out) m = 0;
  for (int r = 0; r < comm.nranks(); r++) out[comm.nodes().node_of_rank[r]] |= 1u << r;
}

}  // namespace cuda
}  // namespace ep
