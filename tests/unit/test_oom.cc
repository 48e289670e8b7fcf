// Out of host memory inside a public call: the call returns epOutOfMemory with
// a message instead of terminating the process, and a data call that failed
// that way marks its communicator failed (its peers may be mid-exchange).
// This program replaces operator new so that a chosen allocation throws.
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <chrono>
#include <thread>
#include <vector>

#include "bootstrap.h"
#include "common.h"

namespace {
// -1: never fail; n >= 0: allocations left before one throws std::bad_alloc.
std::atomic<long> g_fail_after{-1};
// Set: only this thread's allocations count (others, such as a bootstrap
// root's thread still polling after an earlier case, neither fail nor
// take the failure meant for the call under test).
std::atomic<std::thread::id> g_fail_thread{};
}  // namespace

void* operator new(size_t n) {
  const std::thread::id only = g_fail_thread.load();
  long left = only == std::thread::id() || only == std::this_thread::get_id() ? g_fail_after.load() : -1;
  while (left >= 0 && !g_fail_after.compare_exchange_weak(left, left - 1)) {
  }
  if (left == 0) throw std::bad_alloc();
  void* p = malloc(n ? n : 1);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
void* operator new[](size_t n) { return operator new(n); }
// The nothrow forms too (the library uses them): a runtime's own nothrow new
// (a sanitizer's) would neither fail when chosen nor pair with the delete below.
void* operator new(size_t n, const std::nothrow_t&) noexcept {
  try {
    return operator new(n);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
void* operator new[](size_t n, const std::nothrow_t& nt) noexcept { return operator new(n, nt); }
void operator delete(void* p) noexcept { free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { free(p); }
void operator delete(void* p, size_t) noexcept { free(p); }
void operator delete[](void* p) noexcept { free(p); }
void operator delete[](void* p, size_t) noexcept { free(p); }

namespace {

constexpr int kExperts = 4, kHidden = 64, kTokens = 8, kTopk = 2;

epConfig_t config() { return eptest::hostConfig(kExperts, kHidden, kTokens, kTopk); }

epResult_t oneRankComm(epComm_t* comm) { return eptest::makeOneRankComm(comm, config()); }

// The root's thread (started by epGetUniqueId) runs out of memory before the
// rank dials it, taking a stranger's connection: the rank must not retry the
// closed port until its timeout (5 s here) but say at once that the root of
// this process failed. Runs first: no other root's thread may take the
// failing allocation.
void a_failed_root_of_this_process_is_not_waited_for(void**) {
  epUniqueId id;
  assert_ok(epGetUniqueId(&id));
  ep::SocketAddress root;
  assert_true(ep::bootstrapIdInfo(id, nullptr, nullptr, &root));
  g_fail_after = 0;  // the root's next allocation throws: the one that takes this connection
  const int stranger = socket(root.family(), SOCK_STREAM | SOCK_CLOEXEC, 0);  // system calls only: no allocation
  assert_true(stranger >= 0 && connect(stranger, root.sa(), root.length()) == 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(350));
  g_fail_after = -1;
  close(stranger);
  epConfig_t c = config();
  c.timeout_ms = 5000;
  epComm_t comm = nullptr;
  const auto t0 = std::chrono::steady_clock::now();
  const epResult_t res = epCommInitRank(&comm, 1, id, 0, &c);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (res != epRemoteError) print_error("%s after %.2f s\n", epGetLastError(nullptr), secs);
  assert_int_equal(res, epRemoteError);
  assert_contains(epGetLastError(nullptr), "in this process, failed before this rank reached it");
  assert_true(secs < 2.0);
  assert_null(comm);
}

void dispatch_out_of_memory_is_a_result(void**) {
  epComm_t comm = nullptr;
  assert_ok(oneRankComm(&comm));
  std::vector<uint16_t> x(size_t(kTokens) * kHidden, 0x3f80);
  std::vector<int64_t> idx(size_t(kTokens) * kTopk, 1);
  for (int t = 0; t < kTokens; t++) idx[size_t(t) * kTopk + 1] = 2;
  std::vector<uint16_t> recv_x(size_t(kTokens) * kHidden + 64);
  epDispatchArgs_t a = EP_DISPATCH_ARGS_INITIALIZER;
  a.x = x.data();
  a.topk_idx = idx.data();
  a.num_tokens = kTokens;
  a.num_topk = kTopk;
  a.recv_x = recv_x.data();
  a.recv_capacity = kTokens;
  epHandle_t h = nullptr;
  g_fail_after = 0;  // the first allocation inside the call throws
  epResult_t res = epDispatch(comm, &a, &h, nullptr);
  g_fail_after = -1;
  assert_int_equal(res, epOutOfMemory);
  assert_contains(epGetLastError(comm), "epDispatch: out of host memory");
  assert_null(h);
  // It may have stopped mid-exchange: the communicator refuses further data calls.
  assert_result(epDispatch(comm, &a, &h, nullptr), epRemoteError);
  // Its queries still answer (an error handler wants the rank and size).
  int rank = -1, size = -1, local = -1;
  assert_ok(epCommRank(comm, &rank));
  assert_ok(epCommSize(comm, &size));
  int first = -1;
  assert_ok(epCommLocalExperts(comm, &first, &local));
  assert_int_equal(rank, 0);
  assert_int_equal(size, 1);
  assert_ok(epCommDestroy(comm));
}

// Shared-memory segments of the library (EP_SHM_DIR/moeep-*) this process
// has mapped: a communicator's host backend maps its buffers there.
int mappedSegments() {
  int n = 0;
  if (FILE* f = fopen("/proc/self/maps", "r")) {
    char line[4096];
    while (fgets(line, sizeof(line), f) != nullptr) n += strstr(line, "/moeep-") != nullptr;
    fclose(f);
  }
  return n;
}

void every_allocation_of_init_can_fail(void**) {
  // Fail the 1st, 2nd, ... allocation of epCommInitRank in turn: each run must
  // return a result at once (success once the failure point is past init),
  // and leave nothing behind: a failing allocation throws, and what init had
  // made by then (the communicator, its backend with its shared memory) must
  // go too. (Descriptors and mappings in general are no measure here: each
  // run's bootstrap root keeps its thread and port until it gives up.)
  const int segments = mappedSegments();
  int succeeded = 0;
  for (long k = 0; k < 400 && succeeded < 3; k++) {
    epComm_t comm = nullptr;
    epUniqueId id;
    assert_ok(epGetUniqueId(&id));
    epConfig_t c = config();
    g_fail_after = k;
    epResult_t res = epCommInitRank(&comm, 1, id, 0, &c);
    g_fail_after = -1;
    if (res == epSuccess) {
      if (succeeded++ == 0) print_message("init succeeds from allocation %ld on\n", k);
      assert_non_null(comm);
      assert_ok(epCommDestroy(comm));
    } else {
      // Any error with a message (where the bootstrap root's side fails, the
      // rank sees the root close the connection: epRemoteError).
      assert_null(comm);
      assert_true(strlen(epGetLastError(nullptr)) > 0);
      if (res == epTimeout) print_error("allocation %ld failing: %s\n", k, epGetLastError(nullptr));
      assert_int_not_equal(res, epTimeout);  // no failure may turn into a wait
    }
  }
  assert_true(succeeded >= 1);
  const int segments_after = mappedSegments();
  if (segments_after != segments) print_error("shared-memory segments mapped: %d -> %d\n", segments, segments_after);
  assert_int_equal(segments_after, segments);
}

void topology_report_out_of_memory_is_a_result(void**) {
  size_t bytes = 0;
  g_fail_thread = std::this_thread::get_id();
  g_fail_after = 0;
  epResult_t res = epTopologyReport(nullptr, 2, 2, nullptr, &bytes);
  g_fail_after = -1;
  g_fail_thread = std::thread::id();
  assert_int_equal(res, epOutOfMemory);
  assert_contains(epGetLastError(nullptr), "epTopologyReport: out of host memory");
}

}  // namespace

int main() {
  eptest::unsetAllParams();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(a_failed_root_of_this_process_is_not_waited_for),
      cmocka_unit_test(dispatch_out_of_memory_is_a_result),
      cmocka_unit_test(every_allocation_of_init_can_fail),
      cmocka_unit_test(topology_report_out_of_memory_is_a_result),
  };
  return cmocka_run_group_tests_name("out of memory", tests, nullptr, nullptr);
}
