// Public entry points of the topology and the plan (what moeep_info prints).
#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "api_guard.h"
#include "backend.h"
#include "checks.h"
#include "comm.h"
#include "plan.h"

using namespace ep;

namespace {

// The dry-run plan of epTopologyReport is quadratic in ranks: bounded so
// that a typo cannot ask for gigabytes (4096 ranks took ~300 MB).
constexpr int kMaxPlanRanks = 2048;

// A memory stream and its text, both released however the report ends (a
// print that throws std::bad_alloc included: apiException turns it into a
// result above, and nothing may stay behind).
struct MemStream {
  char* text = nullptr;
  size_t len = 0;
  FILE* f = nullptr;
  MemStream() : f(open_memstream(&text, &len)) {}
  ~MemStream() {
    if (f != nullptr) fclose(f);
    free(text);
  }
  MemStream(const MemStream&) = delete;
  MemStream& operator=(const MemStream&) = delete;
  void close() {  // text and len final
    fclose(f);
    f = nullptr;
  }
};

// Runs print into a memory stream and hands the text out by the size protocol
// of moeep.h.
template <typename Print>
epResult_t reportTo(epComm* comm, const char* fn, char* buf, size_t* bytes, Print print) {
  if (bytes == nullptr) return setError(comm, epInvalidArgument, "%s: bytes is NULL", fn);
  MemStream ms;
  if (ms.f == nullptr) return setError(comm, epSystemError, "%s: open_memstream failed", fn);
  const epResult_t res = print(ms.f);
  ms.close();
  if (res != epSuccess) return res;
  const size_t need = ms.len + 1;
  if (buf == nullptr || *bytes < need) {
    const size_t had = buf == nullptr ? 0 : *bytes;
    *bytes = need;
    if (buf == nullptr) return epSuccess;
    return setError(comm, epInvalidArgument, "%s: buf holds %zu bytes, the report needs %zu", fn, had, need);
  }
  memcpy(buf, ms.text, need);
  *bytes = need;
  return epSuccess;
}

// NUL-terminated, cut to room.
void copyText(char* dst, size_t room, const char* src) { snprintf(dst, room, "%s", src ? src : ""); }
}  // namespace

extern "C" {

EP_API epResult_t epTopologyReport(const char* xml_path, int ranks_per_node, int num_nodes, char* buf,
                                   size_t* bytes) try {
  clearThreadError();
  if (ranks_per_node < 0 || num_nodes < 0 || (ranks_per_node > 0) != (num_nodes > 0))
    return setError(nullptr, epInvalidArgument,
                    "epTopologyReport: ranks_per_node = %d and num_nodes = %d must be both 0 or both positive",
                    ranks_per_node, num_nodes);
  if (int64_t(ranks_per_node) * num_nodes > kMaxPlanRanks)
    return setError(nullptr, epInvalidArgument,
                    "epTopologyReport: a dry-run plan covers up to %d ranks (asked: %d nodes of %d)", kMaxPlanRanks,
                    num_nodes, ranks_per_node);
  return reportTo(nullptr, "epTopologyReport", buf, bytes,
                  [&](FILE* f) { return topoReport(f, xml_path, ranks_per_node, num_nodes); });
} catch (...) {
  return apiException("epTopologyReport", nullptr);
}

EP_API epResult_t epCommPlanReport(epComm_t comm, char* buf, size_t* bytes) try {
  CallGuard guard(comm);
  EPCHECK(guard.enter("epCommPlanReport"));
  return reportTo(comm, "epCommPlanReport", buf, bytes, [&](FILE* f) {
    planPrint(f, comm->plan);
    return epSuccess;
  });
} catch (...) {
  return apiException("epCommPlanReport", nullptr);
}

EP_API epResult_t epCommPeerPath(epComm_t comm, int peer, epPathKind_t* kind, int* via_rank) try {
  CallGuard guard(comm);
  EPCHECK(guard.enter("epCommPeerPath"));
  if (peer < 0 || peer >= comm->nranks)
    return setError(comm, epInvalidArgument, "epCommPeerPath: peer = %d is outside [0, %d)", peer, comm->nranks);
  if (kind == nullptr) return setError(comm, epInvalidArgument, "epCommPeerPath: kind is NULL");
  if (int(comm->plan.peers.size()) != comm->nranks)
    return setError(comm, epInternalError, "epCommPeerPath: the communicator has no plan");
  const PeerPath& p = comm->plan.peers[peer];
  *kind = epPathKind_t(int(p.kind));
  if (via_rank) *via_rank = p.kind == PathKind::kRailForward ? p.via : -1;  // the header: -1 when direct
  return epSuccess;
} catch (...) {
  return apiException("epCommPeerPath", nullptr);
}

EP_API epResult_t epCommPeerInfo(epComm_t comm, int peer, epCommPeerInfo_t* info) try {
  CallGuard guard(comm);
  EPCHECK(guard.enter("epCommPeerInfo"));
  if (peer < 0 || peer >= comm->nranks)
    return setError(comm, epInvalidArgument, "epCommPeerInfo: peer = %d is outside [0, %d)", peer, comm->nranks);
  if (info == nullptr) return setError(comm, epInvalidArgument, "epCommPeerInfo: info is NULL");
  if (info->magic != EP_COMM_PEER_INFO_MAGIC)
    return setError(comm, epInvalidArgument,
                    "epCommPeerInfo: info->magic = 0x%x is wrong: initialise epCommPeerInfo_t with "
                    "EP_COMM_PEER_INFO_INITIALIZER", info->magic);
  constexpr size_t kV1 = offsetof(epCommPeerInfo_t, detail) + sizeof(info->detail);
  if (info->size < kV1)
    return setError(comm, epInvalidArgument, "epCommPeerInfo: info->size = %zu is smaller than any known "
                    "epCommPeerInfo_t (%zu)", info->size, kV1);
  if (int(comm->plan.peers.size()) != comm->nranks || comm->backend == nullptr)
    return setError(comm, epInternalError, "epCommPeerInfo: the communicator has no plan");

  epCommPeerInfo_t out;
  memset(&out, 0, sizeof(out));
  out.size = std::min(info->size, sizeof(out));
  out.magic = EP_COMM_PEER_INFO_MAGIC;
  out.version = EP_COMM_PEER_INFO_VERSION;
  out.peer = peer;
  const PeerPath& p = comm->plan.peers[size_t(peer)];
  out.node = p.node;
  out.path = epPathKind_t(int(p.kind));
  out.via_rank = p.kind == PathKind::kRailForward ? p.via : -1;
  copyText(out.transport, sizeof(out.transport), peer == comm->rank ? "self" : comm->backend->peerTransport(peer));
  epTransportConnInfo_v2_t conn;
  memset(&conn, 0, sizeof(conn));
  conn.size = sizeof(conn);
  if (peer != comm->rank && comm->backend->peerConnInfo(peer, &conn)) {
    copyText(out.device, sizeof(out.device), conn.device);
    out.port = conn.port;
    out.qps = conn.qps;
    copyText(out.link, sizeof(out.link), conn.link);
    copyText(out.detail, sizeof(out.detail), conn.detail);
    // The config's request per class; adaptive routing "auto" resolved as the
    // transports do: on for InfiniBand, off for RoCE and TCP.
    const IbTraffic& ib = comm->plan.ib;
    const bool infiniband = strcmp(conn.link, "InfiniBand") == 0;
    for (int c = 0; c < EP_PEER_TRAFFIC_CLASSES; c++) {
      out.classes[c].service_level = ib.sl[c];
      out.classes[c].traffic_class = ib.tclass[c];
      out.classes[c].adaptive_routing = ib.adaptive_routing[c] < 0 ? int(infiniband) : ib.adaptive_routing[c];
    }
  }
  memcpy(info, &out, out.size);
  return epSuccess;
} catch (...) {
  return apiException("epCommPeerInfo", nullptr);
}

}  // extern "C"
