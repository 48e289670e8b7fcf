// CallLog (src/call_log.h), the ranks' logs of their collective kernels that
// the CUDA backend's watcher compares: logs that agree never differ, the
// first call that differs is found on both sides, once, and only among the
// calls both ranks made; a capture into a graph ends the comparison; slots
// reused for later calls are skipped, not misread, also while both ranks
// log and a third thread looks; a log written by another process is read as
// written. Also the low-latency dispatches the logs carry, from which a
// small call chooses its records: plain beside a large peer, as the first
// small peer to make the same dispatch chose, flagged when every rank is small.
// And a rank's leaving (destroy, abort) as its peers read it, also from
// another process after the owner's mapping is gone; the calls each rank
// logged, for a timeout's report.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <vector>

#include "common.h"

#include "call_log.h"

namespace {

using ep::CallKind;
using ep::CallLog;
using ep::CallMismatch;

// Memory for one log, formatted (aligned as a mapping is: the log has
// fields on cache lines of their own).
struct LogMemory {
  struct alignas(64) Line {
    unsigned char bytes[64];
  };
  std::vector<Line> lines = std::vector<Line>(ep::callLogBytes() / 64 + 1);
  LogMemory() { ep::callLogFormat(lines.data()); }
  void* get() { return lines.data(); }
};

// Two ranks of one communicator, each with the other's log mapped.
struct Pair {
  LogMemory mem[2];
  CallLog log0{mem[0].get(), 0, 2}, log1{mem[1].get(), 1, 2};
  Pair() {
    log0.setPeer(1, mem[1].get());
    log1.setPeer(0, mem[0].get());
  }
};

CallKind kindOf(uint64_t i) { return CallKind(1 + i % 5); }

void logs_that_agree_never_differ(void**) {
  Pair p;
  CallMismatch m;
  assert_true(p.log0.comparesAny());
  for (uint64_t i = 0; i < 1000; i++) {
    p.log0.record(kindOf(i), false);
    if (i % 7 == 0) assert_false(p.log1.findMismatch(&m));  // rank 1 behind: only what both made
    p.log1.record(kindOf(i), false);
    if (i % 3 == 0) assert_false(p.log0.findMismatch(&m));
  }
  assert_false(p.log0.findMismatch(&m));
  assert_false(p.log1.findMismatch(&m));
}

void the_first_difference_is_found_on_both_sides_once(void**) {
  Pair p;
  for (int i = 0; i < 3; i++) {
    p.log0.record(ep::kCallLLDispatch, false);
    p.log1.record(ep::kCallLLDispatch, false);
    p.log0.record(ep::kCallLLCombine, false);
    p.log1.record(ep::kCallLLCombine, false);
  }
  p.log0.record(ep::kCallLLDispatch, false);
  p.log1.record(ep::kCallLLDispatch, false);
  p.log0.record(ep::kCallLLCombine, false);  // call 7: a combine here,
  p.log1.record(ep::kCallLLDispatch, false);  // another dispatch there
  CallMismatch m;
  assert_true(p.log0.findMismatch(&m));
  assert_int_equal(m.peer, 1);
  assert_int_equal(m.call, 7);
  assert_int_equal(m.mine, ep::kCallLLCombine);
  assert_int_equal(m.theirs, ep::kCallLLDispatch);
  assert_false(p.log0.findMismatch(&m));  // found once
  assert_true(p.log1.findMismatch(&m));
  assert_int_equal(m.peer, 0);
  assert_int_equal(m.call, 7);
  assert_int_equal(m.mine, ep::kCallLLDispatch);
  assert_int_equal(m.theirs, ep::kCallLLCombine);
}

// A rank ahead is compared only up to the calls its peer made: the
// difference appears when the peer makes the call.
void only_calls_both_made_are_compared(void**) {
  Pair p;
  for (int i = 0; i < 5; i++) p.log0.record(ep::kCallCombine, false);
  p.log1.record(ep::kCallCombine, false);
  CallMismatch m;
  assert_false(p.log0.findMismatch(&m));
  assert_false(p.log1.findMismatch(&m));
  p.log1.record(ep::kCallRouting, false);
  assert_true(p.log0.findMismatch(&m));
  assert_int_equal(m.call, 1);
  assert_int_equal(m.theirs, ep::kCallRouting);
}

// From the first call either rank captured, nothing is compared (graph
// launches run the captured calls again without logging them).
void a_capture_ends_the_comparison(void**) {
  for (int captor = 0; captor < 2; captor++) {
    Pair p;
    CallLog& a = captor == 0 ? p.log0 : p.log1;
    CallLog& b = captor == 0 ? p.log1 : p.log0;
    for (int i = 0; i < 4; i++) {
      a.record(kindOf(i), false);
      b.record(kindOf(i), false);
    }
    a.record(ep::kCallLLDispatch, true);  // captured once, launched many times
    a.record(ep::kCallLLCombine, true);
    a.record(ep::kCallRouting, false);
    for (int i = 0; i < 6; i++) {
      b.record(ep::kCallLLDispatch, false);
      b.record(ep::kCallLLCombine, false);
    }
    b.record(ep::kCallRouting, false);
    CallMismatch m;
    assert_false(p.log0.findMismatch(&m));
    assert_false(p.log1.findMismatch(&m));
  }
  // A difference before the capture is still found.
  Pair p;
  p.log0.record(ep::kCallDispatch, false);
  p.log1.record(ep::kCallCombine, false);
  p.log0.record(ep::kCallCombine, true);
  p.log1.record(ep::kCallCombine, false);
  CallMismatch m;
  assert_true(p.log0.findMismatch(&m));
  assert_int_equal(m.call, 0);
}

// Slots hold the last kSlots calls: a look after both ran far ahead compares
// the calls still there; a rank far behind its peer compares nothing the
// peer's slots no longer hold, and never takes a later call for its own.
void reused_slots_are_skipped_not_misread(void**) {
  const uint64_t n = 3 * CallLog::kSlots + 17;
  {
    Pair p;
    for (uint64_t i = 0; i < n; i++) {
      p.log0.record(kindOf(i), false);
      p.log1.record(kindOf(i), false);
    }
    CallMismatch m;
    assert_false(p.log0.findMismatch(&m));
    p.log0.record(ep::kCallRouting, false);
    p.log1.record(ep::kCallCombine, false);
    assert_true(p.log0.findMismatch(&m));
    assert_int_equal(m.call, n);
  }
  {
    Pair p;
    for (uint64_t i = 0; i < n; i++) p.log1.record(kindOf(i), false);
    // Rank 0's calls agree with rank 1's of the same position, whose slots
    // now hold calls n - kSlots and later.
    for (uint64_t i = 0; i < 40; i++) p.log0.record(kindOf(i), false);
    CallMismatch m;
    assert_false(p.log0.findMismatch(&m));
    assert_false(p.log1.findMismatch(&m));
  }
}

// Both ranks log the same calls from their own threads while a third looks,
// as the watcher does: no look may see a difference that is not there (a
// slot read before its call was published, or a reused one misread), and
// the difference made last is found.
void looks_while_both_ranks_log(void**) {
  Pair p;
  const uint64_t n = 2 * CallLog::kSlots + 1000;
  std::atomic<int> writing{2};
  std::atomic<int> false_reports{0};
  auto writer = [&](CallLog* log) {
    for (uint64_t i = 0; i < n; i++) log->record(kindOf(i * 7 + i / 3), false);
    writing--;
  };
  std::thread w0(writer, &p.log0), w1(writer, &p.log1);
  CallMismatch m;
  while (writing.load() > 0)
    if (p.log0.findMismatch(&m)) false_reports++;
  w0.join();
  w1.join();
  if (p.log0.findMismatch(&m)) false_reports++;
  assert_int_equal(false_reports.load(), 0);
  p.log0.record(ep::kCallDispatch, false);
  p.log1.record(ep::kCallCombine, false);
  assert_true(p.log0.findMismatch(&m));
  assert_int_equal(m.call, n);
}

void unmapped_peers_are_not_compared(void**) {
  LogMemory mem;
  CallLog log(mem.get(), 0, 3);
  assert_false(log.comparesAny());
  log.record(ep::kCallDispatch, false);
  CallMismatch m;
  assert_false(log.findMismatch(&m));
}

// Another process writes rank 1's log in shared memory; rank 0, here, finds
// its difference.
void a_log_written_by_another_process(void**) {
  const size_t bytes = ep::callLogBytes();
  void* shared = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  assert_true(shared != MAP_FAILED);
  ep::callLogFormat(shared);
  const pid_t child = fork();
  assert_true(child >= 0);
  if (child == 0) {
    CallLog theirs(shared, 1, 2);
    for (int i = 0; i < 100; i++) theirs.record(kindOf(i), false);
    theirs.record(ep::kCallLLCombine, false);
    _exit(0);
  }
  int status = 0;
  assert_int_equal(waitpid(child, &status, 0), child);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  LogMemory mine;
  CallLog log(mine.get(), 0, 2);
  log.setPeer(1, shared);
  for (int i = 0; i < 100; i++) log.record(kindOf(i), false);
  CallMismatch m;
  assert_false(log.findMismatch(&m));
  log.record(ep::kCallLLDispatch, false);
  assert_true(log.findMismatch(&m));
  assert_int_equal(m.call, 100);
  assert_int_equal(m.theirs, ep::kCallLLCombine);
  munmap(shared, bytes);
}

// Three ranks of one communicator, each with the others' logs mapped.
struct Trio {
  LogMemory mem[3];
  CallLog log[3] = {{mem[0].get(), 0, 3}, {mem[1].get(), 1, 3}, {mem[2].get(), 2, 3}};
  Trio() {
    for (auto& l : log)
      for (int r = 0; r < 3; r++) l.setPeer(r, mem[r].get());
  }
};

// A rank's next call, a low-latency dispatch: its choice of records, then
// the call logged with it, as the CUDA backend does; *peer as returned.
bool choose(CallLog& log, bool small, int* peer = nullptr, bool follow = true) {
  int p = -2;
  const bool flagged = log.chooseLLRecords(small, follow, &p);
  log.record(ep::kCallLLDispatch, false, ep::llDispatchNote(small, flagged));
  if (peer) *peer = p;
  return flagged;
}

// Steady batches: small ranks beside a large one send plain records from
// the second dispatch on (the first small rank's first read found nothing);
// ranks alike send alike.
void low_latency_choices_steady(void**) {
  Trio t;
  int peer = -2;
  assert_true(choose(t.log[0], true, &peer));  // dispatch 0: nothing known yet
  assert_int_equal(peer, -1);
  assert_false(choose(t.log[1], false));  // rank 1 large: plain, whatever its peers
  assert_true(choose(t.log[2], true, &peer));  // follows rank 0 (the call is mixed either way)
  assert_int_equal(peer, -1);
  // Dispatch 1, rank 0 first: rank 1 has not made it, its latest was large.
  assert_false(choose(t.log[0], true, &peer));
  assert_int_equal(peer, 1);
  assert_false(choose(t.log[2], true, &peer));  // follows rank 0
  assert_int_equal(peer, 0);
  assert_false(choose(t.log[1], false));
  // Every rank small from dispatch 2 on, rank 1 first: flagged everywhere.
  assert_true(choose(t.log[1], true));
  assert_true(choose(t.log[0], true));
  assert_true(choose(t.log[2], true));
  for (int n = 0; n < 300; n++)
    for (auto& l : t.log) assert_true(choose(l, true));
  // Without following, a small call sends flagged records beside a large one.
  assert_false(choose(t.log[1], false));
  assert_true(choose(t.log[0], true, &peer, false));
  assert_int_equal(peer, -1);
  assert_true(choose(t.log[2], true));  // and a following rank after it does what it did
}

// Every rank goes small at the same dispatch while one host runs ahead: it
// reads its peers' previous (large) dispatch and sends plain records; the
// peers, coming later, follow its choice instead of sending flagged ones
// beside it. The next dispatch is flagged everywhere.
void low_latency_choices_when_all_shrink(void**) {
  Trio t;
  for (auto& l : t.log) assert_false(choose(l, false));  // dispatch 0: all large
  int peer = -2;
  assert_false(choose(t.log[0], true, &peer));  // dispatch 1: rank 0 ahead
  assert_int_equal(peer, 1);
  assert_false(choose(t.log[2], true, &peer));  // follows rank 0 (rank 1's latest is large too)
  assert_int_equal(peer, 0);
  assert_false(choose(t.log[1], true, &peer));
  assert_int_equal(peer, 0);
  assert_true(choose(t.log[0], true));  // dispatch 2: every latest small
  assert_true(choose(t.log[1], true));
  assert_true(choose(t.log[2], true));
  // Rank 2 large at dispatch 3: rank 0, after it, sends plain records, and
  // predicts plain for dispatch 4 from rank 2's latest.
  assert_false(choose(t.log[2], false));
  assert_false(choose(t.log[0], true, &peer));
  assert_int_equal(peer, 2);
  assert_false(choose(t.log[0], true, &peer));
  assert_int_equal(peer, 2);
}

// A small peer that already chose flagged records for a dispatch is followed
// although another peer made it large: plain would only add a third kind of
// rank (the call is mixed either way), and the small ranks stay alike.
void low_latency_choices_follow_the_first_small_rank(void**) {
  Trio t;
  assert_false(choose(t.log[2], false));  // dispatch 0: rank 2 large
  int peer = -2;
  assert_true(choose(t.log[0], true, &peer, false));  // rank 0 does not follow: flagged
  assert_int_equal(peer, -1);
  assert_true(choose(t.log[1], true, &peer));  // follows rank 0
  assert_int_equal(peer, -1);
}

// A peer whose slot of this call holds another call (more than kSlots calls
// ahead), or another kind of call (a combine here), is read through its
// latest low-latency dispatch; the notes do not make kinds differ in the
// calls' comparison; unmapped peers are not read.
void low_latency_choices_far_ahead_and_alone(void**) {
  Pair p;
  for (int n = 0; n < CallLog::kSlots + 5; n++) choose(p.log1, false);
  int peer = -2;
  assert_false(choose(p.log0, true, &peer));  // its slot holds a later call
  assert_int_equal(peer, 1);
  // Dispatches with different notes are the same kind of call.
  Pair n;
  assert_false(choose(n.log1, false));
  assert_false(choose(n.log0, true));  // plain beside rank 1: a note other than rank 1's
  CallMismatch m;
  assert_false(n.log0.findMismatch(&m));
  assert_false(n.log1.findMismatch(&m));
  // Rank 1 made call 0 a combine: read as not made there, and the calls
  // differ by their kinds, the note left out.
  Pair q;
  q.log1.record(ep::kCallLLCombine, false);
  assert_true(choose(q.log0, true, &peer));
  assert_int_equal(peer, -1);
  assert_true(q.log0.findMismatch(&m));
  assert_int_equal(m.call, 0);
  assert_int_equal(m.mine, ep::kCallLLDispatch);
  assert_int_equal(m.theirs, ep::kCallLLCombine);
  LogMemory alone;
  CallLog lone(alone.get(), 0, 2);
  assert_true(choose(lone, true, &peer));
  assert_int_equal(peer, -1);
  assert_false(choose(lone, false, &peer));
}

// A rank that leaves its communicator says how; the first announcement
// stays (an abort, then the free that follows it); unmapped or unknown ranks
// read as open.
void a_rank_that_leaves_says_how(void**) {
  Trio t;
  for (int r = 0; r < 3; r++) assert_int_equal(t.log[0].peerClosed(r), ep::kOpen);
  t.log[1].announceClosed(ep::kClosedAborted);
  t.log[1].announceClosed(ep::kClosedDestroyed);
  t.log[2].announceClosed(ep::kClosedDestroyed);
  assert_int_equal(t.log[0].peerClosed(1), ep::kClosedAborted);
  assert_int_equal(t.log[0].peerClosed(2), ep::kClosedDestroyed);
  assert_int_equal(t.log[2].peerClosed(1), ep::kClosedAborted);
  assert_int_equal(t.log[0].peerClosed(0), ep::kOpen);  // its own log is not a peer's
  assert_int_equal(t.log[0].peerClosed(3), ep::kOpen);
  assert_int_equal(t.log[0].peerClosed(-1), ep::kOpen);
  LogMemory mem;
  CallLog alone(mem.get(), 0, 2);
  assert_int_equal(alone.peerClosed(1), ep::kOpen);
}

// A process destroys its communicator (announces, then unmaps its log and
// exits); the peer's mapping still reads it.
void a_leaving_seen_after_the_owner_unmapped(void**) {
  const size_t bytes = ep::callLogBytes();
  void* shared = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  assert_true(shared != MAP_FAILED);
  ep::callLogFormat(shared);
  LogMemory mine;
  CallLog log(mine.get(), 0, 2);
  log.setPeer(1, shared);
  const pid_t child = fork();
  assert_true(child >= 0);
  if (child == 0) {
    CallLog theirs(shared, 1, 2);
    theirs.record(ep::kCallLLDispatch, false);
    theirs.announceClosed(ep::kClosedDestroyed);
    munmap(shared, bytes);
    _exit(0);
  }
  int status = 0;
  assert_int_equal(waitpid(child, &status, 0), child);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  assert_int_equal(log.peerClosed(1), ep::kClosedDestroyed);
  munmap(shared, bytes);
}

// The calls each rank logged, for a timeout's report; none once either
// rank captured calls into a graph, or for a peer not mapped.
void progress_of_a_peer(void**) {
  Pair p;
  uint64_t mine = 9, theirs = 9;
  assert_true(p.log0.progress(1, &mine, &theirs));
  assert_int_equal(mine, 0);
  assert_int_equal(theirs, 0);
  for (int i = 0; i < 5; i++) p.log0.record(kindOf(i), false);
  for (int i = 0; i < 3; i++) p.log1.record(kindOf(i), false);
  assert_true(p.log0.progress(1, &mine, &theirs));
  assert_int_equal(mine, 5);
  assert_int_equal(theirs, 3);
  assert_true(p.log1.progress(0, &mine, &theirs));
  assert_int_equal(mine, 3);
  assert_int_equal(theirs, 5);
  assert_false(p.log0.progress(0, &mine, &theirs));
  assert_false(p.log0.progress(2, &mine, &theirs));
  p.log1.record(ep::kCallLLDispatch, true);  // rank 1 captures
  assert_false(p.log0.progress(1, &mine, &theirs));
  assert_false(p.log1.progress(0, &mine, &theirs));
}

void kinds_have_names(void**) {
  for (int k = ep::kCallRouting; k <= ep::kCallLLCombine; k++)
    assert_true(strcmp(ep::callKindName(k), ep::callKindName(ep::kCallNone)) != 0);
  assert_contains(ep::callKindName(ep::kCallLLCombine), "epLowLatencyCombine");
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(logs_that_agree_never_differ),
      cmocka_unit_test(the_first_difference_is_found_on_both_sides_once),
      cmocka_unit_test(only_calls_both_made_are_compared),
      cmocka_unit_test(a_capture_ends_the_comparison),
      cmocka_unit_test(reused_slots_are_skipped_not_misread),
      cmocka_unit_test(looks_while_both_ranks_log),
      cmocka_unit_test(unmapped_peers_are_not_compared),
      cmocka_unit_test(a_log_written_by_another_process),
      cmocka_unit_test(low_latency_choices_steady),
      cmocka_unit_test(low_latency_choices_when_all_shrink),
      cmocka_unit_test(low_latency_choices_follow_the_first_small_rank),
      cmocka_unit_test(low_latency_choices_far_ahead_and_alone),
      cmocka_unit_test(a_rank_that_leaves_says_how),
      cmocka_unit_test(a_leaving_seen_after_the_owner_unmapped),
      cmocka_unit_test(progress_of_a_peer),
      cmocka_unit_test(kinds_have_names),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
