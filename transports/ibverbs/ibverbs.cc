// ibverbs: RDMA over InfiniBand and RoCE, a version-2 (network) transport.
//
// Per communicator: one port of one NIC (device.cc), a protection domain,
// and per (peer, traffic class) a connection of ib_qps_per_peer RC QPs with
// the class's service level and traffic class (qp_setup.cc, or rdma_cm.cc
// with EP_IB_CM=rdma_cm). A put is an RDMA WRITE, then the signal's 8-byte
// RDMA WRITE on the same QP (data_path.cc). Errors name the peer and the
// device; the first is kept for last_error.
//
// Parameters (through the core's get_param, never the environment):
//   EP_IB_HCA    device[:port] to use where the core names none
//   EP_IB_CM     "rdma_cm": connections through rdma_cm; default: endpoint exchange
//   EP_IB_FAULT  testing: a fault on a live connection (fault.cc)
#include <fcntl.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <string>
#include <new>

#include "ib.h"

namespace ibv {

std::atomic<long> g_live_objects{0};

void logf(const Context* c, epTransportLogLevel_t level, const char* fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  c->env->log(level, kName, "%s", msg);
}

epResult_t fail(Comm* comm, epResult_t res, int peer, const char* fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  // Logged as a warning too: where comm_open fails the core has no
  // communicator to ask, and shows the last warning instead.
  logf(comm->ctx, epTransportLogWarn, "rank %d: %s", comm->info.rank, msg);
  std::lock_guard<std::mutex> lock(comm->err_mu);
  if (comm->err == epSuccess) {
    comm->err = res;
    comm->err_peer = peer;
    comm->err_msg = msg;
  }
  return res;
}

epResult_t failedResult(const Comm* comm) {
  std::lock_guard<std::mutex> lock(comm->err_mu);
  return comm->err == epSuccess ? epSuccess : epRemoteError;
}

const char* className(epTrafficClass_t cls) {
  switch (cls) {
    case epTrafficThroughput: return "throughput";
    case epTrafficLowLatency: return "low latency";
    case epTrafficControl: return "control";
    default: return "unknown class";
  }
}

namespace {

bool wantRdmaCm(const Context* c) {
  const char* v = c->env->get_param("IB_CM");
  return v != nullptr && strcmp(v, "rdma_cm") == 0;
}

epResult_t ibInit(const epTransportEnv_v1_t* env, void** out) {
  auto* c = new (std::nothrow) Context;
  if (c == nullptr) return epOutOfMemory;
  c->env = env;
  std::string why;
  if (!loadVerbs(&c->v, &why)) {
    env->log(epTransportLogWarn, kName, "%s", why.c_str());
    delete c;
    return epNotSupported;
  }
  if (!anyActivePort(c, &why)) {
    env->log(epTransportLogWarn, kName, "%s", why.c_str());
    delete c;
    return epNotSupported;
  }
  c->have_cm = loadRdmacm(&c->cm, &c->cm_why);
  const char* cm = env->get_param("IB_CM");
  if (cm != nullptr && strcmp(cm, "rdma_cm") != 0 && strcmp(cm, "exchange") != 0) {
    env->log(epTransportLogWarn, kName, "EP_IB_CM=%s: not rdma_cm or exchange", cm);
    delete c;
    return epInvalidArgument;
  }
  if (wantRdmaCm(c) && !c->have_cm) {
    env->log(epTransportLogWarn, kName, "EP_IB_CM=rdma_cm: %s", c->cm_why.c_str());
    delete c;
    return epNotSupported;
  }
  parseFault(c, env->get_param("IB_FAULT"));
  *out = c;
  return epSuccess;
}

epResult_t ibProperties(void* ctx, epTransportProps_v1_t* props) {
  const auto* c = static_cast<Context*>(ctx);
  props->name = kName;
  props->caps = EP_TRANSPORT_CAP_HOST_MEM | EP_TRANSPORT_CAP_RDMA | EP_TRANSPORT_CAP_ACROSS_NODES |
                (c && c->v.reg_dmabuf_mr ? EP_TRANSPORT_CAP_DEVICE_MEM : 0u);
  props->latency_us = 3;
  props->bandwidth_gbps = 100;
  return epSuccess;
}

void releaseComm(Comm* comm) {
  for (auto& conn : comm->conns)
    if (conn) destroyConn(conn.release());
  cmClose(comm);
  closeWake(comm);
  closePort(comm);
  delete comm;
}

epResult_t ibCommOpen(void* ctx, const epTransportCommInfo_v2_t* info, void** out) {
  auto* c = static_cast<Context*>(ctx);
  auto* comm = new (std::nothrow) Comm;
  if (comm == nullptr) return epOutOfMemory;
  comm->ctx = c;
  // Defaults for the fields an older core did not know, then what it sent.
  comm->info.gid_index = -1;
  comm->info.qps_per_peer = 1;
  comm->info.ib_timeout = 20;
  comm->info.ib_retry_cnt = 7;
  comm->info.timeout_ms = 60000;
  memcpy(&comm->info, info, std::min(info->size, sizeof(comm->info)));
  comm->info.size = sizeof(comm->info);
  if (info->size < offsetof(epTransportCommInfo_v2_t, qp_budget) + sizeof(int)) comm->info.qp_budget = 0;
  if (info->size < offsetof(epTransportCommInfo_v2_t, aborted_arg) + sizeof(void*)) {
    comm->info.aborted = nullptr;
    comm->info.aborted_arg = nullptr;
  }
  const epTransportCommInfo_v2_t& in = comm->info;
  if (in.nranks < 1 || in.rank < 0 || in.rank >= in.nranks || in.ib_timeout < 0 || in.ib_timeout > 31 ||
      in.ib_retry_cnt < 0 || in.ib_retry_cnt > 7 || in.timeout_ms <= 0 || in.qp_budget < 0) {
    const epResult_t res = fail(comm, epInvalidArgument, -1,
                                "comm_open: rank %d of %d, ib_timeout %d, ib_retry_cnt %d, timeout %d ms: out of range",
                                in.rank, in.nranks, in.ib_timeout, in.ib_retry_cnt, in.timeout_ms);
    delete comm;
    return res;
  }
  comm->nqps = std::max(1, std::min(kMaxQpsPerConn, in.qps_per_peer));
  comm->use_cm = wantRdmaCm(c);
  comm->conns.resize(size_t(in.nranks) * EP_TRAFFIC_CLASSES);
  epResult_t res = openPort(comm);
  if (res == epSuccess) openWake(comm);  // without one, waits nap: not an error
  if (res == epSuccess && comm->use_cm) res = cmOpen(comm);
  if (res != epSuccess) {
    releaseComm(comm);
    return res;
  }
  comm->info.device = nullptr;  // the caller's string; the port says which device it became
  // Adaptive routing "auto": on for InfiniBand, off for RoCE (NCCL's rule).
  for (epTransportClass_v2_t& k : comm->info.classes)
    if (k.adaptive_routing < 0) k.adaptive_routing = comm->port.roce ? 0 : 1;
  // Asynchronous events are read without blocking, from progress.
  const int fd = comm->port.ctx->async_fd;
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  char gid[64] = "";
  snprintf(gid, sizeof(gid), "%s", comm->port.roce ? comm->port.gid_kind.c_str() : "InfiniBand");
  logf(c, epTransportLogInfo, "rank %d: %s port %d (%s, GID index %d, MTU %d), %d QP(s) per peer and class, "
       "connections %s", in.rank, comm->port.device.c_str(), comm->port.port, gid, comm->port.gid_index,
       128 << comm->port.attr.active_mtu, comm->nqps, comm->use_cm ? "through rdma_cm" : "by endpoint exchange");
  for (int k = 0; k < EP_TRAFFIC_CLASSES; k++)  // what each class asks; AR is the subnet manager's to give
    logf(c, epTransportLogInfo, "rank %d: class %s: service level %d, traffic class %d (DSCP %d), adaptive "
         "routing %s", in.rank, className(epTrafficClass_t(k)), in.classes[k].service_level,
         in.classes[k].traffic_class, in.classes[k].traffic_class >> 2,
         in.classes[k].adaptive_routing ? "requested" : "not requested");
  *out = comm;
  return epSuccess;
}

epResult_t ibEndpoint(void* vcomm, int peer, epTrafficClass_t cls, void* buf, size_t* bytes) {
  auto* comm = static_cast<Comm*>(vcomm);
  if (peer < 0 || peer >= comm->info.nranks || peer == comm->info.rank || int(cls) < 0 ||
      int(cls) >= EP_TRAFFIC_CLASSES)
    return fail(comm, epInvalidArgument, peer, "endpoint: peer %d, class %d out of range (rank %d of %d)", peer,
                int(cls), comm->info.rank, comm->info.nranks);
  std::unique_ptr<Conn>& slot = comm->conns[size_t(peer) * EP_TRAFFIC_CLASSES + size_t(cls)];
  if (slot) return fail(comm, epInvalidUsage, peer, "endpoint for rank %d (%s) made twice", peer, className(cls));
  Conn* conn = nullptr;
  const epResult_t res = createConn(comm, peer, cls, &conn);
  if (res != epSuccess) return res;
  slot.reset(conn);
  return makeEndpoint(conn, buf, bytes);
}

epResult_t ibConnect(void* vcomm, int peer, epTrafficClass_t cls, const void* ep, size_t bytes, void** out) {
  auto* comm = static_cast<Comm*>(vcomm);
  Conn* conn = (peer >= 0 && peer < comm->info.nranks && int(cls) >= 0 && int(cls) < EP_TRAFFIC_CLASSES)
                   ? comm->conn(peer, cls)
                   : nullptr;
  if (conn == nullptr)
    return fail(comm, epInvalidUsage, peer, "connect to rank %d (class %d) without its endpoint made first", peer,
                int(cls));
  if (conn->connected) return fail(comm, epInvalidUsage, peer, "rank %d (%s) connected twice", peer, className(cls));
  const epResult_t res = comm->use_cm ? cmConnect(conn, ep, bytes) : connectExchange(conn, ep, bytes);
  if (res != epSuccess) return res;
  // The local QP numbers and the class's traffic class: a capture can then
  // tell each class's frames apart (tests/rdma/pcap_dscp.py).
  std::string qpns;
  for (const Qp& q : conn->qps) qpns += (qpns.empty() ? "" : " ") + std::to_string(q.qp ? q.qp->qp_num : 0);
  logf(comm->ctx, epTransportLogInfo,
       "rank %d: connected to rank %d (%s) at %s, %zu QP(s) [local QPs %s], TC %d, SL %d, inline up to %u bytes",
       comm->info.rank, peer, className(cls), conn->remote_desc, conn->qps.size(), qpns.c_str(),
       comm->info.classes[cls].traffic_class, comm->info.classes[cls].service_level, conn->max_inline);
  *out = conn;
  return epSuccess;
}

epResult_t ibRegMem(void* vcomm, void* ptr, size_t bytes, int kind, int dmabuf_fd, uint64_t dmabuf_offset,
                    void** out) {
  auto* comm = static_cast<Comm*>(vcomm);
  Context* c = comm->ctx;
  const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  struct ibv_mr* mr = nullptr;
  if (dmabuf_fd >= 0) {
    if (c->v.reg_dmabuf_mr == nullptr)
      return fail(comm, epNotSupported, -1, "DMA-BUF registration: this libibverbs has no ibv_reg_dmabuf_mr");
    mr = c->v.reg_dmabuf_mr(comm->port.pd, dmabuf_offset, bytes, reinterpret_cast<uint64_t>(ptr), dmabuf_fd, access);
  } else {
    mr = c->v.reg_mr(comm->port.pd, ptr, bytes, access);
  }
  if (mr == nullptr)
    return fail(comm, epSystemError, -1, "cannot register %zu bytes of %s memory%s on %s: %s", bytes,
                kind == EP_TRANSPORT_MEM_DEVICE ? "device" : "host", dmabuf_fd >= 0 ? " (DMA-BUF)" : "",
                comm->port.device.c_str(), strerror(errno));
  g_live_objects++;
  auto* m = new Mem;
  m->comm = comm;
  m->mr = mr;
  m->ptr = ptr;
  m->bytes = bytes;
  m->kind = kind;
  *out = m;
  return epSuccess;
}

epResult_t ibMemHandle(void* vmem, void* buf, size_t* bytes) {
  auto* m = static_cast<Mem*>(vmem);
  if (*bytes < sizeof(WireMem)) return epInvalidArgument;
  WireMem w;
  memset(&w, 0, sizeof(w));
  w.magic = kMemMagic;
  w.rkey = m->mr->rkey;
  w.addr = reinterpret_cast<uint64_t>(m->ptr);
  w.bytes = m->bytes;
  memcpy(buf, &w, sizeof(w));
  *bytes = sizeof(w);
  return epSuccess;
}

epResult_t ibDeregMem(void* vcomm, void* vmem) {
  auto* comm = static_cast<Comm*>(vcomm);
  auto* m = static_cast<Mem*>(vmem);
  if (m == nullptr) return epSuccess;
  if (m->mr) {
    comm->ctx->v.dereg_mr(m->mr);
    g_live_objects--;
  }
  delete m;
  return epSuccess;
}

epResult_t ibPut(void* vconn, void* mem, size_t offset, const void* remote, size_t remote_offset, size_t bytes,
                 size_t signal_offset, uint64_t value, unsigned flags, uint64_t* request) {
  return put(static_cast<Conn*>(vconn), static_cast<Mem*>(mem), offset, remote, remote_offset, bytes, signal_offset,
             value, flags, request);
}

epResult_t ibTest(void* vconn, uint64_t request, int* done) { return test(static_cast<Conn*>(vconn), request, done); }

epResult_t ibProgress(void* vcomm) { return progress(static_cast<Comm*>(vcomm)); }
epResult_t ibWait(void* vcomm, int timeout_us) { return waitComm(static_cast<Comm*>(vcomm), timeout_us); }

// After a shrink, before the core closes peer's connections: they count as
// closed by the peer (close waits for no acknowledgement), and the
// communicator's first error, when it was that peer's, is forgotten. A later
// failure of another connection records itself again.
epResult_t ibDropPeer(void* vcomm, int peer) {
  auto* comm = static_cast<Comm*>(vcomm);
  for (const auto& conn : comm->conns)  // their close waits for nothing (drainConn)
    if (conn && conn->peer == peer) conn->peer_closed = true;
  std::lock_guard<std::mutex> lock(comm->err_mu);
  if (comm->err != epSuccess && comm->err_peer == peer) {
    logf(comm->ctx, epTransportLogInfo, "rank %d: rank %d dropped (shrink): its error is forgotten: %s",
         comm->info.rank, peer, comm->err_msg.c_str());
    comm->err = epSuccess;
    comm->err_peer = -1;
    comm->err_msg.clear();
  }
  return epSuccess;
}

epResult_t ibConnInfo(void* vconn, epTransportConnInfo_v2_t* info) {
  const auto* conn = static_cast<Conn*>(vconn);
  const Comm* comm = conn->comm;
  epTransportConnInfo_v2_t out;
  memset(&out, 0, sizeof(out));
  out.size = sizeof(out);
  snprintf(out.device, sizeof(out.device), "%s", comm->port.device.c_str());
  out.port = comm->port.port;
  out.qps = int(conn->qps.size());
  snprintf(out.link, sizeof(out.link), "%s",
           !comm->port.roce ? "InfiniBand" : comm->port.gid_kind == "RoCE v2" ? "RoCEv2" : "RoCEv1");
  out.requested = comm->info.classes[conn->cls];
  char detail[256];
  snprintf(detail, sizeof(detail), "QP %u, GID %d -> %s, MTU %d, %s",
           conn->qps.empty() || !conn->qps[0].qp ? 0u : conn->qps[0].qp->qp_num, comm->port.gid_index,
           conn->remote_desc,
           128 << std::min<int>(comm->port.attr.active_mtu, conn->peer_mtu ? int(conn->peer_mtu) : 5),
           comm->use_cm ? "rdma_cm" : "endpoint exchange");
  snprintf(out.detail, sizeof(out.detail), "%.*s", int(sizeof(out.detail) - 1), detail);
  memcpy(info, &out, std::min(info->size ? info->size : sizeof(out), sizeof(out)));
  info->size = std::min(info->size ? info->size : sizeof(out), sizeof(out));
  return epSuccess;
}

epResult_t ibLastError(void* vcomm, int* peer, char* msg, size_t len) {
  const auto* comm = static_cast<Comm*>(vcomm);
  std::lock_guard<std::mutex> lock(comm->err_mu);
  *peer = comm->err_peer;
  if (len) snprintf(msg, len, "%s", comm->err_msg.c_str());
  return comm->err;
}

epResult_t ibClose(void* vconn) {
  auto* conn = static_cast<Conn*>(vconn);
  if (conn == nullptr) return epSuccess;
  Comm* comm = conn->comm;
  drainConn(conn, drainBoundMs(comm));
  conn->closing = true;
  for (auto& slot : comm->conns)
    if (slot.get() == conn) destroyConn(slot.release());
  return epSuccess;
}

epResult_t ibCommClose(void* vcomm) {
  auto* comm = static_cast<Comm*>(vcomm);
  if (comm == nullptr) return epSuccess;
  for (auto& slot : comm->conns)
    if (slot) {
      drainConn(slot.get(), drainBoundMs(comm));
      destroyConn(slot.release());
    }
  releaseComm(comm);
  return epSuccess;
}

epResult_t ibFinalize(void* ctx) {
  delete static_cast<Context*>(ctx);
  return epSuccess;
}

// Version 3 (with wait) for this library; version 2 for a library that
// knows no later table (its waits nap).
const epTransport_v3_t kTable = {
    kName,        3,           ibInit,     ibProperties, nullptr,    ibCommOpen,  ibEndpoint, ibConnect,
    ibRegMem,     ibMemHandle, ibDeregMem, ibPut,        ibTest,     ibProgress,  ibConnInfo, ibLastError,
    ibClose,      ibCommClose, ibFinalize, ibWait,       ibDropPeer};
const epTransport_v2_t kTableV2 = {
    kName,        2,           ibInit,     ibProperties, nullptr,    ibCommOpen,  ibEndpoint, ibConnect,
    ibRegMem,     ibMemHandle, ibDeregMem, ibPut,        ibTest,     ibProgress,  ibConnInfo, ibLastError,
    ibClose,      ibCommClose, ibFinalize};

}  // namespace

}  // namespace ibv

extern "C" __attribute__((visibility("default"))) const epTransport_v3_t epTransport_v3 = ibv::kTable;
extern "C" __attribute__((visibility("default"))) const epTransport_v2_t epTransport_v2 = ibv::kTableV2;

// Testing: the verbs objects (contexts, PDs, CQs, QPs, MRs, rdma_cm ids and
// channels) this process holds through the module; 0 once every
// communicator closed and its memory was deregistered.
extern "C" __attribute__((visibility("default"))) long epIbverbsLiveObjects() { return ibv::g_live_objects.load(); }
