// configResolve (the caller's epConfig_t of any known size -> ep::Config),
// buildNodeMap, and dataTypeSize / dataTypeName.
//
// The group setup clears every EP_* variable, so the cases see the library
// defaults; the cases about EP_* precedence run in a forked child that sets
// its variables before the library first reads them (accessors cache).
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <vector>

#include "comm.h"
#include "child_cases.h"
#include "common.h"
#include "ll_layout.h"

namespace {

using ep::Config;
using ep::configResolve;

// A valid config of the kind most cases start from.
epConfig_t validConfig() {
  epConfig_t c = EP_CONFIG_INITIALIZER;
  c.num_experts = 16;
  c.hidden = 128;
  c.max_tokens_per_rank = 64;
  c.max_topk = 4;
  c.backend = epBackendHost;
  return c;
}

// Resolves c for nranks and expects rejection with a message containing field.
void expectRejected(const epConfig_t& c, int nranks, const char* field, const char* file, int line) {
  Config out;
  out.hidden = -777;  // sentinel: nothing is written on error
  epResult_t res = configResolve(&c, nranks, &out, nullptr);
  if (res != epInvalidArgument) {
    print_error("%s:%d: configResolve returned %d, expected epInvalidArgument (field %s)\n", file,
                line, int(res), field);
    _fail(file, line);
  }
  ::eptest::containsImpl(ep::threadLastError(), field, "ep::threadLastError()", file, line);
  if (out.hidden != -777) {
    print_error("%s:%d: configResolve wrote its output on error\n", file, line);
    _fail(file, line);
  }
}
#define expect_rejected(c, nranks, field) expectRejected((c), (nranks), (field), __FILE__, __LINE__)

Config expectAccepted(const epConfig_t& c, int nranks, const char* file, int line) {
  Config out;
  ep::clearThreadError();
  epResult_t res = configResolve(&c, nranks, &out, nullptr);
  if (res != epSuccess) {
    print_error("%s:%d: configResolve returned %d: %s\n", file, line, int(res), ep::threadLastError());
    _fail(file, line);
  }
  return out;
}
#define expect_accepted(c, nranks) expectAccepted((c), (nranks), __FILE__, __LINE__)

// Cases that need EP_* variables run in a fresh process (this program re-run
// with "--child NAME" and the variables set): the accessors cache their first
// read, and a forked child would inherit the parent's cache. Each child body
// returns 0 when it passed, else the number of the check that failed.
using eptest::ChildCase;
const std::vector<ChildCase>& childCases();

void runInFreshProcess(const char* name) { eptest::runInFreshProcess(childCases(), name); }

int groupSetup(void**) {
  eptest::unsetAllParams();
  return 0;
}

// ---- The initializer and the struct layout ------------------------------------------

void initializer_is_valid_cxx_and_fills_header(void**) {
  epConfig_t c = EP_CONFIG_INITIALIZER;
  assert_int_equal(c.size, sizeof(epConfig_t));
  assert_int_equal(c.magic, EP_CONFIG_MAGIC);
  assert_int_equal(c.version, EP_CONFIG_VERSION);
  assert_int_equal(c.num_experts, 0);
  assert_int_equal(c.hidden, 0);
  assert_int_equal(c.max_tokens_per_rank, 0);
  assert_int_equal(c.max_topk, 0);
  assert_int_equal(c.dispatch_type, epBfloat16);
  assert_int_equal(c.combine_type, epBfloat16);
  assert_int_equal(c.backend, epBackendAuto);
  assert_int_equal(c.device, -1);
  assert_int_equal(c.buffer_bytes_cap, 0);
  assert_int_equal(c.timeout_ms, 0);
  assert_int_equal(c.num_sms, 0);
  assert_int_equal(c.max_nodes_per_token, 0);
  // The other initializers too, as C++ sees them.
  epLayoutArgs_t l = EP_LAYOUT_ARGS_INITIALIZER;
  assert_int_equal(l.size, sizeof(epLayoutArgs_t));
  assert_int_equal(l.magic, EP_LAYOUT_ARGS_MAGIC);
  assert_int_equal(l.topk_idx_type, epInt64);
  epDispatchArgs_t d = EP_DISPATCH_ARGS_INITIALIZER;
  assert_int_equal(d.size, sizeof(epDispatchArgs_t));
  assert_int_equal(d.magic, EP_DISPATCH_ARGS_MAGIC);
  assert_int_equal(d.version, EP_DISPATCH_ARGS_VERSION);
  assert_int_equal(d.topk_idx_type, epInt64);
  assert_null(d.num_recv);
  epCombineArgs_t cb = EP_COMBINE_ARGS_INITIALIZER;
  assert_int_equal(cb.size, sizeof(epCombineArgs_t));
  assert_int_equal(cb.magic, EP_COMBINE_ARGS_MAGIC);
  assert_null(cb.out_topk_weights);
}

void magic_numbers_are_distinct(void**) {
  const unsigned magics[] = {EP_CONFIG_MAGIC, EP_LAYOUT_ARGS_MAGIC, EP_DISPATCH_ARGS_MAGIC,
                             EP_COMBINE_ARGS_MAGIC};
  for (size_t i = 0; i < 4; i++)
    for (size_t j = i + 1; j < 4; j++) assert_int_not_equal(magics[i], magics[j]);
}

// ---- Defaults ---------------------------------------------------------------------

void resolve_fills_defaults(void**) {
  epConfig_t c = validConfig();
  Config r = expect_accepted(c, 4);
  assert_int_equal(r.num_experts, 16);
  assert_int_equal(r.hidden, 128);
  assert_int_equal(r.max_tokens_per_rank, 64);
  assert_int_equal(r.max_topk, 4);
  assert_int_equal(r.dispatch_type, epBfloat16);
  assert_int_equal(r.combine_type, epBfloat16);
  assert_int_equal(r.backend, epBackendHost);
  assert_int_equal(r.device, -1);
  assert_int_equal(r.timeout_ms, 60000);  // EP_TIMEOUT_MS default
  assert_int_equal(r.num_sms, 0);
  assert_int_equal(r.buffer_bytes_cap, 0);
  assert_int_equal(r.max_nodes_per_token, 0);
}

void resolve_keeps_explicit_values(void**) {
  epConfig_t c = validConfig();
  c.timeout_ms = 1234;
  c.num_sms = 20;
  c.buffer_bytes_cap = size_t(1) << 20;
  c.max_nodes_per_token = 4;
  c.device = 3;
  c.dispatch_type = epFloat8E4M3;
  c.combine_type = epFloat32;
  Config r = expect_accepted(c, 2);
  assert_int_equal(r.timeout_ms, 1234);
  assert_int_equal(r.num_sms, 20);
  assert_int_equal(r.buffer_bytes_cap, size_t(1) << 20);
  assert_int_equal(r.max_nodes_per_token, 4);
  assert_int_equal(r.device, 3);
  assert_int_equal(r.dispatch_type, epFloat8E4M3);
  assert_int_equal(r.combine_type, epFloat32);
}

int childEnvFillsZeroFields() {
  epConfig_t c = validConfig();
  Config r;
  if (configResolve(&c, 1, &r, nullptr) != epSuccess) return 1;
  if (r.timeout_ms != 2500) return 2;
  if (r.num_sms != 16) return 3;
  if (r.buffer_bytes_cap != 1048576) return 4;
  c.timeout_ms = 700;  // struct > EP_* > default
  c.num_sms = 3;
  c.buffer_bytes_cap = 4096;
  if (configResolve(&c, 1, &r, nullptr) != epSuccess) return 5;
  if (r.timeout_ms != 700 || r.num_sms != 3 || r.buffer_bytes_cap != 4096) return 6;
  return 0;
}

int childEnvMalformedTimeout() {
  epConfig_t c = validConfig();
  Config r;
  if (configResolve(&c, 1, &r, nullptr) != epSuccess) return 1;
  return r.timeout_ms == 60000 ? 0 : 2;
}

int childEnvNegativeTimeout() {
  epConfig_t c = validConfig();
  Config r;
  if (configResolve(&c, 1, &r, nullptr) != epInvalidArgument) return 1;
  // The message must say where the bad value came from.
  return strstr(ep::threadLastError(), "EP_TIMEOUT_MS") != nullptr ? 0 : 2;
}

// A one-rank host init under the child's EP_* variables must fail with a
// message containing needle: 0 when it does, else the failed step.
int childInitFails(const char* needle) {
  epConfig_t c = validConfig();
  c.backend = epBackendHost;
  epUniqueId id;
  if (epGetUniqueId(&id) != epSuccess) return 1;
  epComm_t comm = nullptr;
  if (epCommInitRank(&comm, 1, id, 0, &c) == epSuccess || comm != nullptr) return 2;
  if (strstr(epGetLastError(nullptr), needle) == nullptr) {
    fprintf(stderr, "message: %s\n", epGetLastError(nullptr));
    return 3;
  }
  return 0;
}

// Ring sizes that do not fit the host backend's int fields (they used to
// wrap: slots 0 hung the exchange, chunk tokens crashed it).
int childEnvHostRingOutOfRange() { return childInitFails("EP_HOST_RING_SLOTS = 4294967296 is outside 2..1024"); }
int childEnvHostChunkOutOfRange() { return childInitFails("EP_HOST_CHUNK_TOKENS = 1099511627776"); }
// 2^32 + 2 would be 2 as an int; a negative size was ignored.
int childEnvNodeSizeHuge() { return childInitFails("EP_NODE_SIZE = 4294967298 is outside 0..1"); }
int childEnvNodeSizeNegative() { return childInitFails("EP_NODE_SIZE = -2 is outside 0..1"); }

// An unknown EP_DEBUG_SUBSYS name is ignored, not taken as "no subsystem"
// (which silenced even the warnings); a known name alongside still selects.
int childDebugSubsysUnknown() {
  if (!ep::logEnabled(ep::kLogWarn, ep::kSubsysInit)) return 1;
  if (!ep::logEnabled(ep::kLogWarn, ep::kSubsysCuda)) return 2;
  return 0;
}
int childDebugSubsysUnknownAndKnown() {
  if (!ep::logEnabled(ep::kLogWarn, ep::kSubsysCuda)) return 1;
  if (ep::logEnabled(ep::kLogWarn, ep::kSubsysInit)) return 2;
  return 0;
}

// config.max_nodes_per_token binds the low-latency dispatch as it does the
// high-throughput calls: a token on experts of two nodes (EP_NODE_SIZE = 1:
// every rank a node) is refused before anything is sent.
int childLowLatencyNodeLimit() {
  epConfig_t c = validConfig();
  c.low_latency = 1;
  c.max_nodes_per_token = 1;
  epComm_t comms[2] = {nullptr, nullptr};
  if (epCommInitAll(comms, 2, nullptr, &c) != epSuccess) return 1;
  std::vector<uint16_t> x(size_t(2) * c.hidden, 0), recv_x(size_t(8) * 2 * 64 * c.hidden);
  std::vector<int64_t> topk = {0, 8, 1, -1};  // token 0: experts of ranks 0 and 1; token 1: rank 0 only
  std::vector<int> recv_count(8);
  epLowLatencyDispatchArgs_t a = EP_LL_DISPATCH_ARGS_INITIALIZER;
  a.x = x.data();
  a.topk_idx = topk.data();
  a.num_tokens = 2;
  a.num_topk = 2;
  a.wire_type = epBfloat16;
  a.recv_x = recv_x.data();
  a.recv_count = recv_count.data();
  epHandle_t h = nullptr;
  const epResult_t res = epLowLatencyDispatch(comms[0], &a, &h, nullptr);
  int rc = 0;
  if (res != epInvalidArgument || h != nullptr) rc = 2;
  else if (strstr(epGetLastError(comms[0]), "token 0 selects experts on 2 nodes") == nullptr) rc = 3;
  if (rc == 3) fprintf(stderr, "message: %s\n", epGetLastError(comms[0]));
  for (epComm_t comm : comms) epCommDestroy(comm);
  return rc;
}

// EP_SHM_DIR problems are named with their cause.
int childShmDirProc() { return childInitFails("cannot create /proc/moeep-"); }
int childShmDirFile() { return childInitFails("/dev/null is not a directory"); }

// Segments of inits that never finished (creator gone, older than ten
// minutes) are removed by the next init in that directory; others stay.
const char kStaleDir[] = "/tmp/moeep-test-stale-shm";
int childShmStale() {
  char stale[256], recent[256], live[256];
  FILE* pf = fopen("/tmp/moeep-test-stale-shm/pids", "r");
  int dead = 0;
  if (pf == nullptr || fscanf(pf, "%d", &dead) != 1) return 1;
  fclose(pf);
  snprintf(stale, sizeof(stale), "%s/moeep-%d-0-0000dead", kStaleDir, dead);
  snprintf(recent, sizeof(recent), "%s/moeep-%d-1-0000beef", kStaleDir, dead);
  snprintf(live, sizeof(live), "%s/moeep-%d-0-00000001", kStaleDir, int(getpid()));
  FILE* lf = fopen(live, "w");  // old, but its creator (this process) lives
  if (lf == nullptr) return 6;
  fclose(lf);
  struct timeval hour_ago[2] = {{time(nullptr) - 3600, 0}, {time(nullptr) - 3600, 0}};
  if (utimes(live, hour_ago) != 0) return 7;
  epConfig_t c = validConfig();
  c.backend = epBackendHost;
  epUniqueId id;
  epComm_t comm = nullptr;
  if (epGetUniqueId(&id) != epSuccess || epCommInitRank(&comm, 1, id, 0, &c) != epSuccess) return 2;
  epCommDestroy(comm);
  if (access(stale, F_OK) == 0) return 3;   // removed
  if (access(recent, F_OK) != 0) return 4;  // too young to judge
  if (access(live, F_OK) != 0) return 5;    // its process lives
  return 0;
}

const std::vector<ChildCase>& childCases() {
  static const std::vector<ChildCase> cases = {
      {"shm_dir_proc", {{"EP_SHM_DIR", "/proc"}}, childShmDirProc},
      {"shm_stale", {{"EP_SHM_DIR", kStaleDir}}, childShmStale},
      {"shm_dir_file", {{"EP_SHM_DIR", "/dev/null"}}, childShmDirFile},
      {"env_host_ring_out_of_range", {{"EP_HOST_RING_SLOTS", "4294967296"}}, childEnvHostRingOutOfRange},
      {"env_host_chunk_out_of_range", {{"EP_HOST_CHUNK_TOKENS", "1099511627776"}}, childEnvHostChunkOutOfRange},
      {"env_node_size_huge", {{"EP_NODE_SIZE", "4294967298"}}, childEnvNodeSizeHuge},
      {"ll_node_limit", {{"EP_NODE_SIZE", "1"}}, childLowLatencyNodeLimit},
      {"debug_subsys_unknown", {{"EP_DEBUG", "WARN"}, {"EP_DEBUG_SUBSYS", "FOO"}}, childDebugSubsysUnknown},
      {"debug_subsys_unknown_and_known",
       {{"EP_DEBUG", "WARN"}, {"EP_DEBUG_SUBSYS", "FOO,cuda"}},
       childDebugSubsysUnknownAndKnown},
      {"env_node_size_negative", {{"EP_NODE_SIZE", "-2"}}, childEnvNodeSizeNegative},
      {"env_fills_zero_fields",
       {{"EP_TIMEOUT_MS", "2500"}, {"EP_NUM_SMS", "0x10"}, {"EP_BUFFER_BYTES_CAP", "1048576"}},
       childEnvFillsZeroFields},
      {"env_malformed_timeout", {{"EP_TIMEOUT_MS", "soon"}}, childEnvMalformedTimeout},
      {"env_negative_timeout", {{"EP_TIMEOUT_MS", "-5"}}, childEnvNegativeTimeout},
  };
  return cases;
}

void env_fills_zero_fields_and_struct_wins(void**) { runInFreshProcess("env_fills_zero_fields"); }
void env_malformed_timeout_keeps_default(void**) { runInFreshProcess("env_malformed_timeout"); }
void stale_segments_of_dead_processes_are_removed(void**) {
  // A pid that is surely dead: a child that exited and was reaped.
  pid_t pid = fork();
  if (pid == 0) _exit(0);
  assert_int_equal(waitpid(pid, nullptr, 0), pid);
  assert_int_equal(system("rm -rf /tmp/moeep-test-stale-shm && mkdir -p /tmp/moeep-test-stale-shm"), 0);
  FILE* f = fopen("/tmp/moeep-test-stale-shm/pids", "w");
  assert_non_null(f);
  fprintf(f, "%d\n", int(pid));
  fclose(f);
  char cmd[512];
  // Old with a dead creator, young with a dead creator (the child adds an old
  // one of its own, alive).
  snprintf(cmd, sizeof(cmd),
           "cd /tmp/moeep-test-stale-shm && touch -d '-1 hour' moeep-%d-0-0000dead && touch moeep-%d-1-0000beef",
           int(pid), int(pid));
  assert_int_equal(system(cmd), 0);
  runInFreshProcess("shm_stale");
  assert_int_equal(system("rm -rf /tmp/moeep-test-stale-shm"), 0);
}

void shm_dir_problems_name_their_cause(void**) {
  runInFreshProcess("shm_dir_proc");
  runInFreshProcess("shm_dir_file");
}

void env_host_ring_sizes_out_of_range_are_rejected(void**) {
  runInFreshProcess("env_host_ring_out_of_range");
  runInFreshProcess("env_host_chunk_out_of_range");
  runInFreshProcess("env_node_size_huge");
  runInFreshProcess("env_node_size_negative");
}
void low_latency_dispatch_keeps_the_node_limit(void**) { runInFreshProcess("ll_node_limit"); }
void unknown_debug_subsystems_are_ignored(void**) {
  runInFreshProcess("debug_subsys_unknown");
  runInFreshProcess("debug_subsys_unknown_and_known");
}
void env_negative_timeout_rejected_naming_variable(void**) {
  runInFreshProcess("env_negative_timeout");
}

// ---- Header checks --------------------------------------------------------------------

void resolve_rejects_null_config(void**) {
  Config out;
  out.hidden = -777;
  assert_result(configResolve(nullptr, 1, &out, nullptr), epInvalidArgument);
  assert_contains(ep::threadLastError(), "config");
  assert_int_equal(out.hidden, -777);
}

void resolve_rejects_wrong_magic(void**) {
  epConfig_t c = validConfig();
  c.magic = 0x12345678u;
  expect_rejected(c, 1, "config.magic");
  assert_contains(ep::threadLastError(), "EP_CONFIG_INITIALIZER");
  c.magic = EP_LAYOUT_ARGS_MAGIC;  // another struct's magic is no better
  expect_rejected(c, 1, "config.magic");
}

void resolve_rejects_too_small_size(void**) {
  const size_t v1 = offsetof(epConfig_t, max_nodes_per_token) + sizeof(int);
  epConfig_t c = validConfig();
  for (size_t size : {size_t(0), size_t(8), size_t(16), v1 - 4, v1 - 1}) {
    c.size = size;
    expect_rejected(c, 1, "config.size");
  }
}

void resolve_accepts_older_v1_sized_struct(void**) {
  const size_t v1 = offsetof(epConfig_t, max_nodes_per_token) + sizeof(int);
  // What a v1 caller owns: exactly v1 bytes; whatever lies past them is not its.
  union {
    epConfig_t c;
    unsigned char bytes[sizeof(epConfig_t) + 64];
  } buf;
  memset(buf.bytes, 0xff, sizeof(buf.bytes));
  epConfig_t valid = validConfig();
  valid.max_nodes_per_token = 2;
  valid.timeout_ms = 999;
  memcpy(buf.bytes, &valid, v1);
  buf.c.size = v1;
  Config r = expect_accepted(buf.c, 4);
  assert_int_equal(r.num_experts, 16);
  assert_int_equal(r.hidden, 128);
  assert_int_equal(r.max_nodes_per_token, 2);
  assert_int_equal(r.timeout_ms, 999);
}

// The current struct ends in tail padding (after ib_qp_budget): not a field,
// so garbage there changes nothing; a field a later version adds there must
// not be read from this caller's padding (configCallerBytes).
void resolve_ignores_tail_padding(void**) {
  const size_t end = offsetof(epConfig_t, enable_shrink) + sizeof(int);
  if (end == sizeof(epConfig_t)) skip();  // no padding on this ABI
  epConfig_t clean = validConfig();
  clean.low_latency = 1;
  clean.ib_ar_control = 0;
  epConfig_t dirty = clean;
  memset(reinterpret_cast<unsigned char*>(&dirty) + end, 0x5a, sizeof(epConfig_t) - end);
  Config a = expect_accepted(clean, 4), b = expect_accepted(dirty, 4);
  assert_int_equal(b.low_latency, 1);
  assert_int_equal(b.num_experts, a.num_experts);
  assert_int_equal(b.max_nodes_per_token, a.max_nodes_per_token);
  assert_int_equal(b.ib.adaptive_routing[2], 0);
}

// A version-2 caller's struct ended in 4 bytes of padding where version 3
// has enable_shrink: that garbage is not read (shrink stays off).
void resolve_version_2_caller_gets_no_shrink(void**) {
  const size_t v2_end = offsetof(epConfig_t, ib_qp_budget) + sizeof(int);
  epConfig_t c = validConfig();
  c.version = 2;
  c.size = (v2_end + alignof(epConfig_t) - 1) / alignof(epConfig_t) * alignof(epConfig_t);
  memset(reinterpret_cast<unsigned char*>(&c) + v2_end, 0x5a, sizeof(epConfig_t) - v2_end);
  Config r = expect_accepted(c, 2);
  assert_int_equal(r.enable_shrink, 0);
  epConfig_t d = validConfig();
  d.enable_shrink = 1;
  assert_int_equal(expect_accepted(d, 2).enable_shrink, 1);
  d.enable_shrink = 2;
  expect_rejected(d, 2, "enable_shrink");
}

// A version-1 caller's struct ended in 4 bytes of padding where version 2
// has ib_tc_throughput: that garbage is not read, and the version-2 fields
// take their defaults (each class's traffic class = ib_traffic_class).
void resolve_version_1_caller_gets_version_2_defaults(void**) {
  const size_t v1_end = offsetof(epConfig_t, ib_ar_control) + sizeof(int);
  epConfig_t c = validConfig();
  c.version = 1;
  c.size = (v1_end + alignof(epConfig_t) - 1) / alignof(epConfig_t) * alignof(epConfig_t);
  c.ib_traffic_class = 96;
  memset(reinterpret_cast<unsigned char*>(&c) + v1_end, 0x5a, sizeof(epConfig_t) - v1_end);
  Config r = expect_accepted(c, 2);
  for (int k = 0; k < 3; k++) assert_int_equal(r.ib.tclass[k], 96);
  assert_int_equal(r.ib.timeout, 20);
  assert_int_equal(r.ib.retry_cnt, 7);
  assert_int_equal(r.ib.qp_budget, 0);
  // A version-2 caller sets them.
  epConfig_t d = validConfig();
  d.ib_tc_low_latency = 184;
  d.ib_timeout = 14;
  d.ib_retry_cnt = 3;
  Config q = expect_accepted(d, 2);
  assert_int_equal(q.ib.tclass[1], 184);
  assert_int_equal(q.ib.tclass[0], q.ib.traffic_class);
  assert_int_equal(q.ib.timeout, 14);
  assert_int_equal(q.ib.retry_cnt, 3);
  d.ib_timeout = 32;
  expect_rejected(d, 2, "config.ib_timeout");
}

void resolve_accepts_larger_struct_copying_only_known_fields(void**) {
  struct Future {
    epConfig_t c;
    int new_field_a;  // fields a later version might add
    int64_t new_field_b;
    char more[40];
  } f;
  memset(&f, 0x5a, sizeof(f));
  f.c = validConfig();
  f.c.size = sizeof(Future);
  f.c.version = EP_CONFIG_VERSION + 1;
  f.c.max_topk = 8;
  Config r = expect_accepted(f.c, 2);
  assert_int_equal(r.num_experts, 16);
  assert_int_equal(r.max_topk, 8);
  assert_int_equal(r.timeout_ms, 60000);
  assert_int_equal(r.max_nodes_per_token, 0);
  // The caller's struct is untouched (it is const, and nothing writes through it).
  assert_int_equal(f.c.size, sizeof(Future));
  assert_int_equal(f.new_field_a, 0x5a5a5a5a);
}

// ---- Field checks ---------------------------------------------------------------------

void resolve_rejects_experts_not_multiple_of_ranks(void**) {
  epConfig_t c = validConfig();
  c.num_experts = 6;
  expect_rejected(c, 4, "config.num_experts");
  assert_contains(ep::threadLastError(), "4 ranks");
  c.num_experts = 8;
  expect_accepted(c, 4);
  c.num_experts = 7;
  expect_accepted(c, 7);
  expect_accepted(c, 1);
  c.num_experts = 4;
  expect_rejected(c, 8, "config.num_experts");  // fewer experts than ranks
}

void resolve_rejects_nonpositive_experts_and_hidden(void**) {
  epConfig_t c = validConfig();
  c.num_experts = 0;
  expect_rejected(c, 1, "config.num_experts");
  c.num_experts = -16;
  expect_rejected(c, 1, "config.num_experts");
  c = validConfig();
  c.hidden = 0;
  expect_rejected(c, 1, "config.hidden");
  c.hidden = -128;
  expect_rejected(c, 1, "config.hidden");
}

void resolve_checks_row_is_multiple_of_16_bytes(void**) {
  epConfig_t c = validConfig();
  c.hidden = 12;  // bf16: 24 bytes
  expect_rejected(c, 1, "config.hidden");
  assert_contains(ep::threadLastError(), "24 bytes");
  c.hidden = 8;  // bf16: 16 bytes
  expect_accepted(c, 1);
  c.hidden = 7168;  // not a power of two (DeepSeek-V3)
  expect_accepted(c, 1);
  c.hidden = 2056;  // 4112 bytes
  expect_accepted(c, 1);

  c.dispatch_type = epFloat8E4M3;
  c.hidden = 16;  // fp8 16 bytes, bf16 combine 32 bytes
  expect_accepted(c, 1);
  c.hidden = 8;  // fp8: 8 bytes
  expect_rejected(c, 1, "config.hidden");
  assert_contains(ep::threadLastError(), "fp8e4m3");

  c = validConfig();
  c.dispatch_type = epFloat32;
  c.combine_type = epFloat32;
  c.hidden = 4;  // 16 bytes
  expect_accepted(c, 1);
  c.hidden = 2;
  expect_rejected(c, 1, "config.hidden");

  c = validConfig();
  c.combine_type = epFloat16;
  c.hidden = 12;  // the combine row counts too
  expect_rejected(c, 1, "config.hidden");
}

void resolve_checks_topk_range(void**) {
  epConfig_t c = validConfig();
  for (int k : {0, 33, -1, 1000}) {
    c.max_topk = k;
    expect_rejected(c, 1, "config.max_topk");
  }
  for (int k : {1, 8, 32}) {
    c.max_topk = k;
    Config r = expect_accepted(c, 1);
    assert_int_equal(r.max_topk, k);
  }
}

void resolve_rejects_unknown_types_and_backend(void**) {
  epConfig_t c = validConfig();
  c.dispatch_type = epInt32;
  expect_rejected(c, 1, "config.dispatch_type");
  c.dispatch_type = epDataType_t(42);
  expect_rejected(c, 1, "config.dispatch_type");
  c.dispatch_type = epDataType_t(-1);
  expect_rejected(c, 1, "config.dispatch_type");
  c = validConfig();
  c.combine_type = epFloat8E4M3;  // no FP8 combine
  expect_rejected(c, 1, "config.combine_type");
  c.combine_type = epInt64;
  expect_rejected(c, 1, "config.combine_type");
  c = validConfig();
  c.backend = epBackend_t(3);
  expect_rejected(c, 1, "config.backend");
  c.backend = epBackend_t(-1);
  expect_rejected(c, 1, "config.backend");
  c.backend = epBackendCuda;  // known (availability is checked at init)
  expect_accepted(c, 1);
}

void resolve_rejects_negative_counts(void**) {
  epConfig_t c = validConfig();
  c.max_tokens_per_rank = -1;
  expect_rejected(c, 1, "config.max_tokens_per_rank");
  c = validConfig();
  c.max_tokens_per_rank = 0;  // no tokens at all is allowed
  expect_accepted(c, 1);
  c = validConfig();
  c.max_nodes_per_token = -2;
  expect_rejected(c, 1, "config.max_nodes_per_token");
}

// Upper bounds: far above any model, and low enough that every buffer size
// computed from the config fits size_t (epLowLatencyBufferBytes included).
void resolve_rejects_sizes_past_the_limits(void**) {
  epConfig_t c = validConfig();
  c.num_experts = ep::kMaxExperts + 1;
  expect_rejected(c, 1, "config.num_experts = 1048577 is outside 1..1048576");
  c = validConfig();
  c.hidden = ep::kMaxHidden + 64;
  expect_rejected(c, 1, "config.hidden = 262208 is outside 1..262144");
  c = validConfig();
  c.max_tokens_per_rank = ep::kMaxTokensPerRank + 1;
  expect_rejected(c, 1, "config.max_tokens_per_rank");
  c = validConfig();
  expect_rejected(c, ep::kMaxCommRanks + 1, "nranks = 65537");
  // The largest accepted config: its low-latency buffer size does not wrap.
  c.num_experts = ep::kMaxExperts;
  c.hidden = ep::kMaxHidden;
  c.max_tokens_per_rank = ep::kMaxTokensPerRank;
  c.max_topk = 32;
  expect_accepted(c, ep::kMaxCommRanks);
  size_t bytes = 0;
  assert_int_equal(epLowLatencyBufferBytes(&c, ep::kMaxCommRanks, &bytes), epSuccess);
  const double expect = 2.0 * ep::kMaxCommRanks * double(ep::kMaxTokensPerRank) *
                        (double(ep::kMaxHidden) * 6);  // BF16 record + float32 combine row, at least
  assert_true(double(bytes) >= expect);
  assert_true(bytes < (size_t(1) << 63));
}

void resolve_rejects_negative_timeout(void**) {
  // 0 means "EP_TIMEOUT_MS"; a negative value is a caller error, not "use the default".
  epConfig_t c = validConfig();
  c.timeout_ms = -1;
  expect_rejected(c, 1, "config.timeout_ms");
}

void resolve_rejects_negative_num_sms(void**) {
  epConfig_t c = validConfig();
  c.num_sms = -4;
  expect_rejected(c, 1, "config.num_sms");
}

// ---- Data types ------------------------------------------------------------------------

void data_type_sizes_and_names(void**) {
  assert_int_equal(ep::dataTypeSize(epBfloat16), 2);
  assert_int_equal(ep::dataTypeSize(epFloat16), 2);
  assert_int_equal(ep::dataTypeSize(epFloat32), 4);
  assert_int_equal(ep::dataTypeSize(epFloat8E4M3), 1);
  assert_int_equal(ep::dataTypeSize(epInt32), 4);
  assert_int_equal(ep::dataTypeSize(epInt64), 8);
  assert_int_equal(ep::dataTypeSize(epDataType_t(6)), 0);
  assert_int_equal(ep::dataTypeSize(epDataType_t(-1)), 0);
  assert_string_equal(ep::dataTypeName(epBfloat16), "bf16");
  assert_string_equal(ep::dataTypeName(epFloat8E4M3), "fp8e4m3");
  assert_string_equal(ep::dataTypeName(epInt64), "int64");
  assert_string_equal(ep::dataTypeName(epDataType_t(99)), "unknown");
}

// ---- buildNodeMap ------------------------------------------------------------------------

std::vector<epPeerInfo_v1_t> peersWithHosts(const std::vector<uint64_t>& hosts) {
  std::vector<epPeerInfo_v1_t> peers(hosts.size());
  for (size_t r = 0; r < hosts.size(); r++) {
    memset(&peers[r], 0, sizeof(peers[r]));
    peers[r].rank = int(r);
    peers[r].host_hash = hosts[r];
    peers[r].cuda_device = -1;
  }
  return peers;
}

void node_map_by_interleaved_host_hash(void**) {
  const uint64_t A = 0xaaaa, B = 0xbbbb, C = 0xcccc;
  auto peers = peersWithHosts({B, A, B, A, C, B});
  ep::NodeMap m;
  assert_ok(ep::buildNodeMap(peers, 0, &m));
  assert_int_equal(m.num_nodes, 3);
  // Node order follows the first rank of each host: B (rank 0), A (rank 1), C (rank 4).
  assert_true((m.node_of_rank == std::vector<int>{0, 1, 0, 1, 2, 0}));
  assert_true((m.local_rank == std::vector<int>{0, 0, 1, 1, 0, 2}));
  assert_true((m.node_size == std::vector<int>{3, 2, 1}));
  assert_true((m.node_first == std::vector<int>{0, 1, 4}));
  assert_int_equal(m.node_ranks.size(), 3);
  assert_true((m.node_ranks[0] == std::vector<int>{0, 2, 5}));
  assert_true((m.node_ranks[1] == std::vector<int>{1, 3}));
  assert_true((m.node_ranks[2] == std::vector<int>{4}));
}

void node_map_single_host_is_one_node(void**) {
  auto peers = peersWithHosts({7, 7, 7, 7});
  ep::NodeMap m;
  assert_ok(ep::buildNodeMap(peers, 0, &m));
  assert_int_equal(m.num_nodes, 1);
  assert_true((m.node_of_rank == std::vector<int>{0, 0, 0, 0}));
  assert_true((m.local_rank == std::vector<int>{0, 1, 2, 3}));
  assert_true((m.node_size == std::vector<int>{4}));
}

void node_map_by_node_size_ignores_hosts(void**) {
  auto peers = peersWithHosts({1, 2, 1, 2, 1, 2});
  ep::NodeMap m;
  assert_ok(ep::buildNodeMap(peers, 2, &m));
  assert_int_equal(m.num_nodes, 3);
  assert_true((m.node_of_rank == std::vector<int>{0, 0, 1, 1, 2, 2}));
  assert_true((m.local_rank == std::vector<int>{0, 1, 0, 1, 0, 1}));
  assert_true((m.node_first == std::vector<int>{0, 2, 4}));
  assert_true((m.node_ranks[1] == std::vector<int>{2, 3}));
  assert_ok(ep::buildNodeMap(peers, 3, &m));
  assert_int_equal(m.num_nodes, 2);
  assert_true((m.node_of_rank == std::vector<int>{0, 0, 0, 1, 1, 1}));
  assert_ok(ep::buildNodeMap(peers, 6, &m));
  assert_int_equal(m.num_nodes, 1);
  assert_ok(ep::buildNodeMap(peers, 1, &m));
  assert_int_equal(m.num_nodes, 6);
  assert_true((m.local_rank == std::vector<int>{0, 0, 0, 0, 0, 0}));
}

void node_map_rejects_node_size_not_dividing_ranks(void**) {
  auto peers = peersWithHosts({1, 1, 1, 1, 1, 1});
  ep::NodeMap m;
  m.num_nodes = 99;  // sentinel
  assert_result(ep::buildNodeMap(peers, 4, &m), epInvalidArgument);
  assert_contains(ep::threadLastError(), "EP_NODE_SIZE");
  assert_int_equal(m.num_nodes, 99);
  assert_result(ep::buildNodeMap(peers, 7, &m), epInvalidArgument);
  assert_contains(ep::threadLastError(), "EP_NODE_SIZE = 7");
}

// epLowLatencyBufferBytes: what a low-latency communicator registers per rank,
// from the config alone: a control area and two sets of (dispatch landing,
// combine landing, per-(source, expert) counts).
void ll_buffer_bytes_follows_the_layout(void**) {
  epConfig_t c = validConfig();
  c.low_latency = 1;
  c.num_experts = 288;
  c.hidden = 7168;
  c.max_tokens_per_rank = 128;
  c.max_topk = 8;
  size_t bytes = 0;
  assert_result(epLowLatencyBufferBytes(&c, 2, &bytes), epSuccess);
  assert_true(bytes == ep::llBufferBytes(2, 128, 7168, 8, 288));
  // One record per (source, token): header (16 + 12 K bytes, 16-aligned), BF16 row, FP8 scales.
  const size_t record = 112 + 7168 * 2 + 56 * 4;
  const size_t rows = 2 * 128;
  // Flagged records of small calls: [R][16] of header words (1 + 2 K, 8 bytes
  // each, 16-aligned), a BF16 row's bytes twice, the scales in 8-byte words.
  const size_t flagged = (2 * 16 * (144 + 7168 * 4 + 448) + 4095) / 4096 * 4096;
  const size_t set = (rows * record + 4095) / 4096 * 4096 + rows * 7168 * 4 + 4096 + flagged;
  assert_true(bytes == 4096 + 2 * set);
  // Flagged tokens per call: at most 16, fewer where ranks * (1 + max_topk)
  // * tokens would exceed a receiving block's stage of 1024 ints.
  assert_int_equal(ep::llFlagTokensFit(1, 8), 16);
  assert_int_equal(ep::llFlagTokensFit(8, 8), 14);
  assert_int_equal(ep::llFlagTokensFit(2, 32), 15);
  assert_int_equal(ep::llFlagTokensFit(8, 32), 3);
  // The counts grow with the experts: 8192 experts need 32 KiB per set instead of 4 KiB.
  c.num_experts = 8192;
  size_t more = 0;
  assert_result(epLowLatencyBufferBytes(&c, 2, &more), epSuccess);
  assert_true(more == bytes + 2 * (32768 - 4096));
  // Bad arguments are refused with a reason.
  assert_result(epLowLatencyBufferBytes(&c, 2, nullptr), epInvalidArgument);
  assert_result(epLowLatencyBufferBytes(&c, 0, &more), epInvalidArgument);
  assert_contains(epGetLastError(nullptr), "nranks");
  c.num_experts = 9;  // not a multiple of 2 ranks
  assert_result(epLowLatencyBufferBytes(&c, 2, &more), epInvalidArgument);
}

}  // namespace

int main(int argc, char** argv) {
  int child_rc = 0;
  if (eptest::runChildCase(argc, argv, childCases(), &child_rc)) return child_rc;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(initializer_is_valid_cxx_and_fills_header),
      cmocka_unit_test(magic_numbers_are_distinct),
      cmocka_unit_test(resolve_fills_defaults),
      cmocka_unit_test(resolve_keeps_explicit_values),
      cmocka_unit_test(env_fills_zero_fields_and_struct_wins),
      cmocka_unit_test(env_malformed_timeout_keeps_default),
      cmocka_unit_test(env_negative_timeout_rejected_naming_variable),
      cmocka_unit_test(resolve_rejects_null_config),
      cmocka_unit_test(resolve_rejects_wrong_magic),
      cmocka_unit_test(resolve_rejects_too_small_size),
      cmocka_unit_test(resolve_accepts_older_v1_sized_struct),
      cmocka_unit_test(resolve_ignores_tail_padding),
      cmocka_unit_test(resolve_version_1_caller_gets_version_2_defaults),
      cmocka_unit_test(resolve_version_2_caller_gets_no_shrink),
      cmocka_unit_test(resolve_accepts_larger_struct_copying_only_known_fields),
      cmocka_unit_test(resolve_rejects_experts_not_multiple_of_ranks),
      cmocka_unit_test(resolve_rejects_nonpositive_experts_and_hidden),
      cmocka_unit_test(resolve_checks_row_is_multiple_of_16_bytes),
      cmocka_unit_test(resolve_checks_topk_range),
      cmocka_unit_test(resolve_rejects_unknown_types_and_backend),
      cmocka_unit_test(resolve_rejects_negative_counts),
      cmocka_unit_test(resolve_rejects_sizes_past_the_limits),
      cmocka_unit_test(env_host_ring_sizes_out_of_range_are_rejected),
      cmocka_unit_test(unknown_debug_subsystems_are_ignored),
      cmocka_unit_test(low_latency_dispatch_keeps_the_node_limit),
      cmocka_unit_test(shm_dir_problems_name_their_cause),
      cmocka_unit_test(stale_segments_of_dead_processes_are_removed),
      cmocka_unit_test(resolve_rejects_negative_timeout),
      cmocka_unit_test(resolve_rejects_negative_num_sms),
      cmocka_unit_test(data_type_sizes_and_names),
      cmocka_unit_test(node_map_by_interleaved_host_hash),
      cmocka_unit_test(node_map_single_host_is_one_node),
      cmocka_unit_test(node_map_by_node_size_ignores_hosts),
      cmocka_unit_test(node_map_rejects_node_size_not_dividing_ranks),
      cmocka_unit_test(ll_buffer_bytes_follows_the_layout),
  };
  return cmocka_run_group_tests_name("config", tests, groupSetup, nullptr);
}
