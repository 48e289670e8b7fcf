// moeep_info: what this libmoeep is and how it is set up, in the manner of
// ucx_info.
//
//   moeep_info          version, library path, transports and every EP_* parameter
//   moeep_info -v       version, library path, whether the bootstrap is authenticated
//   moeep_info -t       transports only
//   moeep_info -p       parameters only, as NAME=value lines with their docs
//   moeep_info -c       a quick self-test: a 2-rank in-process host communicator
//                       runs one dispatch and one combine, checked
//
// Under mpirun only rank 0 prints (every rank with -a), so that the output of
// a job's environment can be looked at once.
#include <dlfcn.h>
#include <getopt.h>
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/launch.h"
#include "common/launcher_env.h"
#include "common/numeric.h"
#include "moeep.h"

namespace {

void usage(FILE* f) {
  fprintf(f,
          "usage: moeep_info [-v] [-t] [-p] [-c] [-a] [-h] [--topo] [--topo-xml FILE]\n"
          "                  [--plan --ranks-per-node N --nodes M] [--comm [--ranks N]]\n"
          "  (no option)  everything but the self-test and the plans\n"
          "  -v  version of the loaded library and of the header this tool was built with, its path, and\n"
          "      whether the bootstrap of this environment is authenticated (EP_COMM_ID, EP_COMM_SECRET)\n"
          "  -t  transports: name, whether usable, where from or why not\n"
          "  -p  EP_* parameters: name, default, value in this environment, description\n"
          "  -c  self-test: 2 ranks as threads, one dispatch + combine on the host backend\n"
          "  -a  under mpirun, print on every rank (default: rank 0 only)\n"
          "  --topo            the topology: GPUs, RDMA NICs, NUMA nodes, PCI distances, the NIC of\n"
          "                    each GPU and why, GPU peer access (NVLink / P2P / none)\n"
          "  --topo-xml FILE   read the topology from an hwloc XML file instead of this machine\n"
          "  --plan            dry run: the plan of a job of --nodes M nodes of --ranks-per-node N\n"
          "                    ranks on machines like this one (local rank i drives GPU i)\n"
          "  --comm            make a communicator of every GPU here (or --ranks N host ranks without\n"
          "                    GPUs) and print each rank's plan: the path to every peer; under\n"
          "                    mpirun, the job's own communicator (one rank per process)\n"
          "  -h  this message\n");
}

void printVersion() {
  int code = 0;
  epResult_t res = epGetVersion(&code);
  if (res != epSuccess) {
    printf("# library version: epGetVersion failed: %s: %s\n", epGetErrorString(res),
           epGetLastError(nullptr));
  } else {
    printf("# libmoeep version %d.%d.%d (loaded library; EP_VERSION_CODE %d)\n", code / 10000,
           code / 100 % 100, code % 100, code);
  }
  printf("# built with moeep.h %d.%d.%d (EP_VERSION_CODE %d)\n", EP_VERSION_MAJOR, EP_VERSION_MINOR,
         EP_VERSION_PATCH, EP_VERSION_CODE);
  // Major versions may break the ABI; minor and patch only add.
  if (res == epSuccess && code / 10000 != EP_VERSION_MAJOR)
    printf("# WARNING: the loaded library's major version differs from the header's: the ABI may differ\n");
  else if (res == epSuccess && code < EP_VERSION_CODE)
    printf("# WARNING: the loaded library is older than the header this tool was built with\n");

  // Which file the dynamic loader picked: the answer to "why does it behave so".
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&epGetVersion), &info) != 0 && info.dli_fname != nullptr) {
    char resolved[PATH_MAX];
    const char* real = realpath(info.dli_fname, resolved);
    if (real != nullptr && strcmp(real, info.dli_fname) != 0)
      printf("# library path: %s -> %s\n", info.dli_fname, real);
    else
      printf("# library path: %s\n", info.dli_fname);
  } else {
    const char* why = dlerror();
    printf("# library path: unknown (dladdr: %s)\n", why ? why : "no symbol information");
  }
}

// The environment's value of parameter `name` (EP_ prefix included) as
// epGetParam shows it; NULL when unset.
const char* paramValue(const char* name) {
  for (int i = 0;; i++) {
    const char *n = nullptr, *value = nullptr;
    if (epGetParam(i, &n, nullptr, &value, nullptr) != epSuccess) return nullptr;
    if (n != nullptr && strcmp(n, name) == 0) return value;
  }
}

// Whether the bootstrap that this environment gives is authenticated
// (docs/SEMANTICS.md, "Bootstrap security"). The library shows a secret only
// as "(set; not shown)" or its file:PATH, which is all this needs.
void printBootstrapSecurity() {
  const char* comm_id = paramValue("EP_COMM_ID");
  const char* secret = paramValue("EP_COMM_SECRET");
  if (comm_id == nullptr) {
    printf("# bootstrap: authenticated: each unique id from epGetUniqueId carries a secret from the OS's random "
           "source (share the id as a password)\n");
    return;
  }
  if (secret == nullptr) {
    printf("# bootstrap: UNAUTHENTICATED: EP_COMM_ID=%s without EP_COMM_SECRET: anyone who reaches that address "
           "or a rank's port can join or disturb the job\n",
           comm_id);
    return;
  }
  if (strncmp(secret, "file:", 5) == 0 && access(secret + 5, R_OK) != 0) {
    printf("# bootstrap: EP_COMM_SECRET=%s cannot be read (%s): epGetUniqueId will fail\n", secret, strerror(errno));
    return;
  }
  printf("# bootstrap: authenticated by EP_COMM_SECRET%s%s (EP_COMM_ID=%s): every rank must set the same secret\n",
         strncmp(secret, "file:", 5) == 0 ? " from " : "", strncmp(secret, "file:", 5) == 0 ? secret + 5 : "",
         comm_id);
}

void printTransports() {
  printf("#\n# Transports\n#\n");
  int count = 0;
  for (int i = 0;; i++) {
    const char *name = nullptr, *detail = nullptr;
    int available = 0;
    if (epGetTransport(i, &name, &available, &detail) != epSuccess) break;
    printf("#   %-12s %-13s %s\n", name ? name : "?", available ? "available" : "unavailable",
           detail ? detail : "");
    count++;
  }
  if (count == 0) printf("#   (none)\n");
}

// Like `ucx_info -cf`: each parameter with its doc, then NAME=value with the
// value this process would use: the environment's when set, else the default.
void printParams() {
  printf("#\n# Parameters (EP_*; a config field set in code takes precedence)\n");
  for (int i = 0;; i++) {
    const char *name = nullptr, *def = nullptr, *value = nullptr, *doc = nullptr;
    if (epGetParam(i, &name, &def, &value, &doc) != epSuccess) break;
    printf("#\n# %s\n", doc ? doc : "");
    printf("# default: \"%s\"%s\n", def ? def : "", value ? "; set in the environment" : "");
    printf("%s=%s\n", name ? name : "?", value ? value : (def ? def : ""));
  }
}

// ---- Self-test ---------------------------------------------------------------

// A tiny problem: 2 ranks, 4 experts (2 each), 8 tokens of 64 bf16 values.
constexpr int kRanks = 2, kExperts = 4, kTokens = 8, kTopk = 2, kHidden = 64;

struct SelfTestRank {
  epComm_t comm = nullptr;
  int rank = 0;
  std::vector<uint16_t> x, recv_x, out;
  std::vector<int64_t> topk;
  int64_t num_recv = -1;
  std::string error;  // empty: passed
};

// Token t of rank r: value (r + 1) * (t + 1) / 64 in every column (exact in
// bf16), routed to experts {t % 4, (t + r + 1) % 4} except every fourth token,
// which goes nowhere (-1, -1).
void makeInputs(SelfTestRank* s) {
  s->x.resize(size_t(kTokens) * kHidden);
  s->topk.resize(size_t(kTokens) * kTopk);
  for (int t = 0; t < kTokens; t++) {
    float v = float((s->rank + 1) * (t + 1)) / 64.0f;
    for (int j = 0; j < kHidden; j++) s->x[size_t(t) * kHidden + j] = tools::floatToBf16(v);
    bool nowhere = t % 4 == 3;
    int64_t a = t % kExperts, b = (t + s->rank + 1) % kExperts;
    s->topk[size_t(t) * 2] = nowhere ? -1 : a;
    s->topk[size_t(t) * 2 + 1] = nowhere || b == a ? -1 : b;
  }
  s->recv_x.assign(size_t(kRanks) * kTokens * kHidden, 0);
  s->out.assign(size_t(kTokens) * kHidden, 0xffff);
}

std::string apiError(const char* call, epResult_t res, epComm_t comm) {
  return std::string(call) + ": " + epGetErrorString(res) + ": " + epGetLastError(comm);
}

// One rank's side: dispatch, y = received rows unchanged, combine. Host-backend
// calls block until every rank joins, hence one thread per rank.
void selfTestRank(SelfTestRank* s) {
  makeInputs(s);
  epDispatchArgs_t d = EP_DISPATCH_ARGS_INITIALIZER;
  d.x = s->x.data();
  d.x_type = epBfloat16;
  d.topk_idx = s->topk.data();
  d.topk_idx_type = epInt64;
  d.num_tokens = kTokens;
  d.num_topk = kTopk;
  d.recv_x = s->recv_x.data();
  d.recv_capacity = int64_t(kRanks) * kTokens;
  d.num_recv = &s->num_recv;
  epHandle_t handle = nullptr;
  epResult_t res = epDispatch(s->comm, &d, &handle, nullptr);
  if (res != epSuccess) {
    s->error = apiError("epDispatch", res, s->comm);
    return;
  }
  epCombineArgs_t c = EP_COMBINE_ARGS_INITIALIZER;
  c.flags = EP_COMBINE_DETERMINISTIC;
  c.y = s->recv_x.data();  // the identity expert
  c.y_type = epBfloat16;
  c.out = s->out.data();
  res = epCombine(s->comm, &c, handle, nullptr);
  epHandleDestroy(handle);
  if (res != epSuccess) s->error = apiError("epCombine", res, s->comm);
}

// With the identity expert, out[t] = x[t] * (number of ranks token t went to).
std::string checkSelfTest(const SelfTestRank& s) {
  if (!s.error.empty()) return s.error;
  for (int t = 0; t < kTokens; t++) {
    int ranks_hit = 0;
    for (int r = 0; r < kRanks; r++) {
      bool hit = false;
      for (int k = 0; k < kTopk; k++) {
        int64_t e = s.topk[size_t(t) * kTopk + k];
        hit = hit || (e >= 0 && e / (kExperts / kRanks) == r);
      }
      ranks_hit += hit;
    }
    float want = float((s.rank + 1) * (t + 1)) / 64.0f * float(ranks_hit);
    for (int j = 0; j < kHidden; j++) {
      float got = tools::bf16ToFloat(s.out[size_t(t) * kHidden + j]);
      if (got != want) {
        char buf[160];
        snprintf(buf, sizeof(buf), "combine out[%d][%d] = %g, expected %g", t, j, double(got), double(want));
        return buf;
      }
    }
  }
  return "";
}

// Prints what the communicator knows about itself: buffer bytes and node map.
void printCommInfo(epComm_t comm) {
  int rank = -1, size = 0, first = 0, count = 0, nodes = 0;
  size_t bytes = 0;
  epCommRank(comm, &rank);
  epCommSize(comm, &size);
  epCommLocalExperts(comm, &first, &count);
  epCommBufferBytes(comm, &bytes);
  std::vector<int> node_of_rank(size_t(size > 0 ? size : 1), -1);
  epCommNodes(comm, &nodes, node_of_rank.data());
  printf("#   rank %d/%d: experts [%d, %d), buffer %zu bytes, %d node%s, nodes of ranks:", rank, size, first,
         first + count, bytes, nodes, nodes == 1 ? "" : "s");
  for (int r = 0; r < size; r++) printf(" %d", node_of_rank[size_t(r)]);
  printf("\n");
}

int selfTest() {
  printf("#\n# Self-test: %d ranks as threads, host backend, %d tokens x %d bf16, top-%d of %d experts\n",
         kRanks, kTokens, kHidden, kTopk, kExperts);
  epConfig_t cfg = EP_CONFIG_INITIALIZER;
  cfg.num_experts = kExperts;
  cfg.hidden = kHidden;
  cfg.max_tokens_per_rank = kTokens;
  cfg.max_topk = kTopk;
  cfg.backend = epBackendHost;
  cfg.timeout_ms = 20000;  // a broken library fails the test instead of hanging it
  epComm_t comms[kRanks] = {};
  epResult_t res = epCommInitAll(comms, kRanks, nullptr, &cfg);
  if (res != epSuccess) {
    printf("# self-test FAILED: %s\n", apiError("epCommInitAll", res, nullptr).c_str());
    return 1;
  }
  for (epComm_t c : comms) printCommInfo(c);

  SelfTestRank ranks[kRanks];
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; r++) {
    ranks[r].comm = comms[r];
    ranks[r].rank = r;
    threads.emplace_back(selfTestRank, &ranks[r]);
  }
  for (std::thread& t : threads) t.join();
  int failed = 0;
  for (int r = 0; r < kRanks; r++) {
    std::string why = checkSelfTest(ranks[r]);
    if (!why.empty()) {
      printf("#   rank %d: FAILED: %s\n", r, why.c_str());
      failed++;
    } else {
      printf("#   rank %d: received %lld rows, combine correct\n", r, (long long)ranks[r].num_recv);
    }
  }
  for (epComm_t c : comms) epCommDestroy(c);
  printf("# self-test %s\n", failed ? "FAILED" : "OK");
  return failed ? 1 : 0;
}

// Prints what a report function returns by the size protocol of moeep.h.
template <typename Report>
int printReport(const char* what, Report report) {
  size_t bytes = 0;
  epResult_t res = report(nullptr, &bytes);
  std::string text(bytes, '\0');
  if (res == epSuccess) res = report(&text[0], &bytes);
  if (res != epSuccess) {
    printf("# %s failed: %s\n", what, apiError(what, res, nullptr).c_str());
    return 1;
  }
  fputs(text.c_str(), stdout);
  return 0;
}

// A communicator of every visible GPU (or `host_ranks` host ranks), and each rank's plan.
int commPlans(int host_ranks) {
  epConfig_t cfg = EP_CONFIG_INITIALIZER;
  cfg.num_experts = 64 * 8;
  cfg.hidden = 1024;
  cfg.max_tokens_per_rank = 8;
  cfg.max_topk = 8;
  cfg.timeout_ms = 30000;
  int n = host_ranks;
  cfg.num_experts = 64 * (n > 0 ? n : 8);  // a multiple of any rank count
  std::vector<epComm_t> comms(size_t(n > 0 ? n : 8), nullptr);
  epResult_t res = epCommInitAll(comms.data(), n, nullptr, &cfg);  // backend auto: GPUs when present
  if (res != epSuccess) {
    printf("# --comm: epCommInitAll(%d ranks) failed: %s\n", n, apiError("epCommInitAll", res, nullptr).c_str());
    return 1;
  }
  printf("#\n# Communicator of %d ranks (backend chosen by the library):\n", n);
  int rc = 0;
  for (int r = 0; r < n; r++) {
    printf("# rank %d paths:", r);
    for (int q = 0; q < n; q++) {
      epPathKind_t kind;
      int via = -1;
      if (epCommPeerPath(comms[size_t(r)], q, &kind, &via) != epSuccess) {
        printf(" %d:?", q);
        rc = 1;
        continue;
      }
      static const char* names[] = {"self", "nvlink", "host-staged", "rail", "rail+fwd"};
      printf(" %d:%s", q, int(kind) >= 0 && int(kind) < 5 ? names[int(kind)] : "?");
      epCommPeerInfo_t info = EP_COMM_PEER_INFO_INITIALIZER;
      if (q != r && epCommPeerInfo(comms[size_t(r)], q, &info) == epSuccess) printf("/%s", info.transport);
    }
    printf("\n");
    rc |= printReport("epCommPlanReport",
                      [&](char* buf, size_t* bytes) { return epCommPlanReport(comms[size_t(r)], buf, bytes); });
  }
  for (epComm_t c : comms)
    if (c) epCommDestroy(c);
  return rc;
}

// Under mpirun: one communicator across the launched processes (one rank
// each, GPU = local rank when there are GPUs); every rank prints its plan.
int jobPlan() {
  LaunchInfo li;
  if (launchRanks(0, 0, &li) != 0) return 1;
  epConfig_t cfg = EP_CONFIG_INITIALIZER;
  cfg.num_experts = 64 * li.nranks;
  cfg.hidden = 1024;
  cfg.max_tokens_per_rank = 8;
  cfg.max_topk = 8;
  cfg.timeout_ms = 30000;
  const char* local = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  if (local != nullptr) cfg.device = atoi(local);
  epComm_t comm = nullptr;
  epResult_t res = epCommInitRank(&comm, li.nranks, li.id, li.rank, &cfg);
  launchJoined();  // init returned: every rank has read the id (or the job failed)
  if (res != epSuccess) {
    printf("# --comm: rank %d: epCommInitRank failed: %s\n", li.rank, apiError("epCommInitRank", res, nullptr).c_str());
    return 1;
  }
  printf("# rank %d of the job (%d ranks)\n", li.rank, li.nranks);
  int rc = printReport("epCommPlanReport", [&](char* buf, size_t* bytes) { return epCommPlanReport(comm, buf, bytes); });
  epCommDestroy(comm);
  return rc;
}

// A whole number in [lo, hi] from an option's value, else a message and false.
bool parseCount(const char* option, const char* text, int lo, int hi, int* out) {
  char* end = nullptr;
  errno = 0;
  const long v = strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v < lo || v > hi) {
    fprintf(stderr, "moeep_info: %s '%s' is not a whole number in %d..%d\n", option, text, lo, hi);
    return false;
  }
  *out = int(v);
  return true;
}

int visibleGpus() {
  // moeep_info links only libmoeep: count GPUs through sysfs' NVIDIA driver entries.
  int n = 0;
  FILE* f = popen("ls /proc/driver/nvidia/gpus 2>/dev/null | wc -l", "r");
  if (f != nullptr) {
    if (fscanf(f, "%d", &n) != 1) n = 0;
    pclose(f);
  }
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  bool version = false, transports = false, params = false, self_test = false, all_ranks = false;
  bool topo = false, plan = false, comm_plan = false;
  const char* topo_xml = nullptr;
  int ranks_per_node = 0, nodes = 0, comm_ranks = 0;
  enum { kTopo = 1000, kTopoXml, kPlan, kRanksPerNode, kNodes, kComm, kRanks };
  static const struct option long_options[] = {
      {"topo", no_argument, nullptr, kTopo},           {"topo-xml", required_argument, nullptr, kTopoXml},
      {"plan", no_argument, nullptr, kPlan},           {"ranks-per-node", required_argument, nullptr, kRanksPerNode},
      {"nodes", required_argument, nullptr, kNodes},   {"comm", no_argument, nullptr, kComm},
      {"ranks", required_argument, nullptr, kRanks},   {"help", no_argument, nullptr, 'h'},
      {nullptr, 0, nullptr, 0}};
  int c;
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":vtpcah", long_options, nullptr)) != -1) {
    switch (c) {
      case 'v': version = true; break;
      case 't': transports = true; break;
      case 'p': params = true; break;
      case 'c': self_test = true; break;
      case 'a': all_ranks = true; break;
      case kTopo: topo = true; break;
      case kTopoXml: topo_xml = optarg; break;
      case kPlan: plan = true; break;
      case kRanksPerNode:
        if (!parseCount("--ranks-per-node", optarg, 1, 2048, &ranks_per_node)) return 2;
        break;
      case kNodes:
        if (!parseCount("--nodes", optarg, 1, 2048, &nodes)) return 2;
        break;
      case kComm: comm_plan = true; break;
      case kRanks:
        if (!parseCount("--ranks", optarg, 1, 64, &comm_ranks)) return 2;
        break;
      case 'h':
        usage(stdout);
        return 0;
      case ':':
        fprintf(stderr, "moeep_info: option %s needs a value\n", argv[optind - 1]);
        usage(stderr);
        return 2;
      default:
        fprintf(stderr, "moeep_info: unknown option %s\n", argv[optind - 1]);
        usage(stderr);
        return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "moeep_info: unexpected argument '%s'\n", argv[optind]);
    usage(stderr);
    return 2;
  }
  if (plan && (ranks_per_node < 1 || nodes < 1)) {
    fprintf(stderr, "moeep_info: --plan needs --ranks-per-node N and --nodes M (both >= 1)\n");
    return 2;
  }
  // Options that only shape another section: refused without it rather than ignored.
  if (!plan && (ranks_per_node > 0 || nodes > 0)) {
    fprintf(stderr, "moeep_info: --ranks-per-node and --nodes go with --plan\n");
    return 2;
  }
  if (comm_ranks > 0 && !comm_plan) {
    fprintf(stderr, "moeep_info: --ranks N goes with --comm\n");
    return 2;
  }
  if (topo_xml != nullptr && !topo && !plan) {
    fprintf(stderr, "moeep_info: --topo-xml FILE goes with --topo or --plan (a communicator, --comm, "
                    "reads its topology from EP_TOPO_XML)\n");
    return 2;
  }
  const tools::LauncherEnv launcher = tools::launcherEnv();
  if (!launcher.error.empty()) {  // which rank prints cannot be told
    fprintf(stderr, "moeep_info: %s\n", launcher.error.c_str());
    return 2;
  }
  const int launcher_rank = launcher.rank;
  int rc = 0;
  const bool other_sections = version || transports || params || self_test || topo || plan;
  if (comm_plan && launcher_rank >= 0) {
    // --comm under mpirun: the running job's communicator, every rank takes
    // part; its ranks are the launcher's, so --ranks has nothing to say.
    if (comm_ranks > 0) {
      fprintf(stderr, "moeep_info: --ranks N makes N ranks as threads; under a launcher --comm uses the "
                      "job's ranks (leave --ranks out)\n");
      return 2;
    }
    rc = jobPlan();
    comm_plan = false;
    if (!other_sections) return rc;
  }
  if (launcher_rank > 0 && !all_ranks) return rc;
  if (launcher_rank >= 0 && all_ranks) printf("# rank %d (of the launcher)\n", launcher_rank);
  // No section chosen: everything except the self-test and the plans.
  if (!other_sections && !comm_plan) version = transports = params = topo = true;

  if (version) {
    printVersion();
    printBootstrapSecurity();
  }
  if (transports) printTransports();
  if (params) printParams();
  if (topo || plan) {
    printf("#\n# Topology%s\n", plan ? " and dry-run plan" : "");
    rc |= printReport("epTopologyReport", [&](char* buf, size_t* bytes) {
      return epTopologyReport(topo_xml, plan ? ranks_per_node : 0, plan ? nodes : 0, buf, bytes);
    });
  }
  if (comm_plan) {
    int n = comm_ranks > 0 ? comm_ranks : visibleGpus();
    if (n < 1) n = 2;
    rc |= commPlans(n);
  }
  if (self_test) rc |= selfTest();
  fflush(stdout);
  return rc;
}
