// Failures must give an error code and a message, never a crash or a hang.
//
//   mp_errors [--only NAME]
//
// Each scenario forks its own ranks (MPI-free launcher) and checks the result
// code, the message and the time it took.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <thread>

#include "common/launch.h"
#include "mp_common.h"

using namespace mp;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kTimeoutMs = 1500;

epConfig_t smallConfig(int hidden = 64) {
  epConfig_t cfg = EP_CONFIG_INITIALIZER;
  cfg.num_experts = 12;
  cfg.hidden = hidden;
  cfg.max_tokens_per_rank = 32;
  cfg.max_topk = 4;
  cfg.backend = epBackendHost;
  cfg.timeout_ms = kTimeoutMs;
  return cfg;
}

double secondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

bool contains(const char* text, const char* part) { return text != nullptr && strstr(text, part) != nullptr; }

struct Tokens {
  std::vector<uint16_t> x;
  std::vector<int64_t> topk;
  std::vector<float> w;
  int n;
  Tokens(int n_, int hidden, int topk_, int experts, uint64_t seed) : n(n_) {
    Rng rng(seed);
    x.resize(size_t(n) * hidden);
    for (auto& v : x) v = toBf16(rng.uniform());
    topk.resize(size_t(n) * topk_);
    for (int t = 0; t < n; t++)
      for (int k = 0; k < topk_; k++) topk[size_t(t) * topk_ + k] = (t + k * 3) % experts;
    w.assign(size_t(n) * topk_, 0.5f);
  }
};

epDispatchArgs_t dispatchArgs(Tokens& tk, int topk, std::vector<uint16_t>& recv, int64_t capacity) {
  epDispatchArgs_t a = EP_DISPATCH_ARGS_INITIALIZER;
  a.x = tk.x.data();
  a.x_type = epBfloat16;
  a.topk_idx = tk.topk.data();
  a.topk_idx_type = epInt64;
  a.topk_weights = tk.w.data();
  a.num_tokens = tk.n;
  a.num_topk = topk;
  a.recv_x = recv.data();
  a.recv_capacity = capacity;
  a.flags = EP_DISPATCH_NO_HOST_SYNC;
  return a;
}

// This rank's communicator of cfg; nullptr, with a failed check, when its
// init fails.
epComm_t joinOrFail(const LaunchInfo& li, Tally* t, const epConfig_t& cfg) {
  epComm_t comm = nullptr;
  if (epCommInitRank(&comm, li.nranks, li.id, li.rank, &cfg) != epSuccess) {
    t->check(false, "init", li.rank);
    return nullptr;
  }
  return comm;
}

// The inputs of one small dispatch: 16 tokens of hidden 64, top-2 of 12
// experts, into 64 rows (the args point into the members: not copied).
struct SmallDispatch {
  Tokens tk;
  std::vector<uint16_t> recv;
  epDispatchArgs_t a;
  explicit SmallDispatch(uint64_t seed = 7) : tk(16, 64, 2, 12, seed), recv(64 * 64), a(dispatchArgs(tk, 2, recv, 64)) {}
  SmallDispatch(const SmallDispatch&) = delete;
  SmallDispatch& operator=(const SmallDispatch&) = delete;
};

// --- scenarios: each returns failures on this rank ---------------------------

int configMismatch(const LaunchInfo& li, Tally* t) {
  epConfig_t cfg = smallConfig(li.rank == 1 ? 32 : 64);
  epComm_t comm = nullptr;
  epResult_t res = epCommInitRank(&comm, li.nranks, li.id, li.rank, &cfg);
  t->check(res == epInvalidArgument, "config mismatch gives epInvalidArgument", li.rank);
  t->check(contains(epGetLastError(nullptr), "config differs") && contains(epGetLastError(nullptr), "hidden"),
           "message names the differing field", li.rank);
  t->check(comm == nullptr, "no communicator on failure", li.rank);
  return 0;
}

// Rank 1 alone sets an EP_* variable that the ranks must agree on; init
// refuses on every rank with epInvalidArgument and a message containing every
// one of needles.
void oneRankSetsEnv(const LaunchInfo& li, Tally* t, const char* var, const char* value,
                    std::initializer_list<const char*> needles) {
  if (li.rank == 1) setenv(var, value, 1);  // read first by this init
  epConfig_t cfg = smallConfig();
  epComm_t comm = nullptr;
  epResult_t res = epCommInitRank(&comm, li.nranks, li.id, li.rank, &cfg);
  t->check(res == epInvalidArgument, "a setting on one rank only gives epInvalidArgument", li.rank);
  bool named = true;
  for (const char* needle : needles) named &= contains(epGetLastError(nullptr), needle);
  t->check(named, "message names the setting", li.rank);
  t->check(comm == nullptr, "no communicator on failure", li.rank);
}

// Ranks whose host rings are laid out differently (EP_HOST_CHUNK_TOKENS on one
// rank only) would write past each other's rings: init refuses, naming it.
int ringMismatch(const LaunchInfo& li, Tally* t) {
  oneRankSetsEnv(li, t, "EP_HOST_CHUNK_TOKENS", "16", {"config differs", "host_chunk_tokens"});
  return 0;
}

// EP_NODE_SIZE on one rank only would give the ranks different node maps
// (and forwarding plans): init refuses, naming it.
int nodeSizeMismatch(const LaunchInfo& li, Tally* t) {
  oneRankSetsEnv(li, t, "EP_NODE_SIZE", "1", {"EP_NODE_SIZE differs across ranks"});
  return 0;
}

// EP_TEST_STAGED on one rank only would make one rank stage its calls and
// the others not (on GPUs, EP_CUDA_NETWORK would pick another backend):
// init refuses, naming the variables.
int stagingMismatch(const LaunchInfo& li, Tally* t) {
  oneRankSetsEnv(li, t, "EP_TEST_STAGED", "1", {"EP_CUDA_NETWORK / EP_TEST_STAGED differ across ranks"});
  return 0;
}

// InfiniBand settings on one rank only: both ends of a connection must open
// the same queue pairs, and a service level set on some ranks only is a setup
// mistake; init refuses, naming the field and its variable.
int ibQpsMismatch(const LaunchInfo& li, Tally* t) {
  oneRankSetsEnv(li, t, "EP_IB_QPS_PER_PEER", "2", {"config differs", "ib_qps_per_peer", "EP_IB_QPS_PER_PEER"});
  return 0;
}
int ibSlMismatch(const LaunchInfo& li, Tally* t) {
  oneRankSetsEnv(li, t, "EP_IB_SL_CONTROL", "3", {"config differs", "ib_sl_control", "EP_IB_SL_CONTROL"});
  return 0;
}

// The GID index names an entry of the local port's GID table, which may
// differ between hosts: one rank's own choice is accepted.
int ibGidPerRank(const LaunchInfo& li, Tally* t) {
  if (li.rank == 1) setenv("EP_IB_GID_INDEX", "3", 1);
  epConfig_t cfg = smallConfig();
  epComm_t comm = nullptr;
  epResult_t res = epCommInitRank(&comm, li.nranks, li.id, li.rank, &cfg);
  t->check(res == epSuccess, "a GID index on one rank only is accepted", li.rank);
  if (res != epSuccess) fprintf(stderr, "  message: %s\n", epGetLastError(nullptr));
  if (comm) epCommDestroy(comm);
  return 0;
}

int missingRank(const LaunchInfo& li, Tally* t) {
  if (li.rank == 2) _exit(0);  // never arrives
  epConfig_t cfg = smallConfig();
  epComm_t comm = nullptr;
  auto t0 = Clock::now();
  epResult_t res = epCommInitRank(&comm, li.nranks, li.id, li.rank, &cfg);
  double s = secondsSince(t0);
  t->check(res == epTimeout, "missing rank gives epTimeout", li.rank);
  t->check(contains(epGetLastError(nullptr), "2"), "message names rank 2", li.rank);
  if (!contains(epGetLastError(nullptr), "2")) fprintf(stderr, "  message: %s\n", epGetLastError(nullptr));
  t->check(s < kTimeoutMs / 1000.0 + 5.0, "within the timeout", li.rank);
  return 0;
}

// Rank F = nranks / 2 fails its init once the ring stands (EP_TEST_FAIL_INIT),
// as a rank whose backend cannot start would. Every other rank, waiting in a
// ring collective, must fail naming rank F and giving its reason, before its
// own timeout: its successor hears it from rank F, the ranks after it from
// their predecessors, and rank F's predecessor, which sees it gone, listens
// for the notice coming round the other way. With 2 ranks the other rank is
// both its successor and its predecessor.
int rankFailsInit(const LaunchInfo& li, Tally* t) {
  const int failing = li.nranks / 2;
  if (li.rank == failing) setenv("EP_TEST_FAIL_INIT", "1", 1);
  epConfig_t cfg = smallConfig();
  epComm_t comm = nullptr;
  auto t0 = Clock::now();
  epResult_t res = epCommInitRank(&comm, li.nranks, li.id, li.rank, &cfg);
  double s = secondsSince(t0);
  const char* msg = epGetLastError(nullptr);
  t->check(res != epSuccess && comm == nullptr, "init fails on every rank", li.rank);
  if (li.rank == failing) return 0;
  const std::string name = "rank " + std::to_string(failing);
  t->check(res == epRemoteError, "epRemoteError", li.rank);
  t->check(contains(msg, name.c_str()), "message names the failing rank", li.rank);
  t->check(contains(msg, "on purpose"), "message gives its reason", li.rank);
  if (!contains(msg, name.c_str()) || !contains(msg, "on purpose"))
    fprintf(stderr, "  rank %d message: %s\n", li.rank, msg);
  t->check(s < kTimeoutMs / 1000.0, "before the timeout", li.rank);
  return 0;
}

int rankExits(const LaunchInfo& li, Tally* t) {
  epConfig_t cfg = smallConfig();
  epComm_t comm = joinOrFail(li, t, cfg);
  if (comm == nullptr) return 0;
  if (li.rank == 1) _exit(0);  // leaves without a word
  SmallDispatch d;
  epDispatchArgs_t& a = d.a;
  epHandle_t h = nullptr;
  auto t0 = Clock::now();
  epResult_t res = epDispatch(comm, &a, &h, nullptr);
  double s = secondsSince(t0);
  t->check(res == epRemoteError || res == epTimeout, "dispatch to a dead rank fails", li.rank);
  t->check(contains(epGetLastError(comm), "rank 1"), "message names rank 1", li.rank);
  t->check(s < kTimeoutMs / 1000.0 + 5.0, "within the timeout", li.rank);
  res = epDispatch(comm, &a, &h, nullptr);
  t->check(res != epSuccess, "a failed communicator refuses further calls", li.rank);
  t->check(epCommDestroy(comm) == epSuccess, "destroy after failure", li.rank);
  return 0;
}

// A rank that lives but never makes the call: the other's dispatch times out
// naming it and saying where it is (its latest call, written beside its ring
// head): it has not made this one.
int rankSkipsCall(const LaunchInfo& li, Tally* t) {
  epConfig_t cfg = smallConfig();
  epComm_t comm = joinOrFail(li, t, cfg);
  if (comm == nullptr) return 0;
  if (li.rank == 1) {  // busy elsewhere past the peer's timeout, then leaves properly
    std::this_thread::sleep_for(std::chrono::milliseconds(kTimeoutMs + 1500));
    epCommDestroy(comm);
    return 0;
  }
  SmallDispatch d;
  epDispatchArgs_t& a = d.a;
  epHandle_t h = nullptr;
  epResult_t res = epDispatch(comm, &a, &h, nullptr);
  const char* msg = epGetLastError(comm);
  t->check(res == epTimeout, "a rank that never calls: epTimeout", li.rank);
  const char* want = "rank 1 has not sent its data (its latest call on this communicator is 0: it has not made this one)";
  t->check(contains(msg, want), "the message says that rank 1 has not made the call", li.rank);
  if (!contains(msg, want) || getenv("MP_ERRORS_VERBOSE")) fprintf(stderr, "  message: %s\n", msg);
  epCommDestroy(comm);
  return 0;
}

int abortUnblocks(const LaunchInfo& li, Tally* t) {
  epConfig_t cfg = smallConfig();
  cfg.timeout_ms = 60000;  // the abort, not the timeout, must end the wait
  epComm_t comm = joinOrFail(li, t, cfg);
  if (comm == nullptr) return 0;
  if (li.rank == 1) {  // busy elsewhere: never joins the dispatch
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    epCommDestroy(comm);
    return 0;
  }
  std::thread aborter([comm] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    epCommAbort(comm);
  });
  SmallDispatch d;
  epDispatchArgs_t& a = d.a;
  epHandle_t h = nullptr;
  auto t0 = Clock::now();
  epResult_t res = epDispatch(comm, &a, &h, nullptr);
  double s = secondsSince(t0);
  aborter.join();
  t->check(res == epAborted, "epCommAbort unblocks a waiting dispatch", li.rank);
  t->check(s < 2.0, "promptly", li.rank);
  return 0;
}

int badArgs(const LaunchInfo& li, Tally* t) {
  epConfig_t cfg = smallConfig();
  epComm_t comm = joinOrFail(li, t, cfg);
  if (comm == nullptr) return 0;
  const int K = 2;
  Tokens tk(16, 64, K, 12, 11 + li.rank);
  std::vector<uint16_t> recv(64 * 64, 0);
  epHandle_t h = nullptr;
  if (li.rank == 0) {  // local argument errors: no communication happens
    epDispatchArgs_t a = dispatchArgs(tk, K, recv, 64);
    t->check(epDispatch(comm, nullptr, &h, nullptr) == epInvalidArgument, "NULL args", 0);
    t->check(epDispatch(comm, &a, nullptr, nullptr) == epInvalidArgument, "NULL handle pointer", 0);
    epDispatchArgs_t b = a;
    b.magic = 0;
    t->check(epDispatch(comm, &b, &h, nullptr) == epInvalidArgument, "wrong magic", 0);
    b = a;
    b.x = nullptr;
    t->check(epDispatch(comm, &b, &h, nullptr) == epInvalidArgument && contains(epGetLastError(comm), "x is NULL"),
             "NULL x named", 0);
    b = a;
    b.x_type = epFloat32;
    t->check(epDispatch(comm, &b, &h, nullptr) == epInvalidArgument && contains(epGetLastError(comm), "x_type"),
             "wrong x_type named", 0);
    b = a;
    b.num_tokens = 33;
    t->check(epDispatch(comm, &b, &h, nullptr) == epInvalidArgument && contains(epGetLastError(comm), "num_tokens"),
             "too many tokens named", 0);
    b = a;
    b.num_topk = 0;
    t->check(epDispatch(comm, &b, &h, nullptr) == epInvalidArgument, "top-k 0", 0);
    std::vector<int64_t> bad = tk.topk;
    bad[5] = 12;  // one past the last expert
    b = a;
    b.topk_idx = bad.data();
    t->check(epDispatch(comm, &b, &h, nullptr) == epInvalidArgument && contains(epGetLastError(comm), "topk_idx[2][1]"),
             "expert id out of range named with its position", 0);
    bad[5] = -2;
    t->check(epDispatch(comm, &b, &h, nullptr) == epInvalidArgument, "expert id -2", 0);
    epCombineArgs_t c = EP_COMBINE_ARGS_INITIALIZER;
    t->check(epCombine(comm, &c, nullptr, nullptr) == epInvalidArgument, "combine with NULL handle", 0);
    t->check(h == nullptr, "no handle was created by failed calls", 0);
  }
  // A collective with too small an output on rank 0: it fails there, the other
  // rank completes, and the communicator stays usable.
  epDispatchArgs_t a = dispatchArgs(tk, K, recv, li.rank == 0 ? 1 : 64);
  epResult_t res = epDispatch(comm, &a, &h, nullptr);
  if (li.rank == 0) {
    t->check(res == epInvalidArgument && contains(epGetLastError(comm), "recv_capacity"),
             "too small recv_capacity", 0);
    t->check(h == nullptr, "no handle on failure", 0);
  } else {
    t->check(res == epSuccess, "peer of a too-small output completes", 1);
    epHandleDestroy(h);
    h = nullptr;
  }
  a = dispatchArgs(tk, K, recv, 64);
  t->check(epDispatch(comm, &a, &h, nullptr) == epSuccess, "communicator usable after argument errors", li.rank);
  std::vector<uint16_t> out(size_t(tk.n) * 64);
  epCombineArgs_t c = EP_COMBINE_ARGS_INITIALIZER;
  c.y = recv.data();
  c.out = out.data();
  t->check(epCombine(comm, &c, h, nullptr) == epSuccess, "combine after argument errors", li.rank);
  epHandleDestroy(h);
  epCommDestroy(comm);
  return 0;
}

int orderMismatch(const LaunchInfo& li, Tally* t) {
  epConfig_t cfg = smallConfig();
  epComm_t comm = joinOrFail(li, t, cfg);
  if (comm == nullptr) return 0;
  SmallDispatch d(5);
  epDispatchArgs_t& a = d.a;
  epHandle_t h = nullptr;
  t->check(epDispatch(comm, &a, &h, nullptr) == epSuccess, "first dispatch", li.rank);
  auto t0 = Clock::now();
  epResult_t res;
  if (li.rank == 0) {  // combine while the peer dispatches again
    std::vector<uint16_t> out(16 * 64);
    epCombineArgs_t c = EP_COMBINE_ARGS_INITIALIZER;
    c.y = d.recv.data();
    c.out = out.data();
    res = epCombine(comm, &c, h, nullptr);
  } else {
    res = epDispatch(comm, &a, &h, nullptr);
  }
  // The rank that sees the other's data first says so (epInvalidUsage) and
  // leaves; across nodes the other may see it leave before that data
  // arrives (epRemoteError), or wait for it (epTimeout).
  t->check(res == epInvalidUsage || res == epTimeout || res == epRemoteError, "calls out of step fail", li.rank);
  t->check(secondsSince(t0) < kTimeoutMs / 1000.0 + 5.0, "without hanging", li.rank);
  epHandleDestroy(h);
  epCommDestroy(comm);
  return 0;
}

// The first low-latency call of a communicator connects that class across
// nodes (collective). Rank 0 makes it while rank 1 dispatches: both must say
// the calls are out of step (epInvalidUsage), not meet at the connect and
// time out (docs/TOPOLOGY.md, "Queue pairs").
int llFirstOutOfStep(const LaunchInfo& li, Tally* t) {
  epConfig_t cfg = smallConfig();
  cfg.low_latency = 1;
  epComm_t comm = joinOrFail(li, t, cfg);
  if (comm == nullptr) return 0;
  SmallDispatch d(5);
  epHandle_t h = nullptr;
  const auto t0 = Clock::now();
  epResult_t res;
  std::vector<uint16_t> recv_x(size_t(6) * 2 * 32 * 64);
  std::vector<int> recv_count(6);
  if (li.rank == 0) {
    epLowLatencyDispatchArgs_t a = EP_LL_DISPATCH_ARGS_INITIALIZER;
    a.x = d.tk.x.data();
    a.topk_idx = d.tk.topk.data();
    a.num_tokens = d.tk.n;
    a.num_topk = 2;
    a.wire_type = epBfloat16;
    a.recv_x = recv_x.data();
    a.recv_count = recv_count.data();
    res = epLowLatencyDispatch(comm, &a, &h, nullptr);
  } else {
    res = epDispatch(comm, &d.a, &h, nullptr);
  }
  t->check(res == epInvalidUsage, "a first low-latency call beside a dispatch gives epInvalidUsage", li.rank);
  t->check(contains(epGetLastError(comm), "same collective calls in the same order"), "saying the calls are out of step",
           li.rank);
  t->check(secondsSince(t0) < kTimeoutMs / 1000.0, "before the timeout", li.rank);
  if (res != epInvalidUsage) fprintf(stderr, "rank %d: %s\n", li.rank, epGetLastError(comm));
  epHandleDestroy(h);
  epCommDestroy(comm);
  return 0;
}

// A rank that waits for a late peer gives the core away: rank 1 comes 1.5 s
// late to a dispatch; rank 0's process (its transports' threads included)
// may use at most a fifth of a core meanwhile (a spin would use all of it),
// or MP_IDLE_CPU_MAX of one (0.05 where the transport sleeps in its wait).
// What the call itself costs, measured on a dispatch both ranks make on time,
// is not the wait's: on a slow machine (an emulated VM) it is a good part.
double processCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + double(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

int latePeerIdle(const LaunchInfo& li, Tally* t) {
  epConfig_t cfg = smallConfig();
  cfg.timeout_ms = 20000;
  epComm_t comm = joinOrFail(li, t, cfg);
  if (comm == nullptr) return 0;
  SmallDispatch d(5);
  epHandle_t h = nullptr;
  t->check(epDispatch(comm, &d.a, &h, nullptr) == epSuccess, "first dispatch", li.rank);  // connections warm
  epHandleDestroy(h);
  h = nullptr;
  auto timedDispatch = [&](const char* what, double* cpu) {
    const double cpu0 = processCpuSeconds();
    const auto t0 = Clock::now();
    t->check(epDispatch(comm, &d.a, &h, nullptr) == epSuccess, what, li.rank);
    epHandleDestroy(h);
    h = nullptr;
    *cpu = processCpuSeconds() - cpu0;
    return secondsSince(t0);
  };
  double call_cpu = 0, cpu = 0;
  timedDispatch("dispatch on time", &call_cpu);
  if (li.rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  const double wall = timedDispatch("dispatch with a late peer", &cpu);
  if (li.rank == 0) {
    const double waiting = std::max(0.0, cpu - call_cpu);
    printf("late-peer-idle: rank 0 waited %.2f s using %.3f s of CPU (%.3f s beyond a call on time)\n", wall, cpu,
           waiting);
    t->check(wall > 1.0, "rank 0 waited for the late peer", li.rank);
    const char* bound_env = getenv("MP_IDLE_CPU_MAX");
    const double bound = bound_env && *bound_env ? atof(bound_env) : 0.2;
    if (waiting >= bound * wall)
      printf("late-peer-idle: %.1f%% of a core, the bound is %.1f%%\n", 100 * waiting / wall, 100 * bound);
    t->check(waiting < bound * wall, "the wait used at most the bound's share of a core", li.rank);
  }
  epCommDestroy(comm);
  return 0;
}

struct Scenario {
  const char* name;
  int nranks;
  int (*run)(const LaunchInfo&, Tally*);
};

const Scenario kScenarios[] = {
    {"config-mismatch", 2, configMismatch}, {"missing-rank", 3, missingRank},
    {"rank-exits", 2, rankExits},           {"abort", 2, abortUnblocks},
    {"rank-skips-call", 2, rankSkipsCall},
    {"bad-args", 2, badArgs},               {"order-mismatch", 2, orderMismatch},
    {"ll-first-out-of-step", 2, llFirstOutOfStep}, {"late-peer-idle", 2, latePeerIdle},
    {"ring-mismatch", 3, ringMismatch},     {"node-size-mismatch", 2, nodeSizeMismatch},
    {"staging-mismatch", 2, stagingMismatch},
    {"rank-fails-init", 4, rankFailsInit},    {"rank-fails-init-2", 2, rankFailsInit},
    {"ib-qps-mismatch", 2, ibQpsMismatch},    {"ib-sl-mismatch", 3, ibSlMismatch},
    {"ib-gid-per-rank", 2, ibGidPerRank},
};

}  // namespace

int main(int argc, char** argv) {
  const char* only = nullptr;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--only") == 0 && i + 1 < argc) only = argv[++i];
    else {
      fprintf(stderr, "usage: %s [--only NAME]\n", argv[0]);
      return 2;
    }
  }
  int passed = 0, failed = 0;
  for (const Scenario& sc : kScenarios) {
    if (only && strcmp(only, sc.name) != 0) continue;
    fflush(stdout);
    pid_t pid = fork();  // one supervising process per scenario keeps them apart
    if (pid == 0) {
      LaunchInfo li;
      if (launchRanks(sc.nranks, 60, &li) != 0) _exit(1);
      Tally tally;
      sc.run(li, &tally);
      if (tally.failed) fprintf(stderr, "%s: rank %d failed %d checks\n", sc.name, li.rank, tally.failed);
      fflush(stdout);
      _exit(tally.failed == 0 ? 0 : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    printf("%-16s %s\n", sc.name, ok ? "PASSED" : "FAILED");
    (ok ? passed : failed)++;
  }
  printf("mp_errors: %d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
