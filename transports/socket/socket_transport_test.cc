// The socket transport on its own: two ranks as processes over loopback,
// the module loaded with dlopen.
//
//   socket_transport_test [--module PATH] [--case NAME]... [--puts N] [--runs N] [-v]
//
// Cases (all but bench by default):
//   order     many puts of random sizes (0 B .. 3 MiB), most with a signal,
//             some without, on 1 and on 3 streams; the receiver checks, each
//             time it sees the signal move, that every put up to that value
//             is complete, and returns credits as signal-only puts; strangers
//             dial the receiver's listener first and must not disturb it;
//             no descriptor or thread is left after the close
//   killed    a sender killed mid-transfer, then a receiver killed: the other
//             side's progress or put fails naming rank 1 within 5 s
//   goodbye   a receiver that closes in order: puts to it are dropped, no error
//   wait      rank 0 sleeps in wait (5 s at a time) until rank 1's signal,
//             sent 0.5 s later, wakes it: well before 5 s, with little CPU;
//             with nothing coming, wait sleeps its timeout out
//   endpoint  a malformed endpoint, one for another rank, one whose port
//             nobody listens on, one of a rank that never connects back: a
//             clear error, within the timeout
//   bench     117 MB (8192 tokens x 7168 BF16) moved by puts beside a plain
//             TCP stream of the same bytes, --runs times each, medians
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/resource.h>

#include <algorithm>
#include <deque>
#include <random>

#include "test_harness.h"
#include "wire.h"

using namespace sockettest;

namespace {

constexpr size_t kRing = size_t(48) << 20;  // data region of the order case
constexpr size_t kHead = kRing;             // receiver: the signal of each put
constexpr size_t kCredit = kRing + 64;      // sender: the receiver's credits
constexpr size_t kOrderBytes = kRing + 4096;

int countEntries(const char* dir) {
  int n = 0;
  if (DIR* d = opendir(dir)) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}

struct PlannedPut {
  size_t offset, bytes;
  bool signal;
};

// Both ranks derive the same puts from the seed: sizes from 0 B to 3 MiB,
// placed one after another in the ring, wrapping.
std::vector<PlannedPut> planPuts(uint64_t seed, int count) {
  std::mt19937_64 rng(seed);
  std::vector<PlannedPut> plan;
  size_t next = 0;
  for (int k = 0; k < count; k++) {
    const unsigned r = unsigned(rng() % 100);
    size_t bytes = r < 8 ? 0 : r < 45 ? rng() % 257 : r < 85 ? rng() % 65537 : 1 + rng() % (size_t(3) << 20);
    if (next + bytes > kRing) next = 0;
    // A put without a signal is only seen through a later one's (in order).
    const bool signal = bytes == 0 || k + 1 == count || rng() % 10 != 0;
    plan.push_back({next, bytes, signal});
    next = (next + bytes + 7) & ~size_t(7);
  }
  return plan;
}

inline uint8_t patternByte(uint64_t k, size_t i) { return uint8_t((k * 167) ^ (i * 31) ^ (i >> 11)); }

bool checkPut(const uint8_t* p, const PlannedPut& put, uint64_t k, uint64_t signal_seen) {
  for (size_t i = 0; i < put.bytes; i++)
    CHECK(p[put.offset + i] == patternByte(k, i),
          "put %llu (%zu bytes at %zu): byte %zu is %u, not %u, once the signal read %llu", (unsigned long long)k,
          put.bytes, put.offset, i, p[put.offset + i], patternByte(k, i), (unsigned long long)signal_seen);
  return true;
}

// Strangers on the receiver's listener before the real connect: one that
// sends junk, one that sends nothing. Kept open through the case.
std::vector<int> dialStrangers(const std::vector<uint8_t>& endpoint) {
  std::vector<int> fds;
  epsock::WireEndpoint e;
  if (endpoint.size() != sizeof(e)) return fds;
  memcpy(&e, endpoint.data(), sizeof(e));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(e.port);
  memcpy(&a.sin_addr, e.addr, 4);
  for (int i = 0; i < 2; i++) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      close(fd);
      continue;
    }
    if (i == 0) {
      char junk[40];
      memset(junk, 0xab, sizeof(junk));
      if (send(fd, junk, sizeof(junk), MSG_NOSIGNAL) < 0) perror("stranger");
    }
    fds.push_back(fd);
  }
  return fds;
}

bool orderCase(int link, int streams, int count, uint64_t seed) {
  g_params["SOCKET_NSTREAMS"] = std::to_string(streams);
  const int fds_before = countEntries("/proc/self/fd"), threads_before = countEntries("/proc/self/task");
  const std::vector<PlannedPut> plan = planPuts(seed, count);
  Side s;
  std::vector<int> strangers;
  CHECK(setupSide(link, kOrderBytes, 20000, &s,
                  [&](const std::vector<uint8_t>& ep) {
                    if (g_rank == 0) strangers = dialStrangers(ep);
                  }),
        "setup");
  epTransportConnInfo_v2_t info;
  memset(&info, 0, sizeof(info));
  info.size = sizeof(info);
  CHECK(T->conn_info(s.conn, &info) == epSuccess, "conn_info");
  CHECK(info.qps == streams && strcmp(info.link, "TCP") == 0 && strcmp(info.device, "lo") == 0 &&
            info.requested.traffic_class == 0x20,
        "conn_info: %d streams, link %s, device %s, class %d", info.qps, info.link, info.device,
        info.requested.traffic_class);
  if (g_rank == 0) printf("    %d streams: %s\n", streams, info.detail);

  size_t total = 0;
  const auto start = Clock::now();
  if (g_rank == 0) {  // the sender
    struct Pending {
      uint64_t k, request;
      size_t offset, bytes;
    };
    std::deque<Pending> pending;
    for (int k = 1; k <= count; k++) {
      const PlannedPut& put = plan[size_t(k - 1)];
      // Room: every earlier put overlapping this one was credited (and so is done here too).
      for (;;) {
        const uint64_t credit = loadSignal(s, kCredit);
        while (!pending.empty() && pending.front().k <= credit) {
          int done = 0;
          CHECK(T->test(s.conn, pending.front().request, &done) == epSuccess && done,
                "put %llu credited but not done", (unsigned long long)pending.front().k);
          pending.pop_front();
        }
        bool overlaps = false;
        for (const Pending& p : pending)
          overlaps |= p.offset < put.offset + put.bytes && put.offset < p.offset + p.bytes;
        if (!overlaps) break;
        CHECK(waitSignal(s, kCredit, credit + 1), "credit");
      }
      for (size_t i = 0; i < put.bytes; i++) s.buf[put.offset + i] = patternByte(uint64_t(k), i);
      uint64_t request = 0;
      const epResult_t r = putRetry(s, put.offset, put.offset, put.bytes, kHead, uint64_t(k),
                                    put.signal ? EP_PUT_SIGNAL : 0, &request);
      CHECK(r == epSuccess, "put %d: %d, %s", k, int(r), s.lastError().c_str());
      pending.push_back({uint64_t(k), request, put.offset, put.bytes});
      total += put.bytes;
    }
    CHECK(waitSignal(s, kCredit, uint64_t(count)), "last credit");
  } else {  // the receiver
    uint64_t seen = 0;
    while (seen < uint64_t(count)) {
      CHECK(waitSignal(s, kHead, seen + 1), "signal after %llu", (unsigned long long)seen);
      const uint64_t now = loadSignal(s, kHead);
      CHECK(now <= uint64_t(count), "signal %llu past the last put", (unsigned long long)now);
      for (uint64_t k = seen + 1; k <= now; k++) {
        CHECK(checkPut(s.buf, plan[size_t(k - 1)], k, now), "data");
        total += plan[size_t(k - 1)].bytes;
      }
      seen = now;
      const epResult_t r = putRetry(s, 0, 0, 0, kCredit, seen, EP_PUT_SIGNAL);
      CHECK(r == epSuccess, "credit %llu: %d", (unsigned long long)seen, int(r));
    }
    printf("    %d puts, %.1f MB checked at each signal, %.2f s\n", count, double(total) / 1e6, secondsSince(start));
  }
  CHECK(linkBarrier(link), "barrier");
  CHECK(s.lastError().empty(), "an error: %s", s.lastError().c_str());
  s.close();
  for (int fd : strangers) close(fd);
  CHECK(countEntries("/proc/self/fd") == fds_before, "%d descriptors open after the close, %d before",
        countEntries("/proc/self/fd"), fds_before);
  CHECK(countEntries("/proc/self/task") == threads_before, "%d threads after the close, %d before",
        countEntries("/proc/self/task"), threads_before);
  return true;
}

// Waits for progress (or a put, when putting) to fail; checks the message.
bool expectPeerError(Side& s, bool putting, double bound_s) {
  const auto start = Clock::now();
  epResult_t r = epSuccess;
  while (r == epSuccess && secondsSince(start) < bound_s) {
    if (putting) {
      r = T->put(s.conn, s.mem, 0, s.peer_handle.data(), 0, size_t(1) << 20, 0, 1, EP_PUT_SIGNAL, nullptr);
      if (r == epInProgress) r = epSuccess;
    }
    if (r == epSuccess) r = T->progress(s.comm);
    usleep(200);
  }
  int peer = -1;
  const std::string why = s.lastError(&peer);
  CHECK(r == epRemoteError, "no error %.1f s after the peer was killed (result %d)", secondsSince(start), int(r));
  CHECK(peer == 1 && why.find("rank 1 (127.0.0.1:") != std::string::npos, "last_error: peer %d, \"%s\"", peer,
        why.c_str());
  printf("    error after %.3f s: %s\n", secondsSince(start), why.c_str());
  return true;
}

bool killedSender(int link, pid_t child) {
  Side s;
  const size_t bytes = size_t(8) << 20;
  CHECK(setupSide(link, bytes, 20000, &s), "setup");
  if (g_rank == 1) {  // sends until killed
    for (uint64_t v = 1;; v++) putRetry(s, 4096, 4096, bytes - 4096, 0, v, EP_PUT_SIGNAL);
  }
  CHECK(waitSignal(s, 0, 5), "five puts");
  kill(child, SIGKILL);
  CHECK(expectPeerError(s, false, 5), "receiver side");
  s.close();
  return true;
}

bool killedReceiver(int link, pid_t child) {
  Side s;
  const size_t bytes = size_t(8) << 20;
  CHECK(setupSide(link, bytes, 20000, &s), "setup");
  if (g_rank == 1) {
    char go = 1;
    linkSend(link, &go, 1);
    for (;;) T->progress(s.comm), usleep(100);  // takes puts until killed
  }
  char go;
  CHECK(linkRecv(link, &go, 1), "child ready");
  for (int i = 0; i < 8; i++)
    CHECK(putRetry(s, 0, 0, bytes, bytes - 8, uint64_t(i + 1), EP_PUT_SIGNAL) == epSuccess, "put %d", i);
  kill(child, SIGKILL);
  CHECK(expectPeerError(s, true, 5), "sender side");
  s.close();
  return true;
}

bool goodbye(int link, pid_t) {
  Side s;
  const size_t bytes = size_t(4) << 20;
  CHECK(setupSide(link, bytes, 20000, &s), "setup");
  if (g_rank == 1) {
    CHECK(waitSignal(s, 0, 3), "three puts");
    s.close();  // in order: the goodbye goes out
    char bye = 1;
    CHECK(linkSend(link, &bye, 1), "tell rank 0");
    return true;
  }
  for (int i = 0; i < 3; i++)
    CHECK(putRetry(s, 8, 8, bytes - 8, 0, uint64_t(i + 1), EP_PUT_SIGNAL) == epSuccess, "put %d", i);
  char bye;
  CHECK(linkRecv(link, &bye, 1), "rank 1 closed");
  const auto start = Clock::now();
  int puts = 0;
  while (secondsSince(start) < 1.0) {  // puts to a rank that left in order are dropped
    const epResult_t r = putRetry(s, 8, 8, bytes - 8, 0, uint64_t(puts) + 4, EP_PUT_SIGNAL);
    CHECK(r == epSuccess, "put after the goodbye: %d, %s", int(r), s.lastError().c_str());
    CHECK(T->progress(s.comm) == epSuccess, "progress after the goodbye: %s", s.lastError().c_str());
    puts++;
  }
  CHECK(s.lastError().empty(), "an error: %s", s.lastError().c_str());
  printf("    %d puts after rank 1 closed in order: dropped without an error\n", puts);
  s.close();
  return true;
}

double cpuSeconds();

bool waitCase(int link, pid_t) {
  Side s;
  const size_t bytes = 4096;
  CHECK(setupSide(link, bytes, 20000, &s), "setup");
  char go = 1;
  if (g_rank == 1) {
    CHECK(linkRecv(link, &go, 1), "rank 0 ready");
    usleep(500000);
    CHECK(putRetry(s, 0, 64, 64, 0, 7, EP_PUT_SIGNAL) == epSuccess, "the signal");
    CHECK(linkRecv(link, &go, 1), "rank 0 woken");
    s.close();
    return true;
  }
  // Nothing coming: each wait sleeps (about) its timeout.
  auto start = Clock::now();
  for (int i = 0; i < 5; i++) CHECK(T3->wait(s.comm, 40000) == epSuccess, "wait: %s", s.lastError().c_str());
  const double idle_s = secondsSince(start);
  CHECK(idle_s > 0.15, "5 waits of 40 ms with nothing coming returned after %.3f s", idle_s);
  CHECK(linkSend(link, &go, 1), "tell rank 1");
  start = Clock::now();
  const double cpu0 = cpuSeconds();
  int waits = 0;
  while (loadSignal(s, 0) < 7) {
    CHECK(T3->wait(s.comm, 5000000) == epSuccess, "wait: %s", s.lastError().c_str());
    waits++;
    CHECK(secondsSince(start) < 30, "no signal within 30 s");
  }
  const double woken = secondsSince(start), cpu = cpuSeconds() - cpu0;
  CHECK(linkSend(link, &go, 1), "tell rank 1");
  printf("    5 idle waits of 40 ms took %.3f s; the signal sent after 0.5 s woke rank 0 after %.3f s (%d waits, "
         "%.3f s of CPU)\n", idle_s, woken, waits, cpu);
  CHECK(woken < 2.0, "rank 0 was not woken by the signal: %.3f s (a wait runs 5 s unless something comes)", woken);
  CHECK(cpu < 0.05 * woken, "%.3f s of CPU while asleep %.3f s", cpu, woken);
  s.close();
  return true;
}

// One process: connects to endpoints that cannot work.
bool badEndpoints() {
  printf("--- endpoint\n");
  g_rank = 0;
  CHECK(T->init(&kEnv, &g_ctx) == epSuccess, "init");
  const epTransportCommInfo_v2_t info = commInfo(0, 1500);
  void* comm = nullptr;
  CHECK(T->comm_open(g_ctx, &info, &comm) == epSuccess, "comm_open");
  char msg[512];
  int peer = -1;
  void* conn = nullptr;

  const char junk[] = "tcp://somewhere:1234";
  epResult_t r = T->connect(comm, 1, epTrafficThroughput, junk, sizeof(junk), &conn);
  T->last_error(comm, &peer, msg, sizeof(msg));
  CHECK(r == epInvalidArgument && peer == 1 && strstr(msg, "not a socket transport endpoint"),
        "junk endpoint: %d, peer %d, \"%s\"", int(r), peer, msg);
  printf("    junk: %s\n", msg);

  // A real listener's port, closed again: nobody answers there.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  CHECK(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
            getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0,
        "a free port");
  close(fd);
  epsock::WireEndpoint e{};
  e.magic = epsock::kEndpointMagic;
  e.version = epsock::kWireVersion;
  e.family = 4;
  e.owner_rank = 2;
  e.for_rank = 0;
  e.port = ntohs(a.sin_port);
  memcpy(e.addr, &a.sin_addr, 4);
  r = T->connect(comm, 1, epTrafficThroughput, &e, sizeof(e), &conn);
  T->last_error(comm, &peer, msg, sizeof(msg));
  CHECK(r == epInvalidArgument, "an endpoint of rank 2 taken for rank 1: %d", int(r));

  // Another communicator, so that last_error shows this case's error.
  T->comm_close(comm);
  CHECK(T->comm_open(g_ctx, &info, &comm) == epSuccess, "comm_open");
  e.owner_rank = 1;
  const auto start = Clock::now();
  r = T->connect(comm, 1, epTrafficThroughput, &e, sizeof(e), &conn);
  const double took = secondsSince(start);
  T->last_error(comm, &peer, msg, sizeof(msg));
  const std::string where = "127.0.0.1:" + std::to_string(e.port);
  CHECK(r == epRemoteError && peer == 1 && strstr(msg, where.c_str()) && strstr(msg, "rank 1"),
        "closed port: %d, peer %d, \"%s\"", int(r), peer, msg);
  CHECK(took >= 1.0 && took < 5.0, "gave up after %.2f s with a 1.5 s timeout", took);
  printf("    closed port, after %.2f s: %s\n", took, msg);
  T->comm_close(comm);

  // A rank that listens but never connects back (its endpoint is real, it
  // just never calls connect): bounded by the timeout too.
  void* silent = nullptr;
  const epTransportCommInfo_v2_t other = commInfo(1, 1500);
  CHECK(T->comm_open(g_ctx, &other, &silent) == epSuccess, "comm_open");
  std::vector<uint8_t> ep(EP_TRANSPORT_ENDPOINT_MAX_BYTES);
  size_t n = ep.size();
  CHECK(T->endpoint(silent, 0, epTrafficThroughput, ep.data(), &n) == epSuccess, "endpoint");
  CHECK(T->comm_open(g_ctx, &info, &comm) == epSuccess, "comm_open");
  const auto start2 = Clock::now();
  r = T->connect(comm, 1, epTrafficThroughput, ep.data(), n, &conn);
  const double took2 = secondsSince(start2);
  T->last_error(comm, &peer, msg, sizeof(msg));
  CHECK(r == epRemoteError && peer == 1 && strstr(msg, "no answer") && took2 < 5.0,
        "silent peer: %d after %.2f s, peer %d, \"%s\"", int(r), took2, peer, msg);
  printf("    silent peer, after %.2f s: %s\n", took2, msg);
  T->comm_close(comm);

  // The same wait with a long timeout, ended by the core's abort (epCommAbort
  // 0.3 s into the connect): epAborted at once, not at the timeout.
  epTransportCommInfo_v2_t abortable = commInfo(0, 20000);
  static Clock::time_point abort_at;
  abort_at = Clock::now() + std::chrono::milliseconds(300);
  abortable.aborted = [](void*) { return Clock::now() >= abort_at ? 1 : 0; };
  CHECK(T->comm_open(g_ctx, &abortable, &comm) == epSuccess, "comm_open");
  const auto start3 = Clock::now();
  r = T->connect(comm, 1, epTrafficThroughput, ep.data(), n, &conn);
  const double took3 = secondsSince(start3);
  T->last_error(comm, &peer, msg, sizeof(msg));
  CHECK(r == epAborted && peer == 1 && strstr(msg, "aborted") && took3 < 2.0,
        "aborted connect: %d after %.2f s, peer %d, \"%s\"", int(r), took3, peer, msg);
  printf("    aborted while connecting, after %.2f s: %s\n", took3, msg);
  T->comm_close(comm);
  T->comm_close(silent);
  T->finalize(g_ctx);
  printf("--- endpoint: ok\n");
  return true;
}

double cpuSeconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + double(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Rank 1 listens for the plain stream; rank 0 dials it.
int plainStream(int link) {
  if (g_rank == 1) {
    const int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (bind(l, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(l, 1) != 0 ||
        getsockname(l, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      return -1;
    linkSend(link, &a, sizeof(a));
    const int fd = accept(l, nullptr, nullptr);
    close(l);
    return fd;
  }
  sockaddr_in a{};
  if (!linkRecv(link, &a, sizeof(a))) return -1;
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  return connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 ? fd : -1;
}

bool bench(int link, int runs, int streams) {
  g_params["SOCKET_NSTREAMS"] = std::to_string(streams);
  constexpr size_t kTokens = 8192, kRowBytes = size_t(7168) * 2, kBytes = kTokens * kRowBytes;
  constexpr size_t kSig = kBytes, kAck = kBytes + 64;
  Side s;
  CHECK(setupSide(link, kBytes + 4096, 60000, &s), "setup");
  const int fd = plainStream(link);
  CHECK(fd >= 0, "plain TCP stream");
  if (g_rank == 0)
    for (size_t i = 0; i < kBytes; i++) s.buf[i] = patternByte(7, i);
  std::vector<uint8_t> plain(g_rank == 0 ? 0 : kBytes);
  // Puts as the host backend's rings carry them (256 tokens a chunk), and the
  // whole buffer in one put.
  const size_t chunks[] = {256 * kRowBytes, kBytes};
  std::vector<double> tcp, puts[2];
  double cpu[3] = {0, 0, 0};  // this process's CPU seconds in each mode: tcp, puts[0], puts[1]
  uint64_t value = 0;
  for (int run = 0; run < runs; run++) {
    CHECK(linkBarrier(link), "barrier");
    auto t = Clock::now();
    double c0 = cpuSeconds();
    if (g_rank == 0) {
      CHECK(linkSend(fd, s.buf, kBytes), "plain send");
      char ack;
      CHECK(linkRecv(fd, &ack, 1), "plain ack");
      tcp.push_back(double(kBytes) / secondsSince(t) / 1e9);
    } else {
      CHECK(linkRecv(fd, plain.data(), kBytes), "plain receive");
      CHECK(linkSend(fd, "k", 1), "plain ack");
    }
    cpu[0] += cpuSeconds() - c0;
    for (int c = 0; c < 2; c++) {
      CHECK(linkBarrier(link), "barrier");
      t = Clock::now();
      c0 = cpuSeconds();
      const size_t n = (kBytes + chunks[c] - 1) / chunks[c];
      if (g_rank == 0) {
        for (size_t i = 0; i < n; i++) {
          const size_t off = i * chunks[c], len = std::min(chunks[c], kBytes - off);
          CHECK(putRetry(s, off, off, len, kSig, ++value, EP_PUT_SIGNAL) == epSuccess, "put: %s",
                s.lastError().c_str());
        }
        CHECK(waitSignal(s, kAck, value), "ack");
        puts[c].push_back(double(kBytes) / secondsSince(t) / 1e9);
      } else {
        value += n;
        CHECK(waitSignal(s, kSig, value), "data");
        CHECK(putRetry(s, 0, 0, 0, kAck, value, EP_PUT_SIGNAL) == epSuccess, "ack");
      }
      cpu[1 + c] += cpuSeconds() - c0;
    }
  }
  // CPU per GB moved, both processes together (the I/O thread included).
  double theirs[3];
  CHECK(linkSend(link, cpu, sizeof(cpu)) && linkRecv(link, theirs, sizeof(theirs)), "CPU times");
  const double gb = double(kBytes) * runs / 1e9;
  if (g_rank == 1) {
    for (size_t i = 0; i < kBytes; i++)
      CHECK(s.buf[i] == patternByte(7, i) && plain[i] == s.buf[i], "byte %zu differs", i);
  } else {
    const double base = median(tcp);
    printf("    %zu bytes (%zu tokens x %zu B), %d runs, medians, %d socket stream(s):\n", kBytes, kTokens,
           kRowBytes, runs, streams);
    printf("    plain TCP stream          %6.2f GB/s           CPU %.2f s/GB\n", base, (cpu[0] + theirs[0]) / gb);
    printf("    socket puts of %5.2f MB    %6.2f GB/s  (%.2fx)  CPU %.2f s/GB\n", double(chunks[0]) / 1e6,
           median(puts[0]), median(puts[0]) / base, (cpu[1] + theirs[1]) / gb);
    printf("    socket, one put           %6.2f GB/s  (%.2fx)  CPU %.2f s/GB\n", median(puts[1]),
           median(puts[1]) / base, (cpu[2] + theirs[2]) / gb);
    // Each run's puts against the same run's plain stream (moments apart, so
    // under the same load from the rest of the machine): the median of those.
    std::vector<double> paired[2];
    for (int r = 0; r < runs; r++)
      for (int c = 0; c < 2; c++) paired[c].push_back(puts[c][size_t(r)] / tcp[size_t(r)]);
    printf("    median of per-run ratios: %.2fx (chunks), %.2fx (one put)\n", median(paired[0]), median(paired[1]));
  }
  CHECK(linkBarrier(link), "barrier");
  close(fd);
  s.close();
  g_params.erase("SOCKET_NSTREAMS");
  return true;
}

std::string defaultModule() {
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  std::string dir = n > 0 ? std::string(exe, size_t(n)) : "";
  dir.resize(dir.rfind('/') == std::string::npos ? 0 : dir.rfind('/'));
  return dir + "/../lib/libmoeep-transport-socket.so";
}

}  // namespace

int main(int argc, char** argv) {
  std::string module = defaultModule();
  std::vector<std::string> cases;
  int count = 1500, runs = 7;
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    if (a == "--module" && i + 1 < argc) module = argv[++i];
    else if (a == "--case" && i + 1 < argc) cases.push_back(argv[++i]);
    else if (a == "--puts" && i + 1 < argc) count = atoi(argv[++i]);
    else if (a == "--runs" && i + 1 < argc) runs = atoi(argv[++i]);
    else if (a == "-v") g_verbose = true;
    else {
      fprintf(stderr, "usage: %s [--module PATH] [--case order|killed|goodbye|wait|endpoint|bench]... [--puts N] "
              "[--runs N] [-v]\n", argv[0]);
      return 2;
    }
  }
  if (cases.empty()) cases = {"order", "killed", "goodbye", "wait", "endpoint"};
  setvbuf(stdout, nullptr, _IOLBF, 0);
  if (!loadModule(module)) return 1;
  g_params["SOCKET_IFNAME"] = "lo";
  int passed = 0, failed = 0;
  auto tally = [&](bool ok) { ok ? passed++ : failed++; };
  for (const std::string& c : cases) {
    if (c == "order") {
      for (int streams : {1, 3})
        tally(runPair(("order, " + std::to_string(streams) + " stream(s)").c_str(),
                      [&](int link, pid_t) { return orderCase(link, streams, count, 42 + uint64_t(streams)); }));
      g_params.erase("SOCKET_NSTREAMS");
    } else if (c == "killed") {
      tally(runPair("killed sender", killedSender, 60, true));
      tally(runPair("killed receiver", killedReceiver, 60, true));
    } else if (c == "goodbye") {
      tally(runPair("goodbye", goodbye));
    } else if (c == "wait") {
      tally(runPair("wait", waitCase));
    } else if (c == "endpoint") {
      tally(badEndpoints());
    } else if (c == "bench") {
      for (int streams : {1, 2})
        tally(runPair(("bench, " + std::to_string(streams) + " stream(s)").c_str(),
                      [&](int link, pid_t) { return bench(link, runs, streams); }, 300));
    } else {
      fprintf(stderr, "unknown case %s\n", c.c_str());
      return 2;
    }
  }
  printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
