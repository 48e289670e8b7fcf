// Result codes and messages: epGetErrorString, epGetLastError (thread-local
// when comm is NULL), epGetVersion, and the public calls given a NULL or dead
// communicator or handle: each returns a result, never crashes.
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "backend.h"
#include "comm.h"
#include "common.h"

namespace {

epConfig_t validConfig() {
  epConfig_t c = EP_CONFIG_INITIALIZER;
  c.num_experts = 8;
  c.hidden = 64;
  c.max_tokens_per_rank = 16;
  c.max_topk = 2;
  c.backend = epBackendHost;
  return c;
}

int groupSetup(void**) {
  eptest::unsetAllParams();
  return 0;
}

// ---- epGetErrorString -------------------------------------------------------------

void error_string_of_every_result_is_distinct_and_nonempty(void**) {
  const epResult_t all[] = {epSuccess,      epUnhandledCudaError, epSystemError, epInternalError,
                            epInvalidArgument, epInvalidUsage,    epRemoteError, epInProgress,
                            epTimeout,      epNotSupported,       epAborted,     epOutOfMemory};
  const int n = int(sizeof(all) / sizeof(all[0]));
  assert_int_equal(n, 12);
  for (int i = 0; i < n; i++) {
    assert_int_equal(int(all[i]), i);  // values are fixed forever
    const char* s = epGetErrorString(all[i]);
    assert_non_null(s);
    assert_true(strlen(s) > 0);
    assert_string_not_equal(s, "unknown result code");
    for (int j = 0; j < i; j++) {
      if (strcmp(s, epGetErrorString(all[j])) == 0)
        print_error("results %d and %d share the string \"%s\"\n", i, j, s);
      assert_string_not_equal(s, epGetErrorString(all[j]));
    }
  }
}

void error_string_names_the_common_results(void**) {
  assert_contains(epGetErrorString(epInvalidArgument), "argument");
  assert_contains(epGetErrorString(epTimeout), "timeout");
  assert_contains(epGetErrorString(epAborted), "abort");
  assert_contains(epGetErrorString(epOutOfMemory), "memory");
}

void error_string_of_unknown_value(void**) {
  for (int v : {12, 13, 100, -1, 0x7fffffff}) {
    const char* s = epGetErrorString(epResult_t(v));
    assert_non_null(s);
    assert_string_equal(s, "unknown result code");
  }
}

// ---- epGetLastError -----------------------------------------------------------------

void last_error_after_init_with_zero_ranks(void**) {
  epUniqueId id;
  memset(&id, 0, sizeof(id));
  epConfig_t cfg = validConfig();
  epComm_t comm = reinterpret_cast<epComm_t>(0x1);
  assert_result(epCommInitRank(&comm, 0, id, 0, &cfg), epInvalidArgument);
  assert_null(comm);  // the output is cleared
  const char* msg = epGetLastError(nullptr);
  assert_non_null(msg);
  assert_contains(msg, "nranks");
  assert_contains(msg, "0");
  assert_string_equal(msg, ep::threadLastError());
}

void last_error_names_each_init_argument(void**) {
  epUniqueId id;
  memset(&id, 0, sizeof(id));
  epConfig_t cfg = validConfig();
  epComm_t comm = nullptr;
  assert_result(epCommInitRank(nullptr, 1, id, 0, &cfg), epInvalidArgument);
  assert_contains(epGetLastError(nullptr), "comm");
  assert_result(epCommInitRank(&comm, 2, id, 2, &cfg), epInvalidArgument);
  assert_contains(epGetLastError(nullptr), "rank = 2");
  assert_result(epCommInitRank(&comm, 2, id, -1, &cfg), epInvalidArgument);
  assert_contains(epGetLastError(nullptr), "rank = -1");
  assert_result(epCommInitRank(&comm, 1, id, 0, &cfg), epInvalidArgument);  // id not from epGetUniqueId
  assert_contains(epGetLastError(nullptr), "unique_id");
  assert_result(epCommInitAll(&comm, 1, nullptr, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(nullptr), "config");
  assert_result(epCommInitAll(nullptr, 1, nullptr, &cfg), epInvalidArgument);
  assert_contains(epGetLastError(nullptr), "comms");
  assert_result(epGetUniqueId(nullptr), epInvalidArgument);
  assert_contains(epGetLastError(nullptr), "unique_id");
}

void last_error_is_per_thread(void**) {
  epUniqueId id;
  memset(&id, 0, sizeof(id));
  epConfig_t cfg = validConfig();
  epComm_t comm = nullptr;
  assert_result(epCommInitRank(&comm, 0, id, 0, &cfg), epInvalidArgument);
  std::string mine = epGetLastError(nullptr);
  assert_contains(mine.c_str(), "nranks");

  std::string seen_by_other = "unset";
  std::string other_after_own_error;
  std::thread other([&] {
    seen_by_other = epGetLastError(nullptr);
    int rank = 0;
    epCommRank(nullptr, &rank);  // an error of its own
    other_after_own_error = epGetLastError(nullptr);
  });
  other.join();
  assert_string_equal(seen_by_other.c_str(), "");
  assert_contains(other_after_own_error.c_str(), "epCommRank");
  // The other thread's error did not replace this thread's message.
  assert_string_equal(epGetLastError(nullptr), mine.c_str());
}

void last_error_is_never_null(void**) {
  std::string got = "unset";
  std::thread t([&] {
    const char* s = epGetLastError(nullptr);
    got = s ? s : "(null)";
  });
  t.join();
  assert_string_equal(got.c_str(), "");
}

// ---- epGetVersion ---------------------------------------------------------------------

void version_matches_header(void**) {
  int v = -1;
  assert_ok(epGetVersion(&v));
  assert_int_equal(v, EP_VERSION_CODE);
  assert_int_equal(EP_VERSION_CODE,
                   EP_VERSION_MAJOR * 10000 + EP_VERSION_MINOR * 100 + EP_VERSION_PATCH);
  assert_int_equal(EP_VERSION_CODE_OF(1, 2, 3), 10203);
}

void version_rejects_null(void**) {
  assert_result(epGetVersion(nullptr), epInvalidArgument);
  assert_contains(epGetLastError(nullptr), "version");
}

// ---- NULL communicator ---------------------------------------------------------------

void queries_with_null_comm_are_rejected(void**) {
  int a = 11, b = 22;
  size_t bytes = 33;
  assert_result(epCommRank(nullptr, &a), epInvalidArgument);
  assert_contains(epGetLastError(nullptr), "epCommRank: comm is NULL");
  assert_int_equal(a, 11);
  assert_result(epCommSize(nullptr, &a), epInvalidArgument);
  assert_contains(epGetLastError(nullptr), "epCommSize");
  assert_result(epCommLocalExperts(nullptr, &a, &b), epInvalidArgument);
  assert_contains(epGetLastError(nullptr), "epCommLocalExperts");
  assert_result(epCommBufferBytes(nullptr, &bytes), epInvalidArgument);
  assert_contains(epGetLastError(nullptr), "epCommBufferBytes");
  assert_result(epCommNodes(nullptr, &a, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(nullptr), "epCommNodes");
  assert_int_equal(a, 11);
  assert_int_equal(b, 22);
  assert_int_equal(bytes, 33);
}

void data_calls_with_null_comm_are_rejected(void**) {
  int64_t idx[2] = {0, 1};
  epLayoutArgs_t la = EP_LAYOUT_ARGS_INITIALIZER;
  la.topk_idx = idx;
  la.num_tokens = 1;
  la.num_topk = 2;
  assert_result(epLayout(nullptr, &la, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(nullptr), "epLayout: comm is NULL");

  epDispatchArgs_t da = EP_DISPATCH_ARGS_INITIALIZER;
  epHandle_t h = nullptr;
  assert_result(epDispatch(nullptr, &da, &h, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(nullptr), "epDispatch: comm is NULL");
  assert_null(h);
  assert_result(epDispatch(nullptr, nullptr, nullptr, nullptr), epInvalidArgument);
  assert_result(epDispatchPrepare(nullptr, &da, &h, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(nullptr), "epDispatchPrepare: comm is NULL");
  assert_null(h);

  epCombineArgs_t ca = EP_COMBINE_ARGS_INITIALIZER;
  assert_result(epCombine(nullptr, &ca, nullptr, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(nullptr), "epCombine: comm is NULL");
  assert_result(epCombine(nullptr, nullptr, nullptr, nullptr), epInvalidArgument);
}

void destroy_calls_accept_null(void**) {
  assert_ok(epHandleDestroy(nullptr));
  assert_ok(epCommDestroy(nullptr));
  assert_ok(epCommAbort(nullptr));
  int64_t n = 5;
  assert_result(epHandleRecvCount(nullptr, &n), epInvalidArgument);
  assert_contains(epGetLastError(nullptr), "epHandleRecvCount");
  assert_int_equal(n, 5);
}

// ---- Dead objects (built here, never freed by the library) --------------------------------

void calls_on_dead_comm_are_rejected(void**) {
  epComm dead;
  dead.magic = ep::kDeadMagic;
  int r = 7;
  assert_result(epCommRank(&dead, &r), epInvalidArgument);
  assert_contains(epGetLastError(nullptr), "not a live communicator");
  assert_int_equal(r, 7);
  epDispatchArgs_t da = EP_DISPATCH_ARGS_INITIALIZER;
  epHandle_t h = nullptr;
  assert_result(epDispatch(&dead, &da, &h, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(nullptr), "not a live communicator");
  assert_int_equal(dead.active_calls.load(), 0);  // a refused call is not counted
  assert_result(epCommDestroy(&dead), epInvalidArgument);
  assert_result(epCommAbort(&dead), epInvalidArgument);
  assert_int_equal(dead.magic, ep::kDeadMagic);
  // With a dead comm epGetLastError falls back to the thread's message.
  assert_string_equal(epGetLastError(&dead), ep::threadLastError());
}

// epCommShrink: refused on a communicator made without enable_shrink, and
// its arguments checked; one rank alone shrinks at once, losing nobody.
void shrink_is_refused_where_it_cannot_run(void**) {
  epConfig_t cfg = validConfig();
  epComm_t comm = nullptr;
  assert_result(epCommInitAll(&comm, 1, nullptr, &cfg), epSuccess);
  int dead[1] = {-1}, ndead = -1;
  assert_result(epCommShrink(comm, nullptr, 0, dead, &ndead), epInvalidUsage);
  assert_contains(epGetLastError(comm), "enable_shrink");
  assert_int_equal(ndead, -1);
  // epCommDeadRanks without shrink: nobody, epoch 0; its arguments checked.
  unsigned int epoch = 7;
  assert_result(epCommDeadRanks(comm, nullptr, 0, &ndead, &epoch), epSuccess);
  assert_int_equal(ndead, 0);
  assert_int_equal(epoch, 0);
  assert_result(epCommDeadRanks(comm, nullptr, 0, nullptr, &epoch), epInvalidArgument);
  assert_result(epCommDeadRanks(comm, nullptr, 2, &ndead, &epoch), epInvalidArgument);
  assert_result(epCommDeadRanks(comm, dead, -1, &ndead, nullptr), epInvalidArgument);
  assert_result(epCommDeadRanks(nullptr, dead, 1, &ndead, nullptr), epInvalidArgument);
  assert_result(epCommDestroy(comm), epSuccess);

  cfg.enable_shrink = 1;
  assert_result(epCommInitAll(&comm, 1, nullptr, &cfg), epSuccess);
  assert_result(epCommShrink(comm, nullptr, 0, nullptr, &ndead), epInvalidArgument);
  const int self[1] = {0};
  assert_result(epCommShrink(comm, self, 1, dead, &ndead), epInvalidArgument);
  assert_contains(epGetLastError(comm), "this rank");
  const int far[1] = {5};
  assert_result(epCommShrink(comm, far, 1, dead, &ndead), epInvalidArgument);
  // One rank alone: nobody to lose, it decides at once.
  assert_result(epCommShrink(comm, nullptr, 0, dead, &ndead), epSuccess);
  assert_int_equal(ndead, 0);
  ndead = -1;
  assert_result(epCommDeadRanks(comm, dead, 1, &ndead, &epoch), epSuccess);
  assert_int_equal(ndead, 0);
  assert_int_equal(epoch, 1);  // the shrink completed, losing nobody
  assert_result(epCommDestroy(comm), epSuccess);

}

void calls_with_dead_handle_are_rejected(void**) {
  epHandle dead;
  dead.magic = ep::kDeadMagic;
  dead.counts_known = true;
  dead.routing.num_recv = 3;
  int64_t n = -9;
  assert_result(epHandleRecvCount(&dead, &n), epInvalidArgument);
  assert_contains(epGetLastError(nullptr), "not a live routing handle");
  assert_int_equal(n, -9);
  assert_result(epHandleDestroy(&dead), epInvalidArgument);
  assert_contains(epGetLastError(nullptr), "epHandleDestroy");
  assert_int_equal(dead.magic, ep::kDeadMagic);
}

void handle_recv_count_needs_output_and_known_counts(void**) {
  epHandle h;  // a live handle with no communicator behind it
  h.routing.num_recv = 42;
  h.counts_known = false;
  int64_t n = -1;
  assert_result(epHandleRecvCount(&h, &n), epInvalidUsage);
  assert_contains(epGetLastError(nullptr), "NO_HOST_SYNC");
  assert_int_equal(n, -1);
  h.counts_known = true;
  assert_result(epHandleRecvCount(&h, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(nullptr), "num_recv");
  assert_ok(epHandleRecvCount(&h, &n));
  assert_int_equal(n, 42);
}

// ---- Transports ------------------------------------------------------------------------

// The host backend needs the built-in shm transport. This suite links
// libmoeep_internal.a like any program that uses the internals, and compiles
// no transport in itself: shm must come from the library.
void built_in_shm_transport_is_listed_and_available(void**) {
  bool found = false;
  int n = 0;
  const char* name = nullptr;
  int available = -1;
  const char* detail = nullptr;
  for (; epGetTransport(n, &name, &available, &detail) == epSuccess; n++) {
    assert_non_null(name);
    assert_non_null(detail);
    if (strcmp(name, "shm") != 0) continue;
    found = true;
    if (!available) print_error("shm is not available: %s\n", detail);
    assert_int_equal(available, 1);
    assert_string_equal(detail, "built-in");
  }
  if (!found) print_error("epGetTransport lists %d transports and no \"shm\"\n", n);
  assert_true(found);
  assert_result(epGetTransport(n, &name, &available, &detail), epInvalidArgument);
  assert_contains(epGetLastError(nullptr), "epGetTransport: index");
  assert_result(epGetTransport(-1, &name, &available, &detail), epInvalidArgument);
}

// The end of a list is an error with a message of its own, not a stale one.
void param_list_end_has_its_own_message(void**) {
  assert_result(epGetVersion(nullptr), epInvalidArgument);  // leaves an unrelated message
  const char* name = nullptr;
  assert_result(epGetParam(100000, &name, nullptr, nullptr, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(nullptr), "epGetParam: index = 100000");
}

// A dry-run plan of a million ranks is refused at once instead of eating memory.
void topology_dry_run_is_bounded(void**) {
  size_t bytes = 0;
  assert_result(epTopologyReport(nullptr, 1000000, 1000000, nullptr, &bytes), epInvalidArgument);
  assert_contains(epGetLastError(nullptr), "up to 2048 ranks");
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(error_string_of_every_result_is_distinct_and_nonempty),
      cmocka_unit_test(error_string_names_the_common_results),
      cmocka_unit_test(error_string_of_unknown_value),
      cmocka_unit_test(last_error_after_init_with_zero_ranks),
      cmocka_unit_test(last_error_names_each_init_argument),
      cmocka_unit_test(last_error_is_per_thread),
      cmocka_unit_test(last_error_is_never_null),
      cmocka_unit_test(version_matches_header),
      cmocka_unit_test(version_rejects_null),
      cmocka_unit_test(queries_with_null_comm_are_rejected),
      cmocka_unit_test(data_calls_with_null_comm_are_rejected),
      cmocka_unit_test(destroy_calls_accept_null),
      cmocka_unit_test(calls_on_dead_comm_are_rejected),
      cmocka_unit_test(shrink_is_refused_where_it_cannot_run),
      cmocka_unit_test(calls_with_dead_handle_are_rejected),
      cmocka_unit_test(handle_recv_count_needs_output_and_known_counts),
      cmocka_unit_test(built_in_shm_transport_is_listed_and_available),
      cmocka_unit_test(param_list_end_has_its_own_message),
      cmocka_unit_test(topology_dry_run_is_bounded),
  };
  return cmocka_run_group_tests_name("errors", tests, groupSetup, nullptr);
}
