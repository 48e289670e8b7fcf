// libmoeep-transport-socket.so: a version-2 (network) transport over TCP,
// for machines without RDMA and for tests across fake nodes on one machine.
// socket.h tells the design; connect.cc sets connections up, io.cc moves data.
//
// Parameters (the core's getter, never the environment directly):
//   EP_SOCKET_IFNAME    the interface whose address the endpoint advertises
//                       (prefixes, "=" exact, "^" excludes); default: the
//                       topology's choice, else the first non-loopback up
//                       interface, else loopback
//   EP_SOCKET_NSTREAMS  TCP streams per peer and traffic class, 1..16;
//                       default (or 0): the config's qps_per_peer when above 1,
//                       else 2
#include <net/if.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "socket.h"

namespace epsock {

epResult_t endpoint(void* comm, int peer, epTrafficClass_t cls, void* buf, size_t* bytes);
epResult_t connect(void* comm, int peer, epTrafficClass_t cls, const void* peer_endpoint, size_t bytes,
                   void** conn);

void Comm::log(epTransportLogLevel_t level, const char* fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  mod->env->log(level, kName, "rank %d: %s", rank, msg);
}

epResult_t Comm::fail(epResult_t res, int peer, const char* fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  {
    std::lock_guard<std::mutex> el(err_mu);
    if (err_msg.empty()) {
      err_msg = msg;
      err_peer = peer;
    }
  }
  log(epTransportLogWarn, "%s", msg);
  return res;
}

namespace {

epResult_t init(const epTransportEnv_v1_t* env, void** ctx) {
  if (env == nullptr || ctx == nullptr || env->log == nullptr || env->get_param == nullptr)
    return epInvalidArgument;
  // One context per process, as init runs once per process; the core keeps
  // it for the life of the process (finalize is not called yet), so it is
  // static rather than allocated, and nothing is left to free.
  static Module module;
  module.env = env;
  *ctx = &module;
  return epSuccess;
}

epResult_t properties(void*, epTransportProps_v1_t* props) {
  props->name = kName;
  props->caps = EP_TRANSPORT_CAP_HOST_MEM | EP_TRANSPORT_CAP_RDMA | EP_TRANSPORT_CAP_ACROSS_NODES;
  props->latency_us = 30;
  props->bandwidth_gbps = 10;
  return epSuccess;
}

// EP_SOCKET_NSTREAMS if set (1..kMaxStreams), else the config's connections
// per peer when it asks for more than one, else kDefaultStreams.
int streamCount(Module* mod, const epTransportCommInfo_v2_t* info) {
  if (const char* text = mod->env->get_param("SOCKET_NSTREAMS")) {
    char* end = nullptr;
    const long n = strtol(text, &end, 10);
    if (end != text && *end == '\0' && n >= 1 && n <= kMaxStreams) return int(n);
    if (end != text && *end == '\0' && n == 0) return info->qps_per_peer > 1 ? std::min(info->qps_per_peer, kMaxStreams) : kDefaultStreams;
    mod->env->log(epTransportLogWarn, kName, "EP_SOCKET_NSTREAMS=\"%s\" is not 1..%d: %d streams", text,
                  kMaxStreams, kDefaultStreams);
    return kDefaultStreams;
  }
  if (info->qps_per_peer > 1) return std::min(info->qps_per_peer, kMaxStreams);
  return kDefaultStreams;
}

uint64_t randomNonce() {
  uint64_t n = 0;
  if (getrandom(&n, sizeof(n), 0) != ssize_t(sizeof(n)))
    n = uint64_t(time(nullptr)) * 0x9e3779b97f4a7c15ull ^ uint64_t(getpid()) << 32 ^ uint64_t(clock());
  return n;
}

epResult_t commOpen(void* ctx, const epTransportCommInfo_v2_t* info, void** comm) {
  auto* mod = static_cast<Module*>(ctx);
  // Fields past the first version-2 struct (qp_budget, aborted) are read only where size covers them.
  if (mod == nullptr || info == nullptr || comm == nullptr ||
      info->size < offsetof(epTransportCommInfo_v2_t, qp_budget) || info->nranks < 1 || info->rank < 0 ||
      info->rank >= info->nranks)
    return epInvalidArgument;
  auto* c = new Comm;
  if (info->size >= offsetof(epTransportCommInfo_v2_t, aborted_arg) + sizeof(void*)) {
    c->aborted_fn = info->aborted;
    c->aborted_arg = info->aborted_arg;
  }
  c->mod = mod;
  c->rank = info->rank;
  c->nranks = info->nranks;
  c->timeout_ms = info->timeout_ms > 0 ? info->timeout_ms : 60000;
  memcpy(c->classes, info->classes, sizeof(c->classes));
  for (epTransportClass_v2_t& k : c->classes)  // adaptive routing "auto": TCP has none to ask for
    if (k.adaptive_routing < 0) k.adaptive_routing = 0;
  c->nstreams = streamCount(mod, info);
  c->nonce = randomNonce();

  std::string spec;
  if (const char* p = mod->env->get_param("SOCKET_IFNAME"))
    spec = p;
  else if (info->device != nullptr && info->device[0] != '\0' && if_nametoindex(info->device) != 0)
    spec = std::string("=") + info->device;  // the core's device, where it is an interface (not "mlx5_0")
  std::string err;
  ep::Fd listener;
  Address bound;
  if (!ep::findInterfaceAddress(spec.c_str(), AF_UNSPEC, &c->local, &c->ifname, &err) ||
      !ep::listenSocket(c->local, &listener, &bound, &err)) {
    c->log(epTransportLogWarn, "%s (EP_SOCKET_IFNAME picks the interface)", err.c_str());
    delete c;
    return epSystemError;
  }
  c->listen_fd = listener.release();
  c->local.setPort(bound.port());
  const epResult_t res = startIo(c);
  if (res != epSuccess) {
    closeFd(&c->listen_fd);
    delete c;
    return res;
  }
  c->log(epTransportLogInfo, "listens on %s (interface %s), %d streams per peer and class", c->local.toString().c_str(),
         c->ifname.c_str(), c->nstreams);
  *comm = c;
  return epSuccess;
}

epResult_t regMem(void* comm, void* ptr, size_t bytes, int kind, int dmabuf_fd, uint64_t, void** mem) {
  auto* c = static_cast<Comm*>(comm);
  if (c == nullptr || mem == nullptr || ptr == nullptr || bytes == 0) return epInvalidArgument;
  if (kind != EP_TRANSPORT_MEM_HOST || dmabuf_fd >= 0)
    return c->fail(epNotSupported, -1, "registers host memory only (TCP reads and writes it with the CPU)");
  std::lock_guard<std::mutex> rl(c->recv_mu);
  auto* m = new Mem{ptr, bytes, uint32_t(c->mems.size() + 1), c->nonce};
  c->mems.push_back(m);
  *mem = m;
  return epSuccess;
}

epResult_t memHandle(void* mem, void* buf, size_t* bytes) {
  auto* m = static_cast<Mem*>(mem);
  if (m == nullptr || buf == nullptr || bytes == nullptr || *bytes < sizeof(WireMemHandle)) return epInvalidArgument;
  const WireMemHandle h = {kMemMagic, m->id, m->bytes, m->nonce};
  memcpy(buf, &h, sizeof(h));
  *bytes = sizeof(h);
  return epSuccess;
}

epResult_t deregMem(void* comm, void* mem) {
  auto* c = static_cast<Comm*>(comm);
  auto* m = static_cast<Mem*>(mem);
  if (c == nullptr || m == nullptr || m->id == 0 || m->id > c->mems.size() || c->mems[m->id - 1] != m)
    return epInvalidArgument;
  std::lock_guard<std::mutex> rl(c->recv_mu);  // not while a frame is landing in it
  c->mems[m->id - 1] = nullptr;
  delete m;
  return epSuccess;
}

epResult_t connInfo(void* conn, epTransportConnInfo_v2_t* info) {
  auto* k = static_cast<Conn*>(conn);
  if (k == nullptr || info == nullptr || info->size < sizeof(size_t)) return epInvalidArgument;
  epTransportConnInfo_v2_t full;
  memset(&full, 0, sizeof(full));
  full.size = info->size;
  Comm* c = k->comm;
  snprintf(full.device, sizeof(full.device), "%s", c->ifname.c_str());
  full.port = k->peer_addr.port();
  full.qps = int(k->tx.size());
  snprintf(full.link, sizeof(full.link), "TCP");
  full.requested = c->classes[k->cls];
  snprintf(full.detail, sizeof(full.detail), "%s -> %s, %zu streams out, %zu in, IP TOS 0x%02x",
           c->local.toString().c_str(), k->peer_addr.toString().c_str(), k->tx.size(), k->rx.size(),
           unsigned(full.requested.traffic_class & 0xfc));
  memcpy(info, &full, std::min(info->size, sizeof(full)));
  return epSuccess;
}

epResult_t lastError(void* comm, int* peer, char* msg, size_t len) {
  auto* c = static_cast<Comm*>(comm);
  if (c == nullptr) return epInvalidArgument;
  std::lock_guard<std::mutex> el(c->err_mu);
  if (peer) *peer = c->err_msg.empty() ? -1 : c->err_peer;
  if (msg && len) snprintf(msg, len, "%s", c->err_msg.c_str());
  return epSuccess;
}

epResult_t closeConnection(void* conn) {
  auto* k = static_cast<Conn*>(conn);
  if (k == nullptr) return epInvalidArgument;
  closeConn(k->comm, k);
  return epSuccess;
}

epResult_t commClose(void* comm) {
  auto* c = static_cast<Comm*>(comm);
  if (c == nullptr) return epInvalidArgument;
  while (!c->conns.empty()) closeConn(c, c->conns.back());
  stopIo(c);
  for (auto& p : c->parked) close(p.second.fd);
  for (auto& h : c->hellos) close(h.fd);
  closeFd(&c->listen_fd);
  for (Mem* m : c->mems) delete m;
  delete c;
  return epSuccess;
}

epResult_t finalize(void*) { return epSuccess; }

}  // namespace

}  // namespace epsock

// Version 3 (with wait) for this library; version 2 for a library that
// knows no later table.
extern "C" __attribute__((visibility("default"))) const epTransport_v3_t epTransport_v3 = {
    epsock::kName,         3,
    epsock::init,          epsock::properties,
    nullptr,  // can_connect: every peer
    epsock::commOpen,      epsock::endpoint,
    epsock::connect,       epsock::regMem,
    epsock::memHandle,     epsock::deregMem,
    epsock::put,           epsock::test,
    epsock::progress,      epsock::connInfo,
    epsock::lastError,     epsock::closeConnection,
    epsock::commClose,     epsock::finalize,
    epsock::wait,          epsock::dropPeer,
};

extern "C" __attribute__((visibility("default"))) const epTransport_v2_t epTransport_v2 = {
    epsock::kName,         2,
    epsock::init,          epsock::properties,
    nullptr,  // can_connect: every peer
    epsock::commOpen,      epsock::endpoint,
    epsock::connect,       epsock::regMem,
    epsock::memHandle,     epsock::deregMem,
    epsock::put,           epsock::test,
    epsock::progress,      epsock::connInfo,
    epsock::lastError,     epsock::closeConnection,
    epsock::commClose,     epsock::finalize,
};
