// Helpers shared by the GPU benchmark (tools/gpu/ep_bench_gpu.cu) and the GPU
// tests (tests/gpu/, which include it as "gpu/gpu_common.h"): random inputs, the host
// reference run, thread-per-rank execution; in namespace ht, the
// high-throughput cases of gpu_test (ranks as threads) and gpu_mp_test (ranks
// as processes), one rank's part per function; and in namespace ll, the
// low-latency cases of gpu_ll_test (ranks as threads) and gpu_mp_test, likewise.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cuda_check.h"
#include "moeep.h"

#define EK(comm, x)                                                                              \
  do {                                                                                           \
    epResult_t r_ = (x);                                                                         \
    if (r_ != epSuccess) {                                                                       \
      fprintf(stderr, "%s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #x, epGetErrorString(r_),     \
              epGetLastError(comm));                                                             \
      exit(3);                                                                                   \
    }                                                                                            \
  } while (0)

inline size_t typeSize(epDataType_t t) {
  return t == epFloat32 ? 4 : t == epFloat8E4M3 ? 1 : 2;
}

// GPUs the ranks are spread over: rank r drives GPU r % gpuCount(). A test
// runs more ranks than GPUs (--ranks) by setting it to the visible count;
// ranks that share a GPU split its SMs (the library sees it at init).
inline int& gpuCount() {
  static int n = 8;
  return n;
}
inline int gpuOf(int r) { return r % gpuCount(); }
// The devices argument of epCommInitAll for R ranks.
inline std::vector<int> gpusOf(int R) {
  std::vector<int> d(R);
  for (int r = 0; r < R; r++) d[r] = gpuOf(r);
  return d;
}

// `prog --ranks N` (1..8): N, else 0; exits 2 on a count out of range. Call
// before CUDA starts: with ranks that may share a GPU, their kernels wait for
// each other, so their streams must not share a hardware queue (CUDA's
// default is 8 queues; docs/SEMANTICS.md): CUDA_DEVICE_MAX_CONNECTIONS=32.
inline int ranksOption(int argc, char** argv, const char* prog) {
  if (argc <= 2 || std::string(argv[1]) != "--ranks") return 0;
  const int n = atoi(argv[2]);
  if (n < 1 || n > 8) {
    fprintf(stderr, "%s: --ranks takes 1..8\n", prog);
    exit(2);
  }
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
  return n;
}

// --staged [R]: the ranks' count (default 2), with the environment of the
// staged path on this machine: each rank a node unless EP_NODE_SIZE says
// otherwise, the nodes joined by the socket transport on loopback
// (EP_CUDA_NETWORK=1). 0: not asked for; exits on a bad count.
inline int stagedOption(int argc, char** argv, const char* prog) {
  if (argc <= 1 || std::string(argv[1]) != "--staged") return 0;
  const int n = argc > 2 ? atoi(argv[2]) : 2;
  if (n < 2 || n > 8) {
    fprintf(stderr, "%s: --staged takes 2..8 ranks\n", prog);
    exit(2);
  }
  setenv("EP_CUDA_NETWORK", "1", 1);
  setenv("EP_NODE_SIZE", "1", 0);
  setenv("EP_TRANSPORTS", "shm,socket", 0);
  setenv("EP_SOCKET_IFNAME", "lo", 0);
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
  return n;
}

// A barrier of the ranks' threads. The tests pass it once every rank has set
// up (allocated, uploaded, poisoned, synchronised its stream) and before any
// rank makes its first call: a rank's thread that allocates or copies from
// pageable memory (calls that may wait for the whole GPU) while a peer's
// kernel already waits for this rank would wait for that kernel, which waits
// for this rank's call: stuck until the timeout (docs/SEMANTICS.md, ranks
// sharing a GPU).
class RankBarrier {
 public:
  explicit RankBarrier(int n) : n_(n) {}
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    const unsigned long long gen = gen_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      gen_++;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return gen_ != gen; });
  }

 private:
  const int n_;
  int arrived_ = 0;
  unsigned long long gen_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
};

inline void runRanks(int R, const std::function<void(int)>& fn) {
  std::vector<std::thread> th;
  for (int r = 0; r < R; r++) th.emplace_back(fn, r);
  for (auto& t : th) t.join();
}

inline uint16_t toBf16Bits(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  return uint16_t((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

// Random finite values of type t (BF16 / FP16 / FP32) or random bytes (FP8).
inline void fillRandomRow(std::mt19937_64& g, epDataType_t t, void* dst, size_t n) {
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  if (t == epFloat8E4M3) {
    uint8_t* p = static_cast<uint8_t*>(dst);
    for (size_t i = 0; i < n; i++) {
      uint8_t v = uint8_t(g());
      if ((v & 0x7f) == 0x7f) v &= 0xfe;  // no NaN encodings
      p[i] = v;
    }
  } else if (t == epFloat32) {
    float* p = static_cast<float*>(dst);
    for (size_t i = 0; i < n; i++) p[i] = u(g);
  } else if (t == epBfloat16) {
    uint16_t* p = static_cast<uint16_t*>(dst);
    for (size_t i = 0; i < n; i++) p[i] = toBf16Bits(u(g));
  } else {  // fp16: random sign, exponent 10..20, mantissa
    uint16_t* p = static_cast<uint16_t*>(dst);
    for (size_t i = 0; i < n; i++)
      p[i] = uint16_t((g() & 0x8000u) | ((10 + g() % 10) << 10) | (g() & 0x3ffu));
  }
}

// n BF16 values uniform in [-2, 2) (16-bit steps; rounding to BF16 can give 2),
// four from each 64-bit draw of a splitmix64 stream: ~15x faster than
// fillRandomRow's for the low-latency tests' expert outputs (hundreds of MB
// per rank at hidden 7168, most of an EP8 test's time when drawn element by
// element).
inline void fillRandomBf16Fast(uint64_t seed, uint16_t* p, size_t n) {
  uint64_t state = seed;
  for (size_t i = 0; i < n; i += 4) {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    for (size_t j = i; j < i + 4 && j < n; j++, z >>= 16)
      p[j] = toBf16Bits(float(z & 0xffff) * (4.0f / 65536.0f) - 2.0f);
  }
}

// K distinct experts of E per token; each entry -1 with probability neg.
inline void randomTopk(std::mt19937_64& g, int T, int K, int E, double neg, std::vector<int64_t>* out) {
  out->assign(size_t(T) * K, -1);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<int> perm(E);
  for (int t = 0; t < T; t++) {
    for (int e = 0; e < E; e++) perm[e] = e;
    for (int k = 0; k < K && k < E; k++) {
      int j = k + int(g() % uint64_t(E - k));
      std::swap(perm[k], perm[j]);
      (*out)[size_t(t) * K + k] = u(g) < neg ? -1 : perm[k];
    }
  }
}

// ---- High-throughput cases: every output of the CUDA backend against the host
// backend on the same random inputs, bit for bit.
namespace ht {

struct Case {
  std::string name;
  int R, H, K, E;
  std::vector<int> T;  // tokens per rank
  epDataType_t dt = epBfloat16, ct = epBfloat16;
  int align = 0;
  double neg = 0;
  bool idx32 = false, weights = true, bias = false, transposed_scales = false;
  int num_sms = 0;
  bool repeats = false;  // every token lists its first expert again as its second entry, every fourth as all
  // Ranks passing different num_topk: Kr[r] (empty: K everywhere; K is config.max_topk). A rank may
  // not send rows to a rank with fewer columns, so own_experts_rank picks only its own experts.
  std::vector<int> Kr;
  int own_experts_rank = -1;
  bool null_topk_if_empty = false;  // a rank without tokens passes topk_idx = NULL (and no weights)
  int cached_without_ids = -1;      // this rank passes no topk_idx in the cached re-dispatch
  int only_rank = -1;               // every rank picks only this rank's experts (it receives every token)
  int row_pad = 0;  // GPU run only: x, the cached x and y with rows this many bytes apart beyond
                    // their size (x_stride / y_stride; the padding holds garbage)
  // GPU run only: the optional outputs left out (recv_topk_idx, recv_topk_weights,
  // recv_tokens_per_expert, out_topk_weights; num_recv in exact sizing, read
  // with epHandleRecvCount instead), and the combine's deterministic flag.
  bool fewer_outputs = false, deterministic = false;
  int kOf(int r) const { return Kr.empty() ? K : Kr[r]; }
};

struct RankIn {
  std::vector<uint8_t> x, x2, bias, y;
  std::vector<float> scales, w, scales2, w2;  // *2: the cached re-dispatch's
  std::vector<int64_t> topk;
  std::vector<int32_t> topk32;
};

struct RankOut {
  int64_t num_recv = -1;
  std::vector<uint8_t> recv_x, recv_x2, out;
  std::vector<float> scales, w, out_w, scales2, w2;  // *2: the cached re-dispatch's outputs
  std::vector<int64_t> idx, idx2;
  std::vector<int> tpe2;
  std::vector<int> tpe;
  std::vector<int> tpr, tpn, tpexp;
  std::vector<uint8_t> in_rank;
};

struct Geometry {
  int maxT, cap, nb, EL;
  size_t drow, crow, s_tok, s_blk;
};

inline Geometry geometryOf(const Case& c) {
  Geometry g;
  g.maxT = *std::max_element(c.T.begin(), c.T.end());
  g.cap = g.maxT * c.R;
  g.nb = c.dt == epFloat8E4M3 ? (c.H + 127) / 128 : 0;
  g.EL = c.E / c.R;
  g.drow = size_t(c.H) * typeSize(c.dt);
  g.crow = size_t(c.H) * typeSize(c.ct);
  g.s_tok = c.transposed_scales ? 1 : size_t(g.nb);
  g.s_blk = c.transposed_scales ? size_t(g.maxT) : 1;
  return g;
}

inline epConfig_t configOf(const Case& c, epBackend_t b) {
  epConfig_t cfg = EP_CONFIG_INITIALIZER;
  cfg.num_experts = c.E;
  cfg.hidden = c.H;
  cfg.max_tokens_per_rank = geometryOf(c).maxT;
  cfg.max_topk = c.K;
  cfg.dispatch_type = c.dt;
  cfg.combine_type = c.ct;
  cfg.backend = b;
  cfg.timeout_ms = 20000;
  cfg.num_sms = c.num_sms;
  return cfg;
}

// Rank r's inputs of case c: a function of (seed, r) alone, so that a rank
// that is a process of its own makes its inputs without the other ranks'.
inline void makeRankInput(const Case& c, uint64_t seed, int r, RankIn* rank_in) {
  const Geometry g = geometryOf(c);
  std::mt19937_64 gen(seed * 1000 + r);
  RankIn& in = *rank_in;
  const int T = c.T[r];
  in.x.resize(std::max<size_t>(1, T * g.drow));
  in.x2.resize(in.x.size());
  fillRandomRow(gen, c.dt, in.x.data(), size_t(T) * c.H);
  fillRandomRow(gen, c.dt, in.x2.data(), size_t(T) * c.H);
  in.scales.assign(std::max<size_t>(1, size_t(g.maxT) * std::max(g.nb, 1)), 0.f);
  std::uniform_real_distribution<float> u(0.001f, 4.0f);
  for (auto& s : in.scales) s = u(gen);
  if (r == c.own_experts_rank || c.only_rank >= 0) {  // experts of one rank only: ids q * EL ..
    const int q = c.only_rank >= 0 ? c.only_rank : r;
    randomTopk(gen, T, c.kOf(r), g.EL, c.neg, &in.topk);
    for (auto& e : in.topk)
      if (e >= 0) e += int64_t(q) * g.EL;
  } else {
    randomTopk(gen, T, c.kOf(r), c.E, c.neg, &in.topk);
  }
  if (c.repeats)
    for (int t = 0; t < T; t++)
      for (int k = 1; k < (t % 4 == 0 ? c.kOf(r) : std::min(2, c.kOf(r))); k++)
        in.topk[size_t(t) * c.kOf(r) + k] = in.topk[size_t(t) * c.kOf(r)];
  in.topk32.assign(in.topk.begin(), in.topk.end());
  in.w.resize(std::max<size_t>(1, size_t(T) * c.kOf(r)));
  for (auto& w : in.w) w = u(gen);
  in.bias.resize(std::max<size_t>(1, T * g.crow));
  fillRandomRow(gen, c.ct, in.bias.data(), size_t(T) * c.H);
  in.y.resize(size_t(g.cap) * g.crow);
  fillRandomRow(gen, c.ct, in.y.data(), size_t(g.cap) * c.H);
  // Drawn last, so that the inputs above stay what they were.
  in.scales2.resize(in.scales.size());
  for (auto& s : in.scales2) s = u(gen);
  in.w2.resize(in.w.size());
  for (auto& w : in.w2) w = u(gen);
}

inline void makeInputs(const Case& c, uint64_t seed, std::vector<RankIn>* ins) {
  ins->resize(c.R);
  for (int r = 0; r < c.R; r++) makeRankInput(c, seed, r, &(*ins)[r]);
}

inline epDispatchArgs_t dispatchArgs(const Case& c, const RankIn& in, int r, const void* x, const float* scales,
                              const void* topk, const float* w) {
  const Geometry g = geometryOf(c);
  epDispatchArgs_t a = EP_DISPATCH_ARGS_INITIALIZER;
  a.x = x;
  a.x_type = c.dt;
  a.x_scales = g.nb ? scales : nullptr;
  a.scales_token_stride = g.s_tok;
  a.scales_block_stride = g.s_blk;
  const bool no_ids = c.null_topk_if_empty && c.T[r] == 0;
  a.topk_idx = no_ids ? nullptr : topk;
  a.topk_idx_type = c.idx32 ? epInt32 : epInt64;
  a.topk_weights = c.weights && !no_ids ? w : nullptr;
  a.num_tokens = c.T[r];
  a.num_topk = c.kOf(r);
  a.expert_alignment = c.align;
  a.recv_capacity = g.cap;
  (void)in;
  return a;
}

// Rank r's part of the reference run on comm (the host backend): layout,
// dispatch, combine and a cached re-dispatch of x2. Collective: every rank
// of comm calls it, each from its own thread or process.
inline void hostRank(const Case& c, epComm_t comm, const RankIn& in, int r, RankOut* out) {
  const Geometry g = geometryOf(c);
  RankOut& o = *out;
  const void* topk = c.idx32 ? (const void*)in.topk32.data() : (const void*)in.topk.data();
  o.tpr.assign(c.R, 0);
  o.tpn.assign(c.R, 0);
  o.tpexp.assign(c.E, 0);
  o.in_rank.assign(std::max<size_t>(1, size_t(c.T[r]) * c.R), 0);
  epLayoutArgs_t la = EP_LAYOUT_ARGS_INITIALIZER;
  la.topk_idx = c.null_topk_if_empty && c.T[r] == 0 ? nullptr : topk;
  la.topk_idx_type = c.idx32 ? epInt32 : epInt64;
  la.num_tokens = c.T[r];
  la.num_topk = c.kOf(r);
  la.tokens_per_rank = o.tpr.data();
  la.tokens_per_node = o.tpn.data();
  la.tokens_per_expert = o.tpexp.data();
  la.is_token_in_rank = o.in_rank.data();
  EK(comm, epLayout(comm, &la, nullptr));
  o.recv_x.assign(size_t(g.cap) * g.drow, 0);
  o.recv_x2.assign(size_t(g.cap) * g.drow, 0);
  o.scales.assign(std::max<size_t>(1, size_t(g.cap) * g.nb), 0);
  o.scales2.assign(o.scales.size(), 0);
  o.idx2.assign(size_t(g.cap) * c.kOf(r), 0);
  o.w2.assign(size_t(g.cap) * c.kOf(r), 0);
  o.tpe2.assign(g.EL, 0);
  o.idx.assign(size_t(g.cap) * c.kOf(r), 0);
  o.w.assign(size_t(g.cap) * c.kOf(r), 0);
  o.tpe.assign(g.EL, 0);
  o.out.assign(std::max<size_t>(1, c.T[r] * g.crow), 0);
  o.out_w.assign(std::max<size_t>(1, size_t(c.T[r]) * c.kOf(r)), 0);
  epDispatchArgs_t a = dispatchArgs(c, in, r, in.x.data(), in.scales.data(), topk, in.w.data());
  a.recv_x = o.recv_x.data();
  a.recv_scales = g.nb ? o.scales.data() : nullptr;
  a.recv_topk_idx = o.idx.data();
  a.recv_topk_weights = c.weights ? o.w.data() : nullptr;
  a.recv_tokens_per_expert = o.tpe.data();
  a.num_recv = &o.num_recv;
  epHandle_t h = nullptr;
  EK(comm, epDispatch(comm, &a, &h, nullptr));
  epCombineArgs_t ca = EP_COMBINE_ARGS_INITIALIZER;
  ca.y = in.y.data();
  ca.y_type = c.ct;
  ca.recv_topk_weights = c.weights ? o.w.data() : nullptr;
  ca.num_topk = c.kOf(r);
  ca.bias = c.bias ? in.bias.data() : nullptr;
  ca.out = o.out.data();
  ca.out_topk_weights = c.weights ? o.out_w.data() : nullptr;
  EK(comm, epCombine(comm, &ca, h, nullptr));
  // The cached re-dispatch: new rows, scales and weights, outputs of its own.
  a.x = in.x2.data();
  a.x_scales = g.nb ? in.scales2.data() : nullptr;
  a.topk_weights = c.weights ? in.w2.data() : nullptr;
  a.recv_x = o.recv_x2.data();
  a.recv_scales = g.nb ? o.scales2.data() : nullptr;
  a.recv_topk_idx = o.idx2.data();
  a.recv_topk_weights = c.weights ? o.w2.data() : nullptr;
  a.recv_tokens_per_expert = o.tpe2.data();
  if (r == c.cached_without_ids) a.topk_idx = nullptr, a.topk_weights = nullptr;
  EK(comm, epDispatch(comm, &a, &h, nullptr));
  epHandleDestroy(h);
}

inline int g_failures = 0;

inline bool same(const char* what, const std::string& cname, int r, const void* gpu, const void* host, size_t bytes,
          size_t elem) {
  if (bytes == 0 || memcmp(gpu, host, bytes) == 0) return true;
  const uint8_t* a = static_cast<const uint8_t*>(gpu);
  const uint8_t* b = static_cast<const uint8_t*>(host);
  size_t i = 0;
  while (a[i] == b[i]) i++;
  size_t n = 0;
  for (size_t j = 0; j < bytes; j++) n += a[j] != b[j];
  printf("  FAIL %s rank %d %s: %zu bytes differ, first at element %zu (gpu 0x", cname.c_str(), r, what, n, i / elem);
  for (size_t k = 0; k < elem; k++) printf("%02x", a[i / elem * elem + elem - 1 - k]);
  printf(" host 0x");
  for (size_t k = 0; k < elem; k++) printf("%02x", b[i / elem * elem + elem - 1 - k]);
  printf(")\n");
  g_failures++;
  return false;
}

struct DevBufs {
  void *x, *x2, *topk, *recv_x, *recv_x2, *y, *bias, *out, *in_rank;
  float *scales, *w, *recv_scales, *recv_w, *out_w;
  float *scales2, *w2, *recv_scales2, *recv_w2;  // the cached re-dispatch's
  int64_t *recv_idx, *num_recv, *recv_idx2;
  int *tpe, *tpr, *tpn, *tpexp, *tpe2;
};

inline void allocDev(const Case& c, const RankIn& in, int r, DevBufs* d) {
  const Geometry g = geometryOf(c);
  const int T = c.T[r];
  auto m = [](void** p, size_t n) { CK(cudaMalloc(p, std::max<size_t>(n, 16))); };
  m(&d->x, in.x.size());
  m(&d->x2, in.x2.size());
  m((void**)&d->scales, in.scales.size() * 4);
  m(&d->topk, in.topk.size() * 8);
  m((void**)&d->w, in.w.size() * 4);
  m(&d->recv_x, size_t(g.cap) * g.drow);
  m(&d->recv_x2, size_t(g.cap) * g.drow);
  m((void**)&d->recv_scales, size_t(g.cap) * g.nb * 4);
  m((void**)&d->recv_idx, size_t(g.cap) * c.kOf(r) * 8);
  m((void**)&d->recv_w, size_t(g.cap) * c.kOf(r) * 4);
  m((void**)&d->tpe, size_t(g.EL) * 4);
  m((void**)&d->num_recv, 8);
  m(&d->y, in.y.size());
  m(&d->bias, in.bias.size());
  m(&d->out, size_t(T) * g.crow);
  m((void**)&d->out_w, size_t(T) * c.kOf(r) * 4);
  m((void**)&d->tpr, c.R * 4);
  m((void**)&d->tpn, c.R * 4);
  m((void**)&d->tpexp, c.E * 4);
  m(&d->in_rank, size_t(T) * c.R);
  m((void**)&d->scales2, in.scales2.size() * 4);
  m((void**)&d->w2, in.w2.size() * 4);
  m((void**)&d->recv_scales2, size_t(g.cap) * g.nb * 4);
  m((void**)&d->recv_idx2, size_t(g.cap) * c.kOf(r) * 8);
  m((void**)&d->recv_w2, size_t(g.cap) * c.kOf(r) * 4);
  m((void**)&d->tpe2, size_t(g.EL) * 4);
}

inline void uploadInputs(const Case& c, const RankIn& in, DevBufs* d, cudaStream_t s) {
  CK(cudaMemcpyAsync(d->x, in.x.data(), in.x.size(), cudaMemcpyHostToDevice, s));
  CK(cudaMemcpyAsync(d->x2, in.x2.data(), in.x2.size(), cudaMemcpyHostToDevice, s));
  CK(cudaMemcpyAsync(d->scales, in.scales.data(), in.scales.size() * 4, cudaMemcpyHostToDevice, s));
  if (c.idx32) CK(cudaMemcpyAsync(d->topk, in.topk32.data(), in.topk32.size() * 4, cudaMemcpyHostToDevice, s));
  else CK(cudaMemcpyAsync(d->topk, in.topk.data(), in.topk.size() * 8, cudaMemcpyHostToDevice, s));
  CK(cudaMemcpyAsync(d->w, in.w.data(), in.w.size() * 4, cudaMemcpyHostToDevice, s));
  CK(cudaMemcpyAsync(d->y, in.y.data(), in.y.size(), cudaMemcpyHostToDevice, s));
  CK(cudaMemcpyAsync(d->bias, in.bias.data(), in.bias.size(), cudaMemcpyHostToDevice, s));
  CK(cudaMemcpyAsync(d->scales2, in.scales2.data(), in.scales2.size() * 4, cudaMemcpyHostToDevice, s));
  CK(cudaMemcpyAsync(d->w2, in.w2.data(), in.w2.size() * 4, cudaMemcpyHostToDevice, s));
}

inline void poison(const Case& c, int r, DevBufs* d, cudaStream_t s) {
  const Geometry g = geometryOf(c);
  const int T = c.T[r];
  CK(cudaMemsetAsync(d->recv_x, 0xa5, size_t(g.cap) * g.drow, s));
  CK(cudaMemsetAsync(d->recv_x2, 0xa5, size_t(g.cap) * g.drow, s));
  CK(cudaMemsetAsync(d->recv_scales, 0xa5, size_t(g.cap) * g.nb * 4, s));
  CK(cudaMemsetAsync(d->recv_idx, 0xa5, size_t(g.cap) * c.kOf(r) * 8, s));
  CK(cudaMemsetAsync(d->recv_w, 0xa5, size_t(g.cap) * c.kOf(r) * 4, s));
  CK(cudaMemsetAsync(d->tpe, 0xa5, size_t(g.EL) * 4, s));
  CK(cudaMemsetAsync(d->num_recv, 0xa5, 8, s));
  CK(cudaMemsetAsync(d->out, 0xa5, size_t(T) * g.crow, s));
  CK(cudaMemsetAsync(d->out_w, 0xa5, size_t(T) * c.kOf(r) * 4, s));
  CK(cudaMemsetAsync(d->tpr, 0xa5, c.R * 4, s));
  CK(cudaMemsetAsync(d->tpn, 0xa5, c.R * 4, s));
  CK(cudaMemsetAsync(d->tpexp, 0xa5, c.E * 4, s));
  CK(cudaMemsetAsync(d->in_rank, 0xa5, size_t(T) * c.R, s));
  CK(cudaMemsetAsync(d->recv_scales2, 0xa5, size_t(g.cap) * g.nb * 4, s));
  CK(cudaMemsetAsync(d->recv_idx2, 0xa5, size_t(g.cap) * c.kOf(r) * 8, s));
  CK(cudaMemsetAsync(d->recv_w2, 0xa5, size_t(g.cap) * c.kOf(r) * 4, s));
  CK(cudaMemsetAsync(d->tpe2, 0xa5, size_t(g.EL) * 4, s));
}

inline void freeDev(DevBufs* d) {
  void* all[] = {d->x,      d->x2,      d->topk,         d->recv_x,    d->recv_x2,   d->y,    d->bias,
                 d->out,    d->in_rank, d->scales,       d->w,         d->recv_scales, d->recv_w, d->out_w,
                 d->recv_idx, d->num_recv, d->tpe,       d->tpr,       d->tpn,       d->tpexp, d->scales2,
                 d->w2,     d->recv_scales2, d->recv_idx2, d->recv_w2, d->tpe2};
  for (void* p : all) cudaFree(p);
}

template <typename T>
inline std::vector<T> download(const void* p, size_t n) {
  std::vector<T> v(std::max<size_t>(n, 1));
  CK(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

// Rank r's part of the same run on comm (the CUDA backend, device r), exact
// or capacity sizing, outputs downloaded into *out. Collective.
// The layout of rank r's ids into d's count buffers.
inline epLayoutArgs_t layoutArgs(const Case& c, int r, const DevBufs& d) {
  epLayoutArgs_t la = EP_LAYOUT_ARGS_INITIALIZER;
  la.topk_idx = c.null_topk_if_empty && c.T[r] == 0 ? nullptr : d.topk;
  la.topk_idx_type = c.idx32 ? epInt32 : epInt64;
  la.num_tokens = c.T[r];
  la.num_topk = c.kOf(r);
  la.tokens_per_rank = d.tpr;
  la.tokens_per_node = d.tpn;
  la.tokens_per_expert = d.tpexp;
  la.is_token_in_rank = (uint8_t*)d.in_rank;
  return la;
}

inline void gpuRank(const Case& c, epComm_t comm, const RankIn& in, int r, bool capacity, RankOut* out) {
  const Geometry g = geometryOf(c);
  CK(cudaSetDevice(gpuOf(r)));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  DevBufs d;
  allocDev(c, in, r, &d);
  uploadInputs(c, in, &d, s);
  poison(c, r, &d, s);
  epLayoutArgs_t la = layoutArgs(c, r, d);
  EK(comm, epLayout(comm, &la, s));
  epDispatchArgs_t a = dispatchArgs(c, in, r, d.x, d.scales, d.topk, d.w);
  a.recv_x = d.recv_x;
  a.recv_scales = g.nb ? d.recv_scales : nullptr;
  a.recv_topk_idx = d.recv_idx;
  a.recv_topk_weights = c.weights ? d.recv_w : nullptr;
  a.recv_tokens_per_expert = d.tpe;
  int64_t host_num_recv = -1;
  if (capacity) {
    a.flags = EP_DISPATCH_NO_HOST_SYNC;
    a.num_recv = d.num_recv;
  } else {
    a.num_recv = c.fewer_outputs ? nullptr : &host_num_recv;
  }
  if (c.fewer_outputs) a.recv_topk_idx = nullptr, a.recv_topk_weights = nullptr, a.recv_tokens_per_expert = nullptr;
  // Strided inputs: the same rows, copied row_pad bytes apart into buffers
  // whose padding is garbage; the outputs must not change.
  void *x_pad = nullptr, *x2_pad = nullptr, *y_pad = nullptr;
  auto padded = [&](const void* packed, size_t row, size_t rows, void** out) {
    const size_t pitch = row + size_t(c.row_pad);
    CK(cudaMalloc(out, std::max<size_t>(pitch * rows, 16)));
    CK(cudaMemsetAsync(*out, 0x5a, pitch * rows, s));
    if (rows) CK(cudaMemcpy2DAsync(*out, pitch, packed, row, row, rows, cudaMemcpyDeviceToDevice, s));
  };
  if (c.row_pad) {
    padded(d.x, g.drow, size_t(c.T[r]), &x_pad);
    padded(d.x2, g.drow, size_t(c.T[r]), &x2_pad);
    padded(d.y, g.crow, size_t(g.cap), &y_pad);
    a.x = x_pad;
    a.x_stride = g.drow + size_t(c.row_pad);
  }
  epHandle_t h = nullptr;
  EK(comm, epDispatch(comm, &a, &h, s));
  if (!capacity && c.fewer_outputs) EK(comm, epHandleRecvCount(h, &host_num_recv));
  epCombineArgs_t ca = EP_COMBINE_ARGS_INITIALIZER;
  ca.flags = c.deterministic ? EP_COMBINE_DETERMINISTIC : 0u;
  ca.y = c.row_pad ? y_pad : d.y;
  ca.y_stride = c.row_pad ? g.crow + size_t(c.row_pad) : 0;
  ca.y_type = c.ct;
  ca.recv_topk_weights = c.weights && !c.fewer_outputs ? d.recv_w : nullptr;
  ca.num_topk = c.kOf(r);
  ca.bias = c.bias ? d.bias : nullptr;
  ca.out = d.out;
  ca.out_topk_weights = c.weights && !c.fewer_outputs ? d.out_w : nullptr;
  EK(comm, epCombine(comm, &ca, h, s));
  a.x = c.row_pad ? x2_pad : d.x2;
  a.x_scales = g.nb ? d.scales2 : nullptr;
  a.topk_weights = c.weights ? d.w2 : nullptr;
  a.recv_x = d.recv_x2;
  a.recv_scales = g.nb ? d.recv_scales2 : nullptr;
  a.recv_topk_idx = d.recv_idx2;
  a.recv_topk_weights = c.weights ? d.recv_w2 : nullptr;
  a.recv_tokens_per_expert = d.tpe2;
  if (c.fewer_outputs) a.recv_topk_idx = nullptr, a.recv_topk_weights = nullptr, a.recv_tokens_per_expert = nullptr;
  if (r == c.cached_without_ids) a.topk_idx = nullptr, a.topk_weights = nullptr;
  EK(comm, epDispatch(comm, &a, &h, s));
  CK(cudaStreamSynchronize(s));
  RankOut& o = *out;
  o.num_recv = capacity ? download<int64_t>(d.num_recv, 1)[0] : host_num_recv;
  const int T = c.T[r];
  o.recv_x = download<uint8_t>(d.recv_x, size_t(g.cap) * g.drow);
  o.recv_x2 = download<uint8_t>(d.recv_x2, size_t(g.cap) * g.drow);
  o.scales2 = download<float>(d.recv_scales2, size_t(g.cap) * g.nb);
  o.idx2 = download<int64_t>(d.recv_idx2, size_t(g.cap) * c.kOf(r));
  o.w2 = download<float>(d.recv_w2, size_t(g.cap) * c.kOf(r));
  o.tpe2 = download<int>(d.tpe2, g.EL);
  o.scales = download<float>(d.recv_scales, size_t(g.cap) * g.nb);
  o.idx = download<int64_t>(d.recv_idx, size_t(g.cap) * c.kOf(r));
  o.w = download<float>(d.recv_w, size_t(g.cap) * c.kOf(r));
  o.tpe = download<int>(d.tpe, g.EL);
  o.out = download<uint8_t>(d.out, size_t(T) * g.crow);
  o.out_w = download<float>(d.out_w, size_t(T) * c.kOf(r));
  o.tpr = download<int>(d.tpr, c.R);
  o.tpn = download<int>(d.tpn, c.R);
  o.tpexp = download<int>(d.tpexp, c.E);
  o.in_rank = download<uint8_t>(d.in_rank, size_t(T) * c.R);
  EK(comm, epHandleDestroy(h));
  freeDev(&d);
  for (void* p : {x_pad, x2_pad, y_pad}) cudaFree(p);
  CK(cudaStreamDestroy(s));
}

// Every output of rank r's GPU run (o) against the reference (e), bit for bit;
// each difference printed and counted in g_failures.
inline void compareRank(const Case& c, const std::string& cname, int r, const RankOut& o, const RankOut& e,
                        bool capacity) {
  const Geometry g = geometryOf(c);
  const int T = c.T[r];
  (void)capacity;  // unused rows are marked with either sizing
  if (o.num_recv != e.num_recv) {
    printf("  FAIL %s rank %d num_recv gpu %lld host %lld\n", cname.c_str(), r, (long long)o.num_recv,
           (long long)e.num_recv);
    g_failures++;
    return;
  }
  const size_t n = size_t(e.num_recv);
  // The nodes the library counts: EP_NODE_SIZE ranks each (the staged path
  // and the node limit's fake nodes), else one.
  const char* node_size = getenv("EP_NODE_SIZE");
  const int per_node = node_size != nullptr && atoi(node_size) > 0 ? atoi(node_size) : c.R;
  const int nnodes = (c.R + per_node - 1) / per_node;
  same("layout tokens_per_rank", cname, r, o.tpr.data(), e.tpr.data(), c.R * 4, 4);
  same("layout tokens_per_node", cname, r, o.tpn.data(), e.tpn.data(), nnodes * 4, 4);
  same("layout tokens_per_expert", cname, r, o.tpexp.data(), e.tpexp.data(), c.E * 4, 4);
  same("layout is_token_in_rank", cname, r, o.in_rank.data(), e.in_rank.data(), size_t(T) * c.R, 1);
  same("recv_x", cname, r, o.recv_x.data(), e.recv_x.data(), n * g.drow, std::min<size_t>(typeSize(c.dt), 4));
  same("recv_scales", cname, r, o.scales.data(), e.scales.data(), n * g.nb * 4, 4);
  same("combine out", cname, r, o.out.data(), e.out.data(), T * g.crow, typeSize(c.ct));
  same("cached recv_x", cname, r, o.recv_x2.data(), e.recv_x2.data(), n * g.drow, std::min<size_t>(typeSize(c.dt), 4));
  same("cached recv_scales", cname, r, o.scales2.data(), e.scales2.data(), n * g.nb * 4, 4);
  if (c.fewer_outputs) return;  // the outputs below were not asked for
  same("recv_topk_idx", cname, r, o.idx.data(), e.idx.data(), n * c.kOf(r) * 8, 8);
  if (c.weights) same("recv_topk_weights", cname, r, o.w.data(), e.w.data(), n * c.kOf(r) * 4, 4);
  same("recv_tokens_per_expert", cname, r, o.tpe.data(), e.tpe.data(), g.EL * 4, 4);
  if (c.weights) same("combine out_topk_weights", cname, r, o.out_w.data(), e.out_w.data(), size_t(T) * c.kOf(r) * 4, 4);
  same("cached recv_topk_idx", cname, r, o.idx2.data(), e.idx2.data(), n * c.kOf(r) * 8, 8);
  if (c.weights) same("cached recv_topk_weights", cname, r, o.w2.data(), e.w2.data(), n * c.kOf(r) * 4, 4);
  same("cached recv_tokens_per_expert", cname, r, o.tpe2.data(), e.tpe2.data(), g.EL * 4, 4);
  // Either sizing: recv_capacity is the tokens of every rank, more than most receive.
  std::vector<int64_t> minus(size_t(g.cap - n) * c.kOf(r), -1);
  same("unused rows recv_topk_idx = -1", cname, r, o.idx.data() + n * c.kOf(r), minus.data(), minus.size() * 8, 8);
}

}  // namespace ht

// ---- Low-latency cases (config.low_latency = 1): the outputs of the CUDA
// backend against the host backend on the same random inputs, element by element.
namespace ll {

struct Shape {
  int hidden, topk, experts, max_tokens;
  std::vector<int> tokens;  // per rank
  bool fp8, pow2, split;
  // Repeated experts: every token lists expert 1 as its first two entries,
  // every fourth token as all of them (expert 1 full at T = M: each token once).
  bool repeats = false;
  // Calls with fewer top-k columns than config.max_topk: the config's bound
  // (0: topk) and each rank's num_topk (empty: topk on every rank).
  int config_topk = 0;
  std::vector<int> topk_of;
  int maxTopk() const { return config_topk ? config_topk : topk; }
  int kOf(int r) const { return topk_of.empty() ? topk : topk_of[r]; }
  // The optional arguments: 32-bit expert ids, no weights (each 1), no recv_src.
  bool idx32 = false, no_weights = false, no_src = false;
};

struct RankData {
  std::vector<uint16_t> x;
  std::vector<int64_t> topk;
  std::vector<int32_t> topk32;  // the same ids, for Shape::idx32
  std::vector<float> w;
  std::vector<uint16_t> y;  // [L, R*M, H]
};

struct Outputs {
  std::vector<uint8_t> recv_x;
  std::vector<float> recv_scales;
  std::vector<int> recv_count, recv_src;
  std::vector<uint16_t> out;
};

inline epConfig_t configFor(const Shape& s, epBackend_t backend) {
  epConfig_t c = EP_CONFIG_INITIALIZER;
  c.num_experts = s.experts;
  c.hidden = s.hidden;
  c.max_tokens_per_rank = s.max_tokens;
  c.max_topk = s.maxTopk();
  c.backend = backend;
  c.low_latency = 1;
  c.timeout_ms = 20000;
  return c;
}

// Rank r's inputs: a function of (seed, r) alone, so that a rank that is a
// process of its own makes its inputs without the other ranks'.
inline void randomInputs(const Shape& s, int R, uint64_t seed, int r, RankData* d) {
  const int L = s.experts / R;
  const size_t cap = size_t(R) * s.max_tokens;
  std::mt19937_64 g(seed * 131 + r);
  d->x.resize(size_t(std::max(s.tokens[r], 1)) * s.hidden);
  fillRandomRow(g, epBfloat16, d->x.data(), d->x.size());
  for (size_t i = 0; i < d->x.size(); i += 97) d->x[i] = toBf16Bits(float(int(g() % 2001) - 1000));  // outliers
  const int K = s.kOf(r);
  randomTopk(g, s.tokens[r], K, s.experts, 0.05, &d->topk);
  if (s.repeats)
    for (int t = 0; t < s.tokens[r]; t++)
      for (int k = 0; k < (t % 4 == 0 ? K : std::min(2, K)); k++) d->topk[size_t(t) * K + k] = 1;
  d->topk32.assign(d->topk.begin(), d->topk.end());
  d->w.resize(size_t(s.tokens[r]) * K);
  std::uniform_real_distribution<float> u(0, 1);
  for (float& f : d->w) f = u(g);
  d->y.resize(size_t(L) * cap * s.hidden);
  fillRandomBf16Fast(g(), d->y.data(), d->y.size());
}

// Rank r's part of the reference: dispatch + combine on comm (the host
// backend). Collective: every rank of comm calls it, each from its own thread
// or process. Returns the first error (a test that expects one: a peer died).
inline epResult_t runHostLayer(const Shape& s, int R, int r, epComm_t comm, const RankData& in, Outputs* o) {
  const int L = s.experts / R, H = s.hidden, nb = (H + 127) / 128;
  const size_t cap = size_t(R) * s.max_tokens, row = s.fp8 ? H : 2 * H;
  o->recv_x.assign(L * cap * row, 0);
  o->recv_scales.assign(L * nb * cap, 0);
  o->recv_count.assign(L, 0);
  o->recv_src.assign(L * cap, -1);
  o->out.assign(size_t(std::max(s.tokens[r], 1)) * H, 0);
  epLowLatencyDispatchArgs_t a = EP_LL_DISPATCH_ARGS_INITIALIZER;
  a.flags = s.pow2 ? EP_LL_ROUND_SCALE_POW2 : 0;
  a.x = in.x.data();
  a.topk_idx = s.idx32 ? (const void*)in.topk32.data() : (const void*)in.topk.data();
  a.topk_idx_type = s.idx32 ? epInt32 : epInt64;
  a.topk_weights = s.no_weights ? nullptr : in.w.data();
  a.num_tokens = s.tokens[r];
  a.num_topk = s.kOf(r);
  a.wire_type = s.fp8 ? epFloat8E4M3 : epBfloat16;
  a.recv_x = o->recv_x.data();
  a.recv_scales = o->recv_scales.data();
  a.recv_count = o->recv_count.data();
  a.recv_src = s.no_src ? nullptr : o->recv_src.data();
  epHandle_t h = nullptr;
  epResult_t res = epLowLatencyDispatch(comm, &a, &h, nullptr);
  if (res == epSuccess) {
    epLowLatencyCombineArgs_t c = EP_LL_COMBINE_ARGS_INITIALIZER;
    c.y = in.y.data();
    c.out = o->out.data();
    res = epLowLatencyCombine(comm, &c, h, nullptr);
  }
  if (h != nullptr) {
    const epResult_t d = epHandleDestroy(h);
    if (res == epSuccess) res = d;
  }
  return res;
}

// runHostLayer where every call must succeed.
inline void runHost(const Shape& s, int R, int r, epComm_t comm, const RankData& in, Outputs* o) {
  EK(comm, runHostLayer(s, R, r, comm, in, o));
}

struct GpuRank {
  epComm_t comm;
  cudaStream_t stream;
  uint16_t *x, *y, *out;
  int64_t* topk;
  float *w, *recv_scales, *scratch;  // scratch: for the other work between split halves
  uint8_t* recv_x;
  int *recv_count, *recv_src;
};

// A rank's stream and buffers on the current device, scratch_bytes of scratch.
inline void allocRank(const Shape& s, int R, GpuRank& g, size_t scratch_bytes) {
  const int L = s.experts / R, H = s.hidden, nb = (H + 127) / 128, M = s.max_tokens;
  const size_t cap = size_t(R) * M;
  CK(cudaStreamCreateWithFlags(&g.stream, cudaStreamNonBlocking));
  CK(cudaMalloc(&g.x, size_t(M) * H * 2 + 16));
  CK(cudaMalloc(&g.topk, size_t(M) * s.maxTopk() * 8 + 8));
  CK(cudaMalloc(&g.w, size_t(M) * s.maxTopk() * 4 + 4));
  CK(cudaMalloc(&g.y, size_t(L) * cap * H * 2));
  CK(cudaMalloc(&g.out, size_t(M) * H * 2 + 16));
  CK(cudaMalloc(&g.recv_x, size_t(L) * cap * H * 2));
  CK(cudaMalloc(&g.recv_scales, size_t(L) * nb * cap * 4));
  CK(cudaMalloc(&g.recv_count, L * 4));
  CK(cudaMalloc(&g.recv_src, size_t(L) * cap * 4));
  CK(cudaMalloc(&g.scratch, scratch_bytes));
}

inline void freeRank(GpuRank& g) {
  for (void* p : {(void*)g.x, (void*)g.topk, (void*)g.w, (void*)g.y, (void*)g.out, (void*)g.recv_x,
                  (void*)g.recv_scales, (void*)g.recv_count, (void*)g.recv_src, (void*)g.scratch})
    CK(cudaFree(p));
  CK(cudaStreamDestroy(g.stream));
}

inline void upload(const Shape& s, int r, const RankData& d, GpuRank& g) {
  CK(cudaMemcpyAsync(g.x, d.x.data(), d.x.size() * 2, cudaMemcpyHostToDevice, g.stream));
  if (!d.topk.empty()) {
    if (s.idx32)
      CK(cudaMemcpyAsync(g.topk, d.topk32.data(), d.topk32.size() * 4, cudaMemcpyHostToDevice, g.stream));
    else
      CK(cudaMemcpyAsync(g.topk, d.topk.data(), d.topk.size() * 8, cudaMemcpyHostToDevice, g.stream));
    CK(cudaMemcpyAsync(g.w, d.w.data(), d.w.size() * 4, cudaMemcpyHostToDevice, g.stream));
  }
  CK(cudaMemcpyAsync(g.y, d.y.data(), d.y.size() * 2, cudaMemcpyHostToDevice, g.stream));
  (void)r;
}

// Outputs poisoned, so that what a run leaves unwritten shows.
inline void poison(const Shape& s, int R, GpuRank& g) {
  const size_t L = size_t(s.experts / R), cap = size_t(R) * s.max_tokens, nb = (s.hidden + 127) / 128;
  CK(cudaMemsetAsync(g.out, 0xff, size_t(s.max_tokens) * s.hidden * 2, g.stream));
  CK(cudaMemsetAsync(g.recv_x, 0xee, L * cap * s.hidden * 2, g.stream));
  CK(cudaMemsetAsync(g.recv_count, 0xdd, L * 4, g.stream));
  CK(cudaMemsetAsync(g.recv_src, 0xdd, L * cap * 4, g.stream));
  CK(cudaMemsetAsync(g.recv_scales, 0xdd, L * nb * cap * 4, g.stream));
}

// The dispatch of rank r's inputs in g as shape s asks (wire type, scales, split).
inline epLowLatencyDispatchArgs_t dispatchArgs(const Shape& s, int r, const GpuRank& g) {
  epLowLatencyDispatchArgs_t a = EP_LL_DISPATCH_ARGS_INITIALIZER;
  a.flags = (s.pow2 ? EP_LL_ROUND_SCALE_POW2 : 0u) | (s.split ? EP_LL_SEND_ONLY : 0u);
  a.x = g.x;
  a.topk_idx = g.topk;
  a.topk_idx_type = s.idx32 ? epInt32 : epInt64;
  a.topk_weights = s.no_weights ? nullptr : g.w;
  a.num_tokens = s.tokens[r];
  a.num_topk = s.kOf(r);
  a.wire_type = s.fp8 ? epFloat8E4M3 : epBfloat16;
  a.recv_x = g.recv_x;
  a.recv_scales = g.recv_scales;
  a.recv_count = g.recv_count;
  a.recv_src = s.no_src ? nullptr : g.recv_src;
  return a;
}

// The combine of g's expert outputs into g's output (flags: EP_LL_SEND_ONLY or 0).
inline epLowLatencyCombineArgs_t combineArgs(const GpuRank& g, unsigned flags = 0) {
  epLowLatencyCombineArgs_t c = EP_LL_COMBINE_ARGS_INITIALIZER;
  c.flags = flags;
  c.y = g.y;
  c.out = g.out;
  return c;
}

// Enqueues one dispatch + combine; with s.split, the halves are split by other
// work, which between(0) (after the dispatch's send half) and between(1) (after
// the combine's) enqueue on g.stream.
inline void enqueueLayer(const Shape& s, int r, GpuRank& g, epHandle_t* h, const std::function<void(int)>& between) {
  epLowLatencyDispatchArgs_t a = dispatchArgs(s, r, g);
  EK(g.comm, epLowLatencyDispatch(g.comm, &a, h, g.stream));
  if (s.split) {
    between(0);
    EK(g.comm, epLowLatencyComplete(g.comm, *h, g.stream));
  }
  epLowLatencyCombineArgs_t c = combineArgs(g, s.split ? EP_LL_SEND_ONLY : 0u);
  EK(g.comm, epLowLatencyCombine(g.comm, &c, *h, g.stream));
  if (s.split) {
    between(1);
    EK(g.comm, epLowLatencyComplete(g.comm, *h, g.stream));
  }
}

// Rank r's device outputs against the host reference, everything exact:
// counts; source, bytes and FP8 scales of each valid row; the combine output;
// the first differing element of a row named. Returns the mismatches; prints
// the first few.
inline long long compare(const Shape& s, int R, int r, GpuRank& g, const Outputs& ref, const std::string& what) {
  const int L = s.experts / R, H = s.hidden, nb = (H + 127) / 128, M = s.max_tokens;
  const size_t cap = size_t(R) * M, row = s.fp8 ? H : 2 * H, esize = s.fp8 ? 1 : 2;
  std::vector<int> count(L), src(L * cap);
  std::vector<uint8_t> rx(L * cap * row);
  std::vector<float> sc(L * nb * cap);
  std::vector<uint16_t> out(size_t(std::max(s.tokens[r], 1)) * H);
  CK(cudaStreamSynchronize(g.stream));
  CK(cudaMemcpy(count.data(), g.recv_count, L * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(src.data(), g.recv_src, src.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(rx.data(), g.recv_x, rx.size(), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(sc.data(), g.recv_scales, sc.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(out.data(), g.out, size_t(s.tokens[r]) * H * 2, cudaMemcpyDeviceToHost));
  const char* w = what.c_str();
  long long bad = 0;
  for (int e = 0; e < L; e++) {
    if (count[e] != ref.recv_count[e]) {
      if (bad++ < 3) printf("  FAIL %s rank %d recv_count[%d]: expected %d, got %d\n", w, r, e, ref.recv_count[e], count[e]);
      continue;
    }
    for (int i = 0; i < count[e]; i++) {
      const size_t k = size_t(e) * cap + i;
      if (!s.no_src && src[k] != ref.recv_src[k] && bad++ < 3)
        printf("  FAIL %s rank %d recv_src[%d][%d]: expected %d, got %d\n", w, r, e, i, ref.recv_src[k], src[k]);
      const uint8_t *a = &rx[k * row], *b = &ref.recv_x[k * row];
      if (memcmp(a, b, row) != 0 && bad++ < 3) {
        size_t j = 0;
        while (a[j] == b[j]) j++;
        j /= esize;
        unsigned want = esize == 1 ? b[j] : unsigned(b[2 * j]) | unsigned(b[2 * j + 1]) << 8;
        unsigned got = esize == 1 ? a[j] : unsigned(a[2 * j]) | unsigned(a[2 * j + 1]) << 8;
        printf("  FAIL %s rank %d recv_x[%d][%d][%zu]: expected 0x%0*x, got 0x%0*x\n", w, r, e, i, j, int(2 * esize),
               want, int(2 * esize), got);
      }
      if (s.fp8)
        for (int b = 0; b < nb; b++) {
          const size_t q = (size_t(e) * nb + b) * cap + i;
          if (sc[q] != ref.recv_scales[q] && bad++ < 3)
            printf("  FAIL %s rank %d recv_scales[%d][%d][%d]: expected %.9g, got %.9g\n", w, r, e, b, i,
                   ref.recv_scales[q], sc[q]);
        }
    }
  }
  for (size_t i = 0; i < size_t(s.tokens[r]) * H; i++)
    if (out[i] != ref.out[i] && bad++ < 3)
      printf("  FAIL %s rank %d combine out[%zu][%zu]: expected 0x%04x, got 0x%04x\n", w, r, i / H, i % H, ref.out[i],
             out[i]);
  if (bad > 3) printf("  FAIL %s rank %d: %lld mismatches in all\n", w, r, bad);
  return bad;
}

// The nearest-rank percentile: the smallest value with at least q of the
// sample at or below it (p99 of 99 calls is their largest).
inline double percentile(std::vector<float> v, double q) {
  std::sort(v.begin(), v.end());
  const size_t rank = size_t(std::ceil(q * double(v.size())));
  return v[std::min(v.size() - 1, rank > 0 ? rank - 1 : 0)];
}

// GPU_LL_BENCH_MAX_TOKENS=M: the communicator's max_tokens_per_rank (default
// 128, at least the call's tokens). It moves every landing region's address,
// so it shows whether a figure depends on where the rows land.
inline int benchMaxTokens(int tokens) {
  const char* env = getenv("GPU_LL_BENCH_MAX_TOKENS");
  const int m = env ? atoi(env) : 128;
  return std::max(m > 0 ? m : 128, tokens);
}

// Latency of dispatch and combine inside one CUDA graph of `layers` layers
// (EP R on GPUs 0..R-1, benchMaxTokens(tokens) max tokens, hidden 7168, top-8 of
// 288, FP8 wire, `tokens` per rank). Prints, per rank, per-call medians and p99 (events around
// each call), the replay time per layer of a graph without events, DeepEP's
// accounting (bytes of (token, expert) pairs) and the physical bytes: one
// record per (token, destination rank) for dispatch; for combine one float32
// row per (token, rank), or with more than two ranks a BF16 row and a 16-byte
// head where the rank holds one of the token's entries; counted for the other
// ranks only (over NVLink).
// per_rank: tokens of each rank (ranks of different batch sizes: small ones
// send flagged records beside large plain ones); empty: `tokens` on every rank.
inline void bench(int R, int tokens, bool split, std::vector<int> per_rank = {}) {
  if (per_rank.empty()) per_rank.assign(R, tokens);
  tokens = *std::max_element(per_rank.begin(), per_rank.end());
  Shape s{7168, 8, 288, benchMaxTokens(tokens), per_rank, true, false, split};
  std::vector<RankData> in(R);
  std::vector<GpuRank> g(R);
  std::vector<epComm_t> comms(R);
  epConfig_t cfg = configFor(s, epBackendCuda);
  EK(nullptr, epCommInitAll(comms.data(), R, gpusOf(R).data(), &cfg));
  for (int r = 0; r < R; r++) randomInputs(s, R, 99, r, &in[r]);
  const int layers = 100;
  std::vector<std::vector<float>> t_disp(R), t_comb(R), t_send(R), t_recv(R);
  std::vector<float> t_layer(R);
  runRanks(R, [&](int r) {
    CK(cudaSetDevice(gpuOf(r)));
    g[r].comm = comms[r];
    allocRank(s, R, g[r], 64 << 20);
    upload(s, r, in[r], g[r]);
    std::vector<cudaEvent_t> ev(4 * layers + 1);
    for (auto& e : ev) CK(cudaEventCreate(&e));
    std::vector<epHandle_t> hs(layers, nullptr);
    // Eager warm-up with all handles alive at once: the handle pool grows to
    // `layers` here, so the capture below allocates nothing.
    for (int l = 0; l < layers; l++) {
      epLowLatencyDispatchArgs_t a = dispatchArgs(s, r, g[r]);
      a.flags = 0;  // unsplit: the combine follows directly
      EK(comms[r], epLowLatencyDispatch(comms[r], &a, &hs[l], g[r].stream));
      epLowLatencyCombineArgs_t c = combineArgs(g[r]);
      EK(comms[r], epLowLatencyCombine(comms[r], &c, hs[l], g[r].stream));
    }
    CK(cudaStreamSynchronize(g[r].stream));
    for (auto& h : hs) {
      epHandleDestroy(h);
      h = nullptr;
    }
    // Two graphs of `layers` layers: one with an event around every call (per-call
    // latency, event nodes included), one without (replay time / layers).
    auto capture = [&](bool events) {
      cudaGraph_t graph_def;
      cudaGraphExec_t exec;
      auto mark = [&](int i) {
        if (events) CK(cudaEventRecordWithFlags(ev[i], g[r].stream, cudaEventRecordExternal));
      };
      CK(cudaStreamBeginCapture(g[r].stream, cudaStreamCaptureModeThreadLocal));
      for (int l = 0; l < layers; l++) {
        epLowLatencyDispatchArgs_t a = dispatchArgs(s, r, g[r]);  // EP_LL_SEND_ONLY when split
        mark(4 * l);
        EK(comms[r], epLowLatencyDispatch(comms[r], &a, &hs[l], g[r].stream));
        mark(4 * l + 1);
        if (split) EK(comms[r], epLowLatencyComplete(comms[r], hs[l], g[r].stream));
        mark(4 * l + 2);
        epLowLatencyCombineArgs_t c = combineArgs(g[r]);
        EK(comms[r], epLowLatencyCombine(comms[r], &c, hs[l], g[r].stream));
        mark(4 * l + 3);
      }
      mark(4 * layers);
      CK(cudaStreamEndCapture(g[r].stream, &graph_def));
      CK(cudaGraphInstantiate(&exec, graph_def, 0));
      CK(cudaGraphDestroy(graph_def));
      return exec;
    };
    cudaGraphExec_t plain = capture(false);
    cudaEvent_t t0, t1;
    CK(cudaEventCreate(&t0));
    CK(cudaEventCreate(&t1));
    for (int rep = 0; rep < 4; rep++) {  // the first replays warm up; the last is timed
      CK(cudaEventRecord(t0, g[r].stream));
      CK(cudaGraphLaunch(plain, g[r].stream));
      CK(cudaEventRecord(t1, g[r].stream));
      CK(cudaStreamSynchronize(g[r].stream));
    }
    float graph_ms = 0;
    CK(cudaEventElapsedTime(&graph_ms, t0, t1));
    t_layer[r] = graph_ms * 1000 / layers;
    CK(cudaGraphExecDestroy(plain));
    for (auto h : hs) epHandleDestroy(h);
    for (auto& h : hs) h = nullptr;
    cudaGraphExec_t exec = capture(true);
    for (int rep = 0; rep < 3; rep++) {  // the first replays warm up
      CK(cudaGraphLaunch(exec, g[r].stream));
      CK(cudaStreamSynchronize(g[r].stream));
    }
    for (int l = 1; l < layers; l++) {
      float ms;
      CK(cudaEventElapsedTime(&ms, ev[4 * l], ev[4 * l + (split ? 1 : 2)]));
      (split ? t_send[r] : t_disp[r]).push_back(ms * 1000);
      if (split) {
        CK(cudaEventElapsedTime(&ms, ev[4 * l + 1], ev[4 * l + 2]));
        t_recv[r].push_back(ms * 1000);
        CK(cudaEventElapsedTime(&ms, ev[4 * l], ev[4 * l + 2]));
        t_disp[r].push_back(ms * 1000);
      }
      CK(cudaEventElapsedTime(&ms, ev[4 * l + 2], ev[4 * l + 3]));
      t_comb[r].push_back(ms * 1000);
    }
    CK(cudaGraphExecDestroy(exec));
    for (auto h : hs) epHandleDestroy(h);
    freeRank(g[r]);
  });
  for (auto c : comms) epCommDestroy(c);
  // DeepEP's accounting: bytes of the rank's valid (token, expert) pairs (ids
  // of -1 move nothing); FP8 rows + scales for dispatch, BF16 for combine.
  const double record_bytes = double((16 + 12 * 8 + 15) / 16 * 16) + 7168 + 56 * 4;  // header, FP8 row, scales
  const int L = s.experts / R;
  double slow_d = 0, slow_c = 0, slow_layer = 0;  // the slower rank's medians
  for (int r = 0; r < R; r++) {
    const int tr = per_rank[r];
    const double pairs = double(std::count_if(in[r].topk.begin(), in[r].topk.begin() + size_t(tr) * 8,
                                              [](int64_t e) { return e >= 0; }));
    const double disp_bytes = pairs * (7168 + 56 * 4), comb_bytes = pairs * 7168 * 2;
    long long remote = 0;      // (token, destination rank other than r) pairs
    double comb_physical = 0;  // combine bytes back to r over NVLink
    for (int t = 0; t < tr; t++) {
      std::vector<int> held(R, 0);  // the token's entries per rank
      for (int k = 0; k < 8; k++) {
        const long long e = in[r].topk[size_t(t) * 8 + k];
        if (e >= 0) held[e / L]++;
      }
      for (int q = 0; q < R; q++) {
        if (q == r || held[q] == 0) continue;
        remote++;
        comb_physical += R > 2 && held[q] == 1 ? 7168.0 * 2 + 16 : 7168.0 * 4;
      }
    }
    double d = percentile(t_disp[r], 0.5), c = percentile(t_comb[r], 0.5);
    slow_d = std::max(slow_d, d);
    slow_c = std::max(slow_c, c);
    slow_layer = std::max(slow_layer, double(t_layer[r]));
    printf("LL EP%d rank %d tokens %d%s: dispatch fp8 median %.1f us p99 %.1f us (%.0f GB/s) | combine bf16 median %.1f us p99 %.1f us (%.0f GB/s)",
           R, r, tr, split ? " split" : "", d, percentile(t_disp[r], 0.99), disp_bytes / d / 1e3, c,
           percentile(t_comb[r], 0.99), comb_bytes / c / 1e3);
    if (split) printf(" | send half %.1f us, receive half %.1f us", percentile(t_send[r], 0.5), percentile(t_recv[r], 0.5));
    printf(" | graph without events: %.1f us per layer (dispatch + combine)\n", t_layer[r]);
    printf("LL EP%d rank %d tokens %d%s: physical bytes to other ranks: dispatch %.2f MB (%.0f GB/s at the median), "
           "combine %.2f MB (%.0f GB/s)\n", R, r, tr, split ? " split" : "", remote * record_bytes / 1e6,
           remote * record_bytes / d / 1e3, comb_physical / 1e6, comb_physical / c / 1e3);
  }
  printf("LL EP%d tokens %d%s: slower rank: dispatch median %.1f us, combine median %.1f us, %.1f us per layer\n", R,
         tokens, split ? " split" : "", slow_d, slow_c, slow_layer);
}

// The standard table: 128 tokens, 128 tokens with split halves, 1 token.
inline void benchStandard(int R) {
  bench(R, 128, false);
  bench(R, 128, true);
  bench(R, 1, false);
}


// A low-latency dispatch of rank r, waited for, then its combine: the result
// of the first call that failed, else the combine's (a kernel's error comes
// at the next call: the combine reports the dispatch's).
inline epResult_t syncedLayer(const Shape& s, int r, GpuRank& g, epHandle_t* h) {
  epLowLatencyDispatchArgs_t a = dispatchArgs(s, r, g);
  const epResult_t res = epLowLatencyDispatch(g.comm, &a, h, g.stream);
  if (res != epSuccess) return res;
  CK(cudaStreamSynchronize(g.stream));
  epLowLatencyCombineArgs_t ca = combineArgs(g);
  return epLowLatencyCombine(g.comm, &ca, *h, g.stream);
}

// A high-throughput dispatch and combine of rank r (exact sizing: the
// dispatch waits for the counts) into `scratch`; the result of the first call
// that failed, else of the combine. With late_ms >= 0 the dispatch is
// prepared (epDispatchPrepare: the routing kernel), then made, then combined,
// late_ms apart: the peers' dispatch and combine kernels wait that long for
// this rank.
inline epResult_t htLayer(const Shape& s, int R, int r, GpuRank& g, uint8_t* scratch, epHandle_t* h, int late_ms = -1) {
  epDispatchArgs_t a = EP_DISPATCH_ARGS_INITIALIZER;
  a.x = g.x;
  a.topk_idx = g.topk;
  a.topk_idx_type = epInt64;
  a.num_tokens = s.tokens[r];
  a.num_topk = s.kOf(r);
  a.recv_x = scratch;  // room for R * M BF16 rows
  a.recv_capacity = int64_t(R) * s.max_tokens;
  int64_t num_recv = 0;
  a.num_recv = &num_recv;
  auto pause = [&] {
    if (late_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(late_ms));
  };
  if (late_ms >= 0) {
    const epResult_t res = epDispatchPrepare(g.comm, &a, h, g.stream);
    if (res != epSuccess) return res;
    pause();
  }
  epResult_t res = epDispatch(g.comm, &a, h, g.stream);
  if (res != epSuccess) return res;
  pause();
  epCombineArgs_t ca = EP_COMBINE_ARGS_INITIALIZER;
  ca.y = scratch;
  ca.out = scratch + size_t(R) * s.max_tokens * s.hidden * 2;
  return epCombine(g.comm, &ca, *h, g.stream);
}

}  // namespace ll
