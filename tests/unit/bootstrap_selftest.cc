// Standalone self-test of the bootstrap (src/bootstrap*.cc, src/socket.cc);
// bootstrap_guard has the cases of strangers on its ports.
//
// Every case runs in its own forked process, so that each can set EP_*
// variables before the library first reads (and caches) them; ranks are forked
// children of the case process and talk over loopback. Built by the Makefile
// (build/tests/bootstrap_selftest) against the library's internal archive.
// Prints "N passed, M failed" and exits non-zero when a case failed. An
// argument runs only the cases whose name contains it.
#include <arpa/inet.h>
#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap.h"
#include "bootstrap_cases.h"
#include "debug.h"
#include "socket.h"

namespace {

// ---- Rank bodies -----------------------------------------------------------------

unsigned char pattern(int rank, size_t i, int round) { return (unsigned char)(rank * 131 + i * 7 + round * 13 + 1); }

int checkSlots(const std::vector<unsigned char>& data, int nranks, size_t bytes, int round) {
  for (int r = 0; r < nranks; r++)
    for (size_t i = 0; i < bytes; i++)
      CHECK(data[size_t(r) * bytes + i] == pattern(r, i, round), "slot %d byte %zu wrong (round %d)", r, i, round);
  return 0;
}

int allGatherRound(ep::Bootstrap* b, int rank, int nranks, size_t bytes, int round) {
  std::vector<unsigned char> data(size_t(nranks) * bytes, 0xEE);
  for (size_t i = 0; i < bytes; i++) data[size_t(rank) * bytes + i] = pattern(rank, i, round);
  epResult_t res = ep::bootstrapAllGather(b, data.data(), bytes);
  CHECK(res == epSuccess, "allgather of %zu bytes: %d %s", bytes, res, ep::threadLastError());
  return checkSlots(data, nranks, bytes, round);
}

int happyRank(const epUniqueId& id, int rank, int nranks) {
  ep::Bootstrap* b = nullptr;
  epResult_t res = ep::bootstrapInit(id, rank, nranks, 5000, nullptr, nullptr, &b);
  CHECK(res == epSuccess && b != nullptr, "init rank %d/%d: %d %s", rank, nranks, res, ep::threadLastError());
  int round = 0;
  // Small, odd, large (beyond socket buffers: exercises partial sends) and zero sizes.
  for (size_t bytes : {size_t(37), size_t(1), size_t(3 << 20) + 5, size_t(8)})
    if (allGatherRound(b, rank, nranks, bytes, round++) != 0) return 1;
  CHECK(ep::bootstrapAllGather(b, nullptr, 0) == epSuccess, "zero-byte allgather");
  for (int i = 0; i < 3; i++)
    CHECK(ep::bootstrapBarrier(b) == epSuccess, "barrier %d: %s", i, ep::threadLastError());
  if (allGatherRound(b, rank, nranks, 64, round++) != 0) return 1;
  CHECK(ep::bootstrapClose(b) == epSuccess, "close");
  return 0;
}

int happyJob(int nranks) {
  epUniqueId id;
  epResult_t res = ep::bootstrapGetUniqueId(&id);
  CHECK(res == epSuccess, "getUniqueId: %s", ep::threadLastError());
  CHECK(ep::bootstrapIdValid(id), "fresh id not valid");
  std::vector<std::function<int()>> ranks;
  for (int r = 0; r < nranks; r++) ranks.push_back([&id, r, nranks] { return happyRank(id, r, nranks); });
  auto codes = runForked(ranks);
  CHECK(allZero(codes), "a rank of %d failed", nranks);
  return 0;
}

// ---- Cases -----------------------------------------------------------------------

int caseParsing() {
  ep::SocketAddress a;
  std::string err;
  CHECK(ep::parseSocketAddress("127.0.0.1:1234", AF_UNSPEC, &a, &err), "%s", err.c_str());
  CHECK(a.family() == AF_INET && a.port() == 1234 && a.toString() == "127.0.0.1:1234", "%s", a.toString().c_str());
  CHECK(ep::parseSocketAddress("[::1]:5678", AF_UNSPEC, &a, &err), "%s", err.c_str());
  CHECK(a.family() == AF_INET6 && a.port() == 5678 && a.toString() == "[::1]:5678", "%s", a.toString().c_str());
  CHECK(ep::parseSocketAddress(" localhost:80 ", AF_INET, &a, &err), "%s", err.c_str());
  CHECK(a.family() == AF_INET && a.isLoopback(), "%s", a.toString().c_str());
  CHECK(!ep::parseSocketAddress("::1:80", AF_UNSPEC, &a, &err) && contains(err.c_str(), "[addr]"), "%s", err.c_str());
  CHECK(!ep::parseSocketAddress("127.0.0.1", AF_UNSPEC, &a, &err), "no port accepted");
  CHECK(!ep::parseSocketAddress("127.0.0.1:99999", AF_UNSPEC, &a, &err), "port range");
  CHECK(!ep::parseSocketAddress("127.0.0.1:http", AF_UNSPEC, &a, &err), "named port");
  CHECK(!ep::parseSocketAddress("[::1]", AF_UNSPEC, &a, &err), "v6 without port");
  CHECK(!ep::parseSocketAddress("[::1]:80", AF_INET, &a, &err), "v6 literal with AF_INET forced");
  CHECK(!ep::parseSocketAddress("[fe80::1%lo]:80", AF_UNSPEC, &a, &err) &&
            contains(err.c_str(), "scope (%lo)"),
        "%s", err.c_str());

  ep::PackedAddress packed;
  ep::SocketAddress back;
  ep::parseSocketAddress("[fd00::1:2]:65535", AF_UNSPEC, &a, &err);
  ep::packAddress(a, &packed);
  CHECK(ep::unpackAddress(packed, &back) && back.toString() == "[fd00::1:2]:65535", "%s", back.toString().c_str());
  ep::parseSocketAddress("10.1.2.3:7", AF_UNSPEC, &a, &err);
  ep::packAddress(a, &packed);
  CHECK(ep::unpackAddress(packed, &back) && back.toString() == "10.1.2.3:7", "%s", back.toString().c_str());

  CHECK(ep::interfaceNameMatches("", "eth0"), "empty spec");
  CHECK(ep::interfaceNameMatches("eth", "eth0"), "prefix");
  CHECK(!ep::interfaceNameMatches("eth", "ib0"), "prefix mismatch");
  CHECK(ep::interfaceNameMatches("ib,eth", "eth1"), "list");
  CHECK(!ep::interfaceNameMatches("=eth", "eth0"), "exact");
  CHECK(ep::interfaceNameMatches("=eth0", "eth0"), "exact match");
  CHECK(!ep::interfaceNameMatches("^docker,lo", "docker0"), "exclude");
  CHECK(ep::interfaceNameMatches("^docker,lo", "eth0"), "exclude other");
  CHECK(ep::interfaceNameMatches("^=eth", "eth0"), "exact exclude");

  CHECK(ep::findInterfaceAddress("lo", AF_INET, &a, nullptr, &err) && a.isLoopback(), "%s", err.c_str());
  CHECK(!ep::findInterfaceAddress("=no_such_if", AF_UNSPEC, &a, nullptr, &err) &&
            contains(err.c_str(), "no_such_if") && contains(err.c_str(), "lo"),
        "%s", err.c_str());
  return 0;
}

int caseHappy(int nranks) { return happyJob(nranks); }

bool haveIpv6Loopback() {
  ep::SocketAddress bound;
  ep::Fd fd;
  std::string err;
  return listenOnFreePort("[::1]:0", AF_INET6, &fd, &bound, &err);
}

int caseIpv6() {
  if (!haveIpv6Loopback()) {
    printf("    (no IPv6 loopback here: skipped)\n");
    return 0;
  }
  setenv("EP_SOCKET_FAMILY", "AF_INET6", 1);
  return happyJob(3);
}

int caseCommId() {
  ep::SocketAddress bound;
  std::string err;
  CHECK(freeLoopbackAddress(&bound, &err), "%s", err.c_str());
  std::string comm_id = bound.toString();
  setenv("EP_COMM_ID", comm_id.c_str(), 1);
  epUniqueId id;
  CHECK(ep::bootstrapGetUniqueId(&id) == epSuccess, "getUniqueId with EP_COMM_ID=%s: %s", comm_id.c_str(),
        ep::threadLastError());
  auto codes = runForked({[&id] { return happyRank(id, 0, 2); }, [&id] { return happyRank(id, 1, 2); }});
  CHECK(allZero(codes), "a rank failed with EP_COMM_ID=%s", comm_id.c_str());
  return 0;
}

// A rank told the outcome (success or timeout) retries with the same
// EP_COMM_ID at once: the root's port is free by then (the root closed its
// listener after the reply, and the retry's bind found it taken).
int caseCommIdRetryAtOnce() {
  ep::SocketAddress bound;
  std::string err;
  CHECK(freeLoopbackAddress(&bound, &err), "%s", err.c_str());
  setenv("EP_COMM_ID", bound.toString().c_str(), 1);
  epUniqueId id;
  CHECK(ep::bootstrapGetUniqueId(&id) == epSuccess, "%s", ep::threadLastError());
  for (int i = 0; i < 60; i++) {
    const int nranks = i % 2 == 0 ? 1 : 2;  // 1: served at once; 2: rank 1 never comes, a timeout
    ep::Bootstrap* b = nullptr;
    const epResult_t res = ep::bootstrapInit(id, 0, nranks, 30, nullptr, nullptr, &b);
    CHECK(res == (nranks == 1 ? epSuccess : epTimeout), "attempt %d with %d ranks: %d (%s)", i, nranks, res,
          ep::threadLastError());
    ep::bootstrapClose(b);
  }
  return 0;
}

// Two launcher jobs on one EP_COMM_ID by mistake: a rank of the second is
// refused by the first job's root, naming the likely cause, instead of
// joining the first job (its ids differ by the job id the launcher sets).
int caseCommIdOtherJob() {
  ep::SocketAddress bound;
  std::string err;
  CHECK(freeLoopbackAddress(&bound, &err), "%s", err.c_str());
  setenv("EP_COMM_ID", bound.toString().c_str(), 1);
  auto rankOfJob = [](const char* job, int rank) {
    setenv("OMPI_MCA_ess_base_jobid", job, 1);
    epUniqueId id;
    CHECK(ep::bootstrapGetUniqueId(&id) == epSuccess, "%s", ep::threadLastError());
    ep::Bootstrap* b = nullptr;
    const epResult_t res = ep::bootstrapInit(id, rank, 2, 1500, nullptr, nullptr, &b);
    if (rank == 0) {  // job A's rank 0 serves the root; its rank 1 never comes
      CHECK(res == epTimeout, "job A rank 0: %d (%s)", res, ep::threadLastError());
      return 0;
    }
    CHECK(res == epInvalidArgument, "job B rank 1 joined job A's root: %d (%s)", res, ep::threadLastError());
    CHECK(contains(ep::threadLastError(), "another launcher job on the same EP_COMM_ID"), "message \"%s\"",
          ep::threadLastError());
    return 0;
  };
  auto codes = runForked({[&] { return rankOfJob("1001", 0); },
                          [&] {
                            usleep(200 * 1000);  // after job A's root listens
                            return rankOfJob("2002", 1);
                          }});
  CHECK(allZero(codes), "job A rank 0 exit %d, job B rank 1 exit %d", codes[0], codes[1]);
  return 0;
}

// Blanks around EP_COMM_ID do not split a job (the address parser ignores
// them, the id's nonce did not); a host name where another rank wrote the
// address does, and the refusal says that every rank must spell it alike.
int caseCommIdSpelling() {
  ep::SocketAddress bound;
  std::string err;
  CHECK(freeLoopbackAddress(&bound, &err), "%s", err.c_str());
  const std::string addr = bound.toString(), port = std::to_string(bound.port());
  auto rankWith = [](const std::string& comm_id, int rank, int timeout_ms, epResult_t want,
                     const char* text) {
    setenv("EP_COMM_ID", comm_id.c_str(), 1);
    setenv("EP_SOCKET_FAMILY", "AF_INET", 1);  // "localhost" is 127.0.0.1, not ::1
    epUniqueId id;
    CHECK(ep::bootstrapGetUniqueId(&id) == epSuccess, "%s", ep::threadLastError());
    ep::Bootstrap* b = nullptr;
    const epResult_t res = ep::bootstrapInit(id, rank, 2, timeout_ms, nullptr, nullptr, &b);
    CHECK(res == want, "rank %d with EP_COMM_ID=\"%s\": %d (%s)", rank, comm_id.c_str(), res,
          ep::threadLastError());
    CHECK(text == nullptr || contains(ep::threadLastError(), text), "message \"%s\"", ep::threadLastError());
    ep::bootstrapClose(b);
    return 0;
  };
  auto codes = runForked({[&] { return rankWith(addr, 0, 5000, epSuccess, nullptr); },
                          [&] { return rankWith(" " + addr + "\t ", 1, 5000, epSuccess, nullptr); }});
  CHECK(allZero(codes), "blanks around EP_COMM_ID: rank exits %d %d", codes[0], codes[1]);
  codes = runForked({[&] { return rankWith(addr, 0, 800, epTimeout, nullptr); },
                     [&] {
                       usleep(100 * 1000);  // after rank 0's root listens
                       return rankWith("localhost:" + port, 1, 800, epInvalidArgument,
                                       "every rank must spell EP_COMM_ID identically");
                     }});
  CHECK(allZero(codes), "a host name for the address: rank exits %d %d", codes[0], codes[1]);
  return 0;
}

// epCommInitAll's ranks are threads of this process: EP_COMM_ID (the job's
// address, here held by another listener) is not theirs to bind.
int caseInitAllIgnoresCommId() {
  ep::SocketAddress bound;
  ep::Fd busy;
  std::string err;
  CHECK(listenOnFreePort("127.0.0.1:0", AF_INET, &busy, &bound, &err), "%s", err.c_str());
  setenv("EP_COMM_ID", bound.toString().c_str(), 1);
  epConfig_t cfg = EP_CONFIG_INITIALIZER;
  cfg.num_experts = 2;
  cfg.hidden = 8;
  cfg.max_tokens_per_rank = 4;
  cfg.max_topk = 1;
  cfg.backend = epBackendHost;
  epComm_t comms[2] = {nullptr, nullptr};
  const epResult_t res = epCommInitAll(comms, 2, nullptr, &cfg);
  CHECK(res == epSuccess, "epCommInitAll with EP_COMM_ID=%s busy: %d (%s)", bound.toString().c_str(), res,
        epGetLastError(nullptr));
  for (epComm_t c : comms) epCommDestroy(c);
  return 0;
}

// EP_COMM_ID names a port where another program answers: the rank says so
// (it used to report the program's bytes as an internal error of the library).
// The program speaks first, as a server that greets its clients does (the
// root speaks first too: its challenge).
int caseForeignRoot() {
  ep::SocketAddress bound;
  ep::Fd server;
  std::string err;
  CHECK(listenOnFreePort("127.0.0.1:0", AF_INET, &server, &bound, &err), "%s", err.c_str());
  std::thread foreign([&server] {
    // The listener is non-blocking: wait for the rank, which may dial after this thread starts.
    pollfd pfd = {server.get(), POLLIN, 0};
    if (poll(&pfd, 1, 5000) != 1) return;
    int fd = accept(server.get(), nullptr, nullptr);
    if (fd < 0) return;
    std::string page = "HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain\r\n\r\n";
    page.resize(1024, 'x');
    ssize_t sent = send(fd, page.data(), page.size(), MSG_NOSIGNAL);
    (void)sent;
    // Whatever the rank says next is read (a close with unread data would reset the page away).
    char sink[256];
    pfd = {fd, POLLIN, 0};
    while (poll(&pfd, 1, 3000) == 1 && recv(fd, sink, sizeof(sink), 0) > 0) {
    }
    close(fd);
  });
  setenv("EP_COMM_ID", bound.toString().c_str(), 1);
  epUniqueId id;
  CHECK(ep::bootstrapGetUniqueId(&id) == epSuccess, "%s", ep::threadLastError());
  ep::Bootstrap* b = nullptr;
  auto t0 = Clock::now();
  epResult_t res = ep::bootstrapInit(id, 1, 2, 3000, nullptr, nullptr, &b);
  foreign.join();
  const char* msg = ep::threadLastError();
  CHECK(res == epRemoteError, "got %d (%s)", res, msg);
  CHECK(contains(msg, "not a moeep bootstrap reply") && contains(msg, "HTTP/1.0 400"), "message \"%s\"", msg);
  CHECK(msSince(t0) < 2500, "took %ld ms", msSince(t0));
  CHECK(b == nullptr, "no bootstrap on failure");
  return 0;
}

// (a) ranks 0 and 1 of 3 come, rank 2 never does.
int caseMissingRank() {
  epUniqueId id;
  CHECK(ep::bootstrapGetUniqueId(&id) == epSuccess, "%s", ep::threadLastError());
  auto body = [&id](int rank) {
    auto t0 = Clock::now();
    ep::Bootstrap* b = nullptr;
    epResult_t res = ep::bootstrapInit(id, rank, 3, 1500, nullptr, nullptr, &b);
    long ms = msSince(t0);
    const char* msg = ep::threadLastError();
    CHECK(res == epTimeout, "rank %d: got %d (%s)", rank, res, msg);
    CHECK(ms >= 1300 && ms <= 5000, "rank %d: timeout after %ld ms, want ~1500", rank, ms);  // slack for a loaded machine
    CHECK(contains(msg, "rank 2 of 3 did not arrive within 1500 ms"), "rank %d: message \"%s\"", rank, msg);
    return 0;
  };
  auto codes = runForked({[&] { return body(0); }, [&] { return body(1); }});
  CHECK(allZero(codes), "missing-rank case");
  return 0;
}

// (b) an abort flag set by another thread unblocks bootstrapInit.
int caseAbortInit() {
  epUniqueId id;
  CHECK(ep::bootstrapGetUniqueId(&id) == epSuccess, "%s", ep::threadLastError());
  std::atomic<int> abort_flag{0};
  std::thread setter([&abort_flag] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    abort_flag.store(1);
  });
  auto t0 = Clock::now();
  ep::Bootstrap* b = nullptr;
  epResult_t res = ep::bootstrapInit(id, 0, 2, 10000, &abort_flag, nullptr, &b);
  long ms = msSince(t0);
  setter.join();
  CHECK(res == epAborted, "got %d (%s)", res, ep::threadLastError());
  CHECK(ms >= 250 && ms < 4000, "abort took %ld ms", ms);  // well before the timeout
  CHECK(b == nullptr, "no bootstrap on failure");
  return 0;
}

// (c) ids that epGetUniqueId did not make.
int caseBadId() {
  epUniqueId id;
  CHECK(ep::bootstrapGetUniqueId(&id) == epSuccess, "%s", ep::threadLastError());
  epUniqueId bad = id;
  bad.internal[0] ^= 0x5a;
  CHECK(!ep::bootstrapIdValid(bad), "corrupted magic accepted");
  ep::Bootstrap* b = nullptr;
  auto t0 = Clock::now();
  epResult_t res = ep::bootstrapInit(bad, 0, 1, 1500, nullptr, nullptr, &b);
  CHECK(res == epInvalidArgument && b == nullptr, "bad magic gave %d", res);
  CHECK(contains(ep::threadLastError(), "unique id"), "message \"%s\"", ep::threadLastError());
  CHECK(msSince(t0) < 200, "rejection was not immediate");
  epUniqueId zero;
  memset(&zero, 0, sizeof(zero));
  CHECK(!ep::bootstrapIdValid(zero), "zero id accepted");
  CHECK(ep::bootstrapInit(zero, 0, 1, 1500, nullptr, nullptr, &b) == epInvalidArgument, "zero id");
  CHECK(ep::bootstrapInit(id, 2, 2, 1500, nullptr, nullptr, &b) == epInvalidArgument, "rank out of range");
  CHECK(ep::bootstrapInit(id, 0, 0, 1500, nullptr, nullptr, &b) == epInvalidArgument, "nranks 0");
  // The real id still works afterwards (a single rank).
  CHECK(ep::bootstrapInit(id, 0, 1, 1500, nullptr, nullptr, &b) == epSuccess, "%s", ep::threadLastError());
  CHECK(ep::bootstrapBarrier(b) == epSuccess, "barrier of one");
  ep::bootstrapClose(b);
  return 0;
}

// A root that is gone: epTimeout naming its address.
int caseRootUnreachable() {
  setenv("EP_TIMEOUT_MS", "200", 1);  // the root gives up 200 ms after nobody came
  epUniqueId id;
  CHECK(ep::bootstrapGetUniqueId(&id) == epSuccess, "%s", ep::threadLastError());
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  auto t0 = Clock::now();
  ep::Bootstrap* b = nullptr;
  epResult_t res = ep::bootstrapInit(id, 0, 1, 700, nullptr, nullptr, &b);
  long ms = msSince(t0);
  const char* msg = ep::threadLastError();
  CHECK(res == epTimeout, "got %d (%s)", res, msg);
  CHECK(ms >= 650 && ms < 3000, "took %ld ms", ms);  // slack for a loaded machine
  CHECK(contains(msg, "root at 127.0.0.1:"), "message \"%s\"", msg);
  return 0;
}

// A process forked after epGetUniqueId (a launcher's rank) does not keep the
// root's port open once the root exited: a late rank is refused at once and
// told that the id may be spent, instead of waiting for an answer that the
// child's inherited listener never gives.
int caseForkedChildDropsRoot() {
  epUniqueId id;
  CHECK(ep::bootstrapGetUniqueId(&id) == epSuccess, "%s", ep::threadLastError());
  int hold[2], ready[2];
  CHECK(pipe(hold) == 0 && pipe(ready) == 0, "pipe");
  fflush(stdout);
  fflush(stderr);
  const pid_t child = fork();
  if (child == 0) {  // says it runs (fork's handlers are done), then waits until the parent closes its end
    close(hold[1]);
    char c = 1;
    if (write(ready[1], &c, 1) != 1) _exit(2);
    _exit(read(hold[0], &c, 1) < 0 ? 1 : 0);
  }
  close(hold[0]);
  close(ready[1]);
  char c;
  CHECK(child > 0 && read(ready[0], &c, 1) == 1, "forked child did not start");
  close(ready[0]);
  ep::Bootstrap* b = nullptr;
  epResult_t res = ep::bootstrapInit(id, 0, 1, 3000, nullptr, nullptr, &b);
  ep::bootstrapClose(b);
  b = nullptr;
  const epResult_t late = res == epSuccess ? ep::bootstrapInit(id, 0, 1, 500, nullptr, nullptr, &b) : res;
  const std::string msg = ep::threadLastError();
  close(hold[1]);
  CHECK(child > 0 && waitChild(child, 5000) == 0, "forked child");
  CHECK(res == epSuccess, "the first init: %d (%s)", res, msg.c_str());
  CHECK(late == epTimeout && b == nullptr, "the late init: %d (%s)", late, msg.c_str());
  CHECK(contains(msg.c_str(), "could not reach the root") && contains(msg.c_str(), "the id may be spent"),
        "message \"%s\"", msg.c_str());
  return 0;
}

// 24 forked ranks join a root whose process may open only a few files more
// than it has open. Ranks wait on a pipe until the limit is set; each exits
// 0 (joined), 10 (timed out, told that the root ran out of descriptors), 11
// (the root reset its connection, saying that it may have) or 1.
std::vector<int> jobWithFewFds(bool lower_hard_limit, int timeout_ms) {
  constexpr int kRanks = 24;
  epUniqueId id;
  int go[2];
  if (ep::bootstrapGetUniqueId(&id) != epSuccess || pipe(go) != 0) return {};
  auto rank = [&id, &go, timeout_ms](int r) {
    close(go[1]);
    char c;
    if (read(go[0], &c, 1) != 0) return 2;
    ep::Bootstrap* b = nullptr;
    const epResult_t res = ep::bootstrapInit(id, r, kRanks, timeout_ms, nullptr, nullptr, &b);
    const char* msg = ep::threadLastError();
    if (res == epSuccess && ep::bootstrapBarrier(b) == epSuccess) return 0;
    if (res == epTimeout && contains(msg, "the root ran out of file descriptors")) return 10;
    if (res == epRemoteError && contains(msg, "out of file descriptors")) return 11;
    fprintf(stderr, "    rank %d: %d (%s)\n", r, res, msg);
    return 1;
  };
  std::vector<pid_t> pids;
  for (int r = 0; r < kRanks; r++) {
    fflush(stdout);
    fflush(stderr);
    const pid_t pid = fork();
    if (pid == 0) _exit(rank(r));
    pids.push_back(pid);
  }
  close(go[0]);
  rlimit lim;
  getrlimit(RLIMIT_NOFILE, &lim);
  lim.rlim_cur = rlim_t(countOpenFds() + 5);  // room for a few ranks
  if (lower_hard_limit) lim.rlim_max = lim.rlim_cur;
  setrlimit(RLIMIT_NOFILE, &lim);
  close(go[1]);  // go
  std::vector<int> codes;
  for (pid_t pid : pids) codes.push_back(pid > 0 ? waitChild(pid, 12000) : 96);
  return codes;
}

// With room under the hard limit, the root raises the soft one for its ranks.
int caseRootRaisesFdLimit() {
  rlimit lim;
  CHECK(getrlimit(RLIMIT_NOFILE, &lim) == 0, "getrlimit");
  if (lim.rlim_max != RLIM_INFINITY && lim.rlim_max < rlim_t(countOpenFds() + 100)) {
    printf("    (hard limit on open files too low here: skipped)\n");
    return 0;
  }
  auto codes = jobWithFewFds(false, 5000);
  CHECK(codes.size() == 24 && allZero(codes), "a rank failed");
  return 0;
}

// Without: the root does not spin (it polled a listener it could not accept
// from, at 100% CPU until the deadline) and the ranks hear why.
int caseRootOutOfFds() {
  rusage before, after;
  getrusage(RUSAGE_SELF, &before);
  auto codes = jobWithFewFds(true, 1500);
  getrusage(RUSAGE_SELF, &after);
  const auto ms = [](const rusage& u) {
    return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1000L + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1000;
  };
  const long cpu_ms = ms(after) - ms(before);
  CHECK(cpu_ms < 500, "the root's process used %ld ms of CPU in ~1.5 s", cpu_ms);
  int told = 0;
  for (int c : codes) {
    CHECK(c == 10 || c == 11, "a rank exited %d", c);
    told += c == 10;
  }
  CHECK(codes.size() == 24 && told > 0, "%d ranks, %d told that the root ran out of descriptors",
        int(codes.size()), told);
  return 0;
}

// One rank never calls the allgather: the other names it.
int caseRingTimeout() {
  epUniqueId id;
  CHECK(ep::bootstrapGetUniqueId(&id) == epSuccess, "%s", ep::threadLastError());
  auto codes = runForked({[&id] {
                            ep::Bootstrap* b = nullptr;
                            CHECK(ep::bootstrapInit(id, 0, 2, 1000, nullptr, nullptr, &b) == epSuccess, "%s",
                                  ep::threadLastError());
                            int v[2] = {7, 0};
                            auto t0 = Clock::now();
                            epResult_t res = ep::bootstrapAllGather(b, v, sizeof(int));
                            long ms = msSince(t0);
                            CHECK(res == epTimeout, "got %d (%s)", res, ep::threadLastError());
                            CHECK(ms >= 900 && ms < 3500, "took %ld ms", ms);  // before the peer leaves
                            CHECK(contains(ep::threadLastError(), "rank 1 did not answer the allgather"),
                                  "message \"%s\"", ep::threadLastError());
                            CHECK(ep::bootstrapBarrier(b) == epRemoteError, "broken ring not reported");
                            ep::bootstrapClose(b);
                            return 0;
                          },
                          [&id] {
                            ep::Bootstrap* b = nullptr;
                            CHECK(ep::bootstrapInit(id, 1, 2, 1000, nullptr, nullptr, &b) == epSuccess, "%s",
                                  ep::threadLastError());
                            // Leaves well after rank 0's 1 s timeout, even on a loaded machine.
                            std::this_thread::sleep_for(std::chrono::milliseconds(4000));
                            ep::bootstrapClose(b);
                            return 0;
                          }});
  CHECK(allZero(codes), "ring-timeout case");
  return 0;
}

// bootstrapAbort from another thread unblocks a waiting barrier; the peer hears of it.
int caseAbortRing() {
  epUniqueId id;
  CHECK(ep::bootstrapGetUniqueId(&id) == epSuccess, "%s", ep::threadLastError());
  auto codes = runForked({[&id] {
                            ep::Bootstrap* b = nullptr;
                            CHECK(ep::bootstrapInit(id, 0, 2, 5000, nullptr, nullptr, &b) == epSuccess, "%s",
                                  ep::threadLastError());
                            std::thread aborter([b] {
                              std::this_thread::sleep_for(std::chrono::milliseconds(300));
                              ep::bootstrapAbort(b);
                            });
                            auto t0 = Clock::now();
                            epResult_t res = ep::bootstrapBarrier(b);
                            long ms = msSince(t0);
                            aborter.join();
                            CHECK(res == epAborted, "got %d (%s)", res, ep::threadLastError());
                            CHECK(ms >= 250 && ms < 4000, "abort took %ld ms", ms);  // well before the timeout
                            CHECK(ep::bootstrapBarrier(b) == epAborted, "later call not aborted");
                            ep::bootstrapClose(b);
                            return 0;
                          },
                          [&id] {
                            ep::Bootstrap* b = nullptr;
                            CHECK(ep::bootstrapInit(id, 1, 2, 5000, nullptr, nullptr, &b) == epSuccess, "%s",
                                  ep::threadLastError());
                            std::this_thread::sleep_for(std::chrono::milliseconds(600));
                            // Rank 0 shut its connections down: this fails at once, not after 5 s.
                            auto t0 = Clock::now();
                            epResult_t res = ep::bootstrapBarrier(b);
                            CHECK(res == epRemoteError && msSince(t0) < 1000, "got %d after %ld ms (%s)", res,
                                  msSince(t0), ep::threadLastError());
                            ep::bootstrapClose(b);
                            return 0;
                          }});
  CHECK(allZero(codes), "abort-ring case");
  return 0;
}

// Different sizes on different ranks fail with a message instead of hanging.
int caseSizeMismatch() {
  epUniqueId id;
  CHECK(ep::bootstrapGetUniqueId(&id) == epSuccess, "%s", ep::threadLastError());
  auto body = [&id](int rank) {
    ep::Bootstrap* b = nullptr;
    CHECK(ep::bootstrapInit(id, rank, 2, 2000, nullptr, nullptr, &b) == epSuccess, "%s", ep::threadLastError());
    std::vector<char> data(64);
    epResult_t res = ep::bootstrapAllGather(b, data.data(), rank == 0 ? 8 : 16);
    CHECK(res == epInvalidUsage, "rank %d got %d (%s)", rank, res, ep::threadLastError());
    CHECK(contains(ep::threadLastError(), "bytes per rank"), "message \"%s\"", ep::threadLastError());
    ep::bootstrapClose(b);
    return 0;
  };
  auto codes = runForked({[&] { return body(0); }, [&] { return body(1); }});
  CHECK(allZero(codes), "size-mismatch case");
  return 0;
}

// Two processes claim rank 0: the second is turned away, the first times out on rank 1.
int caseDuplicateRank() {
  epUniqueId id;
  CHECK(ep::bootstrapGetUniqueId(&id) == epSuccess, "%s", ep::threadLastError());
  auto body = [&id](int delay_ms) {
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    ep::Bootstrap* b = nullptr;
    epResult_t res = ep::bootstrapInit(id, 0, 2, 1000, nullptr, nullptr, &b);
    const char* msg = ep::threadLastError();
    if (res == epInvalidUsage && contains(msg, "arrived twice")) return 10;
    if (res == epTimeout && contains(msg, "rank 1 of 2 did not arrive")) return 11;
    fprintf(stderr, "    unexpected %d (%s)\n", res, msg);
    return 1;
  };
  auto codes = runForked({[&] { return body(0); }, [&] { return body(200); }});
  CHECK(codes.size() == 2 && codes[0] == 11 && codes[1] == 10, "codes %d %d", codes[0], codes[1]);
  return 0;
}

// Ranks call different collectives: the rank that finds the mismatch tells its
// successor why it leaves, so that rank does not report an unexplained exit.
int caseMismatchNotice() {
  epUniqueId id;
  CHECK(ep::bootstrapGetUniqueId(&id) == epSuccess, "%s", ep::threadLastError());
  auto body = [&id](int rank) {
    ep::Bootstrap* b = nullptr;
    CHECK(ep::bootstrapInit(id, rank, 3, 3000, nullptr, nullptr, &b) == epSuccess, "%s", ep::threadLastError());
    std::vector<char> data(3 * 8);
    auto t0 = Clock::now();
    epResult_t res = rank == 0 ? ep::bootstrapBarrier(b) : ep::bootstrapAllGather(b, data.data(), 8);
    std::string msg = ep::threadLastError();
    if (rank == 2) {
      CHECK(res == epRemoteError && contains(msg.c_str(), "rank 1 failed") && msSince(t0) < 2000,
            "rank 2 got %d after %ld ms (%s)", res, msSince(t0), msg.c_str());
    } else {
      CHECK(res == epInvalidUsage, "rank %d got %d (%s)", rank, res, msg.c_str());
    }
    // As commInitRank does after a failed init.
    ep::bootstrapNotifyFailure(b, res, msg.c_str());
    ep::bootstrapClose(b);
    return 0;
  };
  auto codes = runForked({[&] { return body(0); }, [&] { return body(1); }, [&] { return body(2); }});
  CHECK(allZero(codes), "mismatch-notice case");
  return 0;
}

// A rank whose predecessor leaves while a large frame to its successor is half
// sent passes the notice on without garbling the successor's stream: the ranks
// after it name the rank that left, not the one that passed the news on.
int caseNoticeAfterPartialSend() {
  epUniqueId id;
  CHECK(ep::bootstrapGetUniqueId(&id) == epSuccess, "%s", ep::threadLastError());
  const size_t bytes = size_t(16) << 20;  // far beyond the socket buffers
  auto body = [&id, bytes](int rank) {
    ep::Bootstrap* b = nullptr;
    CHECK(ep::bootstrapInit(id, rank, 4, 6000, nullptr, nullptr, &b) == epSuccess, "%s", ep::threadLastError());
    std::vector<char> data(4 * bytes, char(rank));
    // The times below count from one moment on every rank: the ranks' inits
    // end hundreds of milliseconds apart on a loaded machine.
    CHECK(ep::bootstrapBarrier(b) == epSuccess, "%s", ep::threadLastError());
    std::thread aborter;
    if (rank == 0)  // leaves while rank 1 waits for rank 2 to take its first frame
      aborter = std::thread([b] {
        std::this_thread::sleep_for(std::chrono::milliseconds(400));
        ep::bootstrapAbort(b);
      });
    // Rank 2 reads nothing until rank 0 has left (400 ms), but starts well
    // within the second that rank 1 gives it to take the rest of the frame
    // (kNoticeWaitMs): 900 ms leaves half a second either way for the ranks'
    // inits to end at different times (at 1200 ms it failed now and then).
    if (rank == 2) std::this_thread::sleep_for(std::chrono::milliseconds(900));
    epResult_t res = ep::bootstrapAllGather(b, data.data(), bytes);
    std::string msg = ep::threadLastError();
    if (aborter.joinable()) aborter.join();
    if (rank >= 2)
      CHECK(res == epRemoteError && contains(msg.c_str(), "rank 0 left"), "rank %d got %d (%s)", rank, res,
            msg.c_str());
    ep::bootstrapNotifyFailure(b, res, msg.c_str());
    ep::bootstrapClose(b);
    return 0;
  };
  auto codes = runForked({[&] { return body(0); }, [&] { return body(1); }, [&] { return body(2); },
                          [&] { return body(3); }});
  CHECK(allZero(codes), "partial-send notice case");
  return 0;
}

// EP_TIMEOUT_MS far beyond int (the caller gives its own timeout): the root
// must not compute an overflowed, already passed deadline and leave at once.
int caseHugeEnvTimeout() {
  setenv("EP_TIMEOUT_MS", "10000000000000", 1);  // this case's process only
  epUniqueId id;
  CHECK(ep::bootstrapGetUniqueId(&id) == epSuccess, "%s", ep::threadLastError());
  ep::Bootstrap* b = nullptr;
  epResult_t res = ep::bootstrapInit(id, 0, 1, 2000, nullptr, nullptr, &b);
  CHECK(res == epSuccess, "got %d (%s)", res, ep::threadLastError());
  ep::bootstrapClose(b);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);  // belt and braces: the library uses MSG_NOSIGNAL itself
  // Loopback only, whatever interfaces this machine has; before any param is read.
  setenv("EP_SOCKET_IFNAME", "lo", 1);
  unsetenv("EP_COMM_ID");
  unsetenv("EP_SOCKET_FAMILY");
  unsetenv("EP_TIMEOUT_MS");

  struct Case {
    const char* name;
    std::function<int()> run;
  };
  std::vector<Case> cases = {
      {"parsing and interfaces", caseParsing},
      {"1 rank", [] { return caseHappy(1); }},
      {"2 ranks", [] { return caseHappy(2); }},
      {"3 ranks", [] { return caseHappy(3); }},
      {"4 ranks", [] { return caseHappy(4); }},
      {"3 ranks over IPv6", caseIpv6},
      {"2 ranks with EP_COMM_ID", caseCommId},
      {"another program on the EP_COMM_ID port", caseForeignRoot},
      {"epCommInitAll does not bind EP_COMM_ID", caseInitAllIgnoresCommId},
      {"another job on the EP_COMM_ID is refused", caseCommIdOtherJob},
      {"EP_COMM_ID reused at once after init", caseCommIdRetryAtOnce},
      {"EP_COMM_ID spelt differently across ranks", caseCommIdSpelling},
      {"missing rank times out naming it", caseMissingRank},
      {"abort flag unblocks init", caseAbortInit},
      {"bad unique id rejected", caseBadId},
      {"unreachable root times out naming it", caseRootUnreachable},
      {"a forked child does not keep the root's port", caseForkedChildDropsRoot},
      {"the root raises a low open files limit", caseRootRaisesFdLimit},
      {"a root out of file descriptors", caseRootOutOfFds},
      {"silent ring peer times out naming it", caseRingTimeout},
      {"bootstrapAbort unblocks a barrier", caseAbortRing},
      {"allgather size mismatch", caseSizeMismatch},
      {"duplicate rank rejected", caseDuplicateRank},
      {"collective mismatch is passed on", caseMismatchNotice},
      {"notice after a half-sent frame", caseNoticeAfterPartialSend},
      {"a huge EP_TIMEOUT_MS does not end the root", caseHugeEnvTimeout},
  };
  int passed = 0, failed = 0;
  auto t_all = Clock::now();
  for (const Case& c : cases) {
    if (argc > 1 && strstr(c.name, argv[1]) == nullptr) continue;  // optional filter: a part of the case's name
    auto t0 = Clock::now();
    // Each case in its own process: fresh parameter cache, and a hang cannot stop the run.
    int code = runForked({c.run}, 15000)[0];
    bool ok = code == 0;
    printf("%s %-40s %5ld ms\n", ok ? "PASS" : "FAIL", c.name, msSince(t0));
    fflush(stdout);
    (ok ? passed : failed)++;
  }
  printf("%d passed, %d failed (%ld ms)\n", passed, failed, msSince(t_all));
  return failed == 0 ? 0 : 1;
}
