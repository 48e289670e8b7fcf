// A communicator used from several threads: a data call while another thread
// is inside one is refused, epCommDestroy is refused while a call is in
// progress, epCommAbort unblocks it, a peer that destroys its communicator
// ends the wait at once. Two host ranks of one process
// (epCommInitAll); rank 0's dispatch blocks until rank 1 joins, which gives
// each case a call that is certainly in progress.
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "comm.h"
#include "common.h"

namespace {

constexpr int kExperts = 4, kHidden = 64, kTokens = 8, kTopk = 2;

epConfig_t config() { return eptest::hostConfig(kExperts, kHidden, kTokens, kTopk); }

// One rank's dispatch inputs and outputs (every token to experts 0 and 3: both ranks).
struct Rank {
  std::vector<uint16_t> x = std::vector<uint16_t>(size_t(kTokens) * kHidden, 0x3f80);  // bf16 1.0
  std::vector<int64_t> idx;
  std::vector<uint16_t> recv_x = std::vector<uint16_t>(size_t(2 * kTokens) * kHidden + 64);
  Rank() {
    for (int t = 0; t < kTokens; t++) idx.insert(idx.end(), {0, 3});
  }
  epDispatchArgs_t args() {
    epDispatchArgs_t a = EP_DISPATCH_ARGS_INITIALIZER;
    a.x = x.data();
    a.x_type = epBfloat16;
    a.topk_idx = idx.data();
    a.topk_idx_type = epInt64;
    a.num_tokens = kTokens;
    a.num_topk = kTopk;
    a.recv_x = recv_x.data();
    a.recv_capacity = 2 * kTokens;
    return a;
  }
};

double secondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Rank 0's dispatch in a thread of its own; start() returns once it is
// inside the call (the communicator's busy flag is set) and, after a pause,
// still blocked waiting for rank 1; finish() joins it.
struct BlockedDispatch {
  Rank rank;
  std::atomic<int> result{-1};
  epHandle_t handle = nullptr;
  std::thread thread;
  void start(epComm_t comm) {
    thread = std::thread([this, comm] {
      epDispatchArgs_t a = rank.args();
      result = epDispatch(comm, &a, &handle, nullptr);
    });
    // A loaded machine may start the thread late: wait for the flag, not a fixed time.
    const auto start = std::chrono::steady_clock::now();
    while (comm->collective_busy.load() == 0 && result.load() == -1 && secondsSince(start) < 10.0)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    assert_int_equal(comm->collective_busy.load(), 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    assert_int_equal(result.load(), -1);  // still waiting for rank 1
  }
  int finish() {
    thread.join();
    return result.load();
  }
};

// Two host ranks of this process, fresh for each case (cases destroy or abort them).
void initTwoRanks(epComm_t comms[2]) {
  epConfig_t cfg = config();
  assert_ok(epCommInitAll(comms, 2, nullptr, &cfg));
}

// Rank 0 blocked in a dispatch while `during` runs (on this thread); then
// rank 1 dispatches and both complete.
template <typename During>
void withBlockedDispatch(epComm_t comms[2], During during) {
  BlockedDispatch blocked;
  blocked.start(comms[0]);
  during();
  Rank r1;
  epHandle_t h1 = nullptr;
  epDispatchArgs_t a = r1.args();
  assert_ok(epDispatch(comms[1], &a, &h1, nullptr));
  assert_int_equal(blocked.finish(), epSuccess);
  assert_ok(epHandleDestroy(blocked.handle));
  assert_ok(epHandleDestroy(h1));
}

void second_data_call_from_another_thread_is_refused(void**) {
  epComm_t comms[2] = {nullptr, nullptr};
  initTwoRanks(comms);
  withBlockedDispatch(comms, [&] {
    Rank other;
    epDispatchArgs_t a = other.args();
    epHandle_t h = nullptr;
    assert_result(epDispatch(comms[0], &a, &h, nullptr), epInvalidUsage);
    assert_contains(epGetLastError(nullptr), "in progress in another thread");
    assert_null(h);
    // Queries are not data calls: they still answer.
    int rank = -1;
    assert_ok(epCommRank(comms[0], &rank));
    assert_int_equal(rank, 0);
  });
  // The communicator works afterwards (the refused call left no claim behind).
  withBlockedDispatch(comms, [] {});
  assert_ok(epCommDestroy(comms[0]));
  assert_ok(epCommDestroy(comms[1]));
}

void destroy_during_a_call_is_refused(void**) {
  epComm_t comms[2] = {nullptr, nullptr};
  initTwoRanks(comms);
  withBlockedDispatch(comms, [&] {
    assert_result(epCommDestroy(comms[0]), epInvalidUsage);
    assert_contains(epGetLastError(nullptr), "epCommAbort");
  });
  assert_ok(epCommDestroy(comms[0]));  // once the call returned
  assert_ok(epCommDestroy(comms[1]));
}

void abort_unblocks_a_call_then_frees(void**) {
  epComm_t comms[2] = {nullptr, nullptr};
  initTwoRanks(comms);
  BlockedDispatch blocked;
  blocked.start(comms[0]);
  const auto start = std::chrono::steady_clock::now();
  assert_ok(epCommAbort(comms[0]));
  assert_int_equal(blocked.finish(), epAborted);
  assert_null(blocked.handle);
  assert_true(secondsSince(start) < 5.0);  // not the 20 s timeout
  assert_ok(epCommAbort(comms[1]));  // rank 1 never called: nothing to unblock
}

// A peer that destroys its communicator while this rank waits for it: the
// wait ends at once with a message naming it, not at the timeout.
void peer_destroyed_fails_the_wait_at_once(void**) {
  epComm_t comms[2] = {nullptr, nullptr};
  initTwoRanks(comms);
  BlockedDispatch blocked;
  blocked.start(comms[0]);
  const auto start = std::chrono::steady_clock::now();
  assert_ok(epCommDestroy(comms[1]));
  assert_int_equal(blocked.finish(), epRemoteError);
  assert_contains(epGetLastError(comms[0]), "rank 1 left the call (destroyed or aborted its communicator)");
  assert_true(secondsSince(start) < 5.0);  // the timeout is 20 s
  assert_null(blocked.handle);
  assert_ok(epCommDestroy(comms[0]));
}

// A rank may pass fewer top-k columns than its peers, not more: the wider
// rows do not fit the receiver's recv_topk_idx, and it says so.
void wider_topk_of_a_peer_is_reported(void**) {
  epComm_t comms[2] = {nullptr, nullptr};
  initTwoRanks(comms);
  Rank r0, r1;
  std::vector<int64_t> narrow(kTokens, 3);  // rank 1: K = 1, expert 3 (rank 1's)
  narrow[0] = 1;                            // one token to rank 0
  std::vector<int64_t> recv_idx(size_t(2 * kTokens) * kTopk);
  epResult_t res[2];
  epHandle_t h[2] = {nullptr, nullptr};
  std::thread t0([&] {
    epDispatchArgs_t a = r0.args();  // K = 2: every token to ranks 0 and 1
    a.recv_topk_idx = recv_idx.data();
    res[0] = epDispatch(comms[0], &a, &h[0], nullptr);
  });
  epDispatchArgs_t a = r1.args();
  a.topk_idx = narrow.data();
  a.num_topk = 1;
  std::vector<int64_t> recv_idx1(size_t(2 * kTokens));
  a.recv_topk_idx = recv_idx1.data();
  res[1] = epDispatch(comms[1], &a, &h[1], nullptr);
  t0.join();
  assert_int_equal(res[0], epSuccess);  // narrower rows fit
  assert_int_equal(res[1], epInvalidUsage);
  assert_contains(epGetLastError(comms[1]), "rank 0 passed num_topk = 2, more than this rank's 1");
  assert_null(h[1]);
  assert_ok(epHandleDestroy(h[0]));
  assert_ok(epCommDestroy(comms[0]));
  assert_ok(epCommDestroy(comms[1]));
}

}  // namespace

int main() {
  eptest::unsetAllParams();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(second_data_call_from_another_thread_is_refused),
      cmocka_unit_test(destroy_during_a_call_is_refused),
      cmocka_unit_test(abort_unblocks_a_call_then_frees),
      cmocka_unit_test(peer_destroyed_fails_the_wait_at_once),
      cmocka_unit_test(wider_topk_of_a_peer_is_reported),
  };
  return cmocka_run_group_tests_name("communicator and threads", tests, nullptr, nullptr);
}
