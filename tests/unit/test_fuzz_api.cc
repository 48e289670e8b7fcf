// Random arguments through the public API of host communicators: configs
// for epCommInitRank, then epLayout, epDispatchPrepare / epDispatch /
// epCombine and the low-latency calls with every scalar field drawn from
// values that are valid, at a bound, past it, negative or huge, and pointers
// either NULL or a buffer large enough for any valid reading. Each call must
// return (no crash, no hang: the test's timeout), an error must come with a
// message, a refused call must leave its buffers as they were, and after
// every 50 calls a valid layer must still run on the communicator. With
// --ranks R (threads of one process, each drawing the same arguments) no
// call may leave a rank waiting for another: the same arguments on every
// rank are refused by every rank or by none, so no timeout, no peer left,
// no calls out of step. Deterministic (seeded); tests/sanitize.sh runs it
// under the sanitizers too.
//   test_fuzz_api [--iters N] [--seed S] [--ranks R]
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common.h"

namespace {

constexpr int kExperts = 8, kHidden = 64, kMaxTokens = 16, kMaxTopk = 4;
// Room for any valid reading of a call on the communicator: tokens up to the
// bound, rows up to 4 bytes an element and twice apart, every received row.
constexpr size_t kBufBytes = 64 * 1024;
static_assert(kBufBytes >= size_t(kMaxTokens) * kExperts * kHidden * 4, "every received row, FP32");

thread_local std::mt19937_64 g_rng;  // seeded alike on every rank: the same draws
thread_local int g_rank = 0;
int g_nranks = 1;
std::atomic<int> g_failures{0};
thread_local std::map<std::string, std::pair<int, int>> g_calls;  // function: (calls, successes)

template <typename T>
T pick(std::initializer_list<T> values) {
  return values.begin()[g_rng() % values.size()];
}
bool coin(int one_in) { return g_rng() % unsigned(one_in) == 0; }
// Mostly `good` (a call with every field valid goes deep), else one of `odd`.
template <typename T>
T vary(T good, std::initializer_list<T> odd) {
  return coin(10) ? pick(odd) : good;
}

struct Buffers {
  std::vector<std::vector<unsigned char>> mem;
  void* get() {  // zeroed; aligned as malloc aligns (16 bytes), enough for every element type
    mem.emplace_back(kBufBytes, 0);
    return mem.back().data();
  }
  // NULL now and then with one rank. (With several, never: whether a NULL
  // output is refused depends on the rows a rank receives, so one rank may
  // refuse what its peers accept, and they wait for it, as documented.)
  void* maybe() { return g_nranks == 1 && coin(10) ? nullptr : get(); }
  // Still all zero: a refused call wrote nothing the caller passed.
  bool untouched() const {
    static const std::vector<unsigned char> zero(kBufBytes, 0);
    for (const auto& m : mem)
      if (memcmp(m.data(), zero.data(), kBufBytes) != 0) return false;
    return true;
  }
};

void report(const char* what, const std::string& detail) {
  fprintf(stderr, "FAIL rank %d %s: %s\n", g_rank, what, detail.c_str());
  g_failures++;
}

// An error needs a message; the call must not take long (nothing waits on one rank).
void checkResult(const char* fn, epResult_t res, epComm_t comm, std::chrono::steady_clock::time_point t0) {
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (secs > 5.0) report(fn, "took " + std::to_string(secs) + " s");
  g_calls[fn].first++;
  if (res == epSuccess) {
    g_calls[fn].second++;
    return;
  }
  const char* msg = epGetLastError(comm);
  if (msg == nullptr || msg[0] == '\0') {
    report(fn, std::string("result ") + epGetErrorString(res) + " without a message");
    return;
  }
  // Every rank drew the same arguments: a rank that waited for another, or
  // found it in another call, means that one refused what this one took.
  if (g_nranks > 1 && (res == epTimeout || res == epRemoteError || strstr(msg, "in the same order") != nullptr ||
                       strstr(msg, "out of step") != nullptr))
    report(fn, std::string("a rank was left waiting: ") + msg);
}

// An enum field set to an int, as a C caller may (a value outside the enum
// must not pass through the enum type here either: undefined behaviour).
template <typename E>
void setEnum(E& field, int value) {
  static_assert(sizeof(E) == sizeof(int), "the C ABI's enums are ints");
  memcpy(&field, &value, sizeof(value));
}
int anyType() { return pick<int>({0, 1, 2, 3, 4, 5, -1, 6, 1 << 30}); }
int typeOr(int good) { return coin(10) ? anyType() : good; }
// A count up to `bound`, sometimes past it, negative or huge.
int anyCount(int bound) {
  if (!coin(8)) return int(g_rng() % unsigned(bound + 1));
  return pick<int>({bound + 1, -1, -1000, 1 << 30, 0x7fffffff});
}

// Header: usually right, sometimes size / magic / version off.
template <typename Args>
void header(Args& a, unsigned magic, unsigned version) {
  a.size = coin(40) ? pick<size_t>({0, 8, sizeof(Args) - 4, sizeof(Args) + 64, size_t(1) << 40}) : sizeof(Args);
  a.magic = coin(40) ? pick<unsigned>({0u, magic ^ 1u, EP_CONFIG_MAGIC}) : magic;
  a.version = coin(40) ? pick<unsigned>({0u, version + 1, 1000u}) : version;
}

void fuzzConfigs(int iters) {
  for (int i = 0; i < iters; i++) {
    epConfig_t c = EP_CONFIG_INITIALIZER;
    if (coin(15)) c.size = pick<size_t>({0, 16, sizeof(c) - 8, sizeof(c) + 8});
    if (coin(15)) c.magic = 0;
    if (coin(15)) c.version = pick<unsigned>({0u, 2u, 0xffffffffu});
    c.num_experts = vary<int>(pick<int>({1, 8, 288}), {0, -1, 1 << 20, (1 << 20) + 1, 0x7fffffff});
    c.hidden = vary<int>(pick<int>({8, 16, 64, 7168, 2056}), {0, 1, 24, -8, 262144, 262160, 0x7ffffff0});
    c.max_tokens_per_rank = vary<int>(pick<int>({1, 16, 128}), {0, -1, 1 << 20, 0x7fffffff});
    c.max_topk = vary<int>(pick<int>({1, 4, 32}), {0, 33, -1});
    setEnum(c.dispatch_type, typeOr(pick<int>({epBfloat16, epFloat8E4M3, epFloat32})));
    setEnum(c.combine_type, typeOr(pick<int>({epBfloat16, epFloat16})));
    setEnum(c.backend, vary<int>(epBackendHost, {epBackendAuto, epBackendCuda, 3, -1}));
    c.device = vary<int>(-1, {0, 7, -5});
    c.buffer_bytes_cap = vary<size_t>(0, {1, 4096, size_t(1) << 20, ~size_t(0)});
    c.timeout_ms = vary<int>(pick<int>({0, 1000}), {1, -1, 0x7fffffff});
    c.num_sms = vary<int>(0, {1, 32, -1, 100000});
    c.max_nodes_per_token = vary<int>(0, {1, 2, -1, 1 << 20});
    c.low_latency = vary<int>(pick<int>({0, 1}), {2, -1});
    c.ib_sl_throughput = vary<int>(-1, {0, 15, 16, -2});
    c.ib_traffic_class = vary<int>(-1, {0, 255, 256});
    c.ib_gid_index = vary<int>(-1, {0, 255, 256});
    c.ib_qps_per_peer = vary<int>(-1, {1, 16, 17, 0});
    c.ib_ar_control = vary<int>(-1, {0, 1, 2});
    epUniqueId id;
    if (epGetUniqueId(&id) != epSuccess) {
      report("epGetUniqueId", epGetLastError(nullptr));
      return;
    }
    epComm_t comm = nullptr;
    const auto t0 = std::chrono::steady_clock::now();
    const epResult_t res = epCommInitRank(&comm, 1, id, 0, &c);
    const int before = g_failures;
    checkResult("epCommInitRank", res, nullptr, t0);
    if (g_failures != before)  // the inputs, so that a failure can be replayed
      fprintf(stderr,
              "  config: size %zu version %u experts %d hidden %d tokens %d topk %d types %d/%d backend %d "
              "cap %zu timeout %d low_latency %d -> %s\n",
              c.size, c.version, c.num_experts, c.hidden, c.max_tokens_per_rank, c.max_topk, int(c.dispatch_type),
              int(c.combine_type), int(c.backend), c.buffer_bytes_cap, c.timeout_ms, c.low_latency,
              epGetErrorString(res));
    if (res == epSuccess) {
      size_t bytes = 0;
      if (epCommBufferBytes(comm, &bytes) != epSuccess) report("epCommBufferBytes", epGetLastError(comm));
      if (epCommDestroy(comm) != epSuccess) report("epCommDestroy", epGetLastError(comm));
    } else if (comm != nullptr) {
      report("epCommInitRank", "an error left a communicator");
    }
    size_t ll = 0;
    const auto t1 = std::chrono::steady_clock::now();
    checkResult("epLowLatencyBufferBytes", epLowLatencyBufferBytes(coin(20) ? nullptr : &c, vary<int>(pick<int>({1, 2, 8}), {0, -1, 1 << 30}), &ll),
                nullptr, t1);
  }
}

// Token t chooses experts (t + k) % E, k < K, weights 1: a layer whose rows and
// counts are known.
struct ValidLayer {
  int T = 5, K = 2;
  std::vector<int64_t> idx;
  std::vector<uint16_t> x;  // BF16
  std::vector<float> w;
  ValidLayer() : idx(size_t(T) * K), x(size_t(T) * kHidden), w(size_t(T) * K, 1.0f) {
    for (int t = 0; t < T; t++) {
      for (int k = 0; k < K; k++) idx[size_t(t) * K + k] = (t + k) % kExperts;
      for (int h = 0; h < kHidden; h++) x[size_t(t) * kHidden + h] = uint16_t(0x3f80 + t);  // 1.0 + t ulp
    }
  }
};

// One valid high-throughput and one valid low-latency layer: the
// communicator must still serve them after whatever came before.
void checkStillUsable(epComm_t comm) {
  ValidLayer v;
  std::vector<uint16_t> recv_x(size_t(kMaxTokens) * kHidden * kExperts);
  std::vector<int64_t> recv_idx(size_t(kMaxTokens) * kExperts * v.K);
  int64_t num_recv = -1;
  epDispatchArgs_t d = EP_DISPATCH_ARGS_INITIALIZER;
  d.x = v.x.data();
  d.topk_idx = v.idx.data();
  d.num_tokens = v.T;
  d.num_topk = v.K;
  d.recv_x = recv_x.data();
  d.recv_topk_idx = recv_idx.data();
  d.recv_capacity = int64_t(kMaxTokens) * kExperts;
  d.num_recv = &num_recv;
  epHandle_t h = nullptr;
  if (epDispatch(comm, &d, &h, nullptr) != epSuccess) {
    report("valid epDispatch", epGetLastError(comm));
    return;
  }
  // (Values with one rank only: there every row comes back as it left.)
  if (g_nranks == 1 && (num_recv != v.T || memcmp(recv_x.data(), v.x.data(), v.x.size() * 2) != 0))
    report("valid epDispatch", "rows or count differ (num_recv " + std::to_string(num_recv) + ")");
  std::vector<uint16_t> out(size_t(v.T) * kHidden);
  epCombineArgs_t cb = EP_COMBINE_ARGS_INITIALIZER;
  cb.y = recv_x.data();
  cb.out = out.data();
  if (epCombine(comm, &cb, h, nullptr) != epSuccess) report("valid epCombine", epGetLastError(comm));
  // One rank, one received row per token: the combine gives the row back.
  else if (g_nranks == 1 && memcmp(out.data(), v.x.data(), v.x.size() * 2) != 0)
    report("valid epCombine", "output differs");
  epHandleDestroy(h);

  std::vector<uint16_t> ll_x(size_t(kExperts) * kMaxTokens * kHidden);
  std::vector<int> count(kExperts), src(size_t(kExperts) * kMaxTokens);
  epLowLatencyDispatchArgs_t ld = EP_LL_DISPATCH_ARGS_INITIALIZER;
  ld.x = v.x.data();
  ld.topk_idx = v.idx.data();
  ld.topk_weights = v.w.data();
  ld.num_tokens = v.T;
  ld.num_topk = v.K;
  ld.wire_type = epBfloat16;
  ld.recv_x = ll_x.data();
  ld.recv_count = count.data();
  ld.recv_src = src.data();
  epHandle_t lh = nullptr;
  if (epLowLatencyDispatch(comm, &ld, &lh, nullptr) != epSuccess) {
    report("valid epLowLatencyDispatch", epGetLastError(comm));
    return;
  }
  // Every rank sent the same tokens: a local expert's count is the ranks
  // times the tokens of one rank that chose it.
  int first = 0, local = 0;
  epCommLocalExperts(comm, &first, &local);
  for (int le = 0; le < local; le++) {
    int want = 0;
    for (int64_t id : v.idx) want += id == first + le;
    if (count[le] != want * g_nranks) report("valid epLowLatencyDispatch", "recv_count of expert " + std::to_string(le));
  }
  epLowLatencyCombineArgs_t lc = EP_LL_COMBINE_ARGS_INITIALIZER;
  lc.y = ll_x.data();
  lc.out = out.data();
  if (epLowLatencyCombine(comm, &lc, lh, nullptr) != epSuccess) report("valid epLowLatencyCombine", epGetLastError(comm));
  epHandleDestroy(lh);
}

void fuzzCalls(epComm_t comm, int iters) {
  // Inputs that hold valid ids, so that a call with sane sizes goes deep.
  std::vector<int64_t> ids(kBufBytes / 8);
  for (size_t i = 0; i < ids.size(); i++) ids[i] = int64_t(i % (kExperts + 1)) - 1;
  std::vector<epHandle_t> handles;
  for (int i = 0; i < iters; i++) {
    Buffers b;
    const void* idx = coin(10) ? nullptr : static_cast<const void*>(ids.data());
    epResult_t res;
    const auto t0 = std::chrono::steady_clock::now();
    const char* fn = "";
    switch (g_rng() % 5) {
      case 0: {
        fn = "epLayout";
        epLayoutArgs_t a = EP_LAYOUT_ARGS_INITIALIZER;
        header(a, EP_LAYOUT_ARGS_MAGIC, EP_LAYOUT_ARGS_VERSION);
        a.topk_idx = idx;
        setEnum(a.topk_idx_type, vary<int>(epInt64, {epInt32, epBfloat16}));
        a.num_tokens = anyCount(kMaxTokens);
        a.num_topk = anyCount(kMaxTopk);
        a.tokens_per_rank = static_cast<int*>(b.maybe());
        a.tokens_per_node = static_cast<int*>(b.maybe());
        a.tokens_per_expert = static_cast<int*>(b.maybe());
        a.is_token_in_rank = static_cast<uint8_t*>(b.maybe());
        res = epLayout(comm, coin(20) ? nullptr : &a, nullptr);
        break;
      }
      case 1:
      case 2: {
        const bool prepare = coin(3);
        fn = prepare ? "epDispatchPrepare" : "epDispatch";
        epDispatchArgs_t a = EP_DISPATCH_ARGS_INITIALIZER;
        header(a, EP_DISPATCH_ARGS_MAGIC, EP_DISPATCH_ARGS_VERSION);
        a.flags = vary<unsigned>(pick<unsigned>({0u, EP_DISPATCH_NO_HOST_SYNC}), {0x80u});
        a.x = b.maybe();
        setEnum(a.x_type, typeOr(epBfloat16));
        a.x_stride = vary<size_t>(pick<size_t>({0, kHidden * 2, kHidden * 2 + 16, kHidden * 4}), {kHidden * 2 - 16, 7});
        a.x_scales = coin(2) ? nullptr : static_cast<const float*>(b.get());
        a.topk_idx = idx;
        setEnum(a.topk_idx_type, vary<int>(epInt64, {epInt32, epFloat32}));
        a.topk_weights = static_cast<const float*>(b.maybe());
        a.num_tokens = anyCount(kMaxTokens);
        a.num_topk = anyCount(kMaxTopk);
        a.expert_alignment = vary<int>(pick<int>({0, 1, 4}), {-1, 1 << 30});
        a.recv_x = b.maybe();
        a.recv_scales = coin(2) ? nullptr : static_cast<float*>(b.get());
        a.recv_topk_idx = static_cast<int64_t*>(b.maybe());
        a.recv_topk_weights = static_cast<float*>(b.maybe());
        // With several ranks only capacities that hold every row a rank can
        // receive (or that every rank refuses): one too small for the rows
        // of one rank only is refused by that rank alone, as documented, and
        // the ranks' next calls would then differ.
        if (g_nranks == 1)
          a.recv_capacity = vary<int64_t>(pick<int64_t>({kMaxTokens, int64_t(kMaxTokens) * kExperts}), {0, 1, -1, INT64_MIN});
        else
          a.recv_capacity = vary<int64_t>(int64_t(kMaxTokens) * g_nranks, {-1, INT64_MIN});
        a.recv_tokens_per_expert = static_cast<int*>(b.maybe());
        a.num_recv = static_cast<int64_t*>(b.maybe());
        epHandle_t h = nullptr;
        // A cached re-dispatch of an earlier handle now and then.
        if (!handles.empty() && coin(3)) h = handles[g_rng() % handles.size()];
        // (epDispatchPrepare makes a new handle whatever *handle held.)
        const epHandle_t before = h;
        epDispatchArgs_t* ap = coin(20) ? nullptr : &a;
        res = prepare ? epDispatchPrepare(comm, ap, coin(20) ? nullptr : &h, nullptr)
                      : epDispatch(comm, ap, coin(20) ? nullptr : &h, nullptr);
        if (res == epSuccess && h != nullptr && h != before) handles.push_back(h);
        break;
      }
      case 3: {
        fn = "epCombine";
        epCombineArgs_t a = EP_COMBINE_ARGS_INITIALIZER;
        header(a, EP_COMBINE_ARGS_MAGIC, EP_COMBINE_ARGS_VERSION);
        a.flags = vary<unsigned>(pick<unsigned>({0u, EP_COMBINE_DETERMINISTIC}), {0x40u});
        a.y = b.maybe();
        setEnum(a.y_type, typeOr(epBfloat16));
        a.y_stride = vary<size_t>(pick<size_t>({0, kHidden * 2, kHidden * 2 + 16}), {3});
        a.recv_topk_weights = static_cast<const float*>(b.maybe());
        a.num_topk = anyCount(kMaxTopk);
        a.bias = coin(2) ? nullptr : b.get();
        a.out = b.maybe();
        a.out_topk_weights = coin(2) ? nullptr : static_cast<float*>(b.get());
        epHandle_t h = handles.empty() || coin(6) ? nullptr : handles[g_rng() % handles.size()];
        res = epCombine(comm, coin(20) ? nullptr : &a, h, nullptr);
        break;
      }
      default: {
        fn = "epLowLatencyDispatch";
        epLowLatencyDispatchArgs_t a = EP_LL_DISPATCH_ARGS_INITIALIZER;
        header(a, EP_LL_DISPATCH_ARGS_MAGIC, EP_LL_DISPATCH_ARGS_VERSION);
        a.flags = vary<unsigned>(pick<unsigned>({0u, EP_LL_SEND_ONLY, EP_LL_ROUND_SCALE_POW2}), {0x10u});
        a.x = b.maybe();
        a.topk_idx = idx;
        setEnum(a.topk_idx_type, vary<int>(epInt64, {epInt32, epFloat8E4M3}));
        a.topk_weights = static_cast<const float*>(b.maybe());
        a.num_tokens = anyCount(kMaxTokens);
        a.num_topk = anyCount(kMaxTopk);
        setEnum(a.wire_type, vary<int>(pick<int>({epFloat8E4M3, epBfloat16}), {epFloat32, epInt64}));
        a.recv_x = b.maybe();
        a.recv_scales = static_cast<float*>(b.maybe());
        a.recv_count = static_cast<int*>(b.maybe());
        a.recv_src = static_cast<int*>(b.maybe());
        epHandle_t h = nullptr;
        res = epLowLatencyDispatch(comm, coin(20) ? nullptr : &a, coin(20) ? nullptr : &h, nullptr);
        if (res == epSuccess) {  // its completion and combine, with fuzzed args too
          checkResult(fn, res, comm, t0);
          bool completed = (a.flags & EP_LL_SEND_ONLY) == 0;
          if (!completed && !coin(5)) {
            res = epLowLatencyComplete(comm, h, nullptr);
            checkResult("epLowLatencyComplete", res, comm, t0);
            completed = res == epSuccess;
          }
          fn = "epLowLatencyCombine";
          epLowLatencyCombineArgs_t c = EP_LL_COMBINE_ARGS_INITIALIZER;
          header(c, EP_LL_COMBINE_ARGS_MAGIC, EP_LL_COMBINE_ARGS_VERSION);
          c.flags = vary<unsigned>(pick<unsigned>({0u, EP_LL_SEND_ONLY}), {0x8u});
          c.y = b.maybe();
          c.out = b.maybe();
          res = epLowLatencyCombine(comm, &c, h, nullptr);
          checkResult(fn, res, comm, t0);
          if (res == epSuccess && (c.flags & EP_LL_SEND_ONLY) != 0) {
            res = epLowLatencyComplete(comm, h, nullptr);
            fn = "epLowLatencyComplete of a combine";
          } else if (res != epSuccess) {
            // An argument error leaves the communicator usable: the pair is
            // finished with valid arguments (a handle destroyed without its
            // combine would lose its buffer set for good, as documented).
            if (!completed && epLowLatencyComplete(comm, h, nullptr) != epSuccess)
              report("epLowLatencyComplete after a refused combine", epGetLastError(comm));
            epLowLatencyCombineArgs_t ok = EP_LL_COMBINE_ARGS_INITIALIZER;
            ok.y = b.get();
            ok.out = b.get();
            res = epLowLatencyCombine(comm, &ok, h, nullptr);
            fn = "valid epLowLatencyCombine after a refused one";
            if (res != epSuccess) report(fn, epGetLastError(comm));
          }
          epHandleDestroy(h);
        }
        break;
      }
    }
    checkResult(fn, res, comm, t0);
    // A call refused at once leaves every buffer as it was (zero). (Not after
    // a low-latency dispatch that succeeded: its outputs are written.)
    const bool after_ll_dispatch = strcmp(fn, "epLowLatencyDispatch") != 0 && strstr(fn, "epLowLatency") != nullptr;
    // (With several ranks, an error found in the exchange, such as calls
    // out of step, may come after outputs were written: argument errors only.)
    if (res != epSuccess && (g_nranks == 1 || res == epInvalidArgument) && !after_ll_dispatch && !b.untouched())
      report(fn, std::string("refused (") + epGetErrorString(res) + ") but wrote into a buffer it was given");
    if (handles.size() > 8) {
      epHandleDestroy(handles.front());
      handles.erase(handles.begin());
    }
    if (i % 50 == 49) {
      for (epHandle_t h : handles) epHandleDestroy(h);
      handles.clear();
      checkStillUsable(comm);
    }
  }
  for (epHandle_t h : handles) epHandleDestroy(h);
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 2000;
  unsigned long long seed = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--iters") == 0) iters = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--seed") == 0) seed = strtoull(argv[i + 1], nullptr, 0);
    else if (strcmp(argv[i], "--ranks") == 0) g_nranks = atoi(argv[i + 1]);
  }
  if (g_nranks < 1 || kExperts % g_nranks != 0) {
    fprintf(stderr, "test_fuzz_api: --ranks must divide %d\n", kExperts);
    return 2;
  }
  eptest::unsetAllParams();
  g_rng.seed(seed);
  // The first communicator of a process loads the topology and the transport
  // modules once; under the sanitizers' full unwinding at every allocation
  // that alone can pass the 5 s each fuzzed call is held to, so it is made
  // here, untimed.
  {
    epConfig_t warm = eptest::hostConfig(kExperts, kHidden, kMaxTokens, kMaxTopk);
    epComm_t comm = nullptr;
    if (epCommInitAll(&comm, 1, nullptr, &warm) != epSuccess) {
      fprintf(stderr, "FAIL: a first communicator: %s\n", epGetLastError(nullptr));
      return 1;
    }
    epCommDestroy(comm);
  }
  fuzzConfigs(iters / 10);
  epConfig_t c = eptest::hostConfig(kExperts, kHidden, kMaxTokens, kMaxTopk);
  c.low_latency = 1;
  // A rank left waiting shows at this timeout (each call's own limit is 5 s).
  if (g_nranks > 1) c.timeout_ms = 3000;
  std::vector<epComm_t> comms(size_t(g_nranks), nullptr);
  if (epCommInitAll(comms.data(), g_nranks, nullptr, &c) != epSuccess) {
    fprintf(stderr, "FAIL: the communicators of the calls: %s\n", epGetLastError(nullptr));
    return 1;
  }
  // One thread per rank, each drawing the same arguments (the same seed).
  auto rank = [&](int r) {
    g_rank = r;
    g_rng.seed(seed + 1);
    fuzzCalls(comms[size_t(r)], iters);
    checkStillUsable(comms[size_t(r)]);
    if (r == 0) {  // how deep the draws went: calls that all fail the first check would test little
      for (const auto& f : g_calls)
        printf("  %-45s %5d calls, %5d succeeded\n", f.first.c_str(), f.second.first, f.second.second);
    }
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < g_nranks; r++) threads.emplace_back(rank, r);
  for (std::thread& t : threads) t.join();
  for (epComm_t comm : comms)
    if (epCommDestroy(comm) != epSuccess) report("epCommDestroy", epGetLastError(comm));
  printf("test_fuzz_api: %d configs and %d calls on %d rank(s) (seed %llu): %d failures\n", iters / 10, iters,
         g_nranks, seed, g_failures.load());
  return g_failures == 0 ? 0 : 1;
}
