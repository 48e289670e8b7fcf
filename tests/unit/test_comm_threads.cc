// A communicator used from several threads: a data call while another thread
// is inside one is refused, epCommDestroy is refused while a call is in
// progress, epCommAbort unblocks it, a peer that destroys its communicator
// ends the wait at once. Two host ranks of one process
// (epCommInitAll); rank 0's dispatch blocks until rank 1 joins, which gives
// each case a call that is certainly in progress. Last, epCommInitAll when
// a rank's thread cannot be started.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
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

// Combine sums the weights back only when every rank passes its
// recv_topk_weights: a rank that asks for out_topk_weights while a peer
// passed none is told so (it read the peer's stale buffer before), its out
// is still right, and the ranks stay in step.
void combine_weights_from_a_peer_without_them_is_reported(void**) {
  epComm_t comms[2] = {nullptr, nullptr};
  initTwoRanks(comms);
  Rank rank[2];
  std::vector<float> w(size_t(kTokens) * kTopk, 0.5f);
  std::vector<float> recv_w[2], out_w[2];
  std::vector<uint16_t> out[2];
  epHandle_t h[2] = {nullptr, nullptr};
  epResult_t res[2];
  auto both = [&](auto&& body) {
    std::thread other([&] { body(1); });
    body(0);
    other.join();
  };
  for (int round = 0; round < 2; round++) {  // round 1: every rank passes the weights
    both([&](int r) {
      recv_w[r].assign(size_t(2 * kTokens) * kTopk, -1.0f);
      out_w[r].assign(size_t(kTokens) * kTopk, -1.0f);
      out[r].assign(size_t(kTokens) * kHidden, 0);
      epDispatchArgs_t a = rank[r].args();
      a.topk_weights = w.data();
      a.recv_topk_weights = recv_w[r].data();
      res[r] = epDispatch(comms[r], &a, &h[r], nullptr);
      if (res[r] != epSuccess) return;
      epCombineArgs_t c = EP_COMBINE_ARGS_INITIALIZER;
      c.y = rank[r].recv_x.data();
      c.out = out[r].data();
      c.num_topk = kTopk;
      if (r == 0 || round == 1) {
        c.recv_topk_weights = recv_w[r].data();
        c.out_topk_weights = out_w[r].data();
      }
      res[r] = epCombine(comms[r], &c, h[r], nullptr);
    });
    for (int r = 0; r < 2; r++) {
      if (round == 0 && r == 0) {
        assert_int_equal(res[0], epInvalidUsage);
        assert_contains(epGetLastError(comms[0]), "rank 1 passed no recv_topk_weights");
      } else {
        assert_ok(res[r]);
      }
      for (size_t i = 0; i < out[r].size(); i++) assert_int_equal(out[r][i], 0x4000);  // 1.0 from each rank
      for (float v : out_w[r]) assert_true(round == 0 ? v == -1.0f : v == 0.5f);
      assert_ok(epHandleDestroy(h[r]));
      h[r] = nullptr;
    }
  }
  for (epComm_t c : comms) assert_ok(epCommDestroy(c));
}

// The first dispatch of a prepared handle sends the ids (the receivers'
// recv_topk_idx and per-expert counts come from them): without them it is
// refused before anything moves, and the handle can still be dispatched.
void prepared_handle_needs_ids_in_its_first_dispatch(void**) {
  epComm_t comms[2] = {nullptr, nullptr};
  initTwoRanks(comms);
  Rank rank[2];
  epHandle_t h[2] = {nullptr, nullptr};
  epResult_t res[2];
  std::thread other([&] {
    epDispatchArgs_t a = rank[1].args();
    res[1] = epDispatchPrepare(comms[1], &a, &h[1], nullptr);
  });
  epDispatchArgs_t a = rank[0].args();
  res[0] = epDispatchPrepare(comms[0], &a, &h[0], nullptr);
  other.join();
  assert_ok(res[0]);
  assert_ok(res[1]);
  a.topk_idx = nullptr;
  assert_result(epDispatch(comms[0], &a, &h[0], nullptr), epInvalidArgument);
  assert_contains(epGetLastError(comms[0]), "topk_idx is NULL in the first dispatch of a prepared handle");
  std::vector<int> per_expert[2] = {std::vector<int>(2, -1), std::vector<int>(2, -1)};
  std::thread other2([&] {
    epDispatchArgs_t b = rank[1].args();
    b.recv_tokens_per_expert = per_expert[1].data();
    res[1] = epDispatch(comms[1], &b, &h[1], nullptr);
  });
  a = rank[0].args();
  a.recv_tokens_per_expert = per_expert[0].data();
  res[0] = epDispatch(comms[0], &a, &h[0], nullptr);
  other2.join();
  for (int r = 0; r < 2; r++) {
    assert_ok(res[r]);
    for (int e = 0; e < 2; e++) assert_int_equal(per_expert[r][e], (r == 0) == (e == 0) ? 2 * kTokens : 0);
    assert_ok(epHandleDestroy(h[r]));
  }
  for (epComm_t c : comms) assert_ok(epCommDestroy(c));
}

// epCommInitAll of 128 ranks in a child whose address space has room for a
// few thread stacks only. Exit status: 0 as expected, else which check failed.
int initAllWithoutRoomForThreads() {
  long pages = 0;
  FILE* statm = fopen("/proc/self/statm", "r");
  if (statm == nullptr || fscanf(statm, "%ld", &pages) != 1) return 10;
  fclose(statm);
  rlimit lim;
  getrlimit(RLIMIT_AS, &lim);
  lim.rlim_cur = rlim_t(pages) * rlim_t(sysconf(_SC_PAGESIZE)) + (rlim_t(64) << 20);
  if (setrlimit(RLIMIT_AS, &lim) != 0) return 11;
  constexpr int kRanks = 128;
  epConfig_t cfg = eptest::hostConfig(2 * kRanks, kHidden, kTokens, kTopk);  // timeout 20 s
  std::vector<epComm_t> comms(kRanks, reinterpret_cast<epComm_t>(1));
  const auto t0 = std::chrono::steady_clock::now();
  const epResult_t res = epCommInitAll(comms.data(), kRanks, nullptr, &cfg);
  const double seconds = secondsSince(t0);
  const char* msg = epGetLastError(nullptr);
  fprintf(stderr, "    epCommInitAll under RLIMIT_AS: %d after %.2f s (%s)\n", int(res), seconds, msg);
  if (res != epSystemError) return 1;
  if (strstr(msg, "cannot start the thread of rank") == nullptr) return 2;
  for (epComm_t c : comms)
    if (c != nullptr) return 3;
  if (seconds > 10) return 4;  // the started ranks gave up at once, not at their timeout
  return 0;
}

// A rank thread that cannot be started fails epCommInitAll with
// epSystemError, the started ranks leaving at once; std::thread's exception
// terminated the process (joinable threads destroyed).
void init_all_without_room_for_threads_fails(void**) {
  fflush(stdout);
  fflush(stderr);
  const pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) _exit(initAllWithoutRoomForThreads());
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  if (WIFSIGNALED(status)) print_error("the child was killed by signal %d\n", WTERMSIG(status));
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
}

// epCommAbort from one thread while another destroys the handles of the
// communicator (a worker cleaning up after its call returned epAborted):
// handles outlive their communicator as empty shells, so each epHandleDestroy
// must either find its communicator alive or already detached, never freed
// under it. Many handles make the abort's detaching of them take a while.
void handle_destroy_racing_abort_is_safe(void**) {
  for (int round = 0; round < 20; round++) {
    epConfig_t cfg = config();
    epComm_t comm = nullptr;
    assert_ok(eptest::makeOneRankComm(&comm, cfg));
    constexpr int kHandles = 20000;
    std::vector<epHandle_t> handles(kHandles, nullptr);
    for (int i = 0; i < kHandles; i++) {
      epDispatchArgs_t a = EP_DISPATCH_ARGS_INITIALIZER;
      a.num_tokens = 0;
      a.num_topk = 1;
      assert_ok(epDispatchPrepare(comm, &a, &handles[i], nullptr));
    }
    std::atomic<int> aborted{-1}, go{0}, done{0};
    std::thread aborter([&] {
      while (go.load() == 0) std::this_thread::yield();
      aborted = epCommAbort(comm);
    });
    // More runnable threads than cores: the two sides get preempted at any
    // point, where on idle cores they rarely interleave in the window.
    std::vector<std::thread> spinners;
    for (unsigned i = 0; i < std::max(2u, std::thread::hardware_concurrency()); i++)
      spinners.emplace_back([&] {
        while (done.load(std::memory_order_relaxed) == 0) {
        }
      });
    go.store(1);  // the abort and the handles' destroys start together
    for (int i = kHandles - 1; i >= 0; i--) assert_ok(epHandleDestroy(handles[i]));
    aborter.join();
    done.store(1);
    for (std::thread& t : spinners) t.join();
    assert_int_equal(aborted.load(), epSuccess);
  }
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
      cmocka_unit_test(combine_weights_from_a_peer_without_them_is_reported),
      cmocka_unit_test(prepared_handle_needs_ids_in_its_first_dispatch),
      cmocka_unit_test(handle_destroy_racing_abort_is_safe),
      cmocka_unit_test(init_all_without_room_for_threads_fails),
  };
  return cmocka_run_group_tests_name("communicator and threads", tests, nullptr, nullptr);
}
