// A ring neighbour's death seen through the bootstrap connections
// (BackendComm::ringPeerHungUp, src/backend_comm.h): ranks as processes
// joined by the real bootstrap. Across nodes no pid can be watched and an
// RDMA connection shows a dead peer only after its retries; the ring's TCP
// connections close with the process.
//   a neighbour that exits   both its neighbours see it within 2 s, and
//                            nobody sees a live rank as gone
//   not a neighbour          a rank two steps away from the dead one sees
//                            nothing through the ring
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <thread>
#include <vector>

#include "backend_comm.h"
#include "bootstrap.h"
#include "bootstrap_cases.h"
#include "common.h"

namespace {

using Clock = std::chrono::steady_clock;

int g_rank = -1;

#define RCHECK(cond, ...)                                              \
  do {                                                                 \
    if (!(cond)) {                                                     \
      fprintf(stderr, "rank %d: %s:%d: ", g_rank, __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                                    \
      fprintf(stderr, "\n");                                           \
      return 1;                                                        \
    }                                                                  \
  } while (0)

// Rank `victim` of R exits after the barrier; every other rank looks at each
// peer through the ring for 2 s and must find exactly the dead rank's ring
// neighbours seeing it, and no live rank hung up.
int rankMain(const epUniqueId& id, int rank, int R, int victim) {
  g_rank = rank;
  ep::Bootstrap* b = nullptr;
  RCHECK(ep::bootstrapInit(id, rank, R, 10000, nullptr, nullptr, &b) == epSuccess, "bootstrap: %s",
         ep::threadLastError());
  RCHECK(ep::bootstrapBarrier(b) == epSuccess, "barrier");
  if (rank == victim) _exit(0);  // the kernel closes its sockets
  ep::CommFacts facts;
  facts.rank = rank;
  facts.nranks = R;
  std::atomic<int> abort_flag{0}, failed{0};
  const ep::BackendComm view(nullptr, &facts, b, &abort_flag, &failed);
  const bool neighbour = (rank + 1) % R == victim || (victim + 1) % R == rank;
  bool seen = false;
  const auto t0 = Clock::now();
  while (!seen && Clock::now() - t0 < std::chrono::seconds(2)) {
    seen = view.ringPeerHungUp(victim);
    if (!seen) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  fprintf(stderr, "rank %d: rank %d %s after %.1f ms (%s)\n", rank, victim, seen ? "seen gone" : "not seen",
          ms, neighbour ? "its ring neighbour" : "not its neighbour");
  RCHECK(seen == neighbour, "a %s of the dead rank %s it", neighbour ? "neighbour" : "non-neighbour",
         seen ? "saw" : "did not see");
  for (int r = 0; r < R; r++)
    RCHECK(r == victim || !view.ringPeerHungUp(r), "live rank %d looks gone", r);
  RCHECK(!view.ringPeerHungUp(rank), "this rank looks gone to itself");
  // Stay until every rank checked (the slowest, a non-neighbour, after its
  // 2 s): a live rank that exits looks gone to its neighbours too.
  std::this_thread::sleep_until(t0 + std::chrono::milliseconds(2800));
  return 0;
}

void job(int R, int victim) {
  epUniqueId id;
  assert_int_equal(ep::bootstrapGetUniqueId(&id), epSuccess);
  std::vector<std::function<int()>> ranks;
  for (int r = 0; r < R; r++) ranks.push_back([=, &id] { return rankMain(id, r, R, victim); });
  const std::vector<int> codes = runForked(ranks, 20000);
  for (int r = 0; r < R; r++) assert_int_equal(codes[size_t(r)], 0);
}

void a_dead_neighbour_is_seen_by_both(void**) { job(3, 1); }
void only_neighbours_see_it(void**) { job(5, 2); }
void two_ranks_see_each_other(void**) { job(2, 0); }

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(a_dead_neighbour_is_seen_by_both),
      cmocka_unit_test(only_neighbours_see_it),
      cmocka_unit_test(two_ranks_see_each_other),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
