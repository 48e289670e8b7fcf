// High-throughput dispatch and combine across nodes on the host backend: a
// token crosses the network at most once per destination node, to the rail
// peer there (the rank with the source's local index), which forwards it to
// the node's ranks that hold its experts; combine reduces inside each node
// first and sends one float32 partial sum per (token, node) back.
//
// Dispatch, two steps of the exchanger:
//   1. source -> rail peer of each other node: one forward record per token
//      with an expert on that node (global ids, a mask of the node's ranks);
//   2. inside each node: every rank sends each rank of its node its own
//      tokens, then the tokens it forwards, sources ascending, so that a
//      receiver places rows by source rank, then source token, as on one node.
// Combine, the reverse: 1. inside each node, rows go back to the rank that
// forwarded them (or to their source, on its own node), which sums them over
// the node's ranks in ascending order; 2. each partial crosses the network
// to its source, which sums the nodes' partials in ascending node order, its
// own node's among them, then the bias (docs/SEMANTICS.md, "Sum order").
// A rank forwards for the sources of other nodes whose rail peer it is
// (railPeer, src/plan.h); it holds their tokens' records, and in combine
// their float32 partials, for the call. After a shrink, a dead rail peer's
// sources go to its substitute (railPeerAlive): the next live rank of that
// node, over the control class's connection where the two ranks have no
// throughput one.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "../backend_comm.h"
#include "../handle.h"
#include "exchange.h"
#include "records.h"

namespace ep {
namespace host {

// Per node of a communicator: who forwards for whom.
struct Forwarding {
  // carried[p]: the sources whose tokens rank p (of this rank's node) sends
  // inside the node: p itself, then the ranks of other nodes whose rail peer
  // p is, ascending. Empty for ranks of other nodes.
  std::vector<std::vector<int>> carried;
  // forwarder[s]: the rank of this node that forwards source s's tokens
  // here (s itself for the ranks of this node).
  std::vector<int> forwarder;
  // rail[n]: the rank of node n this rank sends that node's tokens to (-1:
  // its own node, or a node whose ranks all died).
  std::vector<int> rail;
};
// dead: [R] the ranks a shrink removed (empty: none); dead sources carry nothing.
Forwarding buildForwarding(const BackendComm& comm, const std::vector<bool>& dead = {});

// The count step of a dispatch across nodes (after the flat one): tells each
// rail peer how many tokens this rank forwards through it (h->fwd_count).
epResult_t exchangeForwardCounts(const BackendComm& comm, Exchanger& ex, const Forwarding& fw, const Routing& rt,
                                 epHandle* h);

struct HierDispatchIo {
  DispatchRecord rec;
  // Writes token t's record for rank d (its local ids), as one node sends it.
  std::function<void(int d, int t, uint8_t* out)> pack;
  // Writes token t's ids and weights as global ids into a forward record
  // (row, scales, ids, weights, count word; not the mask).
  std::function<void(int t, uint8_t* out)> packForward;
  // Places row i of source s's rows from a record with this rank's local ids.
  std::function<void(int s, int64_t i, const uint8_t* in)> place;
};
epResult_t hierDispatch(const BackendComm& comm, Exchanger& ex, const Forwarding& fw, epHandle* h,
                        HierDispatchIo& io);

struct HierCombineIo {
  size_t row_bytes;  // of the combine type
  epDataType_t type;
  int K;             // this rank's weight columns (0: it passed none)
  // The rows this rank received, as it sends them back: y row and weights.
  const char* y;
  size_t y_stride;
  const float* recv_weights;  // [num_recv, K] or null
  // Where the sums go: acc [T, H] and acc_w [T, K] (zeroed by the caller).
  float* acc;
  float* acc_w;
  int* unweighted_node;  // out: a node whose ranks sent no weights (-1: none)
};
epResult_t hierCombine(const BackendComm& comm, Exchanger& ex, const Forwarding& fw, const epHandle* h,
                       HierCombineIo& io);

}  // namespace host
}  // namespace ep
