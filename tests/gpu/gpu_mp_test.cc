// GPU test with the ranks as separate processes: the cross-process path of the
// cuda_ipc transport (cudaIpcGetMemHandle / cudaIpcOpenMemHandle), which
// gpu_test and gpu_ll_test never take (their ranks are threads of one process,
// epCommInitAll, mapped by raw pointers).
//
// The parent forks one process per GPU (R = min(GPUs, 8), at least 2) through
// tools/common/launch.cc, without touching CUDA itself (the GPUs are counted in
// a short-lived child). Each rank joins, per case, a communicator on the CUDA
// backend (epCommInitRank, device = rank) and one on the host backend with the
// same config, runs the same random inputs (fixed seed per rank) on both and
// compares every output of the GPU run with the host run, bit for bit:
//   high throughput (gpu_common.h, namespace ht: the code of gpu_test): layout
//     (tokens per rank / node / expert, is_token_in_rank), dispatch with exact
//     and with capacity sizing (num_recv, recv_x, recv_scales, recv_topk_idx /
//     weights, recv_tokens_per_expert, unused rows), combine (out,
//     out_topk_weights) and a cached re-dispatch; BF16 and FP8 + scales;
//   low latency (config.low_latency = 1, the comparison of gpu_ll_test): per
//     local expert the count, then for each valid row its source, its bytes and
//     (FP8) its scales, and the combine output; FP8 and BF16 wires, split
//     halves (EP_LL_SEND_ONLY + epLowLatencyComplete), two rounds per case (both
//     buffer sets).
// Shapes: hidden 7168, top-8 of 256 experts; and hidden 2056 / 2064, top-5 of
// 8R experts, 100 + 37 r tokens on rank r (a 2056-element row is 2056 bytes in
// FP8, not a multiple of 16, so the FP8 cases of that shape use 2064).
//
//   gpu_mp_test [--timeout SECONDS]   (default 240: ranks still running are killed)
// Prints SKIPPED and exits 0 when fewer than 2 GPUs are visible; ends with
// `gpu_mp_test: N passed, M failed` (cases; a case passes when it passes on every rank).
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include "common/launch.h"
#include "gpu_common.h"

namespace {

// ---- Low latency: the inputs, runs and comparison of gpu_ll_test.cc, for one rank.
namespace ll {

struct Shape {
  int hidden, topk, experts, max_tokens;
  std::vector<int> tokens;  // per rank
  bool fp8, pow2, split;
};

struct RankData {
  std::vector<uint16_t> x;
  std::vector<int64_t> topk;
  std::vector<float> w;
  std::vector<uint16_t> y;  // [L, R*M, H]
};

struct Outputs {
  std::vector<uint8_t> recv_x;
  std::vector<float> recv_scales;
  std::vector<int> recv_count, recv_src;
  std::vector<uint16_t> out;
};

epConfig_t configFor(const Shape& s, epBackend_t backend) {
  epConfig_t c = EP_CONFIG_INITIALIZER;
  c.num_experts = s.experts;
  c.hidden = s.hidden;
  c.max_tokens_per_rank = s.max_tokens;
  c.max_topk = s.topk;
  c.backend = backend;
  c.low_latency = 1;
  c.timeout_ms = 20000;
  return c;
}

// Rank r's inputs, as gpu_ll_test's randomInputs makes them.
void randomInputs(const Shape& s, int R, uint64_t seed, int r, RankData* d) {
  const int L = s.experts / R;
  const size_t cap = size_t(R) * s.max_tokens;
  std::mt19937_64 g(seed * 131 + r);
  d->x.resize(size_t(std::max(s.tokens[r], 1)) * s.hidden);
  fillRandomRow(g, epBfloat16, d->x.data(), d->x.size());
  for (size_t i = 0; i < d->x.size(); i += 97) d->x[i] = toBf16Bits(float(int(g() % 2001) - 1000));  // outliers
  randomTopk(g, s.tokens[r], s.topk, s.experts, 0.05, &d->topk);
  d->w.resize(size_t(s.tokens[r]) * s.topk);
  std::uniform_real_distribution<float> u(0, 1);
  for (float& f : d->w) f = u(g);
  d->y.resize(size_t(L) * cap * s.hidden);
  fillRandomRow(g, epBfloat16, d->y.data(), d->y.size());
}

// The reference: dispatch + combine on the host backend.
void runHost(const Shape& s, int R, int r, epComm_t comm, const RankData& in, Outputs* o) {
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
  a.topk_idx = in.topk.data();
  a.topk_weights = in.w.data();
  a.num_tokens = s.tokens[r];
  a.num_topk = s.topk;
  a.wire_type = s.fp8 ? epFloat8E4M3 : epBfloat16;
  a.recv_x = o->recv_x.data();
  a.recv_scales = o->recv_scales.data();
  a.recv_count = o->recv_count.data();
  a.recv_src = o->recv_src.data();
  epHandle_t h = nullptr;
  EK(comm, epLowLatencyDispatch(comm, &a, &h, nullptr));
  epLowLatencyCombineArgs_t c = EP_LL_COMBINE_ARGS_INITIALIZER;
  c.y = in.y.data();
  c.out = o->out.data();
  EK(comm, epLowLatencyCombine(comm, &c, h, nullptr));
  EK(comm, epHandleDestroy(h));
}

struct GpuRank {
  epComm_t comm;
  cudaStream_t stream;
  uint16_t *x, *y, *out;
  int64_t* topk;
  float *w, *recv_scales;
  uint8_t *recv_x, *scratch;
  int *recv_count, *recv_src;
};

const size_t kScratchBytes = 16 << 20;

void allocRank(const Shape& s, int R, GpuRank& g) {
  const int L = s.experts / R, H = s.hidden, nb = (H + 127) / 128, M = s.max_tokens;
  const size_t cap = size_t(R) * M;
  CK(cudaStreamCreateWithFlags(&g.stream, cudaStreamNonBlocking));
  CK(cudaMalloc(&g.x, size_t(M) * H * 2 + 16));
  CK(cudaMalloc(&g.topk, size_t(M) * s.topk * 8 + 8));
  CK(cudaMalloc(&g.w, size_t(M) * s.topk * 4 + 4));
  CK(cudaMalloc(&g.y, size_t(L) * cap * H * 2));
  CK(cudaMalloc(&g.out, size_t(M) * H * 2 + 16));
  CK(cudaMalloc(&g.recv_x, size_t(L) * cap * H * 2));
  CK(cudaMalloc(&g.recv_scales, size_t(L) * nb * cap * 4));
  CK(cudaMalloc(&g.recv_count, L * 4));
  CK(cudaMalloc(&g.recv_src, size_t(L) * cap * 4));
  CK(cudaMalloc(&g.scratch, kScratchBytes));
}

void freeRank(GpuRank& g) {
  for (void* p : {(void*)g.x, (void*)g.topk, (void*)g.w, (void*)g.y, (void*)g.out, (void*)g.recv_x,
                  (void*)g.recv_scales, (void*)g.recv_count, (void*)g.recv_src, (void*)g.scratch})
    CK(cudaFree(p));
  CK(cudaStreamDestroy(g.stream));
}

// Inputs up, outputs poisoned, one dispatch + combine (halves split by other
// work on the stream when asked), then wait.
void runGpu(const Shape& s, int R, int r, const RankData& d, GpuRank& g) {
  CK(cudaMemcpyAsync(g.x, d.x.data(), d.x.size() * 2, cudaMemcpyHostToDevice, g.stream));
  if (!d.topk.empty()) {
    CK(cudaMemcpyAsync(g.topk, d.topk.data(), d.topk.size() * 8, cudaMemcpyHostToDevice, g.stream));
    CK(cudaMemcpyAsync(g.w, d.w.data(), d.w.size() * 4, cudaMemcpyHostToDevice, g.stream));
  }
  CK(cudaMemcpyAsync(g.y, d.y.data(), d.y.size() * 2, cudaMemcpyHostToDevice, g.stream));
  CK(cudaMemsetAsync(g.out, 0xff, size_t(s.max_tokens) * s.hidden * 2, g.stream));
  CK(cudaMemsetAsync(g.recv_x, 0xee, size_t(s.experts / R) * R * s.max_tokens * s.hidden * 2, g.stream));
  epLowLatencyDispatchArgs_t a = EP_LL_DISPATCH_ARGS_INITIALIZER;
  a.flags = (s.pow2 ? EP_LL_ROUND_SCALE_POW2 : 0u) | (s.split ? EP_LL_SEND_ONLY : 0u);
  a.x = g.x;
  a.topk_idx = g.topk;
  a.topk_weights = g.w;
  a.num_tokens = s.tokens[r];
  a.num_topk = s.topk;
  a.wire_type = s.fp8 ? epFloat8E4M3 : epBfloat16;
  a.recv_x = g.recv_x;
  a.recv_scales = g.recv_scales;
  a.recv_count = g.recv_count;
  a.recv_src = g.recv_src;
  epHandle_t h = nullptr;
  EK(g.comm, epLowLatencyDispatch(g.comm, &a, &h, g.stream));
  if (s.split) {
    CK(cudaMemsetAsync(g.scratch, 0x11, kScratchBytes, g.stream));
    EK(g.comm, epLowLatencyComplete(g.comm, h, g.stream));
  }
  epLowLatencyCombineArgs_t c = EP_LL_COMBINE_ARGS_INITIALIZER;
  c.flags = s.split ? EP_LL_SEND_ONLY : 0u;
  c.y = g.y;
  c.out = g.out;
  EK(g.comm, epLowLatencyCombine(g.comm, &c, h, g.stream));
  if (s.split) {
    CK(cudaMemsetAsync(g.scratch, 0x22, kScratchBytes, g.stream));
    EK(g.comm, epLowLatencyComplete(g.comm, h, g.stream));
  }
  CK(cudaStreamSynchronize(g.stream));
  EK(g.comm, epHandleDestroy(h));
}

// gpu_ll_test's comparison (everything exact: counts; source, bytes and FP8
// scales of each valid row; the combine output), with the first differing
// element of a row named. Returns the mismatches; prints the first few.
long long compare(const Shape& s, int R, int r, GpuRank& g, const Outputs& ref, const std::string& what) {
  const int L = s.experts / R, H = s.hidden, nb = (H + 127) / 128, M = s.max_tokens;
  const size_t cap = size_t(R) * M, row = s.fp8 ? H : 2 * H, esize = s.fp8 ? 1 : 2;
  std::vector<int> count(L), src(L * cap);
  std::vector<uint8_t> rx(L * cap * row);
  std::vector<float> sc(L * nb * cap);
  std::vector<uint16_t> out(size_t(std::max(s.tokens[r], 1)) * H);
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
      if (src[k] != ref.recv_src[k] && bad++ < 3)
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

}  // namespace ll

struct MpCase {
  std::string name;
  bool low_latency;
  ht::Case ht;   // !low_latency
  ll::Shape ll;  // low_latency
};

std::vector<MpCase> makeCases(int R) {
  std::vector<int> t_big(R), t_odd(R), t_ll(R);
  for (int r = 0; r < R; r++) {
    t_big[r] = 1024 - 96 * r;
    t_odd[r] = 100 + 37 * r;
    t_ll[r] = 128 - 9 * r;
  }
  const int odd_max = t_odd[R - 1];
  std::vector<MpCase> cases;
  auto addHt = [&](const ht::Case& c) { cases.push_back({c.name, false, c, ll::Shape{}}); };
  auto addLl = [&](const std::string& name, const ll::Shape& s) { cases.push_back({name, true, ht::Case{}, s}); };
  const std::string ep = "EP" + std::to_string(R) + " ";

  ht::Case c{ep + "bf16 h7168 k8 e256", R, 7168, 8, 256, t_big};
  addHt(c);
  c.name = ep + "fp8 h7168 k8 e256";
  c.dt = epFloat8E4M3;
  addHt(c);
  addLl(ep + "LL fp8 h7168 k8 e256", {7168, 8, 256, 128, t_ll, true, false, false});
  addLl(ep + "LL bf16 h7168 k8 e256 split", {7168, 8, 256, 128, t_ll, false, false, true});

  c = ht::Case{ep + "bf16 h2056 k5 e" + std::to_string(8 * R) + " neg bias align4", R, 2056, 5, 8 * R, t_odd};
  c.neg = 0.1;
  c.bias = true;
  c.align = 4;
  addHt(c);
  addLl(ep + "LL bf16 h2056 k5 e" + std::to_string(8 * R), {2056, 5, 8 * R, odd_max, t_odd, false, false, false});
  c = ht::Case{ep + "fp8 h2064 k5 e" + std::to_string(8 * R) + " neg", R, 2064, 5, 8 * R, t_odd};
  c.dt = epFloat8E4M3;
  c.neg = 0.1;
  addHt(c);
  addLl(ep + "LL fp8 h2064 k5 e" + std::to_string(8 * R) + " pow2 split",
        {2064, 5, 8 * R, odd_max, t_odd, true, true, true});
  return cases;
}

// Joins a communicator, or ends this rank: the others then fail their next
// collective call (a peer that left) instead of waiting for this one.
epComm_t join(int R, const epUniqueId& id, int rank, const epConfig_t& cfg, const std::string& what) {
  epComm_t comm = nullptr;
  epResult_t res = epCommInitRank(&comm, R, id, rank, &cfg);
  if (res != epSuccess) {
    printf("  FAIL %s rank %d: epCommInitRank (%s backend) -> %s: %s\n", what.c_str(), rank,
           cfg.backend == epBackendCuda ? "cuda" : "host", epGetErrorString(res), epGetLastError(nullptr));
    fflush(stdout);
    exit(4);
  }
  return comm;
}

const char* pathName(epPathKind_t k) {
  switch (k) {
    case epPathSelf: return "self";
    case epPathNvlink: return "nvlink";
    case epPathHostStaged: return "host-staged";
    case epPathRail: return "rail";
    case epPathRailForward: return "rail-forward";
  }
  return "?";
}

// One case on this rank: true when every output matched.
bool runCase(const MpCase& mc, int R, int rank, const epUniqueId& gpu_id, const epUniqueId& host_id, bool report_paths) {
  epConfig_t gc = mc.low_latency ? ll::configFor(mc.ll, epBackendCuda) : ht::configOf(mc.ht, epBackendCuda);
  epConfig_t hc = mc.low_latency ? ll::configFor(mc.ll, epBackendHost) : ht::configOf(mc.ht, epBackendHost);
  gc.device = rank;
  epComm_t gpu = join(R, gpu_id, rank, gc, mc.name);
  epComm_t host = join(R, host_id, rank, hc, mc.name);
  if (report_paths) {
    std::string paths;
    for (int p = 0; p < R; p++) {
      epPathKind_t kind = epPathSelf;
      int via = -1;
      EK(gpu, epCommPeerPath(gpu, p, &kind, &via));
      paths += " " + std::to_string(p) + ":" + pathName(kind);
    }
    printf("rank %d (pid %d, device %d) paths to the ranks:%s\n", rank, int(getpid()), rank, paths.c_str());
  }
  bool ok = true;
  if (!mc.low_latency) {
    const ht::Case& c = mc.ht;
    ht::RankIn in;
    ht::makeRankInput(c, 42, rank, &in);
    ht::RankOut ref;
    ht::hostRank(c, host, in, rank, &ref);
    for (bool capacity : {false, true}) {
      ht::RankOut got;
      ht::gpuRank(c, gpu, in, rank, capacity, &got);
      const int before = ht::g_failures;
      ht::compareRank(c, c.name + (capacity ? " [capacity]" : " [exact]"), rank, got, ref, capacity);
      ok &= ht::g_failures == before;
    }
  } else {
    const ll::Shape& s = mc.ll;
    ll::GpuRank g;
    g.comm = gpu;
    ll::allocRank(s, R, g);
    for (int round = 0; round < 2; round++) {  // two rounds: both buffer sets
      ll::RankData in;
      ll::randomInputs(s, R, 7 + round, rank, &in);
      ll::Outputs ref;
      ll::runHost(s, R, rank, host, in, &ref);
      ll::runGpu(s, R, rank, in, g);
      ok &= ll::compare(s, R, rank, g, ref, mc.name + " round " + std::to_string(round)) == 0;
    }
    ll::freeRank(g);
  }
  EK(gpu, epCommDestroy(gpu));
  EK(host, epCommDestroy(host));
  return ok;
}

// Rank `rank`: every case in order; results[case * R + rank] = 0 passed, 1 failed.
int rankMain(int rank, int R, const std::vector<MpCase>& cases, const std::vector<epUniqueId>& ids, int* results) {
  setvbuf(stdout, nullptr, _IOLBF, 0);  // whole lines from each rank in the shared log
  CK(cudaSetDevice(rank));
  bool all = true;
  for (size_t i = 0; i < cases.size(); i++) {
    const auto t0 = std::chrono::steady_clock::now();
    const bool ok = runCase(cases[i], R, rank, ids[2 * i], ids[2 * i + 1], i == 0);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    results[i * R + rank] = ok ? 0 : 1;
    if (!ok || rank == 0) printf("%s %s on rank %d (%.1f s)\n", ok ? "PASS" : "FAIL", cases[i].name.c_str(), rank, s);
    all &= ok;
  }
  return all ? 0 : 1;
}

// GPUs visible, counted in a child so that this process does not initialise
// CUDA before it forks the ranks. -1 with *why when CUDA says none; -2 when the
// count could not be read.
int visibleGpus(std::string* why) {
  int fds[2];
  if (pipe(fds) != 0) {
    *why = "pipe failed";
    return -2;
  }
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) {
    *why = "fork failed";
    return -2;
  }
  if (pid == 0) {
    close(fds[0]);
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    char msg[256];
    int len = snprintf(msg, sizeof(msg), "%d %s", e == cudaSuccess ? n : -1,
                       e == cudaSuccess ? "" : cudaGetErrorString(e));
    ssize_t wrote = write(fds[1], msg, size_t(len));
    _exit(wrote == len ? 0 : 1);
  }
  close(fds[1]);
  std::string text;
  char buf[256];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof(buf))) > 0) text.append(buf, size_t(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  int count = -2;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || sscanf(text.c_str(), "%d", &count) != 1) {
    *why = "the child that counts the GPUs failed (status " + std::to_string(status) + ")";
    return -2;
  }
  size_t space = text.find(' ');
  *why = space == std::string::npos ? "" : text.substr(space + 1);
  return count;
}

}  // namespace

int main(int argc, char** argv) {
  int timeout_s = 240;
  for (int i = 1; i < argc; i++) {
    std::string arg = argv[i];
    if (arg == "--timeout" && i + 1 < argc) {
      timeout_s = atoi(argv[++i]);
    } else {
      fprintf(stderr, "usage: %s [--timeout SECONDS]\n", argv[0]);
      return 2;
    }
  }
  std::string why;
  const int ndev = visibleGpus(&why);
  if (ndev == -2) {
    printf("gpu_mp_test: FAILED: %s\n", why.c_str());
    return 1;
  }
  if (ndev <= 0) {
    printf("SKIPPED gpu_mp_test: no GPU visible (%s)\n", ndev == 0 ? "0 CUDA devices" : why.c_str());
    return 0;
  }
  const int R = std::min(ndev, 8);
  if (R < 2) {
    printf("SKIPPED gpu_mp_test: ranks as processes need 2 GPUs, %d visible\n", ndev);
    return 0;
  }
  const std::vector<MpCase> cases = makeCases(R);
  const size_t nres = cases.size() * size_t(R);
  // Each rank's verdict per case, in memory the children share with this process.
  int* results = static_cast<int*>(
      mmap(nullptr, nres * sizeof(int), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (results == MAP_FAILED) {
    perror("gpu_mp_test: mmap");
    return 1;
  }
  for (size_t i = 0; i < nres; i++) results[i] = -1;  // not run
  printf("gpu_mp_test: %d ranks as processes, %zu cases\n", R, cases.size());
  std::vector<epUniqueId> ids(2 * cases.size());  // per case: the CUDA and the host communicator
  int rank = -1;
  std::vector<int> codes;
  bool timed_out = false;
  if (forkRanksWithIds(R, timeout_s, int(ids.size()), ids.data(), &rank, &codes, &timed_out) != 0) return 1;
  if (rank >= 0) return rankMain(rank, R, cases, ids, results);

  int passed = 0, failed = 0;
  for (size_t i = 0; i < cases.size(); i++) {
    std::string bad;
    for (int r = 0; r < R; r++) {
      const int v = results[i * R + r];
      if (v != 0) bad += " rank " + std::to_string(r) + (v < 0 ? " (did not finish)" : " (mismatch)");
    }
    if (bad.empty()) {
      passed++;
      printf("PASS %s\n", cases[i].name.c_str());
    } else {
      failed++;
      printf("FAIL %s:%s\n", cases[i].name.c_str(), bad.c_str());
    }
  }
  bool ranks_ok = !timed_out;
  for (int r = 0; r < R; r++) ranks_ok &= codes[r] == 0;
  if (!ranks_ok && failed == 0) {  // every case passed, yet a rank failed (in teardown) or was killed
    failed++;
    printf("FAIL ranks' exit statuses:");
    for (int r = 0; r < R; r++) printf(" %d", codes[r]);
    printf("%s\n", timed_out ? " (killed after the timeout)" : "");
  }
  printf("gpu_mp_test: %d passed, %d failed\n", passed, failed);
  munmap(results, nres * sizeof(int));
  return failed == 0 ? 0 : 1;
}
