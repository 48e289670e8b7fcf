#include "backend_comm.h"

#include <cstdarg>

#include "debug.h"
#include "process.h"

namespace ep {

bool BackendComm::peerExited(int r) const {
  return pidVisible(r) && !processAlive(facts_->peers[size_t(r)].pid);
}

epResult_t setError(const BackendComm& comm, epResult_t res, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsetError(comm.errorTarget(), res, fmt, ap);
  va_end(ap);
  return res;
}

epResult_t checkTopkIds(const BackendComm& comm, const char* fn, const void* topk_idx, epDataType_t type,
                        int num_tokens, int num_topk) {
  if (num_tokens <= 0) return epSuccess;
  const Config& cfg = comm.config();
  size_t bad = 0;
  if (!topkValid(topk_idx, type, num_tokens, num_topk, cfg.num_experts, &bad))
    return setError(comm, epInvalidArgument, "%s: topk_idx[%zu][%zu] = %lld is not -1 or an expert id in [0, %d)",
                    fn, bad / num_topk, bad % num_topk, (long long)topkAt(topk_idx, type, bad), cfg.num_experts);
  if (cfg.max_nodes_per_token > 0) {
    int worst_token = -1;
    const NodeMap& nodes = comm.nodes();
    const int worst = maxNodesPerToken(comm.placement(), topk_idx, type, num_tokens, num_topk,
                                       nodes.node_of_rank.data(), nodes.num_nodes, &worst_token);
    if (worst > cfg.max_nodes_per_token)
      return setError(comm, epInvalidArgument,
                      "%s: token %d selects experts on %d nodes, more than config.max_nodes_per_token = %d", fn,
                      worst_token, worst, cfg.max_nodes_per_token);
  }
  return epSuccess;
}

}  // namespace ep
