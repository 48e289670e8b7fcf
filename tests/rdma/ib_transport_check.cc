// Drives libmoeep-transport-ibverbs.so directly, as the core would, over real
// verbs: one process per rank, endpoints and memory handles exchanged as
// files in a directory every rank sees (the job folder shared by the VMs).
//
//   ib_transport_check --rank R --nranks N --dir DIR [options]
//     --module PATH   the module (default: beside this program, ../lib/)
//     --qps N         QPs per peer and class (ib_qps_per_peer)
//     --tc A,B,C      traffic class (DSCP << 2) of throughput, low latency, control
//     --iters N       ping-pong rounds over the sizes (default 2)
//     --stream N      puts of the streaming phase per peer and class (default 600)
//     --max-bytes N   largest ping-pong put (default 1 MiB; TCG VMs move a few MB/s)
//     --gid-index N   ib_gid_index
//     --expect-open-error TEXT   comm_open must fail, its reason containing TEXT
//     --expect-peer-error SECONDS   some call must fail naming a peer rank within
//                     SECONDS of the first put (a fault, a killed peer); exit 0 then
//
// Every connection of every class carries: a ping-pong of puts of 0 (signal
// alone), 8, 100, 4 KiB, 64 KiB, 300 KiB and 1 MiB (data checked once the
// signal is seen, then acknowledged by a signal back), then a stream of small
// puts with no wait between them (queue full, selective signalling, test()),
// whose signal must never go back and whose last slots are checked. Then the
// last rank closes first and the others' puts to it must be dropped without
// error; the others close without a barrier (a peer's close is not an error)
// and the module must hold no verbs object.
// Output: "conn" lines (rank, peer, class, conn_info), "qpn" lines for the
// packet capture check, timings, and "PASS" or "FAIL: why".
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "moeep_transport.h"
#include "proxy/command_ring.h"
#include "proxy/proxy.h"
#include "proxy/transport_sink.h"

namespace {

int g_rank = -1;
std::string g_last_warning;
const char* g_verbose = getenv("EP_DEBUG");

void logFn(epTransportLogLevel_t level, const char* transport, const char* fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  if (level == epTransportLogWarn) g_last_warning = msg;
  if (level == epTransportLogWarn || (g_verbose && level == epTransportLogInfo))
    fprintf(stderr, "[rank %d] %s: %s\n", g_rank, transport, msg);
}

const char* getParam(const char* name) {
  const std::string var = std::string("EP_") + name;
  const char* v = getenv(var.c_str());
  return v && *v ? v : nullptr;
}

const epTransportEnv_v1_t kEnv = {EP_TRANSPORT_ABI_VERSION, logFn, getParam};

// The result's name (this program does not link libmoeep).
const char* resultName(epResult_t r) {
  static const char* names[] = {"success", "cuda error", "system error", "internal error", "invalid argument",
                                "invalid usage", "remote error", "in progress", "timeout", "not supported",
                                "aborted", "out of memory"};
  return unsigned(r) < sizeof(names) / sizeof(names[0]) ? names[r] : "unknown result";
}

double cpuSeconds() {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

[[noreturn]] void die(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stdout, "[rank %d] FAIL: ", g_rank);
  vfprintf(stdout, fmt, ap);
  fprintf(stdout, "\n");
  fflush(stdout);
  va_end(ap);
  _exit(1);
}

// ---- rendezvous through a shared directory
std::string g_dir;

void putFile(const std::string& name, const void* data, size_t bytes) {
  const std::string path = g_dir + "/" + name, tmp = path + ".tmp";
  FILE* f = fopen(tmp.c_str(), "wb");
  if (f == nullptr || fwrite(data, 1, bytes, f) != bytes || fclose(f) != 0) die("cannot write %s", tmp.c_str());
  if (rename(tmp.c_str(), path.c_str()) != 0) die("cannot rename %s", tmp.c_str());
}

std::vector<uint8_t> getFile(const std::string& name, double timeout_s = 120) {
  const std::string path = g_dir + "/" + name;
  const double end = now() + timeout_s;
  for (;;) {
    FILE* f = fopen(path.c_str(), "rb");
    if (f) {
      std::vector<uint8_t> out;
      uint8_t buf[4096];
      size_t n;
      while ((n = fread(buf, 1, sizeof(buf), f)) > 0) out.insert(out.end(), buf, buf + n);
      fclose(f);
      return out;
    }
    if (now() > end) die("no %s after %.0f s", path.c_str(), timeout_s);
    usleep(20000);
  }
}

void barrier(const char* tag, int nranks) {
  const char one = 1;
  putFile(std::string("bar.") + tag + "." + std::to_string(g_rank), &one, 1);
  for (int r = 0; r < nranks; r++) getFile(std::string("bar.") + tag + "." + std::to_string(r));
}

// ---- buffer layout (every rank's is the same)
constexpr size_t kRegion = size_t(1) << 20;  // largest ping-pong put
constexpr size_t kSlot = 256, kSlots = 64;   // stream slots
constexpr int kClasses = EP_TRAFFIC_CLASSES;
const size_t kSizes[] = {0, 8, 100, 4096, 65536, 300 * 1024, kRegion};

struct Layout {
  int R;
  size_t pairs() const { return size_t(R) * kClasses; }
  size_t recv(int src, int c) const { return (size_t(src) * kClasses + size_t(c)) * kRegion; }
  size_t send(int dst, int c) const { return pairs() * kRegion + (size_t(dst) * kClasses + size_t(c)) * kRegion; }
  size_t streamRecv(int src, int c) const {
    return 2 * pairs() * kRegion + (size_t(src) * kClasses + size_t(c)) * kSlot * kSlots;
  }
  size_t streamSend(int dst, int c) const {
    return 2 * pairs() * kRegion + (pairs() + size_t(dst) * kClasses + size_t(c)) * kSlot * kSlots;
  }
  size_t words() const { return 2 * pairs() * kRegion + 2 * pairs() * kSlot * kSlots; }
  size_t sig(int src, int c) const { return words() + (size_t(src) * kClasses + size_t(c)) * 8; }
  size_t ack(int src, int c) const { return words() + (pairs() + size_t(src) * kClasses + size_t(c)) * 8; }
  size_t streamSig(int src, int c) const { return words() + (2 * pairs() + size_t(src) * kClasses + size_t(c)) * 8; }
  size_t total() const { return words() + 3 * pairs() * 8; }
};

uint8_t pattern(int src, int dst, int c, uint64_t i, size_t k) {
  return uint8_t((uint64_t(src) * 131 + uint64_t(dst) * 71 + uint64_t(c) * 29 + i * 17 + k * 7 + (k >> 8)) & 0xff);
}

uint64_t loadWord(const uint8_t* base, size_t off) {
  return __atomic_load_n(reinterpret_cast<const uint64_t*>(base + off), __ATOMIC_ACQUIRE);
}

}  // namespace

int main(int argc, char** argv) {
  int nranks = 0, qps = 1, iters = 2, stream = 600, gid_index = -1;
  size_t max_bytes = kRegion;
  double expect_peer_error = 0;
  std::string module, expect_open_error;
  int tc[kClasses] = {40, 184, 192};  // DSCP 10, 46, 48
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) die("%s needs a value", a.c_str());
      return argv[++i];
    };
    if (a == "--rank") g_rank = atoi(next());
    else if (a == "--nranks") nranks = atoi(next());
    else if (a == "--dir") g_dir = next();
    else if (a == "--module") module = next();
    else if (a == "--qps") qps = atoi(next());
    else if (a == "--iters") iters = atoi(next());
    else if (a == "--stream") stream = atoi(next());
    else if (a == "--gid-index") gid_index = atoi(next());
    else if (a == "--max-bytes") max_bytes = size_t(atol(next()));
    else if (a == "--tc") sscanf(next(), "%d,%d,%d", &tc[0], &tc[1], &tc[2]);
    else if (a == "--expect-open-error") expect_open_error = next();
    else if (a == "--expect-peer-error") expect_peer_error = atof(next());
    else die("unknown option %s", a.c_str());
  }
  if (g_rank < 0 || nranks < 2 || g_rank >= nranks || g_dir.empty())
    die("usage: ib_transport_check --rank R --nranks N --dir DIR [...]");
  if (module.empty()) {
    char self[4096];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    self[n > 0 ? n : 0] = '\0';
    std::string dir(self);
    dir.resize(dir.rfind('/'));
    module = dir + "/../lib/libmoeep-transport-ibverbs.so";
  }
  void* lib = dlopen(module.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) die("dlopen %s: %s", module.c_str(), dlerror());
  const auto* t = static_cast<const epTransport_v2_t*>(dlsym(lib, "epTransport_v2"));
  const auto* t3 = static_cast<const epTransport_v3_t*>(dlsym(lib, "epTransport_v3"));
  auto live = reinterpret_cast<long (*)()>(dlsym(lib, "epIbverbsLiveObjects"));
  if (t == nullptr || t3 == nullptr || t3->wait == nullptr || live == nullptr)
    die("%s lacks epTransport_v2, epTransport_v3 with wait, or epIbverbsLiveObjects", module.c_str());
  void* ctx = nullptr;
  if (t->init(&kEnv, &ctx) != epSuccess) die("init: %s", g_last_warning.c_str());

  epTransportCommInfo_v2_t info;
  memset(&info, 0, sizeof(info));
  info.size = sizeof(info);
  info.rank = g_rank;
  info.nranks = nranks;
  info.node = g_rank;
  info.num_nodes = nranks;
  info.gid_index = gid_index;
  info.qps_per_peer = qps;
  info.ib_timeout = getenv("EP_IB_TIMEOUT") ? atoi(getenv("EP_IB_TIMEOUT")) : 19;
  info.ib_retry_cnt = getenv("EP_IB_RETRY_CNT") ? atoi(getenv("EP_IB_RETRY_CNT")) : 7;
  info.timeout_ms = 60000;
  for (int c = 0; c < kClasses; c++) {
    info.classes[c].service_level = c + 1;
    info.classes[c].traffic_class = tc[c];
    info.classes[c].adaptive_routing = c == 0;
  }
  void* comm = nullptr;
  const epResult_t open_res = t->comm_open(ctx, &info, &comm);
  if (!expect_open_error.empty()) {
    if (open_res == epSuccess) die("comm_open succeeded; expected an error with \"%s\"", expect_open_error.c_str());
    if (g_last_warning.find(expect_open_error) == std::string::npos)
      die("comm_open failed (%s) but its reason lacks \"%s\": %s", resultName(open_res),
          expect_open_error.c_str(), g_last_warning.c_str());
    if (live() != 0) die("%ld verbs objects left after a failed comm_open", live());
    t->finalize(ctx);
    printf("[rank %d] comm_open failed as expected: %s\nPASS\n", g_rank, g_last_warning.c_str());
    return 0;
  }
  if (open_res != epSuccess) die("comm_open: %s", g_last_warning.c_str());

  // A failed call: with --expect-peer-error, the error must name a rank.
  const double t_start = now();
  double t_first_put = 0;
  void* mem = nullptr;
  std::vector<void*> conns(static_cast<size_t>(nranks) * kClasses, nullptr);
  auto check = [&](epResult_t res, const char* what) {
    if (res == epSuccess || res == epInProgress) return;
    int peer = -2;
    char msg[512] = "";
    t->last_error(comm, &peer, msg, sizeof(msg));
    const double after = t_first_put > 0 ? now() - t_first_put : 0;
    printf("[rank %d] %s: %s after %.2f s: last_error peer %d: %s\n", g_rank, what, resultName(res), after, peer,
           msg);
    fflush(stdout);
    if (expect_peer_error > 0) {
      const std::string named = "rank " + std::to_string(peer);
      if (peer < 0 || peer >= nranks || peer == g_rank || strstr(msg, named.c_str()) == nullptr)
        die("the error does not name the peer rank");
      if (after > expect_peer_error) die("the error came after %.2f s, more than %.1f s", after, expect_peer_error);
      for (void*& c : conns)
        if (c) t->close(c), c = nullptr;
      if (mem) t->dereg_mem(comm, mem);
      t->comm_close(comm);
      printf("[rank %d] peer error in %.2f s (bound %.1f s); %ld verbs objects left after comm_close\nPASS\n", g_rank,
             after, expect_peer_error, live());
      fflush(stdout);
      _exit(live() == 0 ? 0 : 1);
    }
    die("%s failed", what);
  };

  // Endpoints for every peer and class, through files; connect ascending.
  for (int p = 0; p < nranks; p++) {
    if (p == g_rank) continue;
    for (int c = 0; c < kClasses; c++) {
      std::vector<uint8_t> ep(EP_TRANSPORT_ENDPOINT_MAX_BYTES);
      size_t bytes = ep.size();
      check(t->endpoint(comm, p, epTrafficClass_t(c), ep.data(), &bytes), "endpoint");
      putFile("ep." + std::to_string(g_rank) + "." + std::to_string(p) + "." + std::to_string(c), ep.data(), bytes);
    }
  }
  const double t_connect = now();
  for (int p = 0; p < nranks; p++) {
    if (p == g_rank) continue;
    for (int c = 0; c < kClasses; c++) {
      const std::vector<uint8_t> ep =
          getFile("ep." + std::to_string(p) + "." + std::to_string(g_rank) + "." + std::to_string(c));
      void*& conn = conns[size_t(p) * kClasses + size_t(c)];
      check(t->connect(comm, p, epTrafficClass_t(c), ep.data(), ep.size(), &conn), "connect");
      epTransportConnInfo_v2_t ci;
      memset(&ci, 0, sizeof(ci));
      ci.size = sizeof(ci);
      check(t->conn_info(conn, &ci), "conn_info");
      printf("[rank %d] conn peer %d class %d: %s port %d, %d QP(s), %s, SL %d TC %d AR %d, %s\n", g_rank, p, c,
             ci.device, ci.port, ci.qps, ci.link, ci.requested.service_level, ci.requested.traffic_class,
             ci.requested.adaptive_routing, ci.detail);
    }
  }
  printf("[rank %d] connected to %d peers x %d classes in %.3f s\n", g_rank, nranks - 1, kClasses, now() - t_connect);

  const Layout L{nranks};
  std::vector<uint8_t> buf(L.total(), 0);
  check(t->reg_mem(comm, buf.data(), buf.size(), EP_TRANSPORT_MEM_HOST, -1, 0, &mem), "reg_mem");
  std::vector<uint8_t> handle(EP_TRANSPORT_MEM_HANDLE_MAX_BYTES);
  size_t hbytes = handle.size();
  check(t->mem_handle(mem, handle.data(), &hbytes), "mem_handle");
  putFile("mh." + std::to_string(g_rank), handle.data(), hbytes);
  std::vector<std::vector<uint8_t>> handles(static_cast<size_t>(nranks));
  for (int p = 0; p < nranks; p++) handles[size_t(p)] = getFile("mh." + std::to_string(p));
  barrier("connected", nranks);

  auto conn = [&](int p, int c) { return conns[size_t(p) * kClasses + size_t(c)]; };
  // Posts until the queue takes it.
  auto putRetry = [&](int p, int c, size_t off, size_t roff, size_t bytes, size_t soff, uint64_t v, uint64_t* req) {
    if (t_first_put == 0) t_first_put = now();
    for (;;) {
      const epResult_t res =
          t->put(conn(p, c), mem, off, handles[size_t(p)].data(), roff, bytes, soff, v, EP_PUT_SIGNAL, req);
      check(res, "put");
      if (res == epSuccess) return;
      check(t->progress(comm), "progress");
    }
  };
  // Waits until word off of this rank's buffer reaches v, calling progress.
  auto waitWord = [&](size_t off, uint64_t v, const char* what, int p, int c) {
    const double end = now() + (expect_peer_error > 0 ? expect_peer_error + 30 : 120);
    uint64_t last = 0;
    while (loadWord(buf.data(), off) < v) {
      const uint64_t seen = loadWord(buf.data(), off);
      if (seen < last) die("%s from rank %d class %d went back from %llu to %llu", what, p, c,
                           (unsigned long long)last, (unsigned long long)seen);
      last = seen;
      check(t->progress(comm), "progress");
      if (now() > end) die("%s from rank %d class %d: %llu, not %llu, after the deadline (a hang)", what, p, c,
                           (unsigned long long)seen, (unsigned long long)v);
    }
  };

  // ---- ping-pong over the sizes
  const double t_pp = now();
  uint64_t round = 0;
  double bytes_moved = 0;
  for (int it = 0; it < iters; it++) {
    for (size_t size : kSizes) {
      if (size > max_bytes) continue;
      round++;
      for (int p = 0; p < nranks; p++) {
        if (p == g_rank) continue;
        for (int c = 0; c < kClasses; c++) {
          uint8_t* src = buf.data() + L.send(p, c);
          for (size_t k = 0; k < size; k++) src[k] = pattern(g_rank, p, c, round, k);
          putRetry(p, c, L.send(p, c), L.recv(g_rank, c), size, L.sig(g_rank, c), round, nullptr);
          bytes_moved += double(size);
        }
      }
      for (int p = 0; p < nranks; p++) {
        if (p == g_rank) continue;
        for (int c = 0; c < kClasses; c++) {
          waitWord(L.sig(p, c), round, "signal", p, c);
          const uint8_t* got = buf.data() + L.recv(p, c);
          for (size_t k = 0; k < size; k++)
            if (got[k] != pattern(p, g_rank, c, round, k))
              die("rank %d class %d, put of %zu bytes (round %llu): byte %zu is %u, not %u: the data did not land "
                  "before its signal",
                  p, c, size, (unsigned long long)round, k, got[k], pattern(p, g_rank, c, round, k));
          putRetry(p, c, 0, 0, 0, L.ack(g_rank, c), round, nullptr);  // a signal alone
        }
      }
      for (int p = 0; p < nranks; p++)
        for (int c = 0; p != g_rank && c < kClasses; c++) waitWord(L.ack(p, c), round, "ack", p, c);
    }
  }
  const double pp_s = now() - t_pp;
  printf("[rank %d] ping-pong: %llu rounds x %zu connections in %.3f s (%.2f ms a round; %.1f MB/s sent)\n", g_rank,
         (unsigned long long)round, size_t(nranks - 1) * kClasses, pp_s, 1e3 * pp_s / double(round),
         bytes_moved / pp_s / 1e6);

  // ---- proxy: the proxy's thread (src/proxy) posts, on the throughput
  // connections, the commands this thread writes into its ring as a kernel
  // will: kProxyPuts puts of one stream slot to each peer, each slot reused
  // once the proxy's completed count says its last put is done, then a
  // flush. The peers' signals reach this rank through the proxy's mirror
  // flags; the last slots' bytes are checked. Nothing else calls the
  // transport meanwhile.
  auto proxyPhase = [&]() {
    constexpr int kProxyPuts = 300;
    std::vector<ep::proxy::Command> slots(64);
    ep::proxy::Ring ring;
    ring.slots = slots.data();
    ring.nslots = uint32_t(slots.size());
    uint64_t flags[ep::proxy::kFlagMirrorFirst + 64] = {};
    ep::proxy::HostFlags writer(flags);
    std::vector<void*> tp_conns(size_t(nranks), nullptr);
    for (int p = 0; p < nranks; p++)
      if (p != g_rank) tp_conns[size_t(p)] = conn(p, epTrafficThroughput);
    ep::proxy::TransportSink sink(t, comm, mem, tp_conns, handles);
    ep::proxy::ProxyOptions o;
    o.nranks = nranks;
    o.max_in_flight_per_peer = 16;
    ep::proxy::Proxy proxy(ring, &sink, &writer, o);
    std::vector<int> mirror(size_t(nranks), -1);
    for (int p = 0; p < nranks; p++)
      if (p != g_rank)
        mirror[size_t(p)] = proxy.watch(reinterpret_cast<const uint64_t*>(buf.data() + L.streamSig(p, 0)));
    barrier("proxy-start", nranks);  // every rank's stream signals final before anyone mirrors
    const double t_proxy = now();
    if (proxy.start() != epSuccess) die("proxy: start");
    auto wait = [&](int flag, uint64_t target, const char* what) {
      int peer = -1;
      bool stalled = false;
      const epResult_t res = ep::proxy::waitFlag(flags, flag, target, 120000, 10000, &peer, &stalled);
      if (res != epSuccess)
        die("proxy: waiting for %s: %s%s (peer %d): %s", what, resultName(res), stalled ? ", the proxy stopped" : "",
            peer, proxy.error().c_str());
    };
    uint64_t head = 0;
    auto push = [&](const ep::proxy::Command& c) {  // as a kernel does: wait for room, then write
      while (!ep::proxy::tryPush(ring, &head, __atomic_load_n(&flags[ep::proxy::kFlagConsumed], __ATOMIC_ACQUIRE), c))
        wait(ep::proxy::kFlagConsumed, head - ring.nslots + 1, "room in the ring");
    };
    std::vector<uint64_t> slot_put(size_t(nranks) * kSlots, 0);  // global put number + 1 that last used a slot
    uint64_t puts = 0;
    for (int i = 0; i < kProxyPuts; i++) {
      const size_t slot = size_t(i) % kSlots;
      for (int p = 0; p < nranks; p++) {
        if (p == g_rank) continue;
        uint64_t& last = slot_put[size_t(p) * kSlots + slot];
        if (last) wait(ep::proxy::kFlagCompleted, last, "a slot's last put");
        uint8_t* src = buf.data() + L.streamSend(p, 0) + slot * kSlot;
        for (size_t k = 0; k < kSlot; k++) src[k] = pattern(g_rank, p, 0, uint64_t(10000 + i), k);
        ep::proxy::Command c{};
        c.op = ep::proxy::kOpPut;
        c.peer = p;
        c.local_offset = L.streamSend(p, 0) + slot * kSlot;
        c.remote_offset = L.streamRecv(g_rank, 0) + slot * kSlot;
        c.bytes = kSlot;
        c.signal_offset = L.streamSig(g_rank, 0);
        c.signal_value = uint64_t(stream + 1 + i);
        push(c);
        last = ++puts;
      }
    }
    ep::proxy::Command f{};
    f.op = ep::proxy::kOpFlush;
    f.signal_value = 1;
    push(f);
    wait(ep::proxy::kFlagFlushed, 1, "the flush");
    for (int p = 0; p < nranks; p++) {
      if (p == g_rank) continue;
      wait(ep::proxy::kFlagMirrorFirst + mirror[size_t(p)], uint64_t(stream + kProxyPuts), "a peer's last signal");
      for (int i = std::max(0, kProxyPuts - int(kSlots)); i < kProxyPuts; i++) {
        const uint8_t* got = buf.data() + L.streamRecv(p, 0) + (size_t(i) % kSlots) * kSlot;
        for (size_t k = 0; k < kSlot; k++)
          if (got[k] != pattern(p, g_rank, 0, uint64_t(10000 + i), k))
            die("proxy: put %d from rank %d, byte %zu wrong", i, p, k);
      }
    }
    barrier("proxy-done", nranks);  // the peers' proxies are done with this rank's memory
    proxy.stop();
    printf("[rank %d] proxy: %d puts of %zu bytes to each of %d peers and a flush through the ring in %.3f s; "
           "at most %d in flight to a peer\n", g_rank, kProxyPuts, kSlot, nranks - 1, now() - t_proxy,
           proxy.maxInFlight(g_rank == 0 ? 1 : 0));
  };

  // ---- sleep: rank 0 sleeps in the transport's wait (5 s at a time) until
  // the others' signals come, which they send 0.5 s after a barrier. With
  // the completion channel the signal wakes rank 0 (WRITE
  // WITH IMMEDIATE): it must be woken well before its 5 s and use almost no
  // CPU meanwhile. EP_IB_COMPLETION_CHANNEL=0 on rank 0: its waits nap
  // instead, and only the signals are checked.
  auto sleepPhase = [&]() {
    constexpr uint64_t kWoken = uint64_t(1) << 40;  // above every earlier ack value
    const int c = epTrafficControl;
    const char* cc = getenv("EP_IB_COMPLETION_CHANNEL");
    const bool channel = !(cc && strcmp(cc, "0") == 0);
    barrier("sleep-start", nranks);
    if (g_rank != 0) {
      usleep(500000);
      putRetry(0, c, 0, 0, 0, L.ack(g_rank, c), kWoken, nullptr);
    } else {
      const double t0 = now(), cpu0 = cpuSeconds();
      int waits = 0;
      for (int p = 1; p < nranks; p++) {
        while (loadWord(buf.data(), L.ack(p, c)) < kWoken) {
          check(t3->wait(comm, 5000000), "wait");
          waits++;
          if (now() - t0 > 60) die("sleep: no signal from rank %d within 60 s", p);
        }
      }
      const double wall = now() - t0, cpu = cpuSeconds() - cpu0;
      printf("[rank 0] sleep: %s; the peers' signals seen %.3f s after the barrier (sent after 0.5 s), %d waits, "
             "%.3f s of CPU\n", channel ? "completion channel" : "no channel (naps)", wall, waits, cpu);
      if (channel && wall > 3.0)
        die("sleep: not woken by the signals (%.3f s; a wait runs 5 s unless a signal ends it)", wall);
      if (channel && cpu > 0.1 * wall) die("sleep: %.3f s of CPU in %.3f s asleep", cpu, wall);
    }
    barrier("sleep-done", nranks);
  };

  // ---- stream: puts back to back, slots reused once test() says so
  const double t_stream = now();
  std::vector<uint64_t> reqs(size_t(nranks) * kClasses * kSlots, 0);
  for (int i = 0; i < stream; i++) {
    const size_t slot = size_t(i) % kSlots;
    for (int p = 0; p < nranks; p++) {
      if (p == g_rank) continue;
      for (int c = 0; c < kClasses; c++) {
        uint64_t& req = reqs[(size_t(p) * kClasses + size_t(c)) * kSlots + slot];
        for (int done = req == 0; !done;) {
          check(t->test(conn(p, c), req, &done), "test");
          if (!done) check(t->progress(comm), "progress");
        }
        uint8_t* src = buf.data() + L.streamSend(p, c) + slot * kSlot;
        for (size_t k = 0; k < kSlot; k++) src[k] = pattern(g_rank, p, c, uint64_t(i), k);
        putRetry(p, c, L.streamSend(p, c) + slot * kSlot, L.streamRecv(g_rank, c) + slot * kSlot, kSlot,
                 L.streamSig(g_rank, c), uint64_t(i + 1), &req);
      }
    }
  }
  for (int p = 0; p < nranks; p++) {
    if (p == g_rank) continue;
    for (int c = 0; c < kClasses; c++) {
      waitWord(L.streamSig(p, c), uint64_t(stream), "stream signal", p, c);
      for (int i = std::max(0, stream - int(kSlots)); i < stream; i++) {
        const uint8_t* got = buf.data() + L.streamRecv(p, c) + (size_t(i) % kSlots) * kSlot;
        for (size_t k = 0; k < kSlot; k++)
          if (got[k] != pattern(p, g_rank, c, uint64_t(i), k))
            die("stream from rank %d class %d: put %d byte %zu wrong", p, c, i, k);
      }
    }
  }
  printf("[rank %d] stream: %d puts of %zu bytes per connection in %.3f s\n", g_rank, stream, kSlot,
         now() - t_stream);
  if (expect_peer_error == 0) sleepPhase();
  if (expect_peer_error == 0) proxyPhase();

  if (expect_peer_error > 0) {  // the fault's rank must have failed by now; keep waiting for its end to show
    const double end = now() + expect_peer_error + 30;
    while (now() < end) {
      check(t->progress(comm), "progress");
      usleep(1000);
    }
    die("no error naming a peer within %.1f s of the first put (a hang)", expect_peer_error);
  }

  // ---- the last rank closes first; puts to it are then dropped, not errors
  // (its closing mark, or rdma_cm's disconnect with it, says it closed on purpose)
  barrier("checked", nranks);
  const int first_out = nranks - 1;
  if (g_rank == first_out)
    for (void*& c : conns)
      if (c) check(t->close(c), "close"), c = nullptr;
  barrier("first-closed", nranks);
  if (g_rank != first_out) {
    const double end = now() + 0.3;
    for (int i = 0; now() < end; i++) {
      for (int c = 0; c < kClasses && i < 8; c++)
        putRetry(first_out, c, 0, 0, 0, L.ack(g_rank, c), uint64_t(1000 + i), nullptr);
      check(t->progress(comm), "progress after the last rank closed");
    }
    printf("[rank %d] puts to rank %d after it closed: dropped, no error\n", g_rank, first_out);
  }
  // ---- the others close without a barrier: a peer that closed first is not an error
  for (void*& c : conns)
    if (c) check(t->close(c), "close"), c = nullptr;
  check(t->dereg_mem(comm, mem), "dereg_mem");
  check(t->comm_close(comm), "comm_close");
  const long left = live();
  t->finalize(ctx);
  if (left != 0) die("%ld verbs objects left after comm_close", left);
  printf("[rank %d] closed; no verbs object left; total %.2f s\nPASS\n", g_rank, now() - t_start);
  return 0;
}
