// The agreement of a shrink (src/recovery/agreement.h, docs/SHRINK.md) on a
// simulated network: survivors as state machines, messages delivered in
// order per sender after per-link delays, deaths before and during the
// rounds (a rank that dies having sent its round message to some survivors
// only, a rank that dies right after deciding), a slow rank that some
// survivors time out, a partition into halves, and random schedules. Every
// survivor that decides must decide the same set; with a majority alive and
// reachable, every survivor decides.
#include <algorithm>
#include <deque>
#include <set>
#include <vector>

#include "common.h"
#include "recovery/agreement.h"

namespace {

using ep::recovery::AgreeMessage;
using ep::recovery::Agreement;
using State = Agreement::State;

constexpr int kSilentTicks = 30;  // no message nor keepalive for this long: silent

struct Sim {
  int R;
  std::vector<Agreement> agents;
  std::vector<bool> alive;
  std::vector<int> side;                     // a partition: messages cross only within a side
  std::vector<std::vector<int>> delay;       // [from][to] ticks
  std::vector<std::vector<bool>> mute;       // [from][to]: its keepalives do not arrive (slow)
  struct InFlight {
    int at, from, to;
    AgreeMessage m;
  };
  std::deque<InFlight> wire;
  std::vector<std::vector<int>> quiet;       // [i][r]: ticks since i heard from r
  // A rank that dies having sent its messages of round `round` to `only` (its first sends: round 1).
  int dies_midway = -1;
  uint32_t dies_round = 0;
  std::set<int> dies_to;
  int dies_after_decide = -1;                // dies having sent its decision to this many
  int dies_after_decide_count = 0;
  int now = 0;

  // same_counter: every rank starts with call counter 100 (else 100 + rank).
  Sim(int r, const std::vector<std::vector<int>>& suspects, bool same_counter = false) : R(r) {
    std::vector<bool> members(size_t(R), true);
    for (int i = 0; i < R; i++)
      agents.emplace_back(i, members, 1u, suspects[size_t(i)], 100 + (same_counter ? 0 : uint64_t(i)));
    alive.assign(size_t(R), true);
    side.assign(size_t(R), 0);
    delay.assign(size_t(R), std::vector<int>(size_t(R), 1));
    mute.assign(size_t(R), std::vector<bool>(size_t(R), false));
    quiet.assign(size_t(R), std::vector<int>(size_t(R), 0));
  }
  // A message from a reaches b (sent before a died, it still arrives).
  bool reach(int a, int b) const { return alive[size_t(b)] && side[size_t(a)] == side[size_t(b)]; }
  // b hears a's keepalives: a lives, on b's side, not slowed.
  bool hears(int b, int a) const { return alive[size_t(a)] && side[size_t(a)] == side[size_t(b)] && !mute[size_t(a)][size_t(b)]; }
  void send(int from, int to, const AgreeMessage& m) {
    if (!alive[size_t(from)]) return;
    wire.push_back({now + delay[size_t(from)][size_t(to)], from, to, m});
  }
  // Sends i's current message to every other rank: to those dead in its view
  // it is the best-effort "excluded" notice (docs/SHRINK.md, agreement step 5).
  void broadcast(int i) {
    const AgreeMessage m = agents[size_t(i)].outgoing();
    int sent = 0;
    for (int r = 0; r < R; r++) {
      if (r == i) continue;
      if (i == dies_midway && m.round == dies_round && !m.decide && dies_to.count(r) == 0) continue;
      if (i == dies_after_decide && m.decide && sent >= dies_after_decide_count) continue;
      send(i, r, m);
      sent++;
    }
    if (i == dies_midway && m.round == dies_round && !m.decide) alive[size_t(i)] = false;
    if (i == dies_after_decide && m.decide) alive[size_t(i)] = false;
  }
  void start() {
    for (int i = 0; i < R; i++)
      if (alive[size_t(i)]) broadcast(i);
  }
  bool running() const {
    for (int i = 0; i < R; i++)
      if (alive[size_t(i)] && agents[size_t(i)].state() == State::kRunning) return true;
    return false;
  }
  void tick() {
    now++;
    // Deliveries (in order per link: equal delays per link keep it).
    std::deque<InFlight> due;  // taken off the wire first: answers sent below go onto it
    due.swap(wire);
    std::deque<InFlight> later;
    for (InFlight& f : due) {
      if (f.at > now) {
        later.push_back(f);
        continue;
      }
      if (!reach(f.from, f.to)) continue;
      Agreement& a = agents[size_t(f.to)];
      const State before = a.state();
      a.receive(f.from, f.m);
      quiet[size_t(f.to)][size_t(f.from)] = 0;
      if (before == State::kRunning && a.state() == State::kDecided) broadcast(f.to);  // relay once
      else if (a.state() == State::kDecided && !f.m.decide) send(f.to, f.from, a.outgoing());  // answer
    }
    later.insert(later.end(), wire.begin(), wire.end());
    wire.swap(later);
    for (int i = 0; i < R; i++) {
      if (!alive[size_t(i)]) continue;
      Agreement& a = agents[size_t(i)];
      if (a.state() != State::kRunning) continue;
      for (int r : a.waitingFor()) {
        // Keepalives: a live, reachable, not slowed peer is heard every tick.
        if (hears(i, r)) quiet[size_t(i)][size_t(r)] = 0;
        else if (++quiet[size_t(i)][size_t(r)] > kSilentTicks) a.silent(r);
      }
      while (a.step()) {
        if (a.state() == State::kRunning || a.state() == State::kDecided) broadcast(i);
        if (a.state() != State::kRunning) break;
      }
    }
  }
  void run(int limit = 20000) {
    start();
    while (running() && now < limit) tick();
  }
  // Every live survivor that decided decided the same set and counter; returns the deciders.
  int checkAgreed(std::vector<bool>* set = nullptr) {
    int deciders = 0;
    const Agreement* first = nullptr;
    for (int i = 0; i < R; i++) {
      const Agreement& a = agents[size_t(i)];
      if (!alive[size_t(i)] || a.state() != State::kDecided) continue;
      deciders++;
      assert_false(a.dead()[size_t(i)]);
      if (first == nullptr) {
        first = &a;
        continue;
      }
      assert_true(a.dead() == first->dead());
      assert_true(a.counter() == first->counter());
    }
    if (set && first) *set = first->dead();
    return deciders;
  }
};

std::vector<bool> setOf(int R, std::initializer_list<int> dead) {
  std::vector<bool> v(size_t(R), false);
  for (int r : dead) v[size_t(r)] = true;
  return v;
}

void one_dead_before_all_decide(void**) {
  Sim s(4, {{3}, {3}, {}, {}});
  s.alive[3] = false;
  s.run();
  std::vector<bool> set;
  assert_int_equal(s.checkAgreed(&set), 3);
  assert_true(set == setOf(4, {3}));
  assert_int_equal(s.agents[0].counter(), 102);  // the largest counter of the survivors
}

void dies_after_sending_to_some(void**) {
  // Rank 4 sends its round-1 message to rank 0 only, then dies; rank 5 was
  // dead before. Rank 0 heard a live rank 4, the others time it out.
  Sim s(6, {{5}, {5}, {5}, {5}, {5}, {}});
  s.alive[5] = false;
  s.dies_midway = 4;
  s.dies_round = 1;
  s.dies_to = {0};
  s.run();
  std::vector<bool> set;
  assert_int_equal(s.checkAgreed(&set), 4);
  assert_true(set == setOf(6, {4, 5}));
}

// The same with equal counters: rank 0 has every round-1 message equal to
// its own (rank 4's included) and decides {5} in round 1; the others, who
// time rank 4 out, must take rank 0's decision rather than decide {4, 5}
// (rank 4 is found dead again at the next call: the next epoch's).
void decision_taken_over_later_suspicion(void**) {
  Sim s(6, {{5}, {5}, {5}, {5}, {5}, {}}, true);
  s.alive[5] = false;
  s.dies_midway = 4;
  s.dies_round = 1;
  s.dies_to = {0};
  s.run();
  std::vector<bool> set;
  assert_int_equal(s.checkAgreed(&set), 4);
  assert_true(set == setOf(6, {5}));
}

void decider_dies_after_telling_one(void**) {
  // Rank 0 decides, tells only rank 1 and dies: rank 1 relays the decision,
  // so nobody decides a set with rank 0 in it beside one without.
  Sim s(5, {{4}, {4}, {4}, {4}, {}});
  s.alive[4] = false;
  s.dies_after_decide = 0;
  s.dies_after_decide_count = 1;
  s.run();
  std::vector<bool> set;
  assert_int_equal(s.checkAgreed(&set), 3);
  assert_true(set == setOf(5, {4}));
}

void slow_rank_is_excluded(void**) {
  // Rank 3 is alive but ranks 0 and 1 hear nothing from it (no keepalive;
  // rank 0's call timed out on it); rank 2 hears it. The survivors decide
  // {3}; rank 3 learns it is excluded.
  Sim s(4, {{3}, {}, {}, {}});
  s.delay[3][0] = s.delay[3][1] = 100000;  // its messages to 0 and 1 never arrive in time
  s.mute[3][0] = s.mute[3][1] = true;
  s.run();
  std::vector<bool> set;
  assert_int_equal(s.checkAgreed(&set), 3);
  assert_true(set == setOf(4, {3}));
  assert_int_equal(int(s.agents[3].state()), int(State::kExcluded));
}

void partition_decides_on_one_side_only(void**) {
  // 2 + 2: only the half with rank 0 may decide; the other is a minority.
  Sim s(4, {{}, {}, {}, {}});
  s.side = {0, 0, 1, 1};
  s.run();
  std::vector<bool> set;
  assert_int_equal(s.checkAgreed(&set), 2);
  assert_true(set == setOf(4, {2, 3}));
  assert_int_equal(int(s.agents[2].state()), int(State::kMinority));
  assert_int_equal(int(s.agents[3].state()), int(State::kMinority));
  // 1 + 3: the single rank (rank 0 included) is a minority, the three decide.
  Sim t(4, {{}, {}, {}, {}});
  t.side = {0, 1, 1, 1};
  t.run();
  assert_int_equal(t.checkAgreed(&set), 3);
  assert_true(set == setOf(4, {0}));
  assert_int_equal(int(t.agents[0].state()), int(State::kMinority));
}

// With no rank suspected anywhere (a shrink asked for by mistake) every
// rank decides the empty set and the largest call counter (round 2: the
// counters differ in round 1). A rank whose messages cannot reach two of
// the others is excluded instead: the others time it out.
void nobody_dead_decides_empty(void**) {
  Sim s(4, {{}, {}, {}, {}});
  s.run();
  std::vector<bool> set;
  assert_int_equal(s.checkAgreed(&set), 4);
  assert_true(set == setOf(4, {}));
  assert_int_equal(s.agents[2].counter(), 103);
  Sim t(4, {{}, {}, {}, {}});
  t.delay[3][0] = t.delay[3][1] = 100000;
  t.mute[3][0] = t.mute[3][1] = true;
  t.run();
  assert_int_equal(t.checkAgreed(&set), 3);
  assert_true(set == setOf(4, {3}));
  assert_int_equal(int(t.agents[3].state()), int(State::kExcluded));
}

void older_and_newer_epochs(void**) {
  std::vector<bool> members(3, true);
  Agreement a(0, members, 2u, {2}, 1);
  AgreeMessage old = a.outgoing();
  old.epoch = 1;
  old.dead = setOf(3, {0});  // an old shrink's message naming rank 0: ignored
  a.receive(1, old);
  assert_int_equal(int(a.state()), int(State::kRunning));
  AgreeMessage newer = a.outgoing();
  newer.epoch = 3;
  a.receive(1, newer);
  assert_int_equal(int(a.state()), int(State::kSuperseded));
}

// A rank an earlier shrink removed (alive, it tries again) has no say: its
// newer epoch supersedes nothing, its decision is not adopted.
void removed_rank_is_not_heard(void**) {
  std::vector<bool> members = {true, true, true, false};  // rank 3 was removed
  Agreement a(0, members, 2u, {}, 1);
  AgreeMessage m = a.outgoing();
  m.epoch = 3;
  a.receive(3, m);
  assert_int_equal(int(a.state()), int(State::kRunning));
  m.epoch = 2;
  m.decide = true;
  m.dead = setOf(4, {0, 3});
  a.receive(3, m);
  assert_int_equal(int(a.state()), int(State::kRunning));
}

void random_schedules(void**) {
  std::mt19937 rng(20261207);
  for (int iter = 0; iter < 300; iter++) {
    const int R = 3 + int(rng() % 6);
    const int dead_before = int(rng() % R);
    std::vector<std::vector<int>> suspects(static_cast<size_t>(R));
    for (int i = 0; i < R; i++)
      if (rng() % 2) suspects[size_t(i)].push_back(dead_before);  // some noticed, some did not
    Sim s(R, suspects);
    s.alive[size_t(dead_before)] = false;
    for (int a = 0; a < R; a++)
      for (int b = 0; b < R; b++) s.delay[size_t(a)][size_t(b)] = 1 + int(rng() % 5);
    // With at most a minority gone in all, one more rank may die mid-round.
    if (R >= 5 && rng() % 2) {
      int x = int(rng() % R);
      if (x == dead_before) x = (x + 1) % R;
      s.dies_midway = x;
      s.dies_round = 1 + rng() % 2;
      for (int r = 0; r < R; r++)
        if (rng() % 2) s.dies_to.insert(r);
    }
    if (rng() % 3 == 0) {  // a decider that dies having told a few
      s.dies_after_decide = int(rng() % R);
      s.dies_after_decide_count = int(rng() % 3);
    }
    s.run();
    int live = 0;
    for (int i = 0; i < R; i++) live += s.alive[size_t(i)] ? 1 : 0;
    const int deciders = s.checkAgreed();
    if (2 * live > R) {  // a majority lives: every live survivor decides
      for (int i = 0; i < R; i++)
        if (s.alive[size_t(i)] && s.agents[size_t(i)].state() != State::kDecided)
          fail_msg("case %d: R %d, rank %d ended in state %d after %d ticks", iter, R, i,
                   int(s.agents[size_t(i)].state()), s.now);
      assert_int_equal(deciders, live);
    }
  }
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(one_dead_before_all_decide),
      cmocka_unit_test(dies_after_sending_to_some),
      cmocka_unit_test(decision_taken_over_later_suspicion),
      cmocka_unit_test(decider_dies_after_telling_one),
      cmocka_unit_test(slow_rank_is_excluded),
      cmocka_unit_test(nobody_dead_decides_empty),
      cmocka_unit_test(partition_decides_on_one_side_only),
      cmocka_unit_test(older_and_newer_epochs),
      cmocka_unit_test(removed_rank_is_not_heard),
      cmocka_unit_test(random_schedules),
  };
  return cmocka_run_group_tests_name("agreement", tests, nullptr, nullptr);
}
