// PeerBuffers (src/peer_buffers.h), the one owner of a transport's setup, on
// a transport of the test's own that logs every call: two ranks (threads
// over a real bootstrap) register, exchange, connect and finish; each peer's
// pointer comes from that peer's handle; the teardown closes every
// connection before it deregisters; a rank without a transport still takes
// part in the exchange; memory of the caller's is refused (transport ABI v1
// allocates what it registers); a connection that failed leaves no pointer.
#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

// The library's headers before CMocka's (common.h), whose fail() macro would
// rewrite the handshake's fail().
#include "bootstrap.h"
#include "peer_buffers.h"
#include "transport.h"

#include "common.h"

namespace {

// What the fake transport saw, in order: "reg R", "connect R->P", "connected R",
// "close R->P", "dereg R" (R: the registering or connecting rank).
std::mutex g_log_mu;
std::vector<std::string> g_log;
std::atomic<int> g_fail_connect_to{-1};  // connect to this rank fails

void logCall(const std::string& what) {
  std::lock_guard<std::mutex> lock(g_log_mu);
  g_log.push_back(what);
}

// The fake's memory: calloc'd, its handle the owner's rank and address.
struct FakeMem {
  int rank;
  void* ptr;
};
struct FakeHandle {
  int rank;
  void* ptr;
};
struct FakeConn {
  int from, to;
};

thread_local int t_rank = -1;  // the rank this thread plays

epResult_t fakeInit(const epTransportEnv_v1_t*, void**) { return epSuccess; }
epResult_t fakeCanConnect(void*, const epPeerInfo_v1_t*, const epPeerInfo_v1_t* peer, int* ok) {
  *ok = peer->rank != 99;
  return epSuccess;
}
epResult_t fakeRegMem(void*, size_t size, int, void** ptr, void* handle, void** mem) {
  auto* m = new FakeMem{t_rank, calloc(1, size)};
  FakeHandle h{t_rank, m->ptr};
  memcpy(handle, &h, sizeof(h));
  *ptr = m->ptr;
  *mem = m;
  logCall("reg " + std::to_string(t_rank));
  return epSuccess;
}
epResult_t fakeDeregMem(void*, void* mem) {
  auto* m = static_cast<FakeMem*>(mem);
  logCall("dereg " + std::to_string(m->rank));
  free(m->ptr);
  delete m;
  return epSuccess;
}
epResult_t fakeConnect(void*, const epPeerInfo_v1_t* peer, const void* peer_handle, void** ptr, void** conn) {
  FakeHandle h;
  memcpy(&h, peer_handle, sizeof(h));
  if (h.rank != peer->rank) return epInternalError;  // the handle of another rank
  if (peer->rank == g_fail_connect_to.load()) {
    *ptr = reinterpret_cast<void*>(0x1);  // garbage the owner must not keep
    return epSystemError;
  }
  *ptr = h.ptr;
  *conn = new FakeConn{t_rank, peer->rank};
  logCall("connect " + std::to_string(t_rank) + "->" + std::to_string(peer->rank));
  return epSuccess;
}
epResult_t fakeConnected(void*, void* mem) {
  logCall("connected " + std::to_string(static_cast<FakeMem*>(mem)->rank));
  return epSuccess;
}
epResult_t fakeClose(void*, void* conn) {
  auto* c = static_cast<FakeConn*>(conn);
  logCall("close " + std::to_string(c->from) + "->" + std::to_string(c->to));
  delete c;
  return epSuccess;
}

const epTransport_v1_t kFakeTable = {"fake-peer-buffers", 1, fakeInit, nullptr,
                                     fakeCanConnect, fakeRegMem, fakeDeregMem, fakeConnect, fakeConnected,
                                     nullptr, nullptr, fakeClose, nullptr};

ep::TransportEntry fakeTransport() {
  ep::TransportEntry e;
  e.table = &kFakeTable;
  e.available = true;
  return e;
}

std::vector<std::string> takeLog() {
  std::lock_guard<std::mutex> lock(g_log_mu);
  std::vector<std::string> log;
  log.swap(g_log);
  return log;
}

// Index of `what` in log (-1: absent).
int at(const std::vector<std::string>& log, const std::string& what) {
  for (size_t i = 0; i < log.size(); i++)
    if (log[i] == what) return int(i);
  return -1;
}

epPeerInfo_v1_t peerInfo(int rank) {
  epPeerInfo_v1_t p{};
  p.rank = rank;
  p.cuda_device = -1;
  return p;
}

// Runs body(rank, bootstrap) on two ranks, each a thread of its own with its
// end of one bootstrap ring.
template <typename Body>
void onTwoRanks(Body body) {
  epUniqueId id;
  assert_int_equal(ep::bootstrapGetUniqueId(&id, false), epSuccess);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; r++)
    threads.emplace_back([&, r] {
      t_rank = r;
      ep::Bootstrap* b = nullptr;
      if (ep::bootstrapInit(id, r, 2, 10000, nullptr, nullptr, &b) != epSuccess) {
        failures++;
        return;
      }
      if (!body(r, b)) failures++;
      ep::bootstrapClose(b);
    });
  for (std::thread& t : threads) t.join();
  assert_int_equal(failures.load(), 0);
}

void two_ranks_set_up_and_tear_down_in_order(void**) {
  const ep::TransportEntry fake = fakeTransport();
  std::atomic<void*> local[2] = {{nullptr}, {nullptr}};
  std::atomic<void*> seen[2] = {{nullptr}, {nullptr}};  // [r]: the peer's memory as r reached it
  onTwoRanks([&](int r, ep::Bootstrap* b) {
    const int peer = 1 - r;
    {
      ep::PeerBuffers buffers(&fake, r, 2);
      ep::LocalMemory memory;
      memory.bytes = 64;
      if (buffers.registerLocal(memory) != epSuccess || !buffers.registered()) return false;
      local[r] = buffers.localPtr();
      if (buffers.peerPtr(r) != buffers.localPtr()) return false;
      if (buffers.exchange(b) != epSuccess || !buffers.offered(0) || !buffers.offered(1)) return false;
      int ok = 0;
      if (buffers.canConnect(peerInfo(r), peerInfo(peer), &ok) != epSuccess || !ok) return false;
      if (buffers.connect(peer, peerInfo(peer)) != epSuccess) return false;
      seen[r] = buffers.peerPtr(peer);
      if (buffers.finish(b) != epSuccess) return false;
      // Both ranks still hold their buffers here: the peer's memory stays
      // registered until its owner is gone.
      if (ep::bootstrapBarrier(b) != epSuccess) return false;
    }
    return true;
  });
  assert_ptr_equal(seen[0].load(), local[1].load());
  assert_ptr_equal(seen[1].load(), local[0].load());
  const std::vector<std::string> log = takeLog();
  for (int r = 0; r < 2; r++) {
    const std::string me = std::to_string(r), peer = std::to_string(1 - r);
    const int reg = at(log, "reg " + me), conn = at(log, "connect " + me + "->" + peer),
              done = at(log, "connected " + me), close = at(log, "close " + me + "->" + peer),
              dereg = at(log, "dereg " + me);
    assert_true(reg >= 0 && conn > reg && done > conn && close > done && dereg > close);
  }
  assert_int_equal(log.size(), 10);
}

void rank_without_transport_takes_part(void**) {
  const ep::TransportEntry fake = fakeTransport();
  std::atomic<int> offered_seen[2][2] = {};
  onTwoRanks([&](int r, ep::Bootstrap* b) {
    ep::PeerBuffers buffers(r == 0 ? nullptr : &fake, r, 2);
    ep::LocalMemory memory;
    memory.bytes = 32;
    if (r == 1 && buffers.registerLocal(memory) != epSuccess) return false;
    if (r == 0 && buffers.registerLocal(memory) == epSuccess) return false;  // nothing to register with
    if (buffers.exchange(b) != epSuccess) return false;
    for (int q = 0; q < 2; q++) offered_seen[r][q] = buffers.offered(q) ? 1 : 0;
    if (r == 1 && buffers.connect(0, peerInfo(0)) == epSuccess) return false;  // rank 0 offered nothing
    return buffers.finish(b) == epSuccess;
  });
  for (int r = 0; r < 2; r++) {
    assert_int_equal(offered_seen[r][0].load(), 0);
    assert_int_equal(offered_seen[r][1].load(), 1);
  }
  const std::vector<std::string> log = takeLog();
  assert_true(at(log, "reg 0") < 0 && at(log, "dereg 0") < 0 && at(log, "connected 0") < 0);
  assert_true(at(log, "reg 1") >= 0 && at(log, "connected 1") > at(log, "reg 1") &&
              at(log, "dereg 1") > at(log, "connected 1"));
}

void memory_of_the_caller_is_refused(void**) {
  const ep::TransportEntry fake = fakeTransport();
  t_rank = 0;
  char mine[64];
  {
    ep::PeerBuffers buffers(&fake, 0, 1);
    ep::LocalMemory memory;
    memory.bytes = sizeof(mine);
    memory.ptr = mine;
    assert_int_equal(buffers.registerLocal(memory), epNotSupported);
    assert_false(buffers.registered());
    assert_null(buffers.localPtr());
  }
  assert_int_equal(takeLog().size(), 0);
}

void failed_connect_keeps_no_pointer(void**) {
  const ep::TransportEntry fake = fakeTransport();
  g_fail_connect_to = 1;
  std::atomic<int> wrong{0};
  onTwoRanks([&](int r, ep::Bootstrap* b) {
    ep::PeerBuffers buffers(&fake, r, 2);
    ep::LocalMemory memory;
    memory.bytes = 16;
    if (buffers.registerLocal(memory) != epSuccess || buffers.exchange(b) != epSuccess) return false;
    const epResult_t res = buffers.connect(1 - r, peerInfo(1 - r));
    if (r == 0 && (res != epSystemError || buffers.peerPtr(1) != nullptr)) wrong++;
    if (r == 1 && res != epSuccess) wrong++;
    return buffers.finish(b) == epSuccess;
  });
  g_fail_connect_to = -1;
  assert_int_equal(wrong.load(), 0);
  const std::vector<std::string> log = takeLog();
  assert_true(at(log, "close 0->1") < 0 && at(log, "close 1->0") >= 0);
  assert_true(at(log, "dereg 0") >= 0 && at(log, "dereg 1") >= 0);
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(two_ranks_set_up_and_tear_down_in_order),
      cmocka_unit_test(rank_without_transport_takes_part),
      cmocka_unit_test(memory_of_the_caller_is_refused),
      cmocka_unit_test(failed_connect_keeps_no_pointer),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
