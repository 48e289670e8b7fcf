// ep_bench_gpu: GPU benchmark of the CUDA backend, EP N on the first N GPUs
// of one node (N = the visible GPUs, at most 8, or --ranks N; ranks are
// threads of this process). `ep_bench --backend cuda` runs it; built by the
// Makefile (build/bin) and by tests/gpu/build.sh (build/tests). --ranks 1 runs EP1 on
// one GPU: every row stays local, so the times are the kernels' own work
// (no link ceiling, no NCCL; what tests/gpu/run.sh runs on one GPU). With
// more ranks than GPUs, rank r runs on GPU r % GPUs and ranks share GPUs
// (set CUDA_DEVICE_MAX_CONNECTIONS=32): the protocol between ranks (rings,
// signals, flow control) without the link's latency and bandwidth, so no
// link ceiling and no NCCL there either.
//
// For each shape: check first (num_recv against the routing computed here, and
// combine(y = recv_x) == x * ranks-that-got-it, bit for bit), then time with
// CUDA events: L2 flushed (256 MB memset) before every timed run, both GPUs
// released together by a peer-flag handshake kernel, median of 20 runs after
// 3 warm-ups, the slower rank's median quoted. Reported:
//   logical GB/s  = bytes of every row this rank received (own included) / time (DeepEP)
//   physical GB/s = bytes that crossed NVLink into this rank / time, and its
//                   ratio to the all-to-all SM-push ceiling measured here
//                   with the same number of blocks (every GPU pushing to
//                   every other at once; the better of 1 and 8 loads in
//                   flight per thread)
//   NCCL all-to-all of the same bytes (dlopen of $EP_BENCH_NCCL_LIB), if found.
// --mode ll: the low-latency benchmark of gpu_ll_test --bench (gpu_common.h, beside this file).
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <string>

#include "gpu_common.h"

namespace {

constexpr int kWarm = 3, kIters = 20, kMaxR = 8;
int g_R = 2;  // ranks (rank r on GPU gpuOf(r))
bool g_shared = false;  // ranks share GPUs (more ranks than GPUs)

// Each rank's handshake slots (kMaxR ints on its GPU, slot q written by rank q).
struct Flags {
  int* of[kMaxR];
};

// Releases all GPUs together: tells every peer, then waits for every peer.
__global__ void handshake(Flags f, int me, int R, int v) {
  for (int q = 0; q < R; q++)
    if (q != me) reinterpret_cast<volatile int*>(f.of[q])[me] = v;
  for (int q = 0; q < R; q++)
    if (q != me)
      while (reinterpret_cast<volatile int*>(f.of[me])[q] < v) {
      }
}

struct Dsts {
  int4* to[kMaxR - 1];  // the peers' receive areas for this rank's pieces
};

// Pushes n 16-byte pieces to each of the npeers peers with every block (an
// even split of blocks among peers left gridDim % npeers of them idle): each
// thread takes the pieces of the [peer][piece] space whose flat index is its
// own modulo the grid's threads, peer by peer, starting at a peer that
// depends on its block so that every peer is served at once. With one peer
// this is a plain grid-stride copy. kU loads in flight per thread before
// their stores (one in flight leaves the copy bound by load latency, not by
// the link).
template <int kU>
__global__ void smPush(const int4* __restrict__ src, Dsts d, int npeers, size_t n) {
  const size_t S = size_t(gridDim.x) * blockDim.x, tid = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int k = 0; k < npeers; k++) {
    const int j = (k + int(blockIdx.x)) % npeers;
    int4* __restrict__ dst = d.to[j];
    for (size_t i = (tid + S - size_t(j) * n % S) % S; i < n; i += S * kU) {  // j * n + i = tid (mod S)
      int4 v[kU];
#pragma unroll
      for (int u = 0; u < kU; u++)
        if (i + u * S < n) v[u] = src[i + u * S];
#pragma unroll
      for (int u = 0; u < kU; u++)
        if (i + u * S < n) dst[i + u * S] = v[u];
    }
  }
}

struct SpinBarrier {
  std::atomic<int> count{0}, gen{0};
  int n;
  explicit SpinBarrier(int n_) : n(n_) {}
  void wait() {
    int g = gen.load();
    if (count.fetch_add(1) == n - 1) {
      count.store(0);
      gen.fetch_add(1);
    } else {
      while (gen.load() == g) std::this_thread::yield();
    }
  }
};

struct Sync {
  Flags flags;
  void* flush[kMaxR];
};
Sync g_sync;
std::atomic<int> g_tick{0};  // handshake values, increasing over the whole run

double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Runs op on rank r kWarm + kIters times, each after an L2 flush and a
// handshake with the other GPUs; returns the median in microseconds.
double timeOp(int r, cudaStream_t s, SpinBarrier& bar, const std::function<void()>& op,
              const std::function<void()>& after = nullptr) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> ts;
  for (int it = 0; it < kWarm + kIters; it++) {
    bar.wait();
    if (r == 0) g_tick.fetch_add(1);
    bar.wait();
    int v = g_tick.load();
    CK(cudaMemsetAsync(g_sync.flush[r], it & 0xff, 256u << 20, s));
    handshake<<<1, 1, 0, s>>>(g_sync.flags, r, g_R, v);
    CK(cudaEventRecord(e0, s));
    op();
    CK(cudaEventRecord(e1, s));
    CK(cudaStreamSynchronize(s));
    if (after) after();
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    if (it >= kWarm) ts.push_back(ms * 1000.f);
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  return median(ts);
}

// All-to-all SM push (every GPU sends bytes in all, an equal share to each
// peer, while the others do the same), GB/s per direction (sent by one GPU),
// 512-thread blocks (as the kernels), kU 16-byte loads in flight per thread.
template <int kU>
double linkCeilingOf(int blocks, size_t bytes) {
  const int R = g_R, npeers = R - 1;
  const size_t per_peer = bytes / 16 / npeers;  // pieces to each peer
  void *src[kMaxR], *dst[kMaxR];
  cudaStream_t s[kMaxR];
  cudaEvent_t e0[kMaxR], e1[kMaxR];
  for (int r = 0; r < R; r++) {
    CK(cudaSetDevice(gpuOf(r)));
    CK(cudaMalloc(&src[r], per_peer * 16));
    CK(cudaMalloc(&dst[r], per_peer * 16 * R));  // slice q: from rank q
    CK(cudaMemset(src[r], 1, per_peer * 16));
    CK(cudaStreamCreate(&s[r]));
    CK(cudaEventCreate(&e0[r]));
    CK(cudaEventCreate(&e1[r]));
  }
  std::vector<float> ts;
  for (int it = 0; it < 13; it++) {
    float worst = 0;
    const int v = ++g_tick;
    for (int r = 0; r < R; r++) {
      CK(cudaSetDevice(gpuOf(r)));
      Dsts d{};
      for (int j = 0, q = 0; q < R; q++)
        if (q != r) d.to[j++] = static_cast<int4*>(dst[q]) + size_t(r) * per_peer;
      handshake<<<1, 1, 0, s[r]>>>(g_sync.flags, r, R, v);
      CK(cudaEventRecord(e0[r], s[r]));
      smPush<kU><<<blocks, 512, 0, s[r]>>>((const int4*)src[r], d, npeers, per_peer);
      CK(cudaEventRecord(e1[r], s[r]));
    }
    for (int r = 0; r < R; r++) {
      CK(cudaSetDevice(gpuOf(r)));
      CK(cudaStreamSynchronize(s[r]));
      float ms;
      CK(cudaEventElapsedTime(&ms, e0[r], e1[r]));
      worst = std::max(worst, ms);
    }
    if (it >= 3) ts.push_back(worst);
  }
  for (int r = 0; r < R; r++) {
    CK(cudaSetDevice(gpuOf(r)));
    cudaFree(src[r]);
    cudaFree(dst[r]);
    cudaStreamDestroy(s[r]);
  }
  return double(per_peer) * 16 * npeers / (median(ts) * 1e6);
}

// The link ceiling: the better of one and eight loads in flight per thread
// (both printed; the kernels keep 8-14 in flight).
double linkCeiling(int blocks, size_t bytes) {
  const double one = linkCeilingOf<1>(blocks, bytes), eight = linkCeilingOf<8>(blocks, bytes);
  printf("link ceiling: SM push all-to-all over %d GPUs, %d blocks x 512 threads: %.1f GB/s per direction with 1 "
         "load in flight per thread, %.1f with 8\n",
         g_R, blocks, one, eight);
  return std::max(one, eight);
}

struct Routing {
  std::vector<int64_t> topk[kMaxR];
  int64_t count[kMaxR][kMaxR];  // [src][dst] rows
  std::vector<uint8_t> cnt_of[kMaxR];  // ranks per token
  // Rows rank d receives (own included), and those that crossed NVLink.
  int64_t recvRows(int d) const {
    int64_t n = 0;
    for (int s = 0; s < g_R; s++) n += count[s][d];
    return n;
  }
  int64_t linkRowsInto(int d) const { return recvRows(d) - count[d][d]; }
  int64_t linkRowsFrom(int s) const {
    int64_t n = 0;
    for (int d = 0; d < g_R; d++) n += d == s ? 0 : count[s][d];
    return n;
  }
};

Routing makeRouting(int T, int K, int E) {
  Routing rt;
  const int R = g_R;
  for (int r = 0; r < R; r++) {
    std::mt19937_64 g(100 + r);
    randomTopk(g, T, K, E, 0.0, &rt.topk[r]);
    for (int d = 0; d < R; d++) rt.count[r][d] = 0;
    rt.cnt_of[r].assign(T, 0);
    for (int t = 0; t < T; t++) {
      bool in[kMaxR] = {};
      for (int k = 0; k < K; k++) in[rt.topk[r][size_t(t) * K + k] / (E / R)] = true;
      for (int d = 0; d < R; d++) {
        rt.count[r][d] += in[d];
        rt.cnt_of[r][t] += in[d];
      }
    }
  }
  return rt;
}

struct Result {
  std::string what;
  double us, logical, physical, ratio;
};
std::vector<Result> g_results;
int g_bad = 0;

void report(const std::string& what, double us, double recv_bytes, double nvlink_bytes, double ceiling) {
  Result res{what, us, recv_bytes / (us * 1e3), nvlink_bytes / (us * 1e3), 0};
  res.ratio = ceiling > 0 ? res.physical / ceiling : 0;
  g_results.push_back(res);
  printf("%-44s %9.1f us  logical %6.1f GB/s  nvlink %6.1f GB/s (%4.0f%% of %5.1f)\n", what.c_str(), us,
         res.logical, res.physical, 100 * res.ratio, ceiling);
  printf("{\"what\":\"%s\",\"us\":%.1f,\"logical_gbps\":%.1f,\"nvlink_gbps\":%.1f,\"ceiling_gbps\":%.1f}\n",
         what.c_str(), us, res.logical, res.physical, ceiling);
  fflush(stdout);
}

void benchConfig(int T, epDataType_t dt, int sms, const Routing& rt, double ceiling, bool layout_too) {
  const int H = 7168, K = 8, E = 256, R = g_R;
  epConfig_t cfg = EP_CONFIG_INITIALIZER;
  cfg.num_experts = E;
  cfg.hidden = H;
  cfg.max_tokens_per_rank = T;
  cfg.max_topk = K;
  cfg.dispatch_type = dt;
  cfg.combine_type = epBfloat16;
  cfg.backend = epBackendCuda;
  cfg.timeout_ms = 20000;
  cfg.num_sms = sms;
  epComm_t comms[kMaxR];
  EK(nullptr, epCommInitAll(comms, R, gpusOf(R).data(), &cfg));
  const bool fp8 = dt == epFloat8E4M3;
  const int nb = fp8 ? H / 128 : 0;
  const size_t drow = size_t(H) * (fp8 ? 1 : 2), crow = size_t(H) * 2;
  const int cap = R * T;
  double t_full[kMaxR], t_cached[kMaxR], t_combine[kMaxR], t_layout[kMaxR];
  SpinBarrier bar(R);
  runRanks(R, [&](int r) {
    CK(cudaSetDevice(gpuOf(r)));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    std::mt19937_64 g(7 + r);
    std::vector<uint8_t> hx(size_t(T) * drow);
    fillRandomRow(g, dt, hx.data(), size_t(T) * H);
    std::vector<float> hs(std::max(1, T * nb), 1.5f), hw(size_t(T) * K, 0.25f);
    void *x, *topk, *recv_x, *y, *out;
    float *scales, *w, *recv_scales, *recv_w;
    int64_t *recv_idx, *num_recv;
    int *tpe, *tpr, *tpexp;
    uint8_t* in_rank;
    CK(cudaMalloc(&x, hx.size()));
    CK(cudaMalloc(&topk, size_t(T) * K * 8));
    CK(cudaMalloc(&recv_x, size_t(cap) * drow));
    CK(cudaMalloc(&y, size_t(cap) * crow));
    CK(cudaMalloc(&out, size_t(T) * crow));
    CK(cudaMalloc((void**)&scales, hs.size() * 4));
    CK(cudaMalloc((void**)&w, hw.size() * 4));
    CK(cudaMalloc((void**)&recv_scales, size_t(cap) * std::max(nb, 1) * 4));
    CK(cudaMalloc((void**)&recv_w, size_t(cap) * K * 4));
    CK(cudaMalloc((void**)&recv_idx, size_t(cap) * K * 8));
    CK(cudaMalloc((void**)&num_recv, 8));
    CK(cudaMalloc((void**)&tpe, E * 4));
    CK(cudaMalloc((void**)&tpr, 64));
    CK(cudaMalloc((void**)&tpexp, E * 4));
    CK(cudaMalloc((void**)&in_rank, size_t(T) * R));
    CK(cudaMemcpy(x, hx.data(), hx.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(topk, rt.topk[r].data(), size_t(T) * K * 8, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(scales, hs.data(), hs.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(w, hw.data(), hw.size() * 4, cudaMemcpyHostToDevice));
    if (fp8) {
      std::vector<uint8_t> hy(size_t(cap) * crow);
      fillRandomRow(g, epBfloat16, hy.data(), size_t(cap) * H);
      CK(cudaMemcpy(y, hy.data(), hy.size(), cudaMemcpyHostToDevice));
    }
    epDispatchArgs_t a = EP_DISPATCH_ARGS_INITIALIZER;
    a.flags = EP_DISPATCH_NO_HOST_SYNC;
    a.x = x;
    a.x_type = dt;
    a.x_scales = fp8 ? scales : nullptr;
    a.topk_idx = topk;
    a.topk_weights = w;
    a.num_tokens = T;
    a.num_topk = K;
    a.recv_x = recv_x;
    a.recv_scales = fp8 ? recv_scales : nullptr;
    a.recv_topk_idx = recv_idx;
    a.recv_topk_weights = recv_w;
    a.recv_capacity = cap;
    a.recv_tokens_per_expert = tpe;
    a.num_recv = num_recv;
    epCombineArgs_t ca = EP_COMBINE_ARGS_INITIALIZER;
    ca.y = fp8 ? y : recv_x;
    ca.y_type = epBfloat16;
    ca.out = out;
    // Check: num_recv, and (BF16) combine(y = recv_x) == x * the ranks that got the token.
    auto check = [&](const char* when) {
      CK(cudaStreamSynchronize(s));
      int64_t n = -1;
      CK(cudaMemcpy(&n, num_recv, 8, cudaMemcpyDeviceToHost));
      const int64_t expect = rt.recvRows(r);
      if (n != expect) {
        printf("CHECK FAILED rank %d %s: num_recv %lld, expected %lld\n", r, when, (long long)n, (long long)expect);
        g_bad++;
      }
      if (fp8) return;
      std::vector<uint16_t> ho(size_t(T) * H);
      CK(cudaMemcpy(ho.data(), out, ho.size() * 2, cudaMemcpyDeviceToHost));
      const uint16_t* xi = reinterpret_cast<const uint16_t*>(hx.data());
      size_t bad = 0;
      for (int t = 0; t < T; t++) {
        float m = rt.cnt_of[r][t];
        for (int j = 0; j < H; j++) {
          uint32_t b = uint32_t(xi[size_t(t) * H + j]) << 16;
          float f;
          memcpy(&f, &b, 4);
          if (ho[size_t(t) * H + j] != toBf16Bits(f * m)) bad++;
        }
      }
      if (bad) {
        printf("CHECK FAILED rank %d %s: %zu combine elements differ from x * ranks\n", r, when, bad);
        g_bad++;
      }
    };
    epHandle_t h = nullptr;
    EK(comms[r], epDispatch(comms[r], &a, &h, s));
    EK(comms[r], epCombine(comms[r], &ca, h, s));
    check("before timing");
    bar.wait();
    t_full[r] = timeOp(r, s, bar, [&] {
      epHandle_t h2 = nullptr;
      EK(comms[r], epDispatch(comms[r], &a, &h2, s));
      epHandleDestroy(h2);  // the slot is reused in stream order
    });
    // What the timed cached dispatches and combines leave is checked too: recv_x
    // and out are poisoned first, so a call that wrote nothing fails (BF16).
    CK(cudaMemsetAsync(recv_x, 0xff, size_t(cap) * drow, s));
    CK(cudaMemsetAsync(out, 0xff, size_t(T) * H * 2, s));
    t_cached[r] = timeOp(r, s, bar, [&] { EK(comms[r], epDispatch(comms[r], &a, &h, s)); });
    t_combine[r] = timeOp(r, s, bar, [&] { EK(comms[r], epCombine(comms[r], &ca, h, s)); });
    check("after timing");
    if (layout_too) {
      epLayoutArgs_t la = EP_LAYOUT_ARGS_INITIALIZER;
      la.topk_idx = topk;
      la.num_tokens = T;
      la.num_topk = K;
      la.tokens_per_rank = tpr;
      la.tokens_per_node = tpr + 8;
      la.tokens_per_expert = tpexp;
      la.is_token_in_rank = in_rank;
      t_layout[r] = timeOp(r, s, bar, [&] { EK(comms[r], epLayout(comms[r], &la, s)); });
    }
    epHandleDestroy(h);
    void* all[] = {x, topk, recv_x, y, out, scales, w, recv_scales, recv_w, recv_idx, num_recv, tpe, tpr, tpexp, in_rank};
    for (void* p : all) cudaFree(p);
    CK(cudaStreamDestroy(s));
  });
  for (int r = 0; r < R; r++) epCommDestroy(comms[r]);
  // Bytes per rank (rank 0's view; the routing is symmetric in expectation).
  const double rowb = double(drow) + nb * 4;
  const double recv_rows = double(rt.recvRows(0));
  const double nvl_rows = double(rt.linkRowsInto(0));
  auto slowest = [R](const double* t) { return *std::max_element(t, t + R); };
  char name[128];
  const char* ty = fp8 ? "fp8" : "bf16";
  snprintf(name, sizeof(name), "dispatch %s T=%d sms=%d (cached)", ty, T, sms);
  report(name, slowest(t_cached), recv_rows * rowb, nvl_rows * rowb, ceiling);
  snprintf(name, sizeof(name), "dispatch %s T=%d sms=%d (new routing)", ty, T, sms);
  report(name, slowest(t_full), recv_rows * rowb, nvl_rows * rowb, ceiling);
  snprintf(name, sizeof(name), "combine bf16 T=%d sms=%d (after %s)", T, sms, ty);
  // Combine: the partial rows of rank 0's tokens come back to it from the other ranks.
  report(name, slowest(t_combine), recv_rows * crow, double(rt.linkRowsFrom(0)) * crow, ceiling);
  if (layout_too) {
    snprintf(name, sizeof(name), "layout T=%d", T);
    report(name, slowest(t_layout), 0, 0, 0);
  }
}

// NCCL all-to-all of the dispatch's bytes (each rank sends count[r][d] rows to d).
typedef int (*ncclCommInitAll_t)(void** comms, int ndev, const int* devlist);
typedef int (*ncclSendRecv_t)(const void* buf, size_t count, int type, int peer, void* comm, cudaStream_t s);
typedef int (*ncclGroup_t)();
typedef int (*ncclCommDestroy_t)(void* comm);

void benchNccl(const Routing& rt, int T, size_t rowb, const char* what) {
  const char* lib = getenv("EP_BENCH_NCCL_LIB");
  void* h = lib ? dlopen(lib, RTLD_NOW) : nullptr;
  if (h == nullptr) {
    printf("SKIPPED nccl all-to-all %s T=%d: libnccl.so.2 not found (%s)\n", what, T, lib ? dlerror() : "EP_BENCH_NCCL_LIB unset");
    return;
  }
  auto initAll = (ncclCommInitAll_t)dlsym(h, "ncclCommInitAll");
  auto send = (ncclSendRecv_t)dlsym(h, "ncclSend");
  auto recv = (ncclSendRecv_t)dlsym(h, "ncclRecv");
  auto gstart = (ncclGroup_t)dlsym(h, "ncclGroupStart");
  auto gend = (ncclGroup_t)dlsym(h, "ncclGroupEnd");
  auto destroy = (ncclCommDestroy_t)dlsym(h, "ncclCommDestroy");
  const int R = g_R;
  void* comms[kMaxR];
  int devs[kMaxR];
  for (int r = 0; r < R; r++) devs[r] = r;
  if (!initAll || initAll(comms, R, devs) != 0) {
    printf("SKIPPED nccl all-to-all: ncclCommInitAll failed\n");
    return;
  }
  void *sb[kMaxR], *rb[kMaxR];
  cudaStream_t s[kMaxR];
  cudaEvent_t e0[kMaxR], e1[kMaxR];
  for (int r = 0; r < R; r++) {
    CK(cudaSetDevice(gpuOf(r)));
    CK(cudaMalloc(&sb[r], size_t(T) * R * rowb));
    CK(cudaMalloc(&rb[r], size_t(T) * R * rowb));
    CK(cudaStreamCreate(&s[r]));
    CK(cudaEventCreate(&e0[r]));
    CK(cudaEventCreate(&e1[r]));
  }
  // Timed as the library's calls are: the GPUs released together by the
  // handshake after the flush (else the first GPU's time includes the gap to
  // the second's start), each rank's median, the slower rank's quoted.
  std::vector<std::vector<float>> ts(R);
  int late_enqueues = 0;
  for (int it = 0; it < kWarm + kIters; it++) {
    const int v = ++g_tick;
    for (int r = 0; r < R; r++) {
      CK(cudaSetDevice(gpuOf(r)));
      CK(cudaMemsetAsync(g_sync.flush[r], 1, 256u << 20, s[r]));
      handshake<<<1, 1, 0, s[r]>>>(g_sync.flags, r, R, v);
      CK(cudaEventRecord(e0[r], s[r]));
    }
    gstart();
    for (int r = 0; r < R; r++) {
      size_t soff = 0, roff = 0;
      for (int d = 0; d < R; d++) {
        send((char*)sb[r] + soff, size_t(rt.count[r][d]) * rowb, 0, d, comms[r], s[r]);
        recv((char*)rb[r] + roff, size_t(rt.count[d][r]) * rowb, 0, d, comms[r], s[r]);
        soff += size_t(rt.count[r][d]) * rowb;
        roff += size_t(rt.count[d][r]) * rowb;
      }
    }
    gend();
    // The GPUs must still be busy with the flush when the group is enqueued:
    // else they idled inside the timed span, counted against NCCL.
    for (int r = 0; r < R; r++)
      if (it >= kWarm && cudaEventQuery(e0[r]) == cudaSuccess) late_enqueues++;
    for (int r = 0; r < R; r++) {
      CK(cudaSetDevice(gpuOf(r)));
      CK(cudaEventRecord(e1[r], s[r]));
    }
    for (int r = 0; r < R; r++) {
      CK(cudaSetDevice(gpuOf(r)));
      CK(cudaStreamSynchronize(s[r]));
      float ms;
      CK(cudaEventElapsedTime(&ms, e0[r], e1[r]));
      if (it >= kWarm) ts[r].push_back(ms * 1000.f);
    }
  }
  double us = 0;
  for (int r = 0; r < R; r++) us = std::max(us, median(ts[r]));
  if (late_enqueues)
    printf("note: nccl all-to-all %s T=%d: in %d of %d timed runs x ranks the GPU had passed its start event "
           "before the group was enqueued (host time inside the span)\n",
           what, T, late_enqueues, kIters * R);
  char name[128];
  snprintf(name, sizeof(name), "nccl all-to-all %s bytes T=%d", what, T);
  report(name, us, double(rt.recvRows(0)) * rowb, double(rt.linkRowsInto(0)) * rowb, 0);
  for (int r = 0; r < R; r++) {
    CK(cudaSetDevice(gpuOf(r)));
    cudaFree(sb[r]);
    cudaFree(rb[r]);
    destroy(comms[r]);
  }
}

}  // namespace

const char kUsage[] =
    "usage: ep_bench_gpu [--mode ht|ll] [--ranks N] [--quick] [--tokens N,..] [--sms A,B,..] [--types bf16|fp8|both]\n"
    "                    [--no-nccl]\n"
    "  --mode ll   the low-latency table (128 tokens, split halves, 1 token) on all GPUs, at most 8\n"
    "  --ranks N   EP N on GPUs 0..N-1 (1..8; default: every visible GPU, at most 8; 1: one GPU, every\n"
    "              row local: the kernels' own work without a link, no link ceiling, no NCCL; more than\n"
    "              the GPUs: rank r on GPU r % GPUs, ranks sharing GPUs, no link ceiling, no NCCL)\n"
    "  --quick     32 SMs only\n"
    "  --no-nccl   skip NCCL's all-to-all of the same bytes\n";

int main(int argc, char** argv) {
  // --quick: 32 SMs only; --tokens N; --sms A,B,..; --types bf16|fp8|both;
  // --no-nccl: skip the NCCL all-to-all reference; --mode ll: the low-latency table.
  bool low_latency = false;
  std::vector<int> sms_list = {24, 32, 64};
  std::vector<int> tokens = {4096, 8192};
  std::vector<epDataType_t> types = {epBfloat16, epFloat8E4M3};
  bool nccl = true;
  int ranks = 0;
  auto ints = [](const char* v) {
    std::vector<int> out;
    for (const char* q = v; *q;) {
      out.push_back(atoi(q));
      while (*q && *q != ',') q++;
      if (*q == ',') q++;
    }
    return out;
  };
  for (int i = 1; i < argc; i++) {
    std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--quick") sms_list = {32};
    else if (arg == "--tokens" && has_value) tokens = ints(argv[++i]);
    else if (arg == "--ranks" && has_value) ranks = atoi(argv[++i]);
    else if (arg == "--sms" && has_value) sms_list = ints(argv[++i]);
    else if (arg == "--types" && has_value) {
      std::string t = argv[++i];
      if (t != "bf16" && t != "fp8" && t != "both") {
        fprintf(stderr, "ep_bench_gpu: --types %s: bf16, fp8 or both\n%s", t.c_str(), kUsage);
        return 2;
      }
      types = t == "bf16" ? std::vector<epDataType_t>{epBfloat16}
              : t == "fp8" ? std::vector<epDataType_t>{epFloat8E4M3}
                           : std::vector<epDataType_t>{epBfloat16, epFloat8E4M3};
    } else if (arg == "--mode" && has_value) {
      std::string m = argv[++i];
      if (m != "ht" && m != "ll") {
        fprintf(stderr, "ep_bench_gpu: --mode %s: ht or ll\n%s", m.c_str(), kUsage);
        return 2;
      }
      low_latency = m == "ll";
    } else if (arg == "--no-nccl") nccl = false;
    else if (arg == "--help" || arg == "-h") {
      fputs(kUsage, stdout);
      return 0;
    } else {
      fprintf(stderr, "ep_bench_gpu: unknown or incomplete argument %s\n%s", arg.c_str(), kUsage);
      return 2;
    }
  }
  for (int t : tokens)
    if (t < 1) {
      fprintf(stderr, "ep_bench_gpu: --tokens values must be at least 1\n");
      return 2;
    }
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < (ranks ? 1 : 2)) {
    printf("SKIPPED ep_bench_gpu: needs 2 GPUs (or --ranks N), %d visible\n", ndev);
    return 0;
  }
  g_R = ranks ? ranks : std::min(ndev, kMaxR);
  if (g_R < 1 || g_R > kMaxR) {
    fprintf(stderr, "ep_bench_gpu: --ranks %d: 1..%d\n", ranks, kMaxR);
    return 2;
  }
  gpuCount() = std::min(ndev, g_R);
  g_shared = g_R > ndev;
  if (g_shared)
    printf("ranks share GPUs: %d ranks on %d GPU%s (rank r on GPU r %% %d): no link ceiling, no NCCL, and the "
           "nvlink columns count the rows between ranks\n",
           g_R, ndev, ndev == 1 ? "" : "s", ndev);
  if (low_latency) {
    ll::benchStandard(g_R);
    return 0;
  }
  if (256 % g_R != 0) {
    fprintf(stderr, "ep_bench_gpu: the high-throughput table has 256 experts: EP%d does not divide them\n",
            g_R);
    return 2;
  }
  for (int sms : sms_list)
    if (sms < 1 || sms > 64) {
      printf("ep_bench_gpu: --sms values must be in [1, 64]\n");
      return 2;
    }
  for (int r = 0; r < g_R; r++) {
    CK(cudaSetDevice(gpuOf(r)));
    for (int q = 0; q < g_R; q++) {
      if (gpuOf(q) == gpuOf(r)) continue;
      cudaError_t e = cudaDeviceEnablePeerAccess(gpuOf(q), 0);
      if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) CK(e);
      cudaGetLastError();
    }
    CK(cudaMalloc((void**)&g_sync.flags.of[r], kMaxR * sizeof(int)));
    CK(cudaMemset(g_sync.flags.of[r], 0, kMaxR * sizeof(int)));
    CK(cudaMalloc(&g_sync.flush[r], 256u << 20));
  }
  std::vector<double> ceil_of(65, 0);
  if (g_R == 1) printf("link ceiling: none at EP1 (every row stays on its GPU; nvlink bytes 0)\n");
  else if (g_shared) printf("link ceiling: none (ranks share GPUs)\n");
  else
    for (int b : sms_list) ceil_of[b] = linkCeiling(b, 117u << 20);
  for (int T : tokens) {
    Routing rt = makeRouting(T, 8, 256);
    printf("routing T=%d, EP%d: rows src->dst", T, g_R);
    for (int s = 0; s < g_R; s++)
      for (int d = 0; d < g_R; d++) printf(" %d->%d %lld", s, d, (long long)rt.count[s][d]);
    printf("\n");
    for (epDataType_t dt : types)
      for (int sms : sms_list) benchConfig(T, dt, sms, rt, ceil_of[sms], dt == epBfloat16 && sms == sms_list[0]);
    if (nccl && g_R == 1) printf("SKIPPED nccl all-to-all T=%d: EP1 moves no bytes between GPUs\n", T);
    else if (nccl && g_shared) printf("SKIPPED nccl all-to-all T=%d: ranks share GPUs (NCCL takes one per GPU)\n", T);
    else if (nccl) {
      benchNccl(rt, T, 7168 * 2, "bf16");
      benchNccl(rt, T, 7168 + 56 * 4, "fp8");
    }
  }
  printf("\n%-44s %9s %8s %8s %6s\n", "summary", "us", "logical", "nvlink", "ratio");
  for (const Result& r : g_results)
    printf("%-44s %9.1f %8.1f %8.1f %5.0f%%\n", r.what.c_str(), r.us, r.logical, r.physical, 100 * r.ratio);
  if (g_bad) printf("ep_bench_gpu: %d CHECKS FAILED\n", g_bad);
  return g_bad ? 1 : 0;
}
