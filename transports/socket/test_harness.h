// What the socket transport's test program needs around the module: the
// module loaded with dlopen (nothing else is linked), the environment the
// core would hand it, two ranks as processes joined by a Unix socket pair
// (their bootstrap: endpoints and memory handles cross it), and checks.
#pragma once

#include <dlfcn.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "moeep_transport.h"

namespace sockettest {

inline int g_rank = 0;
inline bool g_verbose = false;
inline std::map<std::string, std::string> g_params;  // what get_param answers
inline const epTransport_v2_t* T = nullptr;
inline const epTransport_v3_t* T3 = nullptr;  // the same module's version-3 table (wait)
inline void* g_ctx = nullptr;

#define CHECK(cond, ...)                                                                          \
  do {                                                                                            \
    if (!(cond)) {                                                                                \
      fprintf(stderr, "[rank %d] %s:%d: check failed: %s: ", g_rank, __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                                               \
      fputc('\n', stderr);                                                                        \
      return false;                                                                               \
    }                                                                                             \
  } while (0)

inline void testLog(epTransportLogLevel_t level, const char* transport, const char* fmt, ...) {
  if (level != epTransportLogWarn && !g_verbose) return;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  fprintf(stderr, "    [pid %d] %s %s: %s\n", int(getpid()), level == epTransportLogWarn ? "WARN" : "INFO",
          transport, msg);
}

inline const char* testParam(const char* name) {
  auto it = g_params.find(name);
  return it == g_params.end() ? nullptr : it->second.c_str();
}

inline const epTransportEnv_v1_t kEnv = {EP_TRANSPORT_ABI_VERSION, testLog, testParam};

inline bool loadModule(const std::string& path) {
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    fprintf(stderr, "cannot load %s: %s\n", path.c_str(), dlerror());
    return false;
  }
  T = static_cast<const epTransport_v2_t*>(dlsym(lib, "epTransport_v2"));
  if (T == nullptr || T->version != 2 || strcmp(T->name, "socket") != 0) {
    fprintf(stderr, "%s: no version-2 table called socket\n", path.c_str());
    return false;
  }
  T3 = static_cast<const epTransport_v3_t*>(dlsym(lib, "epTransport_v3"));
  if (T3 == nullptr || T3->version != 3 || T3->wait == nullptr || T3->put != T->put) {
    fprintf(stderr, "%s: no version-3 table with wait, or one unlike its version-2 table\n", path.c_str());
    return false;
  }
  return true;
}

using Clock = std::chrono::steady_clock;
inline double secondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The bootstrap between the two ranks: exact messages over a socket pair.
inline bool linkSend(int fd, const void* buf, size_t n) {
  const char* p = static_cast<const char*>(buf);
  while (n > 0) {
    const ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w <= 0) return false;
    p += w;
    n -= size_t(w);
  }
  return true;
}
inline bool linkRecv(int fd, void* buf, size_t n) {
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t r = recv(fd, p, n, 0);
    if (r <= 0) return false;
    p += r;
    n -= size_t(r);
  }
  return true;
}
template <typename V>
bool linkSwap(int fd, const V& mine, V* theirs) {
  uint32_t n = uint32_t(mine.size()), m = 0;
  if (!linkSend(fd, &n, 4) || !linkSend(fd, mine.data(), n) || !linkRecv(fd, &m, 4)) return false;
  theirs->resize(m);
  return linkRecv(fd, theirs->data(), m);
}
inline bool linkBarrier(int fd) {
  char a = 1, b = 0;
  return linkSend(fd, &a, 1) && linkRecv(fd, &b, 1);
}

// One rank's side of a connection to the other rank, with one registered buffer.
struct Side {
  void* comm = nullptr;
  void* conn = nullptr;
  void* mem = nullptr;
  uint8_t* buf = nullptr;
  size_t bytes = 0;
  std::vector<uint8_t> peer_endpoint, peer_handle;
  int peer() const { return 1 - g_rank; }

  std::string lastError(int* peer = nullptr) const {
    char msg[512] = "";
    int p = -1;
    T->last_error(comm, &p, msg, sizeof(msg));
    if (peer) *peer = p;
    return msg;
  }
  // Closes in the core's order: connection, memory, communicator.
  void close() {
    if (conn) T->close(conn), conn = nullptr;
    if (mem) T->dereg_mem(comm, mem), mem = nullptr;
    if (comm) T->comm_close(comm), comm = nullptr;
    free(buf);
    buf = nullptr;
  }
};

inline epTransportCommInfo_v2_t commInfo(int rank, int timeout_ms) {
  epTransportCommInfo_v2_t info;
  memset(&info, 0, sizeof(info));
  info.size = sizeof(info);
  info.rank = rank;
  info.nranks = 2;
  info.node = rank;
  info.num_nodes = 2;
  info.qps_per_peer = 1;
  info.gid_index = -1;
  info.timeout_ms = timeout_ms;
  info.classes[epTrafficThroughput].traffic_class = 0x20;  // DSCP 8: the socket sets IP_TOS from it
  return info;
}

// Opens, connects to the other rank and registers bytes of zeroed memory;
// before_connect runs with the peer's endpoint in hand (strangers dial then).
inline bool setupSide(int link, size_t bytes, int timeout_ms, Side* s,
                      const std::function<void(const std::vector<uint8_t>&)>& before_connect = {}) {
  const epTransportCommInfo_v2_t info = commInfo(g_rank, timeout_ms);
  CHECK(T->comm_open(g_ctx, &info, &s->comm) == epSuccess, "comm_open");
  std::vector<uint8_t> ep(EP_TRANSPORT_ENDPOINT_MAX_BYTES);
  size_t n = ep.size();
  CHECK(T->endpoint(s->comm, s->peer(), epTrafficThroughput, ep.data(), &n) == epSuccess, "endpoint");
  ep.resize(n);
  CHECK(linkSwap(link, ep, &s->peer_endpoint), "endpoint exchange");
  if (before_connect) before_connect(s->peer_endpoint);
  const epResult_t res = T->connect(s->comm, s->peer(), epTrafficThroughput, s->peer_endpoint.data(),
                                    s->peer_endpoint.size(), &s->conn);
  CHECK(res == epSuccess, "connect: %d, %s", int(res), s->lastError().c_str());
  s->bytes = bytes;
  s->buf = static_cast<uint8_t*>(aligned_alloc(4096, (bytes + 4095) / 4096 * 4096));
  CHECK(s->buf != nullptr, "allocating %zu bytes", bytes);
  memset(s->buf, 0, bytes);
  CHECK(T->reg_mem(s->comm, s->buf, bytes, EP_TRANSPORT_MEM_HOST, -1, 0, &s->mem) == epSuccess, "reg_mem");
  std::vector<uint8_t> h(EP_TRANSPORT_MEM_HANDLE_MAX_BYTES);
  n = h.size();
  CHECK(T->mem_handle(s->mem, h.data(), &n) == epSuccess, "mem_handle");
  h.resize(n);
  CHECK(linkSwap(link, h, &s->peer_handle), "handle exchange");
  return true;
}

// Posts a put, letting the transport progress while its queue is full.
inline epResult_t putRetry(Side& s, size_t off, size_t remote_off, size_t bytes, size_t sig_off, uint64_t value,
                           unsigned flags, uint64_t* request = nullptr) {
  for (;;) {
    const epResult_t r = T->put(s.conn, s.mem, off, s.peer_handle.data(), remote_off, bytes, sig_off, value, flags,
                                request);
    if (r != epInProgress) return r;
    const epResult_t p = T->progress(s.comm);
    if (p != epSuccess) return p;
    usleep(50);
  }
}

inline uint64_t loadSignal(const Side& s, size_t off) {
  return __atomic_load_n(reinterpret_cast<const uint64_t*>(s.buf + off), __ATOMIC_ACQUIRE);
}

// Waits until the word at off reaches at least target, progressing; false
// on a transport error or after timeout_s.
inline bool waitSignal(Side& s, size_t off, uint64_t target, double timeout_s = 30) {
  const auto start = Clock::now();
  for (unsigned spins = 0;; spins++) {
    if (loadSignal(s, off) >= target) return true;
    const epResult_t p = T->progress(s.comm);
    CHECK(p == epSuccess, "progress: %d, %s", int(p), s.lastError().c_str());
    CHECK(secondsSince(start) < timeout_s, "word at %zu is %llu after %.0f s, %llu awaited", off,
          (unsigned long long)loadSignal(s, off), timeout_s, (unsigned long long)target);
    // A long wait sleeps longer: on a machine of few cores, a waiter that
    // wakes often takes them from the transport's thread.
    if (spins > 1000) usleep(spins > 5000 ? 500 : 20);
  }
}

// Runs body as rank 1 in a child and as rank 0 here; each rank has its own
// module context. The child is given limit_s seconds, then killed.
// child_killed: rank 0 kills the child on purpose (SIGKILL is its success).
inline bool runPair(const char* name, const std::function<bool(int link, pid_t child)>& body, int limit_s = 90,
                    bool child_killed = false) {
  printf("--- %s\n", name);
  fflush(stdout);
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return false;
  const auto start = Clock::now();
  const pid_t pid = fork();
  if (pid == 0) {
    close(sv[0]);
    g_rank = 1;
    alarm(unsigned(limit_s));
    if (T->init(&kEnv, &g_ctx) != epSuccess) _exit(3);
    const bool ok = body(sv[1], 0);
    T->finalize(g_ctx);
    _exit(ok ? 0 : 1);
  }
  close(sv[1]);
  g_rank = 0;
  bool ok = T->init(&kEnv, &g_ctx) == epSuccess && body(sv[0], pid);
  T->finalize(g_ctx);
  close(sv[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  const bool child_ok = child_killed ? WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL
                                     : WIFEXITED(status) && WEXITSTATUS(status) == 0;
  if (!child_ok)
    fprintf(stderr, "[rank 1] %s\n",
            WIFEXITED(status) ? "failed" : (std::string("died of signal ") + strsignal(WTERMSIG(status))).c_str());
  ok = ok && child_ok;
  printf("--- %s: %s (%.1f s)\n", name, ok ? "ok" : "FAILED", secondsSince(start));
  fflush(stdout);
  return ok;
}

}  // namespace sockettest
