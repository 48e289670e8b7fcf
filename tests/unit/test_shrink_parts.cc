// The pieces of a shrink that every survivor must compute alike, alone:
// the substitute of a dead rail peer (railPeerAlive, src/plan.h: equal and
// unequal nodes, neighbours dead, a whole node dead), and what a rank makes
// of the shrink messages it hears (ShrinkNotice, src/recovery/
// shrink_notice.h: who is involved, what the error says, epochs, ranks a
// shrink removed).
#include <string>
#include <vector>

#include "common.h"
#include "node_map.h"
#include "plan.h"
#include "recovery/shrink_notice.h"

namespace {

ep::NodeMap nodesOf(int R, int node_size) {
  std::vector<epPeerInfo_v1_t> peers(static_cast<size_t>(R));
  ep::NodeMap m;
  assert_int_equal(ep::buildNodeMap(peers, node_size, &m), epSuccess);
  return m;
}

std::vector<bool> deadSet(int R, std::initializer_list<int> ranks) {
  std::vector<bool> d(static_cast<size_t>(R), false);
  for (int r : ranks) d[size_t(r)] = true;
  return d;
}

void substitute_is_the_next_live_rank(void**) {
  const ep::NodeMap m = nodesOf(6, 3);  // {0,1,2} {3,4,5}
  assert_int_equal(ep::railPeerAlive(m, 4, 0, {}), 1);  // no shrink: the rail peer
  assert_int_equal(ep::railPeerAlive(m, 4, 0, deadSet(6, {})), ep::railPeer(m, 4, 0));
  assert_int_equal(ep::railPeerAlive(m, 4, 0, deadSet(6, {1})), 2);
  assert_int_equal(ep::railPeerAlive(m, 4, 0, deadSet(6, {1, 2})), 0);  // wraps
  assert_int_equal(ep::railPeerAlive(m, 5, 0, deadSet(6, {2})), 0);
  assert_int_equal(ep::railPeerAlive(m, 4, 0, deadSet(6, {0, 1, 2})), -1);  // the node is gone
  // Two sources whose rail peers both died go to the same live rank only
  // where no other is left.
  assert_int_equal(ep::railPeerAlive(m, 3, 0, deadSet(6, {0, 1})), 2);
  assert_int_equal(ep::railPeerAlive(m, 4, 0, deadSet(6, {0, 1})), 2);
}

void substitute_on_unequal_nodes(void**) {
  ep::NodeMap m;  // {0,1,2} {3,4}, as hosts of 3 and 2 GPUs make it
  m.num_nodes = 2;
  m.node_of_rank = {0, 0, 0, 1, 1};
  m.local_rank = {0, 1, 2, 0, 1};
  m.node_size = {3, 2};
  m.node_first = {0, 3};
  m.node_ranks = {{0, 1, 2}, {3, 4}};
  assert_int_equal(ep::railPeerAlive(m, 2, 1, {}), 3);  // local 2 wraps onto local 0
  assert_int_equal(ep::railPeerAlive(m, 2, 1, deadSet(5, {3})), 4);
  assert_int_equal(ep::railPeerAlive(m, 0, 1, deadSet(5, {3})), 4);
  assert_int_equal(ep::railPeerAlive(m, 4, 0, deadSet(5, {1, 2})), 0);
}

void notice_involves_senders_and_their_dead(void**) {
  ep::recovery::ShrinkNotice n;
  assert_int_equal(n.epoch(), 0);
  assert_int_equal(n.blocks([](int) { return true; }), -1);
  n.record(1, 2, deadSet(4, {1}));
  assert_int_equal(n.epoch(), 1);
  assert_int_equal(n.blocks([](int r) { return r == 1; }), 1);   // counted dead
  assert_int_equal(n.blocks([](int r) { return r == 2; }), 2);   // the sender left its calls
  assert_int_equal(n.blocks([](int r) { return r == 3; }), -1);  // still in its call
  assert_contains(n.describe().c_str(), "rank 2 began epCommShrink (epoch 1), counting rank 1 dead");
  // A later message of the same epoch adds its sender and its dead; the
  // first sender stays the one named.
  n.record(1, 3, deadSet(4, {0, 1}));
  assert_int_equal(n.blocks([](int r) { return r == 3; }), 3);
  assert_int_equal(n.blocks([](int r) { return r == 0; }), 0);
  assert_contains(n.describe().c_str(), "rank 2 began epCommShrink (epoch 1), counting ranks 0, 1 dead");
  n.record(0, 1, deadSet(4, {}));  // an older epoch's: ignored
  assert_int_equal(n.epoch(), 1);
}

void notice_after_a_shrink(void**) {
  ep::recovery::ShrinkNotice n;
  n.record(1, 0, deadSet(4, {1}));
  n.removed(deadSet(4, {1}));  // the shrink completed without rank 1
  n.record(2, 1, deadSet(4, {}));  // the removed rank, still alive, tries again: nobody listens
  assert_int_equal(n.epoch(), 1);
  n.record(2, 3, deadSet(4, {1, 2}));  // a new epoch: its own involved set; rank 1 is not news
  assert_int_equal(n.epoch(), 2);
  assert_int_equal(n.blocks([](int r) { return r == 0; }), -1);
  assert_int_equal(n.blocks([](int r) { return r == 2; }), 2);
  const std::string said = n.describe();
  assert_contains(said.c_str(), "rank 3 began epCommShrink (epoch 2), counting rank 2 dead");
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(substitute_is_the_next_live_rank),
      cmocka_unit_test(substitute_on_unequal_nodes),
      cmocka_unit_test(notice_involves_senders_and_their_dead),
      cmocka_unit_test(notice_after_a_shrink),
  };
  return cmocka_run_group_tests_name("shrink parts", tests, nullptr, nullptr);
}
