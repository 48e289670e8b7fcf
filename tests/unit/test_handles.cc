// Dispatch, combine and routing handles on a one-rank host communicator
// (epGetUniqueId + epCommInitRank with nranks 1, config.backend = host), and
// the argument checks of the data calls.
//
// With one rank every token that selects at least one expert comes back to
// this rank, in token order, so every output has a known value. The group
// setup creates the communicator the cases share; cases that need another
// (a second comm, an abort) create and free their own.
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <new>
#include <memory>
#include <vector>

#include "comm.h"
#include "common.h"
#include "host/convert.h"
#include "routing.h"


// ---- A guarded allocator for communicators -------------------------------------------
// While armed, every allocation of sizeof(epComm) bytes gets pages of its own,
// and freeing it makes them inaccessible: a later read of a freed communicator
// is a SIGSEGV (which cmocka reports as a failed case) instead of silent
// undefined behaviour. Everything else goes to malloc/free.
namespace guard {
std::atomic<bool> armed{false};
std::mutex mu;
struct Block {
  void* ptr;
  size_t len;
};
Block blocks[64];
int num_blocks = 0;

void* allocate(size_t n) {
  if (armed.load() && n == sizeof(epComm)) {
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    const size_t len = (n + page - 1) / page * page;
    void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    std::lock_guard<std::mutex> lock(mu);
    if (num_blocks < 64) {
      blocks[num_blocks++] = {p, len};
      return p;
    }
    munmap(p, len);
  }
  return malloc(n ? n : 1);
}

void release(void* p) {
  if (p == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (int i = 0; i < num_blocks; i++)
      if (blocks[i].ptr == p) {
        mprotect(p, blocks[i].len, PROT_NONE);  // kept mapped, never reused
        blocks[i] = blocks[--num_blocks];
        return;
      }
  }
  free(p);
}
}  // namespace guard

void* operator new(size_t n) {
  void* p = guard::allocate(n);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
void* operator new(size_t n, const std::nothrow_t&) noexcept { return guard::allocate(n); }
void* operator new[](size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { guard::release(p); }
void operator delete(void* p, size_t) noexcept { guard::release(p); }
void operator delete[](void* p) noexcept { guard::release(p); }
void operator delete[](void* p, size_t) noexcept { guard::release(p); }

namespace {

constexpr int kExperts = 8, kHidden = 64, kMaxTokens = 32, kMaxTopk = 4;
constexpr size_t kRowBytes = kHidden * 2;  // bf16

epComm_t g_comm = nullptr;

epConfig_t testConfig() {
  epConfig_t c = eptest::hostConfig(kExperts, kHidden, kMaxTokens, kMaxTopk);
  c.max_nodes_per_token = 1;  // declared node-limited routing: one rank is one node
  return c;
}

epResult_t makeComm(epComm_t* comm, const epConfig_t& cfg) { return eptest::makeOneRankComm(comm, cfg); }

int groupSetup(void**) {
  eptest::unsetAllParams();
  epConfig_t cfg = testConfig();
  epResult_t res = makeComm(&g_comm, cfg);
  if (res != epSuccess) {
    fprintf(stderr, "cannot create a 1-rank host communicator: %s: %s\n", epGetErrorString(res),
            epGetLastError(nullptr));
    return -1;
  }
  return 0;
}

int groupTeardown(void**) {
  return epCommDestroy(g_comm) == epSuccess ? 0 : -1;
}

using eptest::Buf;

// One rank's tokens with a random routing and its known one-rank answers.
struct Tokens {
  int T = 0, K = 0;
  Buf<uint16_t> x;        // [T, H] bf16
  Buf<uint16_t> bias;     // [T, H] bf16
  std::vector<int64_t> idx;  // [T, K]
  std::vector<int32_t> idx32;
  std::vector<float> w;      // [T, K]
  std::vector<int> received;  // tokens with at least one expert, ascending
  std::vector<int> per_expert;  // (token, expert) pairs per expert
};

Tokens makeTokens(uint64_t seed, int T, int K) {
  eptest::Rng rng(seed);
  Tokens tk;
  tk.T = T;
  tk.K = K;
  tk.x = Buf<uint16_t>(size_t(T) * kHidden);
  tk.bias = Buf<uint16_t>(size_t(T) * kHidden);
  for (size_t i = 0; i < size_t(T) * kHidden; i++) {
    tk.x[i] = ep::floatToBf16(rng.real(-4.0f, 4.0f));
    tk.bias[i] = ep::floatToBf16(rng.real(-1.0f, 1.0f));
  }
  tk.idx.assign(size_t(T) * K, -1);
  tk.w.resize(size_t(T) * K);
  tk.per_expert.assign(kExperts, 0);
  for (int t = 0; t < T; t++) {
    bool any = false;
    std::vector<int> chosen;
    const bool empty_token = t % 5 == 3;  // some tokens select no expert at all
    for (int k = 0; k < K; k++) {
      tk.w[size_t(t) * K + k] = rng.real(0.1f, 1.0f);
      if (empty_token || rng.uniform(0, 3) == 0) continue;
      int e;
      bool dup;
      do {
        e = rng.uniform(0, kExperts - 1);
        dup = false;
        for (int c : chosen) dup |= c == e;
      } while (dup);
      chosen.push_back(e);
      tk.idx[size_t(t) * K + k] = e;
      tk.per_expert[e]++;
      any = true;
    }
    if (any) tk.received.push_back(t);
  }
  tk.idx32.assign(tk.idx.begin(), tk.idx.end());
  return tk;
}

epDispatchArgs_t dispatchArgs(const Tokens& tk, Buf<uint16_t>& recv_x, int64_t capacity) {
  epDispatchArgs_t a = EP_DISPATCH_ARGS_INITIALIZER;
  a.x = tk.x.data();
  a.x_type = epBfloat16;
  a.topk_idx = tk.idx.data();
  a.topk_idx_type = epInt64;
  a.topk_weights = tk.w.data();
  a.num_tokens = tk.T;
  a.num_topk = tk.K;
  a.recv_x = recv_x.data();
  a.recv_capacity = capacity;
  return a;
}

// recv_x rows are the received tokens' x rows, in token order.
void checkRecvRows(const Tokens& tk, const uint16_t* x, const Buf<uint16_t>& recv_x) {
  for (size_t i = 0; i < tk.received.size(); i++) {
    int t = tk.received[i];
    if (memcmp(&recv_x[i * kHidden], x + size_t(t) * kHidden, kRowBytes) != 0)
      print_error("recv_x row %zu is not token %d\n", i, t);
    assert_memory_equal(&recv_x[i * kHidden], x + size_t(t) * kHidden, kRowBytes);
  }
}

void checkRecvTopk(const Tokens& tk, const int64_t* recv_idx, const float* recv_w) {
  for (size_t i = 0; i < tk.received.size(); i++) {
    int t = tk.received[i];
    for (int k = 0; k < tk.K; k++) {
      int64_t e = tk.idx[size_t(t) * tk.K + k];
      assert_int_equal(recv_idx[i * tk.K + k], e);  // one rank: local id == global id, -1 kept
      float want = e >= 0 ? tk.w[size_t(t) * tk.K + k] : 0.0f;
      assert_true(recv_w[i * tk.K + k] == want);
    }
  }
}

// ---- Queries -------------------------------------------------------------------------

void comm_queries_of_one_rank(void**) {
  int rank = -1, size = -1, first = -1, count = -1, nodes = -1, node_of[1] = {-1};
  size_t bytes = 0;
  assert_ok(epCommRank(g_comm, &rank));
  assert_int_equal(rank, 0);
  assert_ok(epCommSize(g_comm, &size));
  assert_int_equal(size, 1);
  assert_ok(epCommLocalExperts(g_comm, &first, &count));
  assert_int_equal(first, 0);
  assert_int_equal(count, kExperts);
  assert_ok(epCommNodes(g_comm, &nodes, node_of));
  assert_int_equal(nodes, 1);
  assert_int_equal(node_of[0], 0);
  assert_ok(epCommBufferBytes(g_comm, &bytes));
  assert_true(bytes >= kRowBytes);
  assert_result(epCommRank(g_comm, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "rank is NULL");
}

void layout_of_one_rank(void**) {
  Tokens tk = makeTokens(11, 20, 3);
  epLayoutArgs_t a = EP_LAYOUT_ARGS_INITIALIZER;
  a.topk_idx = tk.idx32.data();
  a.topk_idx_type = epInt32;
  a.num_tokens = tk.T;
  a.num_topk = tk.K;
  int per_rank[1] = {-1}, per_node[1] = {-1}, per_expert[kExperts];
  std::vector<uint8_t> in_rank(tk.T, 0xee);
  a.tokens_per_rank = per_rank;
  a.tokens_per_node = per_node;
  a.tokens_per_expert = per_expert;
  a.is_token_in_rank = in_rank.data();
  assert_ok(epLayout(g_comm, &a, nullptr));
  assert_int_equal(per_rank[0], int(tk.received.size()));
  assert_int_equal(per_node[0], int(tk.received.size()));
  for (int e = 0; e < kExperts; e++) assert_int_equal(per_expert[e], tk.per_expert[e]);
  for (int t = 0; t < tk.T; t++) {
    bool got = false;
    for (int r : tk.received) got |= r == t;
    assert_int_equal(in_rank[t], got ? 1 : 0);
  }
}

// ---- Dispatch and combine -----------------------------------------------------------------

void dispatch_combine_round_trip(void**) {
  Tokens tk = makeTokens(1, 24, 4);
  const int64_t n = int64_t(tk.received.size());
  assert_true(n > 0 && n < tk.T);  // the case has tokens that go nowhere
  Buf<uint16_t> recv_x(size_t(kMaxTokens) * kHidden);
  std::vector<int64_t> recv_idx(size_t(kMaxTokens) * tk.K, 77);
  std::vector<float> recv_w(size_t(kMaxTokens) * tk.K, 77.0f);
  std::vector<int> per_expert(kExperts, -1);
  int64_t num_recv = -1;
  epDispatchArgs_t a = dispatchArgs(tk, recv_x, kMaxTokens);
  a.recv_topk_idx = recv_idx.data();
  a.recv_topk_weights = recv_w.data();
  a.recv_tokens_per_expert = per_expert.data();
  a.expert_alignment = 4;
  a.num_recv = &num_recv;
  epHandle_t h = nullptr;
  assert_ok(epDispatch(g_comm, &a, &h, nullptr));
  assert_non_null(h);
  assert_int_equal(num_recv, n);
  int64_t count = -1;
  assert_ok(epHandleRecvCount(h, &count));
  assert_int_equal(count, n);
  checkRecvRows(tk, tk.x.data(), recv_x);
  checkRecvTopk(tk, recv_idx.data(), recv_w.data());
  for (int e = 0; e < kExperts; e++) assert_int_equal(per_expert[e], ep::alignUp(tk.per_expert[e], 4));

  // Combine: y = the received rows; out[t] = x[t] + bias[t] (bf16, float32 sum).
  Buf<uint16_t> out(size_t(tk.T) * kHidden);
  std::vector<float> out_w(size_t(tk.T) * tk.K, -5.0f);
  epCombineArgs_t c = EP_COMBINE_ARGS_INITIALIZER;
  c.y = recv_x.data();
  c.y_type = epBfloat16;
  c.bias = tk.bias.data();
  c.out = out.data();
  c.recv_topk_weights = recv_w.data();
  c.num_topk = tk.K;
  c.out_topk_weights = out_w.data();
  assert_ok(epCombine(g_comm, &c, h, nullptr));
  int bad = 0;
  for (int t = 0; t < tk.T; t++) {
    bool got = false;
    for (int r : tk.received) got |= r == t;
    for (int j = 0; j < kHidden; j++) {
      size_t i = size_t(t) * kHidden + j;
      float sum = (got ? ep::bf16ToFloat(tk.x[i]) : 0.0f) + ep::bf16ToFloat(tk.bias[i]);
      uint16_t want = ep::floatToBf16(sum);
      if (out[i] != want && bad++ < 5)
        print_error("out[%d][%d] = 0x%04x, want 0x%04x\n", t, j, out[i], want);
    }
    for (int k = 0; k < tk.K; k++) {
      int64_t e = tk.idx[size_t(t) * tk.K + k];
      float want = e >= 0 ? tk.w[size_t(t) * tk.K + k] : 0.0f;
      assert_true(out_w[size_t(t) * tk.K + k] == want);
    }
  }
  assert_int_equal(bad, 0);

  // Deterministic mode gives the same bits.
  Buf<uint16_t> out2(size_t(tk.T) * kHidden);
  c.out = out2.data();
  c.flags = EP_COMBINE_DETERMINISTIC;
  c.out_topk_weights = nullptr;
  c.recv_topk_weights = nullptr;
  assert_ok(epCombine(g_comm, &c, h, nullptr));
  assert_memory_equal(out2.data(), out.data(), size_t(tk.T) * kRowBytes);
  assert_ok(epHandleDestroy(h));
}

void dispatch_with_int32_ids_and_strided_rows(void**) {
  Tokens tk = makeTokens(2, 16, 2);
  const size_t stride = kRowBytes + 64;  // padded rows
  Buf<uint16_t> x_padded(size_t(tk.T) * stride / 2);
  for (int t = 0; t < tk.T; t++)
    memcpy(reinterpret_cast<char*>(x_padded.data()) + size_t(t) * stride, &tk.x[size_t(t) * kHidden],
           kRowBytes);
  Buf<uint16_t> recv_x(size_t(kMaxTokens) * kHidden);
  std::vector<int64_t> recv_idx(size_t(kMaxTokens) * tk.K);
  epDispatchArgs_t a = dispatchArgs(tk, recv_x, kMaxTokens);
  a.x = x_padded.data();
  a.x_stride = stride;
  a.topk_idx = tk.idx32.data();
  a.topk_idx_type = epInt32;
  a.topk_weights = nullptr;
  a.recv_topk_idx = recv_idx.data();
  epHandle_t h = nullptr;
  assert_ok(epDispatch(g_comm, &a, &h, nullptr));
  checkRecvRows(tk, tk.x.data(), recv_x);
  for (size_t i = 0; i < tk.received.size(); i++)
    for (int k = 0; k < tk.K; k++)
      assert_int_equal(recv_idx[i * tk.K + k], tk.idx[size_t(tk.received[i]) * tk.K + k]);

  // Combine from padded y rows into packed out, no bias: out = x for received tokens, 0 elsewhere.
  const size_t y_stride = kRowBytes + 32;
  Buf<uint16_t> y(tk.received.size() * y_stride / 2 + 1);
  for (size_t i = 0; i < tk.received.size(); i++)
    memcpy(reinterpret_cast<char*>(y.data()) + i * y_stride, &recv_x[i * kHidden], kRowBytes);
  Buf<uint16_t> out(size_t(tk.T) * kHidden);
  memset(out.data(), 0xff, size_t(tk.T) * kRowBytes);
  epCombineArgs_t c = EP_COMBINE_ARGS_INITIALIZER;
  c.y = y.data();
  c.y_stride = y_stride;
  c.out = out.data();
  assert_ok(epCombine(g_comm, &c, h, nullptr));
  for (int t = 0; t < tk.T; t++) {
    bool got = false;
    for (int r : tk.received) got |= r == t;
    for (int j = 0; j < kHidden; j++) {
      uint16_t want = got ? tk.x[size_t(t) * kHidden + j] : uint16_t(0);
      assert_int_equal(out[size_t(t) * kHidden + j], want);
    }
  }
  assert_ok(epHandleDestroy(h));
}

void prepare_then_recv_count_then_dispatch(void**) {
  Tokens tk = makeTokens(3, 30, 3);
  Buf<uint16_t> recv_x(size_t(kMaxTokens) * kHidden);
  epDispatchArgs_t a = dispatchArgs(tk, recv_x, 0);
  a.recv_x = nullptr;
  epHandle_t h = nullptr;
  assert_ok(epDispatchPrepare(g_comm, &a, &h, nullptr));
  assert_non_null(h);
  int64_t count = -1;
  assert_ok(epHandleRecvCount(h, &count));
  assert_int_equal(count, int64_t(tk.received.size()));

  // Size the outputs exactly from the count, then dispatch with the prepared handle.
  Buf<uint16_t> exact(size_t(count) * kHidden);
  std::vector<int64_t> recv_idx(size_t(count) * tk.K);
  std::vector<float> recv_w(size_t(count) * tk.K);
  a.recv_x = exact.data();
  a.recv_capacity = count;
  a.recv_topk_idx = recv_idx.data();
  a.recv_topk_weights = recv_w.data();
  epHandle_t same = h;
  assert_ok(epDispatch(g_comm, &a, &same, nullptr));
  assert_ptr_equal(same, h);  // the prepared handle is used, not replaced
  checkRecvRows(tk, tk.x.data(), exact);
  checkRecvTopk(tk, recv_idx.data(), recv_w.data());
  assert_ok(epHandleDestroy(h));
}

void cached_redispatch_moves_new_x(void**) {
  Tokens tk = makeTokens(4, 20, 4);
  Buf<uint16_t> recv_x(size_t(kMaxTokens) * kHidden);
  std::vector<int> per_expert(kExperts);
  epDispatchArgs_t a = dispatchArgs(tk, recv_x, kMaxTokens);
  a.recv_tokens_per_expert = per_expert.data();
  epHandle_t h = nullptr;
  assert_ok(epDispatch(g_comm, &a, &h, nullptr));

  // New activations, same routing; topk_idx is not given.
  Tokens tk2 = makeTokens(5, 20, 4);
  Buf<uint16_t> recv_x2(size_t(kMaxTokens) * kHidden);
  std::vector<int> per_expert2(kExperts, -1);
  std::vector<int64_t> recv_idx2(size_t(kMaxTokens) * tk.K, 66);
  std::vector<float> recv_w2(size_t(kMaxTokens) * tk.K, 66.0f);
  int64_t num_recv = -1;
  epDispatchArgs_t b = dispatchArgs(tk2, recv_x2, kMaxTokens);
  b.topk_idx = nullptr;
  b.topk_weights = nullptr;
  b.recv_tokens_per_expert = per_expert2.data();
  b.recv_topk_idx = recv_idx2.data();  // no ids were sent: rows of -1 and weights of 0
  b.recv_topk_weights = recv_w2.data();
  b.num_recv = &num_recv;
  epHandle_t cached = h;
  assert_ok(epDispatch(g_comm, &b, &cached, nullptr));
  assert_ptr_equal(cached, h);
  assert_int_equal(num_recv, int64_t(tk.received.size()));
  checkRecvRows(tk, tk2.x.data(), recv_x2);  // tk's routing, tk2's rows
  for (int e = 0; e < kExperts; e++) assert_int_equal(per_expert2[e], tk.per_expert[e]);
  for (size_t i = 0; i < size_t(num_recv) * tk.K; i++) {
    assert_int_equal(recv_idx2[i], -1);
    assert_true(recv_w2[i] == 0.0f);
  }

  // Without ids num_topk is not used (the handle's K applies): a stray value is harmless.
  b.num_topk = -3;
  assert_ok(epDispatch(g_comm, &b, &cached, nullptr));
  checkRecvRows(tk, tk2.x.data(), recv_x2);
  b.num_topk = tk.K;

  // Ids given to a cached dispatch are forwarded, so they are checked like a new routing's.
  std::vector<int64_t> bad_ids = tk.idx;
  bad_ids[3 * size_t(tk.K) + 1] = int64_t(1) << 35;
  b.topk_idx = bad_ids.data();
  assert_result(epDispatch(g_comm, &b, &cached, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "topk_idx[3][1]");
  b.topk_idx = tk.idx.data();
  b.topk_idx_type = epFloat32;
  assert_result(epDispatch(g_comm, &b, &cached, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "topk_idx_type");
  b.topk_idx_type = epInt64;
  b.topk_idx = nullptr;

  // A cached dispatch must keep the token count of the routing.
  b.num_tokens = 19;
  assert_result(epDispatch(g_comm, &b, &cached, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "num_tokens = 19");
  assert_ok(epHandleDestroy(h));
}

void dispatch_zero_tokens(void**) {
  epDispatchArgs_t a = EP_DISPATCH_ARGS_INITIALIZER;
  a.num_topk = 2;
  int64_t num_recv = -1;
  a.num_recv = &num_recv;
  epHandle_t h = nullptr;
  assert_ok(epDispatch(g_comm, &a, &h, nullptr));
  assert_non_null(h);
  assert_int_equal(num_recv, 0);
  epCombineArgs_t c = EP_COMBINE_ARGS_INITIALIZER;  // no rows, no tokens: no buffers needed
  assert_ok(epCombine(g_comm, &c, h, nullptr));
  assert_ok(epHandleDestroy(h));
}

void unused_rows_are_marked_with_and_without_no_host_sync(void**) {
  for (unsigned flags : {0u, unsigned(EP_DISPATCH_NO_HOST_SYNC)}) {
    Tokens tk = makeTokens(6, 12, 2);
    Buf<uint16_t> recv_x(size_t(kMaxTokens) * kHidden);
    std::vector<int64_t> recv_idx(size_t(kMaxTokens) * tk.K, 55);
    int64_t num_recv = -1;
    epDispatchArgs_t a = dispatchArgs(tk, recv_x, kMaxTokens);
    a.flags = flags;
    a.recv_topk_idx = recv_idx.data();
    a.num_recv = &num_recv;
    epHandle_t h = nullptr;
    assert_ok(epDispatch(g_comm, &a, &h, nullptr));
    assert_int_equal(num_recv, int64_t(tk.received.size()));
    for (size_t i = size_t(num_recv) * tk.K; i < recv_idx.size(); i++) {
      if (recv_idx[i] != -1)
        print_error("flags 0x%x: recv_topk_idx[%zu] = %lld\n", flags, i, (long long)recv_idx[i]);
      assert_int_equal(recv_idx[i], -1);
    }
    checkRecvRows(tk, tk.x.data(), recv_x);
    assert_ok(epHandleDestroy(h));
  }
}

// ---- Handle misuse ---------------------------------------------------------------------

void combine_with_prepared_only_handle_is_invalid_usage(void**) {
  Tokens tk = makeTokens(7, 8, 2);
  Buf<uint16_t> recv_x(size_t(kMaxTokens) * kHidden);
  epDispatchArgs_t a = dispatchArgs(tk, recv_x, kMaxTokens);
  epHandle_t h = nullptr;
  assert_ok(epDispatchPrepare(g_comm, &a, &h, nullptr));
  Buf<uint16_t> out(size_t(tk.T) * kHidden);
  epCombineArgs_t c = EP_COMBINE_ARGS_INITIALIZER;
  c.y = recv_x.data();
  c.out = out.data();
  assert_result(epCombine(g_comm, &c, h, nullptr), epInvalidUsage);
  assert_contains(epGetLastError(g_comm), "dispatch");
  // A cached re-dispatch of a prepared-only handle is its first dispatch: allowed.
  assert_ok(epDispatch(g_comm, &a, &h, nullptr));
  assert_ok(epCombine(g_comm, &c, h, nullptr));
  assert_ok(epHandleDestroy(h));
}

void handle_of_another_comm_is_rejected(void**) {
  epComm_t other = nullptr;
  assert_ok(makeComm(&other, testConfig()));
  Tokens tk = makeTokens(8, 8, 2);
  Buf<uint16_t> recv_x(size_t(kMaxTokens) * kHidden);
  epDispatchArgs_t a = dispatchArgs(tk, recv_x, kMaxTokens);
  epHandle_t foreign = nullptr;
  assert_ok(epDispatch(other, &a, &foreign, nullptr));

  Buf<uint16_t> out(size_t(tk.T) * kHidden);
  epCombineArgs_t c = EP_COMBINE_ARGS_INITIALIZER;
  c.y = recv_x.data();
  c.out = out.data();
  assert_result(epCombine(g_comm, &c, foreign, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "another communicator");
  epHandle_t h = foreign;
  assert_result(epDispatch(g_comm, &a, &h, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "another communicator");
  assert_ptr_equal(h, foreign);
  // Both comms still work.
  assert_ok(epCombine(other, &c, foreign, nullptr));
  epHandle_t mine = nullptr;
  assert_ok(epDispatch(g_comm, &a, &mine, nullptr));
  assert_ok(epHandleDestroy(mine));
  assert_ok(epHandleDestroy(foreign));
  assert_ok(epCommDestroy(other));
}

void null_and_dead_handles_are_rejected(void**) {
  assert_ok(epHandleDestroy(nullptr));
  Tokens tk = makeTokens(9, 4, 1);
  Buf<uint16_t> recv_x(size_t(kMaxTokens) * kHidden);
  Buf<uint16_t> out(size_t(tk.T) * kHidden);
  epCombineArgs_t c = EP_COMBINE_ARGS_INITIALIZER;
  c.y = recv_x.data();
  c.out = out.data();
  assert_result(epCombine(g_comm, &c, nullptr, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "epCombine: handle is NULL");
  epDispatchArgs_t a = dispatchArgs(tk, recv_x, kMaxTokens);
  assert_result(epDispatch(g_comm, &a, nullptr, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "epDispatch: handle is NULL");
  assert_result(epDispatchPrepare(g_comm, &a, nullptr, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "epDispatchPrepare: handle is NULL");

  // A handle object whose magic says it was destroyed (built here: no use after free).
  epHandle dead;
  dead.magic = ep::kDeadMagic;
  dead.comm = g_comm;
  dead.dispatched = true;
  assert_result(epCombine(g_comm, &c, &dead, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "not a live routing handle");
  epHandle_t h = &dead;
  assert_result(epDispatch(g_comm, &a, &h, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "not a live routing handle");
  assert_result(epHandleDestroy(&dead), epInvalidArgument);
}

// ---- Argument checks ---------------------------------------------------------------------

void dispatch_args_header_is_checked(void**) {
  Tokens tk = makeTokens(10, 8, 2);
  Buf<uint16_t> recv_x(size_t(kMaxTokens) * kHidden);
  epDispatchArgs_t a = dispatchArgs(tk, recv_x, kMaxTokens);
  epHandle_t h = nullptr;
  assert_result(epDispatch(g_comm, nullptr, &h, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "args is NULL");
  a.magic = EP_COMBINE_ARGS_MAGIC;
  assert_result(epDispatch(g_comm, &a, &h, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "args.magic");
  assert_result(epDispatchPrepare(g_comm, &a, &h, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "args.magic");
  a = dispatchArgs(tk, recv_x, kMaxTokens);
  a.size = offsetof(epDispatchArgs_t, num_recv);  // one field short of v1
  assert_result(epDispatch(g_comm, &a, &h, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "args.size");
  a = dispatchArgs(tk, recv_x, kMaxTokens);
  a.flags = 0x80u;
  assert_result(epDispatch(g_comm, &a, &h, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "args.flags = 0x80");
  assert_null(h);
  // A prepare refuses bad routing fields as the dispatch would (x and the
  // buffers come with the dispatch).
  assert_result(epDispatchPrepare(g_comm, &a, &h, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "epDispatchPrepare: args.flags = 0x80");
  a = dispatchArgs(tk, recv_x, kMaxTokens);
  a.expert_alignment = -5;
  assert_result(epDispatchPrepare(g_comm, &a, &h, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "expert_alignment = -5");
  assert_null(h);
}

void combine_and_layout_args_header_is_checked(void**) {
  Tokens tk = makeTokens(12, 8, 2);
  Buf<uint16_t> recv_x(size_t(kMaxTokens) * kHidden);
  epDispatchArgs_t a = dispatchArgs(tk, recv_x, kMaxTokens);
  epHandle_t h = nullptr;
  assert_ok(epDispatch(g_comm, &a, &h, nullptr));
  Buf<uint16_t> out(size_t(tk.T) * kHidden);
  epCombineArgs_t c = EP_COMBINE_ARGS_INITIALIZER;
  c.y = recv_x.data();
  c.out = out.data();
  c.magic = EP_DISPATCH_ARGS_MAGIC;
  assert_result(epCombine(g_comm, &c, h, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "args.magic");
  c.magic = EP_COMBINE_ARGS_MAGIC;
  c.size = sizeof(size_t);
  assert_result(epCombine(g_comm, &c, h, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "args.size");
  c.size = sizeof(c);
  c.flags = 0x6u;
  assert_result(epCombine(g_comm, &c, h, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "args.flags");

  epLayoutArgs_t l = EP_LAYOUT_ARGS_INITIALIZER;
  l.topk_idx = tk.idx.data();
  l.num_tokens = tk.T;
  l.num_topk = tk.K;
  l.magic = 0;
  assert_result(epLayout(g_comm, &l, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "args.magic");
  l.magic = EP_LAYOUT_ARGS_MAGIC;
  l.size = offsetof(epLayoutArgs_t, is_token_in_rank);
  assert_result(epLayout(g_comm, &l, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "args.size");
  assert_result(epLayout(g_comm, nullptr, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "args is NULL");
  assert_ok(epHandleDestroy(h));
}

void num_tokens_above_max_is_rejected(void**) {
  Tokens tk = makeTokens(13, kMaxTokens + 1, 2);
  Buf<uint16_t> recv_x(size_t(kMaxTokens + 1) * kHidden);
  epDispatchArgs_t a = dispatchArgs(tk, recv_x, kMaxTokens + 1);
  epHandle_t h = nullptr;
  assert_result(epDispatch(g_comm, &a, &h, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "num_tokens = 33");
  assert_contains(epGetLastError(g_comm), "max_tokens_per_rank");
  assert_result(epDispatchPrepare(g_comm, &a, &h, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "num_tokens = 33");
  a.num_tokens = -1;
  assert_result(epDispatch(g_comm, &a, &h, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "num_tokens = -1");
  epLayoutArgs_t l = EP_LAYOUT_ARGS_INITIALIZER;
  l.topk_idx = tk.idx.data();
  l.num_tokens = kMaxTokens + 1;
  l.num_topk = 2;
  assert_result(epLayout(g_comm, &l, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "num_tokens = 33");
  assert_null(h);
  a.num_tokens = kMaxTokens;  // the maximum itself is fine
  assert_ok(epDispatch(g_comm, &a, &h, nullptr));
  assert_ok(epHandleDestroy(h));
}

void expert_out_of_range_names_position(void**) {
  Tokens tk = makeTokens(14, 6, 3);
  Buf<uint16_t> recv_x(size_t(kMaxTokens) * kHidden);
  tk.idx[3 * 3 + 1] = kExperts;  // token 3, k 1
  epDispatchArgs_t a = dispatchArgs(tk, recv_x, kMaxTokens);
  epHandle_t h = nullptr;
  assert_result(epDispatch(g_comm, &a, &h, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "topk_idx[3][1] = 8");
  assert_result(epDispatchPrepare(g_comm, &a, &h, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "topk_idx[3][1] = 8");
  tk.idx[3 * 3 + 1] = -1;
  tk.idx[0 * 3 + 2] = -2;  // only -1 means "none"
  assert_result(epDispatch(g_comm, &a, &h, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "topk_idx[0][2] = -2");
  tk.idx[0 * 3 + 2] = -1;
  std::vector<int32_t> idx32(tk.idx.begin(), tk.idx.end());
  idx32[5 * 3 + 0] = 1000;
  a.topk_idx = idx32.data();
  a.topk_idx_type = epInt32;
  assert_result(epDispatch(g_comm, &a, &h, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "topk_idx[5][0] = 1000");
  epLayoutArgs_t l = EP_LAYOUT_ARGS_INITIALIZER;
  int per_rank[1] = {-3};
  l.topk_idx = idx32.data();
  l.topk_idx_type = epInt32;
  l.num_tokens = tk.T;
  l.num_topk = 3;
  l.tokens_per_rank = per_rank;
  assert_result(epLayout(g_comm, &l, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "topk_idx[5][0] = 1000");
  assert_int_equal(per_rank[0], -3);  // outputs untouched on error
  assert_null(h);
}

void recv_capacity_too_small_keeps_comm_usable(void**) {
  Tokens tk = makeTokens(15, 20, 2);
  const int64_t n = int64_t(tk.received.size());
  assert_true(n >= 2);
  Buf<uint16_t> recv_x(size_t(kMaxTokens) * kHidden);
  memset(recv_x.data(), 0xab, size_t(kMaxTokens) * kRowBytes);
  std::vector<int64_t> recv_idx(size_t(kMaxTokens) * tk.K, 99);
  int64_t num_recv = -7;
  epDispatchArgs_t a = dispatchArgs(tk, recv_x, n - 1);
  a.recv_topk_idx = recv_idx.data();
  a.num_recv = &num_recv;
  epHandle_t h = nullptr;
  assert_result(epDispatch(g_comm, &a, &h, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "recv_capacity");
  assert_null(h);
  assert_int_equal(num_recv, -7);
  for (size_t i = 0; i < size_t(kMaxTokens) * kHidden; i++) assert_int_equal(recv_x[i], 0xabab);
  for (int64_t v : recv_idx) assert_int_equal(v, 99);

  // The next, valid call works.
  a.recv_capacity = n;
  assert_ok(epDispatch(g_comm, &a, &h, nullptr));
  assert_int_equal(num_recv, n);
  checkRecvRows(tk, tk.x.data(), recv_x);
  assert_ok(epHandleDestroy(h));
  h = nullptr;

  // Same with a prepared handle: a too-small dispatch fails, a retry succeeds.
  assert_ok(epDispatchPrepare(g_comm, &a, &h, nullptr));
  a.recv_capacity = 0;
  a.recv_x = nullptr;
  assert_result(epDispatch(g_comm, &a, &h, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "recv_capacity = 0");
  a.recv_capacity = n;
  a.recv_x = recv_x.data();
  assert_ok(epDispatch(g_comm, &a, &h, nullptr));
  checkRecvRows(tk, tk.x.data(), recv_x);
  assert_ok(epHandleDestroy(h));
}

// An enum field set to an int that is no value of the enum (as a C caller can).
void setRaw(epDataType_t* field, int v) { memcpy(field, &v, sizeof(v)); }

void dispatch_field_checks_name_the_field(void**) {
  Tokens tk = makeTokens(16, 8, 2);
  Buf<uint16_t> recv_x(size_t(kMaxTokens) * kHidden);
  epHandle_t h = nullptr;
  struct Bad {
    const char* field;
    void (*mutate)(epDispatchArgs_t&);
  };
  const Bad cases[] = {
      {"x_type = fp32", [](epDispatchArgs_t& a) { a.x_type = epFloat32; }},
      {"num_topk = 0", [](epDispatchArgs_t& a) { a.num_topk = 0; }},
      {"num_topk = 5", [](epDispatchArgs_t& a) { a.num_topk = kMaxTopk + 1; }},
      {"topk_idx is NULL", [](epDispatchArgs_t& a) { a.topk_idx = nullptr; }},
      {"topk_idx_type", [](epDispatchArgs_t& a) { a.topk_idx_type = epFloat32; }},
      // Not values of the enum: refused before they are read as one.
      {"x_type = 1000 is not an epDataType_t value", [](epDispatchArgs_t& a) { setRaw(&a.x_type, 1000); }},
      {"topk_idx_type = -7 is not an epDataType_t value",
       [](epDispatchArgs_t& a) { setRaw(&a.topk_idx_type, -7); }},
      {"x is NULL", [](epDispatchArgs_t& a) { a.x = nullptr; }},
      {"x_stride = 8", [](epDispatchArgs_t& a) { a.x_stride = 8; }},
      {"x_stride = 136", [](epDispatchArgs_t& a) { a.x_stride = kRowBytes + 8; }},
      {"16-byte aligned",
       [](epDispatchArgs_t& a) { a.recv_x = static_cast<char*>(a.recv_x) + 2; }},
      {"recv_capacity = -1", [](epDispatchArgs_t& a) { a.recv_capacity = -1; }},
      {"recv_x is NULL", [](epDispatchArgs_t& a) { a.recv_x = nullptr; }},
      {"expert_alignment = -2", [](epDispatchArgs_t& a) { a.expert_alignment = -2; }},
      {"expert_alignment = 2147483647", [](epDispatchArgs_t& a) { a.expert_alignment = 2147483647; }},
  };
  for (const Bad& bad : cases) {
    epDispatchArgs_t a = dispatchArgs(tk, recv_x, kMaxTokens);
    bad.mutate(a);
    epResult_t res = epDispatch(g_comm, &a, &h, nullptr);
    if (res != epInvalidArgument) print_error("case \"%s\" returned %d\n", bad.field, int(res));
    assert_int_equal(res, epInvalidArgument);
    assert_contains(epGetLastError(g_comm), bad.field);
    assert_null(h);
  }
  epDispatchArgs_t a = dispatchArgs(tk, recv_x, kMaxTokens);
  assert_ok(epDispatch(g_comm, &a, &h, nullptr));
  assert_ok(epHandleDestroy(h));
}

void combine_field_checks_name_the_field(void**) {
  Tokens tk = makeTokens(17, 10, 2);
  Buf<uint16_t> recv_x(size_t(kMaxTokens) * kHidden);
  std::vector<float> recv_w(size_t(kMaxTokens) * tk.K);
  epDispatchArgs_t a = dispatchArgs(tk, recv_x, kMaxTokens);
  a.recv_topk_weights = recv_w.data();
  epHandle_t h = nullptr;
  assert_ok(epDispatch(g_comm, &a, &h, nullptr));
  Buf<uint16_t> out(size_t(tk.T) * kHidden);
  std::vector<float> out_w(size_t(tk.T) * tk.K);
  struct Ctx {
    uint16_t* y;
    uint16_t* out;
    float* recv_w;
    float* out_w;
  } ctx{recv_x.data(), out.data(), recv_w.data(), out_w.data()};
  struct Bad {
    const char* field;
    void (*mutate)(epCombineArgs_t&, const Ctx&);
  };
  const Bad cases[] = {
      {"y_type = fp16", [](epCombineArgs_t& c, const Ctx&) { c.y_type = epFloat16; }},
      {"y_type = 6 is not an epDataType_t value", [](epCombineArgs_t& c, const Ctx&) { setRaw(&c.y_type, 6); }},
      {"y_stride = 64", [](epCombineArgs_t& c, const Ctx&) { c.y_stride = 64; }},
      {"y is NULL", [](epCombineArgs_t& c, const Ctx&) { c.y = nullptr; }},
      {"out is NULL", [](epCombineArgs_t& c, const Ctx&) { c.out = nullptr; }},
      {"16-byte aligned",
       [](epCombineArgs_t& c, const Ctx& x) { c.bias = reinterpret_cast<char*>(x.out) + 4; }},
      {"out_topk_weights needs recv_topk_weights",
       [](epCombineArgs_t& c, const Ctx& x) {
         c.recv_topk_weights = nullptr;
         c.out_topk_weights = x.out_w;
       }},
      {"num_topk = 3", [](epCombineArgs_t& c, const Ctx&) { c.num_topk = 3; }},
  };
  for (const Bad& bad : cases) {
    epCombineArgs_t c = EP_COMBINE_ARGS_INITIALIZER;
    c.y = ctx.y;
    c.out = ctx.out;
    c.recv_topk_weights = ctx.recv_w;
    c.num_topk = tk.K;
    c.out_topk_weights = ctx.out_w;
    bad.mutate(c, ctx);
    epResult_t res = epCombine(g_comm, &c, h, nullptr);
    if (res != epInvalidArgument) print_error("case \"%s\" returned %d\n", bad.field, int(res));
    assert_int_equal(res, epInvalidArgument);
    assert_contains(epGetLastError(g_comm), bad.field);
  }
  epCombineArgs_t c = EP_COMBINE_ARGS_INITIALIZER;
  c.y = ctx.y;
  c.out = ctx.out;
  assert_ok(epCombine(g_comm, &c, h, nullptr));
  assert_ok(epHandleDestroy(h));
}

// Errors of the report calls are kept on the communicator too (not a stale message).
void plan_report_errors_are_kept_on_the_comm(void**) {
  assert_result(epCommNodes(g_comm, nullptr, nullptr), epInvalidArgument);  // an earlier, unrelated error
  assert_result(epCommPlanReport(g_comm, nullptr, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "epCommPlanReport: bytes is NULL");
  size_t bytes = 0;
  assert_ok(epCommPlanReport(g_comm, nullptr, &bytes));
  assert_true(bytes > 1);
  char small[1];
  size_t have = 1;
  assert_result(epCommPlanReport(g_comm, small, &have), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "the report needs");
}

void comm_stays_usable_after_argument_errors(void**) {
  epDispatchArgs_t bad = EP_DISPATCH_ARGS_INITIALIZER;
  bad.num_tokens = 1000;
  epHandle_t h = nullptr;
  assert_result(epDispatch(g_comm, &bad, &h, nullptr), epInvalidArgument);
  // The message is kept on the communicator, and in the thread's slot.
  assert_contains(epGetLastError(g_comm), "num_tokens = 1000");
  assert_contains(epGetLastError(nullptr), "num_tokens = 1000");
  Tokens tk = makeTokens(18, 16, 3);
  Buf<uint16_t> recv_x(size_t(kMaxTokens) * kHidden);
  epDispatchArgs_t a = dispatchArgs(tk, recv_x, kMaxTokens);
  assert_ok(epDispatch(g_comm, &a, &h, nullptr));
  checkRecvRows(tk, tk.x.data(), recv_x);
  assert_ok(epHandleDestroy(h));
  int rank = -1;
  assert_ok(epCommRank(g_comm, &rank));
  assert_int_equal(rank, 0);
}

// ---- Node-limited routing -------------------------------------------------------------------

void node_limited_bound_counts_distinct_nodes(void**) {
  // One rank is one node, so the comm cannot show a violation; check the bound's
  // arithmetic on a 4-node placement (E = 16, R = 8, 2 ranks of 2 experts per node).
  ep::Placement pl;
  pl.num_experts = 16;
  pl.nranks = 8;
  pl.experts_per_rank = 2;
  const int node_of_rank[8] = {0, 0, 1, 1, 2, 2, 3, 3};
  const int64_t idx[4 * 4] = {
      0,  1,  2,  3,   // ranks 0, 1: node 0 only
      0,  4,  8,  12,  // ranks 0, 2, 4, 6: four nodes
      5,  6,  -1, -1,  // ranks 2, 3: node 1
      15, 0,  14, -1,  // ranks 7, 0: nodes 3, 0
  };
  int worst = -5;
  assert_int_equal(ep::maxNodesPerToken(pl, idx, epInt64, 4, 4, node_of_rank, 4, &worst), 4);
  assert_int_equal(worst, 1);
  // Without token 1 the bound M = 2 holds.
  const int64_t* rest = idx + 8;
  assert_int_equal(ep::maxNodesPerToken(pl, rest, epInt64, 2, 4, node_of_rank, 4, &worst), 2);
  assert_int_equal(worst, 1);  // index within `rest`: token 3 of idx
  assert_int_equal(ep::maxNodesPerToken(pl, idx, epInt64, 1, 4, node_of_rank, 4, &worst), 1);
  // And the comm (declared M = 1, one node) accepts any valid routing.
  Tokens tk = makeTokens(19, 16, 4);
  Buf<uint16_t> recv_x(size_t(kMaxTokens) * kHidden);
  epDispatchArgs_t a = dispatchArgs(tk, recv_x, kMaxTokens);
  epHandle_t h = nullptr;
  assert_ok(epDispatch(g_comm, &a, &h, nullptr));
  assert_ok(epHandleDestroy(h));
}

// ---- Abort ----------------------------------------------------------------------------------

void abort_on_idle_comm_succeeds(void**) {
  epComm_t c = nullptr;
  assert_ok(makeComm(&c, testConfig()));
  Tokens tk = makeTokens(20, 4, 1);
  Buf<uint16_t> recv_x(size_t(kMaxTokens) * kHidden);
  epDispatchArgs_t a = dispatchArgs(tk, recv_x, kMaxTokens);
  epHandle_t h = nullptr;
  assert_ok(epDispatch(c, &a, &h, nullptr));
  assert_ok(epHandleDestroy(h));  // handles go before their communicator
  assert_ok(epCommAbort(c));      // frees c
}

// A program may destroy its communicator before the handles made on it
// (epCommDestroy does not say otherwise). Then epHandleDestroy must free the
// handle without reading the freed communicator; or epCommDestroy must refuse
// while handles are live. The communicator here lives in guarded pages.
void handle_destroy_after_comm_destroy_does_not_read_freed_comm(void**) {
  epComm_t c = nullptr;
  guard::armed.store(true);
  epResult_t res = makeComm(&c, testConfig());
  guard::armed.store(false);
  assert_ok(res);
  Tokens tk = makeTokens(21, 4, 1);
  Buf<uint16_t> recv_x(size_t(kMaxTokens) * kHidden);
  epDispatchArgs_t a = dispatchArgs(tk, recv_x, kMaxTokens);
  epHandle_t h = nullptr;
  assert_ok(epDispatch(c, &a, &h, nullptr));
  res = epCommDestroy(c);
  if (res == epSuccess) {
    assert_ok(epHandleDestroy(h));  // SIGSEGV here if it reads the freed comm
  } else {
    assert_int_equal(res, epInvalidUsage);
    assert_contains(epGetLastError(nullptr), "handle");
    assert_ok(epHandleDestroy(h));
    assert_ok(epCommDestroy(c));
  }
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(comm_queries_of_one_rank),
      cmocka_unit_test(layout_of_one_rank),
      cmocka_unit_test(dispatch_combine_round_trip),
      cmocka_unit_test(dispatch_with_int32_ids_and_strided_rows),
      cmocka_unit_test(prepare_then_recv_count_then_dispatch),
      cmocka_unit_test(cached_redispatch_moves_new_x),
      cmocka_unit_test(dispatch_zero_tokens),
      cmocka_unit_test(unused_rows_are_marked_with_and_without_no_host_sync),
      cmocka_unit_test(combine_with_prepared_only_handle_is_invalid_usage),
      cmocka_unit_test(handle_of_another_comm_is_rejected),
      cmocka_unit_test(null_and_dead_handles_are_rejected),
      cmocka_unit_test(dispatch_args_header_is_checked),
      cmocka_unit_test(combine_and_layout_args_header_is_checked),
      cmocka_unit_test(num_tokens_above_max_is_rejected),
      cmocka_unit_test(expert_out_of_range_names_position),
      cmocka_unit_test(recv_capacity_too_small_keeps_comm_usable),
      cmocka_unit_test(dispatch_field_checks_name_the_field),
      cmocka_unit_test(combine_field_checks_name_the_field),
      cmocka_unit_test(plan_report_errors_are_kept_on_the_comm),
      cmocka_unit_test(comm_stays_usable_after_argument_errors),
      cmocka_unit_test(node_limited_bound_counts_distinct_nodes),
      cmocka_unit_test(abort_on_idle_comm_succeeds),
      cmocka_unit_test(handle_destroy_after_comm_destroy_does_not_read_freed_comm),
  };
  return cmocka_run_group_tests_name("handles", tests, groupSetup, groupTeardown);
}
