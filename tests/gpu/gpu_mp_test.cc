// GPU test with the ranks as separate processes: the cross-process path of the
// cuda_ipc transport (cudaIpcGetMemHandle / cudaIpcOpenMemHandle), which
// gpu_test and gpu_ll_test never take (their ranks are threads of one process,
// epCommInitAll, mapped by raw pointers).
//
// The parent forks one process per GPU (R = min(GPUs, 8), at least 2; or
// --ranks N, where rank r drives GPU r % GPUs, so processes may share a GPU)
// through tools/common/launch.cc, without touching CUDA itself (the GPUs are
// counted in a short-lived child). Each rank joins, per case, a communicator on
// the CUDA backend (epCommInitRank, device = its GPU) and one on the host backend with the
// same config, runs the same random inputs (fixed seed per rank) on both and
// compares every output of the GPU run with the host run, bit for bit:
//   high throughput (gpu_common.h, namespace ht: the code of gpu_test): layout
//     (tokens per rank / node / expert, is_token_in_rank), dispatch with exact
//     and with capacity sizing (num_recv, recv_x, recv_scales, recv_topk_idx /
//     weights, recv_tokens_per_expert, unused rows), combine (out,
//     out_topk_weights) and a cached re-dispatch; BF16 and FP8 + scales;
//   low latency (config.low_latency = 1; gpu_common.h, namespace ll: the code
//     of gpu_ll_test): per local expert the count, then for each valid row its
//     source, its bytes and (FP8) its scales, and the combine output; FP8 and
//     BF16 wires, split halves (EP_LL_SEND_ONLY + epLowLatencyComplete), two
//     rounds per case (both buffer sets); the ranks other than 0 run with
//     EP_CUDA_LL_FLAGGED=0, and in one case rank 0 sends 2 tokens (flagged
//     records to ranks that never send them; rank 0 runs with
//     EP_CUDA_LL_FLAGGED_PEERS=0).
// Shapes: hidden 7168, top-8 of 256 experts; and hidden 2056 / 2064, top-5 of
// 8R experts, 100 + 37 r tokens on rank r (a 2056-element row is 2056 bytes in
// FP8, not a multiple of 16, so the FP8 cases of that shape use 2064).
//
// Then the wall time of a low-latency layer (dispatch + combine) per rank,
// printed, not checked (timeLlLayers). Then ranks out of step (rank 0 in a
// low-latency dispatch, the others in a high-throughput one; then low-latency
// calls out of order among themselves): every rank must return
// epInvalidUsage within seconds (runOutOfStep). Then a peer that leaves
// (runPeerLeaves): the last rank destroys its communicators and lives on,
// then aborts them and lives on, and last its process exits without
// destroying them; each time the others' waiting GPU calls must fail with
// epRemoteError naming it and how it left within seconds.
//
// With --shrink, only the shrink case (runShrink): the last rank exits, the
// others shrink both communicators and go on, a graph captured before the
// death replayed after it; against the host backend's masked result.
//
//   gpu_mp_test [--timeout SECONDS] [--ranks N] [--shrink]
// --timeout: ranks still running then are killed (default 240). --ranks N (2..8):
// N processes even on fewer GPUs. Processes that share a GPU run their kernels
// side by side only under MPS (docs/SEMANTICS.md); without it they take turns
// in the GPU's time slices, and a kernel that waits for another process's
// kernel waits for the slice to end (milliseconds per layer: see the timing).
// Without --ranks, prints SKIPPED and exits 0 when fewer than 2 GPUs are visible; ends with
// `gpu_mp_test: N passed, M failed` (cases; a case passes when it passes on every rank).
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "common/launch.h"
#include "gpu/gpu_common.h"

namespace {

// ---- Low latency: the inputs, runs and comparison of gpu_ll_test.cc, for one
// rank (gpu_common.h, namespace ll), with memsets as the other work between
// split halves.

const size_t kScratchBytes = 16 << 20;

// Inputs up, outputs poisoned, one dispatch + combine (halves split by other
// work on the stream when asked), then wait.
void runLlGpu(const ll::Shape& s, int R, int r, const ll::RankData& d, ll::GpuRank& g) {
  ll::upload(s, r, d, g);
  ll::poison(s, R, g);
  epHandle_t h = nullptr;
  ll::enqueueLayer(s, r, g, &h, [&](int half) {
    CK(cudaMemsetAsync(g.scratch, half == 0 ? 0x11 : 0x22, kScratchBytes, g.stream));
  });
  CK(cudaStreamSynchronize(g.stream));
  EK(g.comm, epHandleDestroy(h));
}

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
  // Rank 0 sends flagged records (2 tokens) to ranks that themselves never
  // send any (rankMain: EP_CUDA_LL_FLAGGED=0 there): they must still take
  // the receive that reads flagged sources (agreed at init).
  std::vector<int> t_mixed = t_ll;
  t_mixed[0] = 2;
  addLl(ep + "LL fp8 h7168 k8 e256 flagged rank 0 only", {7168, 8, 256, 128, t_mixed, true, false, false});
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
  gc.device = gpuOf(rank);
  epComm_t gpu = join(R, gpu_id, rank, gc, mc.name);
  epComm_t host = join(R, host_id, rank, hc, mc.name);
  if (report_paths) {
    std::string paths;
    for (int p = 0; p < R; p++) {
      epPathKind_t kind = epPathSelf;
      int via = -1;
      EK(gpu, epCommPeerPath(gpu, p, &kind, &via));
      paths += " " + std::to_string(p) + ":" + pathName(kind);
      // epCommPeerInfo agrees, and names the transport: cuda_ipc on one node.
      epCommPeerInfo_t info = EP_COMM_PEER_INFO_INITIALIZER;
      EK(gpu, epCommPeerInfo(gpu, p, &info));
      const char* want = p == rank ? "self" : "cuda_ipc";
      if (info.path != kind || info.peer != p || strcmp(info.transport, want) != 0 || info.qps != 0) {
        fprintf(stderr, "FAIL: rank %d: epCommPeerInfo(%d): transport '%s' (want %s), path %d (want %d), qps %d\n",
                rank, p, info.transport, want, int(info.path), int(kind), info.qps);
        exit(1);
      }
      paths += std::string("/") + info.transport;
    }
    printf("rank %d (pid %d, device %d) paths to the ranks:%s\n", rank, int(getpid()), gpuOf(rank), paths.c_str());
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
    ll::allocRank(s, R, g, kScratchBytes);
    for (int round = 0; round < 2; round++) {  // two rounds: both buffer sets
      ll::RankData in;
      ll::randomInputs(s, R, 7 + round, rank, &in);
      ll::Outputs ref;
      ll::runHost(s, R, rank, host, in, &ref);
      runLlGpu(s, R, rank, in, g);
      ok &= ll::compare(s, R, rank, g, ref, mc.name + " round " + std::to_string(round)) == 0;
    }
    ll::freeRank(g);
  }
  EK(gpu, epCommDestroy(gpu));
  EK(host, epCommDestroy(host));
  return ok;
}

// How the last rank leaves runPeerLeaves: its process exits, or it destroys
// or aborts its communicators and lives on.
enum class Leave { kExit, kDestroy, kAbort };
const char* leaveName(Leave how) {
  return how == Leave::kExit ? "peer exit" : how == Leave::kDestroy ? "peer destroys" : "peer aborts";
}

// True when `res` is the epRemoteError of a call that found rank `gone` left
// as `how` says (the message names it so), `elapsed` seconds after the first
// call, well within the 60 s timeout.
bool remoteErrorSeen(const char* what, int rank, epResult_t res, epComm_t comm, int gone, Leave how,
                     double elapsed) {
  const std::string msg = epGetLastError(comm);
  const std::string r = "rank " + std::to_string(gone);
  const std::string name = how == Leave::kExit      ? r + " (pid"
                           : how == Leave::kDestroy ? r + " destroyed its communicator"
                                                    : r + " aborted its communicator";
  const bool ok = res == epRemoteError && msg.find(name) != std::string::npos &&
                  (how != Leave::kExit || msg.find("exited") != std::string::npos) && elapsed < 15.0;
  printf("  %s rank %d: %s after %.2f s: %s (%s)\n", ok ? "ok  " : "FAIL", rank, what, elapsed,
         epGetErrorString(res), msg.c_str());
  return ok;
}

// A peer that leaves: the last rank joins a high-throughput and a
// low-latency communicator, waits 1.5 s and then exits without destroying
// them, or destroys (or aborts) both and lives on until the others are done.
// Every other rank's GPU waits for it must end with epRemoteError naming it
// and how it left within seconds (the backend watches the peers' pids and
// call logs every 100 ms), not at the 60 s timeout: the exact-sizing
// dispatch (its count wait on the host), then a low-latency dispatch, whose
// error the combine after it returns (or, once the peer's leaving was seen,
// the dispatch itself: refused before it sends).
bool runPeerLeaves(int R, int rank, const epUniqueId& ht_id, const epUniqueId& ll_id, Leave how, int* result) {
  const std::vector<int> T(R, 64);
  ht::Case c{leaveName(how), R, 2048, 4, 8 * R, T};
  epConfig_t hc = ht::configOf(c, epBackendCuda);
  ll::Shape s{2048, 4, 8 * R, 64, T, false, false, false};
  epConfig_t lc = ll::configFor(s, epBackendCuda);
  hc.device = lc.device = gpuOf(rank);
  hc.timeout_ms = lc.timeout_ms = 60000;
  epComm_t ht_comm = join(R, ht_id, rank, hc, c.name);
  epComm_t ll_comm = join(R, ll_id, rank, lc, c.name);
  const int gone = R - 1;
  if (rank == gone) {
    fflush(stdout);
    usleep(1500 * 1000);
    if (how == Leave::kExit) {
      *result = 0;
      _exit(0);
    }
    auto close = how == Leave::kDestroy ? epCommDestroy : epCommAbort;
    const bool ok = close(ht_comm) == epSuccess && close(ll_comm) == epSuccess;
    usleep(3000 * 1000);  // alive while the others find it gone (its pid says nothing)
    *result = ok ? 0 : 1;
    return ok;
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto since = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  bool ok = true;
  {  // high throughput: layout (its kernel waits for the counts), then the exact dispatch
    ht::RankIn in;
    ht::makeRankInput(c, 42, rank, &in);
    ht::DevBufs d;
    ht::allocDev(c, in, rank, &d);
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    ht::uploadInputs(c, in, &d, st);
    epLayoutArgs_t la = ht::layoutArgs(c, rank, d);
    epResult_t res = epLayout(ht_comm, &la, st);
    const char* what = "epLayout";
    if (res == epSuccess) {
      epDispatchArgs_t a = ht::dispatchArgs(c, in, rank, d.x, d.scales, d.topk, d.w);
      int64_t num_recv = -1;
      a.recv_x = d.recv_x;
      a.recv_scales = nullptr;
      a.recv_topk_idx = d.recv_idx;
      a.recv_topk_weights = c.weights ? d.recv_w : nullptr;
      a.recv_tokens_per_expert = d.tpe;
      a.num_recv = &num_recv;
      epHandle_t h = nullptr;
      res = epDispatch(ht_comm, &a, &h, st);
      what = "epDispatch (exact sizing)";
      if (h) epHandleDestroy(h);
    }
    ok &= remoteErrorSeen(what, rank, res, ht_comm, gone, how, since());
    CK(cudaStreamSynchronize(st));
    CK(cudaStreamDestroy(st));
    ht::freeDev(&d);
  }
  {  // low latency: the dispatch kernel ends once it sees the exit; the combine reports it
    ll::GpuRank g;
    g.comm = ll_comm;
    ll::allocRank(s, R, g, kScratchBytes);
    ll::RankData in;
    ll::randomInputs(s, R, 5, rank, &in);
    ll::upload(s, rank, in, g);
    const double start = since();
    epLowLatencyDispatchArgs_t a = ll::dispatchArgs(s, rank, g);
    epHandle_t h = nullptr;
    epResult_t res = epLowLatencyDispatch(ll_comm, &a, &h, g.stream);
    const char* what = "epLowLatencyDispatch";
    if (res == epSuccess) {
      CK(cudaStreamSynchronize(g.stream));
      epLowLatencyCombineArgs_t cb = ll::combineArgs(g);
      res = epLowLatencyCombine(ll_comm, &cb, h, g.stream);
      what = "epLowLatencyCombine after the dispatch";
    }
    if (h) epHandleDestroy(h);
    ok &= remoteErrorSeen(what, rank, res, ll_comm, gone, how, since() - start);
    CK(cudaStreamSynchronize(g.stream));
    ll::freeRank(g);
  }
  ok &= epCommDestroy(ht_comm) == epSuccess;
  ok &= epCommDestroy(ll_comm) == epSuccess;
  *result = ok ? 0 : 1;
  return ok;
}

// Rank `rank` of a low-latency case of shape s: a communicator joined with
// cfg, its buffers on its GPU, the random inputs of `seed` uploaded.
ll::GpuRank joinLlRank(const ll::Shape& s, int R, int rank, const epUniqueId& id, const epConfig_t& cfg,
                       const std::string& what, uint64_t seed) {
  ll::GpuRank g;
  g.comm = join(R, id, rank, cfg, what);
  ll::allocRank(s, R, g, kScratchBytes);
  ll::RankData in;
  ll::randomInputs(s, R, seed, rank, &in);
  ll::upload(s, rank, in, g);
  CK(cudaStreamSynchronize(g.stream));
  return g;
}

// The shape of the out-of-step cases, and a rank of one (timeout 60 s).
ll::Shape outOfStepShape(int R) { return ll::Shape{2048, 4, 8 * R, 64, std::vector<int>(R, 64), false, false, false}; }
ll::GpuRank joinOutOfStepRank(const ll::Shape& s, int R, int rank, const epUniqueId& id, const std::string& what,
                              uint64_t seed) {
  epConfig_t cfg = ll::configFor(s, epBackendCuda);
  cfg.device = gpuOf(rank);
  cfg.timeout_ms = 60000;
  return joinLlRank(s, R, rank, id, cfg, what, seed);
}

// Low-latency calls out of order among themselves, across processes (a
// communicator of `id`, timeout 60 s): after a dispatch on every rank, rank
// 0 combines while the others dispatch again. Only the hosts' call logs,
// compared across the processes, find it: every rank's next call (valid on
// its own) must return epInvalidUsage naming collective call 2 within 10 s.
bool runLlOutOfOrder(int R, int rank, const epUniqueId& id) {
  const ll::Shape s = outOfStepShape(R);
  ll::GpuRank g = joinOutOfStepRank(s, R, rank, id, "low-latency calls out of order", 10);
  const epComm_t comm = g.comm;
  epLowLatencyDispatchArgs_t a = ll::dispatchArgs(s, rank, g);
  epLowLatencyCombineArgs_t ca = ll::combineArgs(g);
  epHandle_t h = nullptr, h2 = nullptr;
  EK(comm, epLowLatencyDispatch(comm, &a, &h, g.stream));
  CK(cudaStreamSynchronize(g.stream));
  const auto t0 = std::chrono::steady_clock::now();
  epResult_t res = rank == 0 ? epLowLatencyCombine(comm, &ca, h, g.stream) : epLowLatencyDispatch(comm, &a, &h2, g.stream);
  cudaStreamSynchronize(g.stream);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // in case the kernels did not wait
  if (res == epSuccess)
    res = rank == 0 ? epLowLatencyDispatch(comm, &a, &h2, g.stream) : epLowLatencyCombine(comm, &ca, h, g.stream);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string msg = epGetLastError(comm);
  const bool ok = res == epInvalidUsage && secs < 10.0 &&
                  msg.find("ranks must issue the same collective calls in the same order") != std::string::npos &&
                  msg.find("collective call 2 ") != std::string::npos;
  printf("  %s rank %d (low-latency calls out of order): %s after %.2f s: %s\n", ok ? "ok  " : "FAIL", rank,
         epGetErrorString(res), secs, msg.c_str());
  cudaStreamSynchronize(g.stream);
  if (h2) epHandleDestroy(h2);
  epHandleDestroy(h);
  ll::freeRank(g);
  return epCommDestroy(comm) == epSuccess && ok;
}

// Ranks out of step across processes: rank 0 makes a low-latency dispatch
// (then its combine, which reports), the others an exact-sized
// high-throughput dispatch, on one communicator (timeout 60 s). Every rank
// must return epInvalidUsage saying so within 10 s: the high-throughput ranks
// find rank 0's low-latency sends and mark themselves in its buffer; rank 0's
// host must read that mark as the notice of a live process, not as an exit.
// Then, on a communicator of id2, low-latency calls out of order
// (runLlOutOfOrder).
bool runOutOfStep(int R, int rank, const epUniqueId& id, const epUniqueId& id2, int* result) {
  const ll::Shape s = outOfStepShape(R);
  ll::GpuRank g = joinOutOfStepRank(s, R, rank, id, "out of step", 9);
  const epComm_t comm = g.comm;
  const auto t0 = std::chrono::steady_clock::now();
  epHandle_t h = nullptr;
  const epResult_t res = rank == 0 ? ll::syncedLayer(s, rank, g, &h)
                                   : ll::htLayer(s, R, rank, g, reinterpret_cast<uint8_t*>(g.scratch), &h);
  cudaStreamSynchronize(g.stream);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string msg = epGetLastError(comm);
  const bool ok = res == epInvalidUsage && secs < 10.0 &&
                  msg.find("ranks must issue the same collective calls in the same order") != std::string::npos;
  printf("  %s rank %d (%s): %s after %.2f s: %s\n", ok ? "ok  " : "FAIL", rank,
         rank == 0 ? "low latency" : "high throughput", epGetErrorString(res), secs, msg.c_str());
  if (h) epHandleDestroy(h);
  ll::freeRank(g);
  const bool destroyed = epCommDestroy(comm) == epSuccess;
  const bool ll_ok = runLlOutOfOrder(R, rank, id2);
  *result = ok && destroyed && ll_ok ? 0 : 1;
  return ok && destroyed && ll_ok;
}

// Wall time per low-latency layer (dispatch + combine, FP8, 128 tokens of
// hidden 7168 per rank, top-8 of 288 experts; launch and stream wait
// included), median and p90 of 50 after 10 of warm-up, printed by rank 0: the
// cost of the processes' kernels meeting, with or without MPS where they
// share a GPU. Any failed call ends the rank (the parent then fails the run).
void timeLlLayers(int R, int rank, const epUniqueId& id) {
  const ll::Shape s{7168, 8, 288, 128, std::vector<int>(R, 128), true, false, false};
  epConfig_t cfg = ll::configFor(s, epBackendCuda);
  cfg.device = gpuOf(rank);
  ll::GpuRank g = joinLlRank(s, R, rank, id, cfg, "layer timing", 3);
  const epComm_t comm = g.comm;
  std::vector<double> us;
  for (int i = 0; i < 60; i++) {
    const auto t0 = std::chrono::steady_clock::now();
    epHandle_t h = nullptr;
    ll::enqueueLayer(s, rank, g, &h, [](int) {});
    CK(cudaStreamSynchronize(g.stream));
    EK(comm, epHandleDestroy(h));
    if (i >= 10) us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(us.begin(), us.end());
  if (rank == 0)
    printf("EP%d LL layer (dispatch + combine, FP8, 128 tokens per rank), wall time per layer: median %.1f us, "
           "p90 %.1f us\n", R, us[us.size() / 2], us[us.size() * 9 / 10]);
  ll::freeRank(g);
  EK(comm, epCommDestroy(comm));
}

// One low-latency layer on the GPU communicator of g, returning the first
// error (the dispatch's, or the combine's, which reports what the dispatch
// kernel found).
epResult_t gpuLayer(const ll::Shape& s, int R, int r, const ll::RankData& in, ll::GpuRank& g) {
  ll::upload(s, r, in, g);
  ll::poison(s, R, g);
  epLowLatencyDispatchArgs_t a = ll::dispatchArgs(s, r, g);
  epHandle_t h = nullptr;
  epResult_t res = epLowLatencyDispatch(g.comm, &a, &h, g.stream);
  if (res == epSuccess) {
    CK(cudaStreamSynchronize(g.stream));
    epLowLatencyCombineArgs_t c = ll::combineArgs(g);
    res = epLowLatencyCombine(g.comm, &c, h, g.stream);
  }
  CK(cudaStreamSynchronize(g.stream));
  if (h) epHandleDestroy(h);
  return res;
}

// Shrink on GPUs (docs/SHRINK.md, "GPUs"): R ranks join a CUDA and a host
// communicator with enable_shrink, both low-latency. Before the death: a
// layer of 50-60 tokens per rank (plain records), one of 1-3 (flagged
// records where the rank sends them), and a CUDA graph of a layer captured
// and replayed; each against the host backend, bit for bit. Then the last
// rank exits between calls. Every survivor's next layer must fail on both
// communicators with epRemoteError naming it; epCommShrink on each must
// return it alone; then the same three layers (the graph captured before
// the death, replayed), run twice (both buffer sets), must match the host
// backend's masked result bit for bit: no record to or from the dead
// rank, its experts' terms absent from the combine.
bool runShrink(int R, int rank, const std::vector<epUniqueId>& ids, int* result) {
  const epUniqueId &gpu_id = ids[0], &host_id = ids[1];
  std::vector<int> t_plain(R), t_small(R);
  for (int r = 0; r < R; r++) {
    t_plain[r] = 60 - 3 * r;
    t_small[r] = 1 + r % 3;
  }
  const ll::Shape plain{2048, 4, 8 * R, 64, t_plain, false, false, false};
  ll::Shape small = plain;
  small.tokens = t_small;
  small.fp8 = true;
  epConfig_t gc = ll::configFor(plain, epBackendCuda);
  gc.device = gpuOf(rank);
  gc.enable_shrink = 1;
  epConfig_t hc = ll::configFor(plain, epBackendHost);
  hc.enable_shrink = 1;
  ll::GpuRank g = joinLlRank(plain, R, rank, gpu_id, gc, "shrink", 11);
  epComm_t host = join(R, host_id, rank, hc, "shrink (host)");
  // High throughput: a CUDA and a host communicator of their own (no
  // low-latency mode), with enable_shrink.
  std::vector<int> t_ht(R);
  for (int r = 0; r < R; r++) t_ht[r] = 96 - 7 * r;
  ht::Case htc{"shrink HT bf16 h2048 k4 e" + std::to_string(8 * R) + " neg bias", R, 2048, 4, 8 * R, t_ht};
  htc.neg = 0.1;
  htc.bias = true;
  epConfig_t htg = ht::configOf(htc, epBackendCuda);
  htg.device = gpuOf(rank);
  htg.enable_shrink = 1;
  epConfig_t hth = ht::configOf(htc, epBackendHost);
  hth.enable_shrink = 1;
  epComm_t ht_gpu = join(R, ids[2], rank, htg, "shrink HT");
  epComm_t ht_host = join(R, ids[3], rank, hth, "shrink HT (host)");
  const int gone = R - 1;
  bool ok = true;
  // The staged path (EP_CUDA_NETWORK=1: the ranks' nodes joined through host
  // staging and the network transport) cannot be captured in graphs.
  const char* net = getenv("EP_CUDA_NETWORK");
  const bool graphs = net == nullptr || atoi(net) == 0;
  if (!graphs && rank == 0) printf("  (EP_CUDA_NETWORK=%s: the staged path, no graphs)\n", net);
  // The graph of one plain layer (the inputs are read from g's buffers at each replay).
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  epHandle_t graph_handle = nullptr;
  if (graphs) {
    CK(cudaStreamBeginCapture(g.stream, cudaStreamCaptureModeThreadLocal));
    ll::enqueueLayer(plain, rank, g, &graph_handle, [](int) {});
    CK(cudaStreamEndCapture(g.stream, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
  }
  auto check = [&](const ll::Shape& sh, uint64_t seed, bool replay, const std::string& what) {
    ll::RankData in;
    ll::randomInputs(sh, R, seed, rank, &in);
    ll::Outputs ref;
    const epResult_t hr = ll::runHostLayer(sh, R, rank, host, in, &ref);
    if (hr != epSuccess) {
      printf("  FAIL shrink rank %d: %s on the host backend: %s (%s)\n", rank, what.c_str(), epGetErrorString(hr),
             epGetLastError(host));
      return false;
    }
    epResult_t res = epSuccess;
    if (replay) {
      ll::upload(sh, rank, in, g);
      ll::poison(sh, R, g);
      CK(cudaGraphLaunch(exec, g.stream));
      CK(cudaStreamSynchronize(g.stream));
    } else {
      res = gpuLayer(sh, R, rank, in, g);
    }
    if (res != epSuccess) {
      printf("  FAIL shrink rank %d: %s: %s (%s)\n", rank, what.c_str(), epGetErrorString(res), epGetLastError(g.comm));
      return false;
    }
    const bool same = ll::compare(sh, R, rank, g, ref, "shrink " + what) == 0;
    long long rows = 0;
    for (int c : ref.recv_count) rows += c;
    if (same) printf("  ok   rank %d: %s: %lld rows received, the combine of %d tokens, as the host backend\n", rank,
                     what.c_str(), rows, sh.tokens[rank]);
    return same;
  };
  // A high-throughput layer (layout, dispatch, combine, cached re-dispatch;
  // exact and capacity sizing) against the host backend's, every output.
  auto checkHt = [&](uint64_t seed, const std::string& what) {
    ht::RankIn in;
    ht::makeRankInput(htc, seed, rank, &in);
    ht::RankOut ref;
    ht::hostRank(htc, ht_host, in, rank, &ref);
    const int before = ht::g_failures;
    for (bool capacity : {false, true}) {
      ht::RankOut got;
      ht::gpuRank(htc, ht_gpu, in, rank, capacity, &got);
      ht::compareRank(htc, "shrink " + what + (capacity ? " [capacity]" : " [exact]"), rank, got, ref, capacity);
    }
    const bool same = ht::g_failures == before;
    if (same) printf("  ok   rank %d: %s: %lld rows received, as the host backend\n", rank, what.c_str(),
                     (long long)ref.num_recv);
    return same;
  };
  // A CUDA graph of a high-throughput dispatch and combine (capacity sizing),
  // captured before the death; each check uploads new inputs and replays it.
  ht::DevBufs hd;
  cudaStream_t hst;
  CK(cudaStreamCreateWithFlags(&hst, cudaStreamNonBlocking));
  cudaGraph_t ht_graph = nullptr;
  cudaGraphExec_t ht_exec = nullptr;
  epHandle_t ht_graph_handle = nullptr;
  {
    ht::RankIn in;
    ht::makeRankInput(htc, 70, rank, &in);  // the sizes of every seed's inputs
    ht::allocDev(htc, in, rank, &hd);
    epDispatchArgs_t a = ht::dispatchArgs(htc, in, rank, hd.x, hd.scales, hd.topk, hd.w);
    a.recv_x = hd.recv_x;
    a.recv_topk_idx = hd.recv_idx;
    a.recv_topk_weights = hd.recv_w;
    a.recv_tokens_per_expert = hd.tpe;
    a.flags = EP_DISPATCH_NO_HOST_SYNC;
    a.num_recv = hd.num_recv;
    epCombineArgs_t ca = EP_COMBINE_ARGS_INITIALIZER;
    ca.y = hd.y;
    ca.y_type = htc.ct;
    ca.recv_topk_weights = hd.recv_w;
    ca.num_topk = htc.K;
    ca.bias = hd.bias;
    ca.out = hd.out;
    ca.out_topk_weights = hd.out_w;
    if (graphs) {
      CK(cudaStreamBeginCapture(hst, cudaStreamCaptureModeThreadLocal));
      EK(ht_gpu, epDispatch(ht_gpu, &a, &ht_graph_handle, hst));
      EK(ht_gpu, epCombine(ht_gpu, &ca, ht_graph_handle, hst));
      CK(cudaStreamEndCapture(hst, &ht_graph));
      CK(cudaGraphInstantiate(&ht_exec, ht_graph, 0));
    }
  }
  auto checkHtGraph = [&](uint64_t seed, const std::string& what) {
    ht::RankIn in;
    ht::makeRankInput(htc, seed, rank, &in);
    ht::RankOut ref;
    ht::hostRank(htc, ht_host, in, rank, &ref);
    ht::uploadInputs(htc, in, &hd, hst);
    ht::poison(htc, rank, &hd, hst);
    CK(cudaGraphLaunch(ht_exec, hst));
    CK(cudaStreamSynchronize(hst));
    const ht::Geometry geo = ht::geometryOf(htc);
    const int64_t n = ht::download<int64_t>(hd.num_recv, 1)[0];
    const int T = htc.T[rank], K = htc.K;
    const std::string name = "shrink " + what;
    const int before = ht::g_failures;
    if (n != ref.num_recv) {
      printf("  FAIL %s rank %d: num_recv %lld, the host's %lld\n", name.c_str(), rank, (long long)n,
             (long long)ref.num_recv);
      ht::g_failures++;
    } else {
      ht::same("recv_x", name, rank, ht::download<uint8_t>(hd.recv_x, size_t(n) * geo.drow).data(),
               ref.recv_x.data(), size_t(n) * geo.drow, 2);
      ht::same("recv_topk_idx", name, rank, ht::download<int64_t>(hd.recv_idx, size_t(n) * K).data(),
               ref.idx.data(), size_t(n) * K * 8, 8);
      ht::same("recv_topk_weights", name, rank, ht::download<float>(hd.recv_w, size_t(n) * K).data(),
               ref.w.data(), size_t(n) * K * 4, 4);
      ht::same("recv_tokens_per_expert", name, rank, ht::download<int>(hd.tpe, geo.EL).data(), ref.tpe.data(),
               size_t(geo.EL) * 4, 4);
      ht::same("combine out", name, rank, ht::download<uint8_t>(hd.out, size_t(T) * geo.crow).data(),
               ref.out.data(), size_t(T) * geo.crow, 2);
      ht::same("combine out_topk_weights", name, rank, ht::download<float>(hd.out_w, size_t(T) * K).data(),
               ref.out_w.data(), size_t(T) * K * 4, 4);
    }
    const bool same = ht::g_failures == before;
    if (same) printf("  ok   rank %d: %s: %lld rows received, as the host backend\n", rank, what.c_str(),
                     (long long)n);
    return same;
  };
  auto checkAll = [&](const std::string& when, uint64_t seed) {
    bool all = check(plain, seed, false, when + ", plain records");
    all &= check(small, seed + 1, false, when + ", 1-3 tokens (flagged records)");
    if (graphs) all &= check(plain, seed + 2, true, when + ", the graph captured before the death");
    all &= checkHt(seed + 3, when + ", high throughput");
    if (graphs) all &= checkHtGraph(seed + 4, when + ", the high-throughput graph captured before the death");
    return all;
  };
  ok &= checkAll("before the death", 20);
  // A handle routed before the death, and a graph of its combine alone:
  // replayed after the shrink it must run nothing and say so at the next
  // call (htStaleHandle), not read the routing the shrink zeroed.
  ht::DevBufs sd;
  cudaGraph_t stale_graph = nullptr;
  cudaGraphExec_t stale_exec = nullptr;
  epHandle_t stale_h = nullptr;
  if (graphs) {
    ht::RankIn in;
    ht::makeRankInput(htc, 60, rank, &in);
    ht::allocDev(htc, in, rank, &sd);
    ht::uploadInputs(htc, in, &sd, hst);
    epDispatchArgs_t a = ht::dispatchArgs(htc, in, rank, sd.x, sd.scales, sd.topk, sd.w);
    a.recv_x = sd.recv_x;
    a.recv_topk_weights = sd.recv_w;
    a.flags = EP_DISPATCH_NO_HOST_SYNC;
    a.num_recv = sd.num_recv;
    EK(ht_gpu, epDispatch(ht_gpu, &a, &stale_h, hst));
    epCombineArgs_t ca = EP_COMBINE_ARGS_INITIALIZER;
    ca.y = sd.y;
    ca.y_type = htc.ct;
    ca.recv_topk_weights = sd.recv_w;
    ca.num_topk = htc.K;
    ca.out = sd.out;
    CK(cudaStreamBeginCapture(hst, cudaStreamCaptureModeThreadLocal));
    EK(ht_gpu, epCombine(ht_gpu, &ca, stale_h, hst));
    CK(cudaStreamEndCapture(hst, &stale_graph));
    CK(cudaGraphInstantiate(&stale_exec, stale_graph, 0));
    CK(cudaStreamSynchronize(hst));
  }
  if (rank == gone) {
    printf("  rank %d exits\n", rank);
    fflush(stdout);
    *result = ok ? 0 : 1;
    _exit(0);
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto since = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  const std::string name = "rank " + std::to_string(gone);
  {  // the next layer fails on both, naming the dead rank
    ll::RankData in;
    ll::randomInputs(plain, R, 30, rank, &in);
    epResult_t res = gpuLayer(plain, R, rank, in, g);
    if (res == epSuccess) res = gpuLayer(plain, R, rank, in, g);  // the failed wait reported by the next call
    const std::string msg = epGetLastError(g.comm);
    const bool seen = res == epRemoteError && msg.find(name) != std::string::npos;
    printf("  %s rank %d: the GPU layer after the death: %s after %.2f s (%s)\n", seen ? "ok  " : "FAIL", rank,
           epGetErrorString(res), since(), msg.c_str());
    ok &= seen;
    ll::Outputs out;
    res = ll::runHostLayer(plain, R, rank, host, in, &out);
    const std::string hmsg = epGetLastError(host);
    const bool hseen = res == epRemoteError && hmsg.find(name) != std::string::npos;
    printf("  %s rank %d: the host layer after the death: %s (%s)\n", hseen ? "ok  " : "FAIL", rank,
           epGetErrorString(res), hmsg.c_str());
    ok &= hseen;
  }
  {  // the high-throughput communicator's next call fails too (exact sizing: its count wait)
    ht::RankIn in;
    ht::makeRankInput(htc, 31, rank, &in);
    ht::DevBufs d;
    ht::allocDev(htc, in, rank, &d);
    ht::uploadInputs(htc, in, &d, hst);
    epDispatchArgs_t a = ht::dispatchArgs(htc, in, rank, d.x, d.scales, d.topk, d.w);
    a.recv_x = d.recv_x;
    a.recv_topk_weights = d.recv_w;
    int64_t num_recv = -1;
    a.num_recv = &num_recv;
    epHandle_t h = nullptr;
    const epResult_t res = epDispatch(ht_gpu, &a, &h, hst);
    const std::string msg = epGetLastError(ht_gpu);
    const bool seen = res == epRemoteError && msg.find(name) != std::string::npos;
    printf("  %s rank %d: the high-throughput dispatch after the death: %s (%s)\n", seen ? "ok  " : "FAIL", rank,
           epGetErrorString(res), msg.c_str());
    ok &= seen;
    if (h) epHandleDestroy(h);
    CK(cudaStreamSynchronize(hst));
    ht::freeDev(&d);
  }
  for (epComm_t c : {g.comm, host, ht_gpu, ht_host}) {
    int dead[8] = {-1}, ndead = -1;
    const auto s0 = std::chrono::steady_clock::now();
    const epResult_t res = epCommShrink(c, nullptr, 0, dead, &ndead);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s0).count();
    const bool right = res == epSuccess && ndead == 1 && dead[0] == gone;
    printf("  %s rank %d: epCommShrink (%s): %s, %d dead (first %d), %.1f ms%s%s\n", right ? "ok  " : "FAIL", rank,
           c == host ? "host" : c == ht_host ? "HT host" : c == ht_gpu ? "HT cuda" : "cuda", epGetErrorString(res), ndead, dead[0], ms, res == epSuccess ? "" : ": ",
           res == epSuccess ? "" : epGetLastError(c));
    ok &= right;
  }
  if (ok) {
    ok &= checkAll("after the shrink", 40);
    if (graphs) {  // the stale graph: nothing runs, the next call says why, the one after runs
      CK(cudaGraphLaunch(stale_exec, hst));
      CK(cudaStreamSynchronize(hst));
      epLayoutArgs_t la = ht::layoutArgs(htc, rank, hd);
      const epResult_t res = epLayout(ht_gpu, &la, hst);
      const std::string msg = epGetLastError(ht_gpu);
      const bool said = res == epInvalidUsage && msg.find("routed before epCommShrink") != std::string::npos;
      printf("  %s rank %d: a graph of a combine of a handle routed before the death, replayed: %s (%s)\n",
             said ? "ok  " : "FAIL", rank, epGetErrorString(res), msg.c_str());
      ok &= said;
      CK(cudaStreamSynchronize(hst));
    }
    ok &= checkAll("after the shrink, again", 50);
  }
  if (graphs) {
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    CK(cudaGraphExecDestroy(ht_exec));
    CK(cudaGraphDestroy(ht_graph));
  }
  if (graph_handle) epHandleDestroy(graph_handle);
  if (ht_graph_handle) epHandleDestroy(ht_graph_handle);
  if (graphs) {
    CK(cudaGraphExecDestroy(stale_exec));
    CK(cudaGraphDestroy(stale_graph));
    ht::freeDev(&sd);
  }
  if (stale_h) epHandleDestroy(stale_h);
  ht::freeDev(&hd);
  CK(cudaStreamDestroy(hst));
  ll::freeRank(g);
  ok &= epCommDestroy(g.comm) == epSuccess;
  ok &= epCommDestroy(host) == epSuccess;
  ok &= epCommDestroy(ht_gpu) == epSuccess;
  ok &= epCommDestroy(ht_host) == epSuccess;
  *result = ok ? 0 : 1;
  return ok;
}

// Rank `rank`: every case in order; results[case * R + rank] = 0 passed, 1 failed.
int rankMain(int rank, int R, const std::vector<MpCase>& cases, const std::vector<epUniqueId>& ids, int* results) {
  setvbuf(stdout, nullptr, _IOLBF, 0);  // whole lines from each rank in the shared log
  // Only rank 0 may send flagged records (small low-latency calls); the
  // library reads the variable at the first low-latency init of this process.
  if (rank != 0) setenv("EP_CUDA_LL_FLAGGED", "0", 1);
  // And rank 0 sends them whatever its peers send (by default a small call
  // sends plain records beside peers that cannot send flagged ones).
  if (rank == 0) setenv("EP_CUDA_LL_FLAGGED_PEERS", "0", 1);
  CK(cudaSetDevice(gpuOf(rank)));
  bool all = true;
  for (size_t i = 0; i < cases.size(); i++) {
    const auto t0 = std::chrono::steady_clock::now();
    const bool ok = runCase(cases[i], R, rank, ids[2 * i], ids[2 * i + 1], i == 0);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    results[i * R + rank] = ok ? 0 : 1;
    if (!ok || rank == 0) printf("%s %s on rank %d (%.1f s)\n", ok ? "PASS" : "FAIL", cases[i].name.c_str(), rank, s);
    all &= ok;
  }
  // Then: out of step (case n), a peer that leaves (cases n + 1 to n + 3:
  // destroys, aborts, and last exits); then the layer timing's id.
  const size_t n = cases.size();
  timeLlLayers(R, rank, ids[2 * (n + 4)]);
  {
    const auto t0 = std::chrono::steady_clock::now();
    const bool ok = runOutOfStep(R, rank, ids[2 * n], ids[2 * n + 1], &results[n * R + rank]);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!ok || rank == 0) printf("%s EP%d out of step on rank %d (%.1f s)\n", ok ? "PASS" : "FAIL", R, rank, s);
    all &= ok;
  }
  for (Leave how : {Leave::kDestroy, Leave::kAbort, Leave::kExit}) {
    const size_t i = n + 1 + size_t(how == Leave::kAbort) + 2 * size_t(how == Leave::kExit);
    const auto t0 = std::chrono::steady_clock::now();
    const bool ok = runPeerLeaves(R, rank, ids[2 * i], ids[2 * i + 1], how, &results[i * R + rank]);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!ok || rank == 0)
      printf("%s EP%d %s on rank %d (%.1f s)\n", ok ? "PASS" : "FAIL", R, leaveName(how), rank, s);
    all &= ok;
  }
  return all ? 0 : 1;
}

// --shrink: runShrink alone (its last rank exits). 0 when every rank passed.
int shrinkMain(int R, int timeout_s) {
  int* results = static_cast<int*>(mmap(nullptr, size_t(R) * sizeof(int), PROT_READ | PROT_WRITE,
                                        MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (results == MAP_FAILED) {
    perror("gpu_mp_test: mmap");
    return 1;
  }
  for (int r = 0; r < R; r++) results[r] = -1;
  printf("gpu_mp_test --shrink: %d ranks as processes\n", R);
  std::vector<epUniqueId> ids(4);
  int rank = -1;
  std::vector<int> codes;
  bool timed_out = false;
  if (forkRanksWithIds(R, timeout_s, int(ids.size()), ids.data(), &rank, &codes, &timed_out) != 0) return 1;
  if (rank >= 0) {
    setvbuf(stdout, nullptr, _IOLBF, 0);
    CK(cudaSetDevice(gpuOf(rank)));
    const auto t0 = std::chrono::steady_clock::now();
    const bool ok = runShrink(R, rank, ids, &results[rank]);
    printf("%s EP%d shrink on rank %d (%.1f s)\n", ok ? "PASS" : "FAIL", R, rank,
           std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return ok ? 0 : 1;
  }
  std::string bad;
  for (int r = 0; r < R; r++)
    if (results[r] != 0 || codes[r] != 0)
      bad += " rank " + std::to_string(r) + (results[r] < 0 ? " (did not finish)" : results[r] ? " (failed)" : "") +
             (codes[r] != 0 ? " (exit status " + std::to_string(codes[r]) + ")" : "");
  if (timed_out) bad += " (killed after the timeout)";
  printf("%s EP%d shrink%s\n", bad.empty() ? "PASS" : "FAIL", R, bad.c_str());
  printf("gpu_mp_test: %d passed, %d failed\n", bad.empty() ? 1 : 0, bad.empty() ? 0 : 1);
  munmap(results, size_t(R) * sizeof(int));
  return bad.empty() ? 0 : 1;
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
  int timeout_s = 240, ranks = 0;
  bool shrink = false;
  for (int i = 1; i < argc; i++) {
    std::string arg = argv[i];
    if (arg == "--shrink") {
      shrink = true;
    } else if (arg == "--timeout" && i + 1 < argc) {
      timeout_s = atoi(argv[++i]);
    } else if (arg == "--ranks" && i + 1 < argc) {
      ranks = atoi(argv[++i]);
      if (ranks < 2 || ranks > 8) {
        fprintf(stderr, "%s: --ranks takes 2..8\n", argv[0]);
        return 2;
      }
    } else {
      fprintf(stderr, "usage: %s [--timeout SECONDS] [--ranks N] [--shrink]\n", argv[0]);
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
  gpuCount() = ndev;  // rank r drives GPU r % ndev
  const int R = ranks ? ranks : std::min(ndev, 8);
  if (R < 2) {
    printf("SKIPPED gpu_mp_test: a process per GPU needs 2 GPUs, %d visible (--ranks 2: two processes on one)\n",
           ndev);
    return 0;
  }
  if (shrink) return shrinkMain(R, timeout_s);
  const std::vector<MpCase> cases = makeCases(R);
  const size_t ncases = cases.size() + 4;  // + out of step, + a peer that destroys, aborts, exits (last)
  const size_t nres = ncases * size_t(R);
  // Each rank's verdict per case, in memory the children share with this process.
  int* results = static_cast<int*>(
      mmap(nullptr, nres * sizeof(int), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (results == MAP_FAILED) {
    perror("gpu_mp_test: mmap");
    return 1;
  }
  for (size_t i = 0; i < nres; i++) results[i] = -1;  // not run
  printf("gpu_mp_test: %d ranks as processes on %d GPU%s, %zu cases\n", R, std::min(ndev, R), ndev == 1 ? "" : "s",
         ncases);
  // Per case: the CUDA and the host communicator (out of step: two CUDA, the
  // families, then low-latency calls out of order; a peer that leaves: two
  // CUDA); then the layer timing's.
  std::vector<epUniqueId> ids(2 * ncases + 1);
  int rank = -1;
  std::vector<int> codes;
  bool timed_out = false;
  if (forkRanksWithIds(R, timeout_s, int(ids.size()), ids.data(), &rank, &codes, &timed_out) != 0) return 1;
  if (rank >= 0) return rankMain(rank, R, cases, ids, results);

  int passed = 0, failed = 0;
  for (size_t i = 0; i < ncases; i++) {
    const Leave leaves[] = {Leave::kDestroy, Leave::kAbort, Leave::kExit};
    const std::string name = i < cases.size()    ? cases[i].name
                             : i == cases.size() ? "EP" + std::to_string(R) + " out of step"
                                                 : "EP" + std::to_string(R) + " " +
                                                       leaveName(leaves[i - cases.size() - 1]);
    std::string bad;
    for (int r = 0; r < R; r++) {
      const int v = results[i * R + r];
      if (v != 0) bad += " rank " + std::to_string(r) + (v < 0 ? " (did not finish)" : " (mismatch)");
    }
    if (bad.empty()) {
      passed++;
      printf("PASS %s\n", name.c_str());
    } else {
      failed++;
      printf("FAIL %s:%s\n", name.c_str(), bad.c_str());
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
