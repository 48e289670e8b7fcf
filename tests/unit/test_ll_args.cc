// The argument checks of the low-latency calls (epLowLatencyDispatch,
// epLowLatencyCombine, epLowLatencyComplete) on a one-rank host communicator
// made with config.low_latency = 1: every bad argument returns a result whose
// message names it, before anything is sent, and leaves no handle behind; a
// third dispatch with two uncombined is refused; a handle of one mode is
// refused by the calls of the other; the communicator stays usable afterwards.
//
// With one rank every (token, expert) pair lands here, so a valid call has a
// known answer: recv_count[e] = tokens that chose e, and with a BF16 wire and
// y = recv_x the combine gives sum_k w[t][k] * x[t].
#include <cmath>
#include <memory>
#include <thread>
#include <vector>

#include "comm.h"
#include "common.h"
#include "host/convert.h"

namespace {

constexpr int kExperts = 8, kHidden = 64, kMaxTokens = 16, kMaxTopk = 4;

epComm_t g_comm = nullptr;  // low_latency = 1, shared by the cases

epConfig_t llConfig(int hidden) {
  epConfig_t c = eptest::hostConfig(kExperts, hidden, kMaxTokens, kMaxTopk);
  c.low_latency = 1;
  return c;
}

epResult_t makeComm(epComm_t* comm, const epConfig_t& cfg) { return eptest::makeOneRankComm(comm, cfg); }

int groupSetup(void**) {
  eptest::unsetAllParams();
  epResult_t res = makeComm(&g_comm, llConfig(kHidden));
  if (res != epSuccess) {
    fprintf(stderr, "cannot create a 1-rank low-latency host communicator: %s: %s\n", epGetErrorString(res),
            epGetLastError(nullptr));
    return -1;
  }
  return 0;
}

int groupTeardown(void**) { return epCommDestroy(g_comm) == epSuccess ? 0 : -1; }

using eptest::Buf;

// One call's inputs and the output buffers of the low-latency layout.
struct Call {
  int T, K;
  Buf<uint16_t> x;
  std::vector<int64_t> idx;
  std::vector<float> w;
  Buf<uint16_t> recv_x{size_t(kExperts) * kMaxTokens * kHidden};  // room for a BF16 wire
  Buf<float> recv_scales{size_t(kExperts) * kMaxTokens * ((kHidden + 127) / 128)};
  Buf<int> recv_count{kExperts};
  Buf<int> recv_src{size_t(kExperts) * kMaxTokens};
  Buf<uint16_t> out;
  Call(uint64_t seed, int tokens, int topk)
      : T(tokens), K(topk), x(size_t(tokens) * kHidden), out(size_t(tokens) * kHidden) {
    eptest::Rng rng(seed);
    for (size_t i = 0; i < size_t(T) * kHidden; i++) x[i] = ep::floatToBf16(rng.real(-2.0f, 2.0f));
    idx.assign(size_t(T) * K, -1);
    w.resize(size_t(T) * K);
    for (int t = 0; t < T; t++) {
      for (int k = 0; k < K; k++) {
        w[size_t(t) * K + k] = rng.real(0.1f, 1.0f);
        // distinct experts per token: k-th choice from a rotation, some left out
        if (rng.uniform(0, 3) != 0) idx[size_t(t) * K + k] = (t + 3 * k) % kExperts;
      }
    }
  }
  epLowLatencyDispatchArgs_t dispatchArgs(epDataType_t wire) {
    epLowLatencyDispatchArgs_t a = EP_LL_DISPATCH_ARGS_INITIALIZER;
    a.x = x.data();
    a.topk_idx = idx.data();
    a.topk_idx_type = epInt64;
    a.topk_weights = w.data();
    a.num_tokens = T;
    a.num_topk = K;
    a.wire_type = wire;
    a.recv_x = recv_x.data();
    a.recv_scales = recv_scales.data();
    a.recv_count = recv_count.data();
    a.recv_src = recv_src.data();
    return a;
  }
  epLowLatencyCombineArgs_t combineArgs() {
    epLowLatencyCombineArgs_t c = EP_LL_COMBINE_ARGS_INITIALIZER;
    c.y = recv_x.data();
    c.out = out.data();
    return c;
  }
};

// With a BF16 wire and y = recv_x, out[t] = (sum of t's weights) * x[t], up to rounding.
void checkWeightedSums(const Call& call) {
  for (int t = 0; t < call.T; t++) {
    float wsum = 0.0f;
    for (int k = 0; k < call.K; k++)
      if (call.idx[size_t(t) * call.K + k] >= 0) wsum += call.w[size_t(t) * call.K + k];
    for (int j = 0; j < kHidden; j++) {
      const float want = wsum * ep::bf16ToFloat(call.x[size_t(t) * kHidden + j]);
      const float got = ep::bf16ToFloat(call.out[size_t(t) * kHidden + j]);
      if (std::fabs(got - want) > 1e-2f * (1.0f + std::fabs(want))) {
        print_error("out[%d][%d] = %g, expected %g\n", t, j, got, want);
        fail();
      }
    }
  }
}

// A BF16-wire dispatch + combine with y = recv_x: the counts and the weighted sums.
void checkRoundTrip(epComm_t comm, Call& call) {
  epLowLatencyDispatchArgs_t a = call.dispatchArgs(epBfloat16);
  epHandle_t h = nullptr;
  assert_ok(epLowLatencyDispatch(comm, &a, &h, nullptr));
  assert_non_null(h);
  for (int e = 0; e < kExperts; e++) {
    int pairs = 0;
    for (int64_t id : call.idx) pairs += id == e;
    assert_int_equal(call.recv_count[e], pairs);
  }
  epLowLatencyCombineArgs_t c = call.combineArgs();
  assert_ok(epLowLatencyCombine(comm, &c, h, nullptr));
  checkWeightedSums(call);
  assert_ok(epHandleDestroy(h));
}

// ---- Cases ------------------------------------------------------------------------------

void round_trip_of_one_rank(void**) {
  Call call(1, 12, 3);
  checkRoundTrip(g_comm, call);
}

void calls_need_a_low_latency_comm(void**) {
  epConfig_t cfg = llConfig(kHidden);
  cfg.low_latency = 0;
  epComm_t ht = nullptr;
  assert_ok(makeComm(&ht, cfg));
  Call call(2, 4, 2);
  epLowLatencyDispatchArgs_t a = call.dispatchArgs(epFloat8E4M3);
  epHandle_t h = nullptr;
  assert_result(epLowLatencyDispatch(ht, &a, &h, nullptr), epInvalidUsage);
  assert_contains(epGetLastError(ht), "config.low_latency = 0");
  assert_null(h);
  epLowLatencyCombineArgs_t c = call.combineArgs();
  assert_result(epLowLatencyCombine(ht, &c, nullptr, nullptr), epInvalidUsage);
  assert_contains(epGetLastError(ht), "epLowLatencyCombine");
  assert_result(epLowLatencyComplete(ht, nullptr, nullptr), epInvalidUsage);
  assert_contains(epGetLastError(ht), "config.low_latency = 0");
  assert_ok(epCommDestroy(ht));
}

void dispatch_args_header_is_checked(void**) {
  Call call(3, 4, 2);
  epHandle_t h = nullptr;
  assert_result(epLowLatencyDispatch(g_comm, nullptr, &h, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "args is NULL");
  epLowLatencyDispatchArgs_t a = call.dispatchArgs(epFloat8E4M3);
  a.magic = EP_LL_COMBINE_ARGS_MAGIC;
  assert_result(epLowLatencyDispatch(g_comm, &a, &h, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "EP_LL_DISPATCH_ARGS_INITIALIZER");
  a = call.dispatchArgs(epFloat8E4M3);
  a.size = offsetof(epLowLatencyDispatchArgs_t, recv_src);  // one field short of v1
  assert_result(epLowLatencyDispatch(g_comm, &a, &h, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "args.size");
  a = call.dispatchArgs(epFloat8E4M3);
  assert_result(epLowLatencyDispatch(g_comm, &a, nullptr, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "handle is NULL");
  assert_null(h);
}

void dispatch_field_checks_name_the_field(void**) {
  struct Bad {
    const char* needle;
    void (*mutate)(epLowLatencyDispatchArgs_t&, Call&);
  };
  const Bad cases[] = {
      {"args.flags = 0x4", [](epLowLatencyDispatchArgs_t& a, Call&) { a.flags = 0x4u; }},
      {"num_tokens = -1", [](epLowLatencyDispatchArgs_t& a, Call&) { a.num_tokens = -1; }},
      {"num_tokens = 17", [](epLowLatencyDispatchArgs_t& a, Call&) { a.num_tokens = kMaxTokens + 1; }},
      {"num_topk = 0", [](epLowLatencyDispatchArgs_t& a, Call&) { a.num_topk = 0; }},
      {"num_topk = 5", [](epLowLatencyDispatchArgs_t& a, Call&) { a.num_topk = kMaxTopk + 1; }},
      {"topk_idx_type", [](epLowLatencyDispatchArgs_t& a, Call&) { a.topk_idx_type = epFloat32; }},
      {"x or topk_idx is NULL", [](epLowLatencyDispatchArgs_t& a, Call&) { a.x = nullptr; }},
      {"x or topk_idx is NULL", [](epLowLatencyDispatchArgs_t& a, Call&) { a.topk_idx = nullptr; }},
      {"wire_type", [](epLowLatencyDispatchArgs_t& a, Call&) { a.wire_type = epFloat16; }},
      {"wire_type = 99 is not an epDataType_t value",
       [](epLowLatencyDispatchArgs_t& a, Call&) { const int v = 99; memcpy(&a.wire_type, &v, sizeof(v)); }},
      {"recv_x and recv_count are required", [](epLowLatencyDispatchArgs_t& a, Call&) { a.recv_x = nullptr; }},
      {"recv_x and recv_count are required",
       [](epLowLatencyDispatchArgs_t& a, Call&) { a.recv_count = nullptr; }},
      {"recv_scales is NULL with an FP8 wire",
       [](epLowLatencyDispatchArgs_t& a, Call&) { a.recv_scales = nullptr; }},
      {"16-byte aligned",
       [](epLowLatencyDispatchArgs_t& a, Call&) { a.x = static_cast<const char*>(a.x) + 2; }},
      {"16-byte aligned",
       [](epLowLatencyDispatchArgs_t& a, Call&) { a.recv_x = static_cast<char*>(a.recv_x) + 8; }},
      {"topk_idx[2][1]",
       [](epLowLatencyDispatchArgs_t&, Call& call) { call.idx[2 * size_t(call.K) + 1] = kExperts; }},
      {"topk_idx[3][0]", [](epLowLatencyDispatchArgs_t&, Call& call) { call.idx[3 * size_t(call.K)] = -2; }},
  };
  for (const Bad& bad : cases) {
    Call call(4, 6, 2);
    epLowLatencyDispatchArgs_t a = call.dispatchArgs(epFloat8E4M3);
    bad.mutate(a, call);
    epHandle_t h = nullptr;
    epResult_t res = epLowLatencyDispatch(g_comm, &a, &h, nullptr);
    if (res != epInvalidArgument) print_error("case \"%s\" returned %d\n", bad.needle, int(res));
    assert_int_equal(res, epInvalidArgument);
    assert_contains(epGetLastError(g_comm), bad.needle);
    assert_null(h);
  }
  // A BF16 wire needs no scales.
  Call call(5, 6, 2);
  epLowLatencyDispatchArgs_t a = call.dispatchArgs(epBfloat16);
  a.recv_scales = nullptr;
  epHandle_t h = nullptr;
  assert_ok(epLowLatencyDispatch(g_comm, &a, &h, nullptr));
  epLowLatencyCombineArgs_t c = call.combineArgs();
  assert_ok(epLowLatencyCombine(g_comm, &c, h, nullptr));
  assert_ok(epHandleDestroy(h));
}

// Two buffer sets: a third dispatch before either of two earlier ones is
// combined is refused (on GPUs it would wait for a set forever), and a handle
// destroyed without its combine keeps its set for good.
void third_uncombined_dispatch_is_refused(void**) {
  epComm_t comm = nullptr;
  assert_ok(makeComm(&comm, llConfig(kHidden)));
  Call call(11, 4, 2);
  epLowLatencyDispatchArgs_t a = call.dispatchArgs(epBfloat16);
  epLowLatencyCombineArgs_t c = call.combineArgs();
  epHandle_t h[4] = {nullptr, nullptr, nullptr, nullptr};
  assert_ok(epLowLatencyDispatch(comm, &a, &h[0], nullptr));
  assert_ok(epLowLatencyDispatch(comm, &a, &h[1], nullptr));
  assert_result(epLowLatencyDispatch(comm, &a, &h[2], nullptr), epInvalidUsage);
  assert_contains(epGetLastError(comm), "two before this one (the same buffer set) is not combined yet");
  assert_null(h[2]);
  assert_ok(epLowLatencyCombine(comm, &c, h[0], nullptr));
  assert_ok(epLowLatencyDispatch(comm, &a, &h[2], nullptr));  // h[0]'s set is free again
  assert_ok(epHandleDestroy(h[1]));                           // never combined: its set is lost
  assert_result(epLowLatencyDispatch(comm, &a, &h[3], nullptr), epInvalidUsage);
  assert_ok(epLowLatencyCombine(comm, &c, h[2], nullptr));
  // The next dispatch takes h[1]'s set, which is never released.
  assert_result(epLowLatencyDispatch(comm, &a, &h[3], nullptr), epInvalidUsage);
  assert_contains(epGetLastError(comm), "destroyed without its combine");
  assert_null(h[3]);
  for (epHandle_t x : {h[0], h[2]}) assert_ok(epHandleDestroy(x));
  assert_ok(epCommDestroy(comm));
}

// Pairs alternate between the sets by dispatch order, so a dispatch needs the
// pair two before it combined, even when a later one was combined first.
void combines_out_of_order_block_the_set(void**) {
  epComm_t comm = nullptr;
  assert_ok(makeComm(&comm, llConfig(kHidden)));
  Call call(12, 4, 2);
  epLowLatencyDispatchArgs_t a = call.dispatchArgs(epBfloat16);
  epLowLatencyCombineArgs_t c = call.combineArgs();
  epHandle_t h[3] = {nullptr, nullptr, nullptr};
  assert_ok(epLowLatencyDispatch(comm, &a, &h[0], nullptr));  // set 0
  assert_ok(epLowLatencyDispatch(comm, &a, &h[1], nullptr));  // set 1
  assert_ok(epLowLatencyCombine(comm, &c, h[1], nullptr));
  assert_result(epLowLatencyDispatch(comm, &a, &h[2], nullptr), epInvalidUsage);  // set 0: h[0] owes
  assert_contains(epGetLastError(comm), "two before this one");
  assert_ok(epLowLatencyCombine(comm, &c, h[0], nullptr));
  assert_ok(epLowLatencyDispatch(comm, &a, &h[2], nullptr));
  assert_ok(epLowLatencyCombine(comm, &c, h[2], nullptr));
  for (epHandle_t x : h) assert_ok(epHandleDestroy(x));
  assert_ok(epCommDestroy(comm));
}

// A send-only combine owes its receive half (epLowLatencyComplete) before the
// combine of the pair two later, which reuses its buffer set: on GPUs that
// combine would wait for it. Refused until it is completed; for good once its
// handle was destroyed without it.
void send_only_combine_is_completed_before_its_set_returns(void**) {
  epComm_t comm = nullptr;
  assert_ok(makeComm(&comm, llConfig(kHidden)));
  Call call(13, 4, 2);
  epLowLatencyDispatchArgs_t a = call.dispatchArgs(epBfloat16);
  epLowLatencyCombineArgs_t c = call.combineArgs(), send = c;
  send.flags = EP_LL_SEND_ONLY;
  epHandle_t h[6] = {};
  assert_ok(epLowLatencyDispatch(comm, &a, &h[0], nullptr));   // set 0
  assert_ok(epLowLatencyCombine(comm, &send, h[0], nullptr));
  assert_ok(epLowLatencyDispatch(comm, &a, &h[1], nullptr));   // set 1
  assert_ok(epLowLatencyCombine(comm, &c, h[1], nullptr));
  assert_ok(epLowLatencyDispatch(comm, &a, &h[2], nullptr));   // set 0 again
  assert_result(epLowLatencyCombine(comm, &c, h[2], nullptr), epInvalidUsage);
  assert_contains(epGetLastError(comm), "call epLowLatencyComplete on it first");
  assert_ok(epLowLatencyComplete(comm, h[0], nullptr));
  assert_ok(epLowLatencyCombine(comm, &c, h[2], nullptr));
  checkWeightedSums(call);
  assert_ok(epLowLatencyDispatch(comm, &a, &h[3], nullptr));   // set 1
  assert_ok(epLowLatencyCombine(comm, &send, h[3], nullptr));
  assert_ok(epHandleDestroy(h[3]));                            // its receive half never runs
  assert_ok(epLowLatencyDispatch(comm, &a, &h[4], nullptr));   // set 0
  assert_ok(epLowLatencyCombine(comm, &c, h[4], nullptr));
  assert_ok(epLowLatencyDispatch(comm, &a, &h[5], nullptr));   // set 1: its dispatch may go on
  assert_result(epLowLatencyCombine(comm, &c, h[5], nullptr), epInvalidUsage);
  assert_contains(epGetLastError(comm), "make a new communicator");
  for (epHandle_t x : {h[0], h[1], h[2], h[4], h[5]}) assert_ok(epHandleDestroy(x));
  assert_ok(epCommDestroy(comm));
}

// hidden = 8: a BF16 row is 16 bytes (the communicator is valid) but an FP8
// row is 8, which the copy kernels cannot move.
void fp8_wire_needs_rows_of_16_bytes(void**) {
  epComm_t comm = nullptr;
  assert_ok(makeComm(&comm, llConfig(8)));
  Buf<uint16_t> x(4 * 8);
  std::vector<int64_t> idx = {0, 1, 2, 3};
  Buf<uint8_t> recv_x(size_t(kExperts) * kMaxTokens * 16);
  Buf<float> scales(size_t(kExperts) * kMaxTokens);
  Buf<int> count(kExperts);
  epLowLatencyDispatchArgs_t a = EP_LL_DISPATCH_ARGS_INITIALIZER;
  a.x = x.data();
  a.topk_idx = idx.data();
  a.num_tokens = 4;
  a.num_topk = 1;
  a.recv_x = recv_x.data();
  a.recv_scales = scales.data();
  a.recv_count = count.data();
  epHandle_t h = nullptr;
  assert_result(epLowLatencyDispatch(comm, &a, &h, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(comm), "not a multiple of 16");
  assert_null(h);
  a.wire_type = epBfloat16;
  assert_ok(epLowLatencyDispatch(comm, &a, &h, nullptr));
  assert_ok(epHandleDestroy(h));
  assert_ok(epCommDestroy(comm));
}

void combine_checks_name_the_problem(void**) {
  Call call(6, 8, 3);
  epLowLatencyDispatchArgs_t a = call.dispatchArgs(epBfloat16);
  epHandle_t h = nullptr;
  assert_ok(epLowLatencyDispatch(g_comm, &a, &h, nullptr));
  epLowLatencyCombineArgs_t c = call.combineArgs();
  assert_result(epLowLatencyCombine(g_comm, nullptr, h, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "args is NULL");
  c.magic = EP_LL_DISPATCH_ARGS_MAGIC;
  assert_result(epLowLatencyCombine(g_comm, &c, h, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "EP_LL_COMBINE_ARGS_INITIALIZER");
  c = call.combineArgs();
  assert_result(epLowLatencyCombine(g_comm, &c, nullptr, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "handle is NULL");
  c.flags = 0x2u;
  assert_result(epLowLatencyCombine(g_comm, &c, h, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "args.flags = 0x2");
  c = call.combineArgs();
  c.y = nullptr;
  assert_result(epLowLatencyCombine(g_comm, &c, h, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "y is NULL");
  c = call.combineArgs();
  c.out = nullptr;
  assert_result(epLowLatencyCombine(g_comm, &c, h, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "out is NULL with 8 tokens");
  c = call.combineArgs();
  c.out = reinterpret_cast<char*>(c.out) + 4;
  assert_result(epLowLatencyCombine(g_comm, &c, h, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "16-byte aligned");
  // None of the above used the handle up: the valid combine still runs, once.
  c = call.combineArgs();
  assert_ok(epLowLatencyCombine(g_comm, &c, h, nullptr));
  assert_result(epLowLatencyCombine(g_comm, &c, h, nullptr), epInvalidUsage);
  assert_contains(epGetLastError(g_comm), "already combined");
  assert_ok(epHandleDestroy(h));
}

void split_calls_are_checked(void**) {
  Call call(7, 8, 2);
  epLowLatencyDispatchArgs_t a = call.dispatchArgs(epFloat8E4M3);
  a.flags = EP_LL_SEND_ONLY;
  epHandle_t h = nullptr;
  assert_ok(epLowLatencyDispatch(g_comm, &a, &h, nullptr));
  epLowLatencyCombineArgs_t c = call.combineArgs();
  assert_result(epLowLatencyCombine(g_comm, &c, h, nullptr), epInvalidUsage);
  assert_contains(epGetLastError(g_comm), "epLowLatencyComplete");
  assert_ok(epLowLatencyComplete(g_comm, h, nullptr));
  assert_result(epLowLatencyComplete(g_comm, h, nullptr), epInvalidUsage);
  assert_contains(epGetLastError(g_comm), "no send-only call to finish");
  assert_result(epLowLatencyComplete(g_comm, nullptr, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "handle is NULL");
  c.flags = EP_LL_SEND_ONLY;
  assert_ok(epLowLatencyCombine(g_comm, &c, h, nullptr));
  assert_ok(epLowLatencyComplete(g_comm, h, nullptr));
  assert_ok(epHandleDestroy(h));
}

// A handle of one mode is refused by the calls of the other, with a message
// that names the right call.
void handles_do_not_cross_modes(void**) {
  Call call(8, 6, 2);
  epLowLatencyDispatchArgs_t a = call.dispatchArgs(epBfloat16);
  epHandle_t ll = nullptr;
  assert_ok(epLowLatencyDispatch(g_comm, &a, &ll, nullptr));

  epCombineArgs_t hc = EP_COMBINE_ARGS_INITIALIZER;
  hc.y = call.recv_x.data();
  hc.out = call.out.data();
  assert_result(epCombine(g_comm, &hc, ll, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "epLowLatencyDispatch");
  epDispatchArgs_t hd = EP_DISPATCH_ARGS_INITIALIZER;
  hd.x = call.x.data();
  hd.num_tokens = call.T;
  hd.recv_x = call.recv_x.data();
  hd.recv_capacity = kMaxTokens;
  epHandle_t reuse = ll;
  assert_result(epDispatch(g_comm, &hd, &reuse, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "epLowLatencyDispatch");
  int64_t n = -1;
  assert_result(epHandleRecvCount(ll, &n), epInvalidArgument);
  assert_contains(epGetLastError(nullptr), "recv_count");

  // The handle is still good for its own combine.
  epLowLatencyCombineArgs_t c = call.combineArgs();
  assert_ok(epLowLatencyCombine(g_comm, &c, ll, nullptr));
  assert_ok(epHandleDestroy(ll));

  // An epDispatch handle (on this communicator, which also does high throughput).
  hd.topk_idx = call.idx.data();
  hd.topk_idx_type = epInt64;
  hd.num_topk = call.K;
  epHandle_t ht = nullptr;
  assert_ok(epDispatch(g_comm, &hd, &ht, nullptr));
  assert_result(epLowLatencyCombine(g_comm, &c, ht, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "comes from epDispatch");
  assert_result(epLowLatencyComplete(g_comm, ht, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "comes from epDispatch");
  assert_ok(epHandleDestroy(ht));
}

void comm_stays_usable_after_argument_errors(void**) {
  Call call(9, kMaxTokens, kMaxTopk);
  epLowLatencyDispatchArgs_t bad = call.dispatchArgs(epBfloat16);
  bad.num_tokens = 1000;
  epHandle_t h = nullptr;
  assert_result(epLowLatencyDispatch(g_comm, &bad, &h, nullptr), epInvalidArgument);
  assert_contains(epGetLastError(g_comm), "num_tokens = 1000");
  assert_contains(epGetLastError(nullptr), "num_tokens = 1000");
  checkRoundTrip(g_comm, call);
  Call none(10, 0, 1);  // a rank may send no tokens
  epLowLatencyDispatchArgs_t a = none.dispatchArgs(epFloat8E4M3);
  assert_ok(epLowLatencyDispatch(g_comm, &a, &h, nullptr));
  for (int e = 0; e < kExperts; e++) assert_int_equal(none.recv_count[e], 0);
  epLowLatencyCombineArgs_t c = none.combineArgs();
  c.out = nullptr;  // no tokens: no output
  assert_ok(epLowLatencyCombine(g_comm, &c, h, nullptr));
  assert_ok(epHandleDestroy(h));
}

// Two ranks (threads of this process): ranks may pass different num_topk (up
// to config.max_topk), and a wire type that differs between ranks is an error
// on the ranks that receive the other's rows, after which the communicators
// still work.
void ranks_with_different_topk_and_wire_types(void**) {
  epComm_t comms[2] = {nullptr, nullptr};
  epConfig_t cfg = llConfig(kHidden);
  assert_ok(epCommInitAll(comms, 2, nullptr, &cfg));
  const int L = kExperts / 2;
  // Rank 0 with K = 2, rank 1 with K = 4; every token picks an expert of each rank.
  Call calls[2] = {Call(21, 6, 2), Call(22, 5, 4)};
  for (int r = 0; r < 2; r++)
    for (int t = 0; t < calls[r].T; t++)
      for (int k = 0; k < calls[r].K; k++)
        calls[r].idx[size_t(t) * calls[r].K + k] = k % 2 == 0 ? (t + k / 2) % L : L + (t + k / 2) % L;
  auto both = [&](auto&& body) {
    std::thread other([&] { body(1); });
    body(0);
    other.join();
  };
  epResult_t res[2];
  epHandle_t h[2] = {nullptr, nullptr};
  both([&](int r) {
    epLowLatencyDispatchArgs_t a = calls[r].dispatchArgs(epBfloat16);
    res[r] = epLowLatencyDispatch(comms[r], &a, &h[r], nullptr);
  });
  assert_ok(res[0]);
  assert_ok(res[1]);
  for (int r = 0; r < 2; r++)
    for (int e = 0; e < L; e++) {
      int pairs = 0;
      for (const Call& c : calls)
        for (int64_t id : c.idx) pairs += id == r * L + e;
      assert_int_equal(calls[r].recv_count[e], pairs);
    }
  both([&](int r) {
    epLowLatencyCombineArgs_t c = calls[r].combineArgs();
    res[r] = epLowLatencyCombine(comms[r], &c, h[r], nullptr);
  });
  assert_ok(res[0]);
  assert_ok(res[1]);
  for (const Call& call : calls) checkWeightedSums(call);
  for (epHandle_t x : h) assert_ok(epHandleDestroy(x));

  // Rank 0 asks for FP8, rank 1 for BF16: both receive rows of the other type.
  both([&](int r) {
    epLowLatencyDispatchArgs_t a = calls[r].dispatchArgs(r == 0 ? epFloat8E4M3 : epBfloat16);
    epHandle_t x = nullptr;
    res[r] = epLowLatencyDispatch(comms[r], &a, &x, nullptr);
    if (x != nullptr) epHandleDestroy(x);
  });
  for (int r = 0; r < 2; r++) {
    assert_int_equal(res[r], epInvalidUsage);
    assert_contains(epGetLastError(comms[r]), "wire_type must be the same on every rank");
  }
  // Still in step: a matching call works.
  both([&](int r) {
    epLowLatencyDispatchArgs_t a = calls[r].dispatchArgs(epFloat8E4M3);
    epHandle_t x = nullptr;
    res[r] = epLowLatencyDispatch(comms[r], &a, &x, nullptr);
    if (res[r] == epSuccess) {
      epLowLatencyCombineArgs_t c = calls[r].combineArgs();
      res[r] = epLowLatencyCombine(comms[r], &c, x, nullptr);
    }
    epHandleDestroy(x);
  });
  assert_ok(res[0]);
  assert_ok(res[1]);
  for (epComm_t c : comms) assert_ok(epCommDestroy(c));
}

// An expert listed more than once in a token's top-k receives the token once
// (an expert has room for one row per (source, token): counting each entry
// would run past it); the combine applies every entry's weight to that row.
void repeated_experts_reach_the_expert_once(void**) {
  Call call(41, kMaxTokens, kMaxTopk);
  for (int t = 0; t < call.T; t++)  // even tokens: expert 5 four times; odd: 5, 5, 2, none
    for (int k = 0; k < call.K; k++)
      call.idx[size_t(t) * call.K + k] = t % 2 == 0 ? 5 : k < 2 ? 5 : k == 2 ? 2 : -1;
  epLowLatencyDispatchArgs_t a = call.dispatchArgs(epBfloat16);
  epHandle_t h = nullptr;
  assert_ok(epLowLatencyDispatch(g_comm, &a, &h, nullptr));
  for (int e = 0; e < kExperts; e++)
    assert_int_equal(call.recv_count[e], e == 5 ? kMaxTokens : e == 2 ? kMaxTokens / 2 : 0);
  for (int t = 0; t < kMaxTokens; t++) assert_int_equal(call.recv_src[size_t(5) * kMaxTokens + t], t);
  epLowLatencyCombineArgs_t c = call.combineArgs();
  assert_ok(epLowLatencyCombine(g_comm, &c, h, nullptr));
  checkWeightedSums(call);
  assert_ok(epHandleDestroy(h));
}

// A rank in a low-latency call and a peer in a high-throughput one (the same
// call number) are out of step: both are told so at the count exchange, and
// neither reads the other's records as its own.
void a_peer_in_the_other_mode_is_reported(void**) {
  epComm_t comms[2] = {nullptr, nullptr};
  epConfig_t cfg = llConfig(kHidden);
  assert_ok(epCommInitAll(comms, 2, nullptr, &cfg));
  Call ll(51, 4, 2), ht(52, 4, 2);
  epResult_t res[2];
  std::thread other([&] {
    epLowLatencyDispatchArgs_t a = ll.dispatchArgs(epBfloat16);
    epHandle_t h = nullptr;
    res[0] = epLowLatencyDispatch(comms[0], &a, &h, nullptr);
    if (h != nullptr) epHandleDestroy(h);
  });
  std::vector<int64_t> recv_idx(size_t(2) * kMaxTokens * ht.K);
  epDispatchArgs_t d = EP_DISPATCH_ARGS_INITIALIZER;
  d.x = ht.x.data();
  d.x_type = epBfloat16;
  d.topk_idx = ht.idx.data();
  d.topk_idx_type = epInt64;
  d.num_tokens = ht.T;
  d.num_topk = ht.K;
  d.recv_x = ht.recv_x.data();
  d.recv_topk_idx = recv_idx.data();
  d.recv_capacity = 2 * kMaxTokens;
  d.flags = EP_DISPATCH_NO_HOST_SYNC;
  int64_t num_recv = 0;
  d.num_recv = &num_recv;
  epHandle_t h = nullptr;
  res[1] = epDispatch(comms[1], &d, &h, nullptr);
  other.join();
  if (h != nullptr) epHandleDestroy(h);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(res[r], epInvalidUsage);
    assert_contains(epGetLastError(comms[r]), "ranks must issue the same collective calls in the same order");
  }
  assert_contains(epGetLastError(comms[0]), "sent counts data");
  assert_contains(epGetLastError(comms[1]), "sent low-latency counts data");
  for (epComm_t c : comms) epCommDestroy(c);
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(round_trip_of_one_rank),
      cmocka_unit_test(calls_need_a_low_latency_comm),
      cmocka_unit_test(dispatch_args_header_is_checked),
      cmocka_unit_test(dispatch_field_checks_name_the_field),
      cmocka_unit_test(fp8_wire_needs_rows_of_16_bytes),
      cmocka_unit_test(combine_checks_name_the_problem),
      cmocka_unit_test(split_calls_are_checked),
      cmocka_unit_test(third_uncombined_dispatch_is_refused),
      cmocka_unit_test(combines_out_of_order_block_the_set),
      cmocka_unit_test(send_only_combine_is_completed_before_its_set_returns),
      cmocka_unit_test(handles_do_not_cross_modes),
      cmocka_unit_test(comm_stays_usable_after_argument_errors),
      cmocka_unit_test(ranks_with_different_topk_and_wire_types),
      cmocka_unit_test(repeated_experts_reach_the_expert_once),
      cmocka_unit_test(a_peer_in_the_other_mode_is_reported),
  };
  return cmocka_run_group_tests_name("low-latency arguments", tests, groupSetup, groupTeardown);
}
