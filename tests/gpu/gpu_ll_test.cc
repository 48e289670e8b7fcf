// Low-latency mode on GPUs against the host backend, element by element, and
// its latency in CUDA graphs.
//
//   gpu_ll_test            correctness: shapes x wire types, split halves with
//                          other work between them, 10 layers captured in a graph
//                          and replayed on new data, ranks sending 0 tokens,
//                          experts repeated in a token's top-k
//   gpu_ll_test --bench [--ranks N]
//                          latency per call (median / p99 over >= 100 calls,
//                          inside a CUDA graph), EP = number of visible GPUs
//                          (or N, ranks sharing GPUs as below)
//   gpu_ll_test --bench-tokens N[,N...]
//                          the same for N tokens per rank (unsplit calls only)
//   gpu_ll_test --bench-tokens A/B[/...]
//                          the same with one rank per entry, rank r sending
//                          that many tokens (ranks share GPUs as below)
//   gpu_ll_test --mixed [--ranks N]
//                          correctness of ranks with different batch sizes
//                          only (two ranks, or N; they share GPUs as below)
//   gpu_ll_test --ranks N  correctness at EP N only; with fewer GPUs than N,
//                          rank r on GPU r % GPUs (ranks share GPUs, each
//                          with its share of the SMs)
//   EP_NODE_SIZE=1 gpu_ll_test --node-limit
//                          config.max_nodes_per_token only (two ranks)
//   gpu_ll_test --staged [R]
//                          the staged path of GPU ranks on different nodes (R
//                          ranks, default 2, each a node unless EP_NODE_SIZE
//                          says otherwise, over the socket transport on
//                          loopback, EP_CUDA_NETWORK=1): the shapes below
//                          without graphs, split halves included
//   gpu_ll_test --eager-bench R N[,N...]
//                          dispatch + combine of N tokens per rank called
//                          eagerly (no graph: the staged path cannot be
//                          captured), host wall clock per layer, median and
//                          p99 of 200; with EP_CUDA_NETWORK=1 EP_NODE_SIZE=1
//                          EP_TRANSPORTS=shm,socket the staged path, without
//                          them the single-node kernels
//   gpu_ll_test --random N [SEED [--first I]]
//                          N shapes drawn at random (tests/gpu/random_cases.h):
//                          1 to 8 ranks (sharing GPUs as above), hidden sizes,
//                          top-k, experts, batches per rank, wire types,
//                          split, graphs; a failure prints how to draw it again
#include <algorithm>
#include <chrono>
#include <functional>
#include <thread>
#include <cmath>
#include <string>

#include "early_producer.cuh"
#include "gpu/gpu_common.h"
#include "random_cases.h"

namespace {

// Shapes, inputs, one rank's host / GPU run and its comparison (gpu_common.h).
using ll::compare;
using ll::configFor;
using ll::freeRank;
using ll::GpuRank;
using ll::Outputs;
using ll::poison;
using ll::RankData;
using ll::Shape;
using ll::upload;

__global__ void busyKernel(float* p, int n) {  // "other work" between the halves
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = p[i] * 0.5f + 1.0f;
}

// The kernel before a call that lets the call be placed on the GPU at once
// (griddepcontrol.launch_dependents, as a kernel written for programmatic
// dependent launch may do), and writes the call's inputs only `delay_ns`
// later: n 4-byte words of src to dst. A call launched with programmatic
// dependent launch that read its inputs before it waited for this kernel
// would read what was there before.
__global__ void lateCopyKernel(const uint32_t* src, uint32_t* dst, size_t n, unsigned long long delay_ns) {
  letDependentsInThenWait(delay_ns);
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    dst[i] = src[i];
}

// Runs dispatch (+ combine) on the host backend: the reference.
void runHost(const Shape& s, int R, std::vector<RankData>& in, std::vector<Outputs>& ref) {
  std::vector<epComm_t> comms(R);
  epConfig_t cfg = configFor(s, epBackendHost);
  EK(nullptr, epCommInitAll(comms.data(), R, nullptr, &cfg));
  runRanks(R, [&](int r) { ll::runHost(s, R, r, comms[r], in[r], &ref[r]); });
  for (auto c : comms) epCommDestroy(c);
}

void randomInputs(const Shape& s, int R, uint64_t seed, std::vector<RankData>& in) {
  runRanks(R, [&](int r) { ll::randomInputs(s, R, seed, r, &in[r]); });  // a function of (seed, r): any order
}

void allocRank(const Shape& s, int R, int r, GpuRank& g) {
  CK(cudaSetDevice(gpuOf(r)));
  ll::allocRank(s, R, g, 64 << 20);  // busyKernel's 16 << 20 floats
}

// Rank r's buffers allocated on its GPU and its inputs uploaded (its outputs
// poisoned when asked), then the barrier of the ranks: no rank makes a call
// while another still allocates or copies (RankBarrier).
void setUpRank(const Shape& s, int R, int r, epComm_t comm, const RankData& in, GpuRank& g, RankBarrier& ready,
               bool poison_outputs = false) {
  g.comm = comm;
  allocRank(s, R, r, g);
  upload(s, r, in, g);
  if (poison_outputs) poison(s, R, g);
  CK(cudaStreamSynchronize(g.stream));
  ready.wait();
}

// A case of one shape: its communicators (one per rank, on the GPUs gpusOf(R)
// gives, their config as configFor makes it, then changed by `edit`), random
// inputs of `seed` and their host reference (unless with_ref is false: a case
// that changes the inputs first calls runHost itself). The ranks' buffers are
// the case's to set up (setUpRank); close() ends the case.
struct RankedCase {
  const Shape& s;
  const int R;
  std::vector<RankData> in;
  std::vector<Outputs> ref;
  std::vector<GpuRank> g;
  std::vector<epComm_t> comms;
  RankedCase(const Shape& shape, int ranks, uint64_t seed, const std::function<void(epConfig_t&)>& edit = nullptr,
             bool with_ref = true)
      : s(shape), R(ranks), in(ranks), ref(ranks), g(ranks), comms(ranks) {
    epConfig_t cfg = configFor(s, epBackendCuda);
    if (edit) edit(cfg);
    EK(nullptr, epCommInitAll(comms.data(), R, gpusOf(R).data(), &cfg));
    randomInputs(s, R, seed, in);
    if (with_ref) runHost(s, R, in, ref);
  }
  // Rank by rank: its outputs compared with the reference when `what` names
  // the comparison, its buffers freed (if it set them up), its communicator
  // destroyed. Returns the outputs that differ.
  long long close(const char* what = nullptr) {
    long long wrong = 0;
    for (int r = 0; r < R; r++) {
      CK(cudaSetDevice(gpuOf(r)));
      if (what != nullptr) wrong += compare(s, R, r, g[r], ref[r], what);
      if (g[r].stream != nullptr) freeRank(g[r]);
      epCommDestroy(comms[r]);
    }
    return wrong;
  }
};

// Enqueues one dispatch + combine (halves split by other work when asked).
void enqueueLayer(const Shape& s, int r, GpuRank& g, epHandle_t* h) {
  ll::enqueueLayer(s, r, g, h, [&](int) { busyKernel<<<64, 256, 0, g.stream>>>(g.scratch, 16 << 20); });
}

// Layers in the graph cases: more than the communicator's ready handle slots
// (8), so its pool grows while the stream is being captured, as in a decode
// graph of a whole model (a handle per layer, alive for the graph's life).
constexpr int kGraphLayers = 10;

int runShape(const Shape& s, int R, uint64_t seed, bool graph) {
  std::vector<RankData> in(R);
  std::vector<Outputs> ref(R);
  std::vector<GpuRank> g(R);
  std::vector<epComm_t> comms(R);
  epConfig_t cfg = configFor(s, epBackendCuda);
  EK(nullptr, epCommInitAll(comms.data(), R, gpusOf(R).data(), &cfg));
  for (int r = 0; r < R; r++) {
    g[r].comm = comms[r];
    allocRank(s, R, r, g[r]);
  }
  long long bad = 0;
  const int rounds = graph ? 3 : 2;  // graph: 3 replays of the graph
  std::vector<cudaGraphExec_t> exec(R, nullptr);
  std::vector<std::vector<epHandle_t>> graph_handles(R);
  RankBarrier ready(R);
  for (int round = 0; round < rounds; round++) {
    randomInputs(s, R, seed + round, in);
    runHost(s, R, in, ref);
    runRanks(R, [&](int r) {
      CK(cudaSetDevice(gpuOf(r)));
      upload(s, r, in[r], g[r]);
      poison(s, R, g[r]);
      CK(cudaStreamSynchronize(g[r].stream));
      ready.wait();  // no rank's call waits for a peer that still copies
      if (!graph) {
        epHandle_t h = nullptr;
        enqueueLayer(s, r, g[r], &h);
        CK(cudaStreamSynchronize(g[r].stream));
        epHandleDestroy(h);
        return;
      }
      if (exec[r] == nullptr) {  // kGraphLayers layers with alternating buffer sets, captured once
        cudaGraph_t graph_def;
        graph_handles[r].assign(kGraphLayers, nullptr);
        CK(cudaStreamSynchronize(g[r].stream));
        CK(cudaStreamBeginCapture(g[r].stream, cudaStreamCaptureModeThreadLocal));
        for (int layer = 0; layer < kGraphLayers; layer++) enqueueLayer(s, r, g[r], &graph_handles[r][layer]);
        CK(cudaStreamEndCapture(g[r].stream, &graph_def));
        CK(cudaGraphInstantiate(&exec[r], graph_def, 0));
        CK(cudaGraphDestroy(graph_def));
        // The handles' device state is used by the graph: kept for its life.
      }
      ready.wait();  // every rank captured (the capture grows the handle pool: cudaMalloc)
      CK(cudaGraphLaunch(exec[r], g[r].stream));
      CK(cudaStreamSynchronize(g[r].stream));
    });
    for (int r = 0; r < R; r++) {
      CK(cudaSetDevice(gpuOf(r)));
      bad += compare(s, R, r, g[r], ref[r], graph ? "graph" : "eager");
    }
  }
  for (int r = 0; r < R; r++) {
    CK(cudaSetDevice(gpuOf(r)));
    if (exec[r]) cudaGraphExecDestroy(exec[r]);
    for (epHandle_t h : graph_handles[r]) epHandleDestroy(h);
    freeRank(g[r]);
    epCommDestroy(comms[r]);
  }
  printf("%-6s R=%d H=%-5d K=%-2d E=%-3d M=%-4d T=[", graph ? "graph" : "eager", R, s.hidden, s.topk, s.experts, s.max_tokens);
  for (int r = 0; r < R; r++) printf("%s%d", r ? "," : "", s.tokens[r]);
  printf("]");
  if (s.config_topk || !s.topk_of.empty()) {  // calls with fewer columns than config.max_topk
    printf(" max_topk=%d num_topk=[", s.maxTopk());
    for (int r = 0; r < R; r++) printf("%s%d", r ? "," : "", s.kOf(r));
    printf("]");
  }
  printf(" %s%s%s%s%s%s%s: %s\n", s.fp8 ? "fp8" : "bf16", s.pow2 ? " pow2" : "", s.split ? " split" : "",
         s.repeats ? " repeats" : "", s.idx32 ? " idx32" : "", s.no_weights ? " no-weights" : "",
         s.no_src ? " no-src" : "", bad ? "FAILED" : "OK");
  return bad ? 1 : 0;
}

// Ranks of different batch sizes (R > 1): 8 tokens beside 100 (flagged
// beside plain at the default bound of 8, plain beside plain below it); 1 to
// 8 tokens beside 100; flagged calls of different sizes. Small ranks send
// flagged records beside large plain ones (a mixed receive) where they chose
// before they saw a large peer (by default: at most a communicator's first
// dispatch), or at every call with EP_CUDA_LL_FLAGGED_PEERS=0.
std::vector<Shape> unevenShapes(int R) {
  std::vector<Shape> shapes;
  if (R < 2) return shapes;
  std::vector<int> small_plain(R);
  for (int r = 0; r < R; r++) small_plain[r] = r % 2 ? 100 : 8;
  shapes.push_back({7168, 8, 288, 128, small_plain, true, false, false});
  shapes.push_back({7168, 8, 288, 128, small_plain, false, false, true});
  std::vector<int> mixed(R);
  for (int r = 0; r < R; r++) mixed[r] = r % 2 ? 100 : 1 + (7 * r / 2) % 8;  // 1, 8, 7, 6 flagged tokens
  shapes.push_back({7168, 8, 288, 128, mixed, true, false, false});
  shapes.push_back({7168, 8, 288, 128, mixed, true, true, true});
  shapes.push_back({1040, 32, 36 * R, 128, mixed, false, false, false, true});
  std::vector<int> uneven(R);
  for (int r = 0; r < R; r++) uneven[r] = 8 - (3 * r) % 8;  // 8, 5, 2, 7, ...
  shapes.push_back({7168, 8, 288, 8, uneven, false, false, false});
  return shapes;
}


// Three layers in one graph, each with its own inputs, routing and outputs
// (so a layer that read the other buffer set, or the previous layer's rows,
// would show), every layer's outputs compared; rank 1 (when there is one)
// runs other work before layer 2, so that its peers reach the set that layer
// reuses before it does. Replayed on new inputs.
int runDistinctLayers(const Shape& s, int R, uint64_t seed) {
  constexpr int kLayers = 3;
  std::vector<epComm_t> comms(R);
  epConfig_t cfg = configFor(s, epBackendCuda);
  EK(nullptr, epCommInitAll(comms.data(), R, gpusOf(R).data(), &cfg));
  std::vector<std::vector<GpuRank>> g(R, std::vector<GpuRank>(kLayers));
  for (int r = 0; r < R; r++)
    for (int l = 0; l < kLayers; l++) {
      g[r][l].comm = comms[r];
      allocRank(s, R, r, g[r][l]);
    }
  std::vector<cudaGraphExec_t> exec(R, nullptr);
  std::vector<std::vector<epHandle_t>> handles(R, std::vector<epHandle_t>(kLayers, nullptr));
  long long bad = 0;
  RankBarrier ready(R);
  for (int replay = 0; replay < 2; replay++) {
    std::vector<std::vector<RankData>> in(kLayers, std::vector<RankData>(R));
    std::vector<std::vector<Outputs>> ref(kLayers, std::vector<Outputs>(R));
    for (int l = 0; l < kLayers; l++) {
      randomInputs(s, R, seed + 100 * replay + l, in[l]);
      runHost(s, R, in[l], ref[l]);
    }
    runRanks(R, [&](int r) {
      CK(cudaSetDevice(gpuOf(r)));
      cudaStream_t st = g[r][0].stream;
      for (int l = 0; l < kLayers; l++) {
        GpuRank gl = g[r][l];
        gl.stream = st;  // every layer on the rank's one stream
        upload(s, r, in[l][r], gl);
        poison(s, R, gl);
      }
      CK(cudaStreamSynchronize(st));
      ready.wait();  // no rank's call waits for a peer that still copies
      if (exec[r] == nullptr) {
        CK(cudaStreamSynchronize(st));
        cudaGraph_t def;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        for (int l = 0; l < kLayers; l++) {
          GpuRank gl = g[r][l];
          gl.stream = st;
          if (l == 2 && r == 1) busyKernel<<<8, 256, 0, st>>>(gl.scratch, 16 << 20);  // rank 1 late
          ll::enqueueLayer(s, r, gl, &handles[r][l], [&](int) { busyKernel<<<64, 256, 0, st>>>(gl.scratch, 1 << 20); });
        }
        CK(cudaStreamEndCapture(st, &def));
        CK(cudaGraphInstantiate(&exec[r], def, 0));
        CK(cudaGraphDestroy(def));
      }
      ready.wait();  // every rank captured (the capture may grow the handle pool: cudaMalloc)
      CK(cudaGraphLaunch(exec[r], st));
      CK(cudaStreamSynchronize(st));
    });
    for (int l = 0; l < kLayers; l++)
      for (int r = 0; r < R; r++) {
        CK(cudaSetDevice(gpuOf(r)));
        GpuRank gl = g[r][l];
        gl.stream = g[r][0].stream;
        bad += compare(s, R, r, gl, ref[l][r], "layers (layer " + std::to_string(l) + ")");
      }
  }
  for (int r = 0; r < R; r++) {
    CK(cudaSetDevice(gpuOf(r)));
    if (exec[r]) CK(cudaGraphExecDestroy(exec[r]));
    for (epHandle_t h : handles[r]) epHandleDestroy(h);
    for (GpuRank& gl : g[r]) freeRank(gl);
    epCommDestroy(comms[r]);
  }
  printf("graph  R=%d H=%-5d K=%-2d E=%-3d M=%-4d %d distinct layers%s%s: %s\n", R, s.hidden, s.topk, s.experts,
         s.max_tokens, kLayers, s.split ? " split" : "", R > 1 ? ", rank 1 late" : "", bad ? "FAILED" : "OK");
  return bad ? 1 : 0;
}

// Rank 0 asks for FP8 rows, the others for BF16: every rank that received
// rows of the other type reports it (epInvalidUsage naming wire_type) at its
// next call, here the combine, instead of reading the rows as its own.
int runWireMismatch(int R) {
  Shape s{512, 4, 4 * R, 40, std::vector<int>(R, 40), false, false, false};
  RankedCase c(s, R, 21, nullptr, false);
  std::vector<int> bad(R, 0);
  RankBarrier ready(R);
  runRanks(R, [&](int r) {
    setUpRank(s, R, r, c.comms[r], c.in[r], c.g[r], ready);  // BF16-sized: fits either wire type
    Shape mine = s;
    mine.fp8 = r == 0;
    epLowLatencyDispatchArgs_t a = ll::dispatchArgs(mine, r, c.g[r]);
    epHandle_t h = nullptr;
    EK(c.comms[r], epLowLatencyDispatch(c.comms[r], &a, &h, c.g[r].stream));
    CK(cudaStreamSynchronize(c.g[r].stream));
    epLowLatencyCombineArgs_t ca = ll::combineArgs(c.g[r]);
    const epResult_t res = epLowLatencyCombine(c.comms[r], &ca, h, c.g[r].stream);
    const std::string msg = epGetLastError(c.comms[r]);
    if (res != epInvalidUsage || msg.find("wire_type must be the same") == std::string::npos) {
      printf("rank %d: combine after a wire_type mismatch gave %d (%s)\n", r, int(res), msg.c_str());
      bad[r] = 1;
    }
    epHandleDestroy(h);
  });
  c.close();
  const bool failed = std::count(bad.begin(), bad.end(), 1) != 0;
  printf("eager  R=%d wire_type fp8 on rank 0, bf16 elsewhere: %s\n", R, failed ? "FAILED" : "OK (reported)");
  return failed ? 1 : 0;
}

// Rank 0 passes an expert id out of range in device memory, which only the
// kernel sees: the dispatch counts the entry as -1 and rank 0's next call (its
// combine) returns epInvalidArgument naming the token and the id, doing
// nothing more (docs/SEMANTICS.md). The communicator stays usable: rank 0
// calls the combine again, which runs, so the peers' combines (waiting for
// rank 0's sums) finish well within the timeout. Every output must equal the
// host reference with that entry -1. tokens = 1: a flagged send.
// Rank r's dispatch, then its combine, which must return `want` (an error
// with `needle` in its message: a dispatch kernel's report); a combine that
// returned an error did nothing and is made again, which must run. Returns 1
// (printed) when either went otherwise.
int layerAfterReport(const Shape& s, int r, GpuRank& g, epResult_t want, const std::string& needle,
                     const std::string& what) {
  epLowLatencyDispatchArgs_t a = ll::dispatchArgs(s, r, g);
  epHandle_t h = nullptr;
  EK(g.comm, epLowLatencyDispatch(g.comm, &a, &h, g.stream));
  CK(cudaStreamSynchronize(g.stream));  // a kernel's report is in by now
  epLowLatencyCombineArgs_t c = ll::combineArgs(g);
  int bad = 0;
  epResult_t res = epLowLatencyCombine(g.comm, &c, h, g.stream);
  const std::string msg = epGetLastError(g.comm);
  if (res != want || (want != epSuccess && msg.find(needle) == std::string::npos)) {
    printf("rank %d, %s: the combine after the dispatch gave %d (%s), expected %d%s%s\n", r, what.c_str(), int(res),
           msg.c_str(), int(want), want != epSuccess ? " naming " : "", want != epSuccess ? needle.c_str() : "");
    bad = 1;
  }
  if (res != epSuccess) res = epLowLatencyCombine(g.comm, &c, h, g.stream);  // again: it runs now
  if (res != epSuccess) {
    printf("rank %d, %s: combine gave %d (%s)\n", r, what.c_str(), int(res), epGetLastError(g.comm));
    bad = 1;
  }
  CK(cudaStreamSynchronize(g.stream));
  epHandleDestroy(h);
  return bad;
}

int runBadId(int R, int tokens) {
  Shape s{512, 4, 4 * R, 40, std::vector<int>(R, tokens), true, false, false};
  // A peer left waiting fails the case in 20 s, not 60.
  RankedCase c(s, R, 31, [](epConfig_t& cfg) { cfg.timeout_ms = 20000; }, false);
  const int t_bad = tokens / 2, k_bad = 1;
  const long long bad_id = s.experts + 7;
  c.in[0].topk[size_t(t_bad) * s.topk + k_bad] = -1;
  runHost(s, R, c.in, c.ref);
  c.in[0].topk[size_t(t_bad) * s.topk + k_bad] = bad_id;
  const std::string want = "topk_idx of token " + std::to_string(t_bad) + " = " + std::to_string(bad_id);
  std::vector<int> bad(R, 0);
  RankBarrier ready(R);
  runRanks(R, [&](int r) {
    setUpRank(s, R, r, c.comms[r], c.in[r], c.g[r], ready, true);
    bad[r] = layerAfterReport(s, r, c.g[r], r == 0 ? epInvalidArgument : epSuccess, want, "a bad expert id");
  });
  const long long wrong = c.close("bad id");
  const bool failed = wrong != 0 || std::count(bad.begin(), bad.end(), 1) != 0;
  printf("eager  R=%d T=%d expert id %lld on rank 0 (token %d): %s\n", R, tokens, bad_id, t_bad,
         failed ? "FAILED" : "OK (reported, then combined)");
  return failed ? 1 : 0;
}

// A wait that fails after an argument error of the same kernel: rank 0
// dispatches with an expert id out of range (the kernel reports it) while
// the other ranks make no call, so its waits time out. Rank 0's next call
// must report the timeout, not the bad id (a failed wait has a slot of its
// own), saying that the peer's host has not made the call (the call logs),
// and the one after it must fail too (the communicator is broken).
int runTimeoutAfterBadId(int R) {
  Shape s{512, 4, 4 * R, 40, std::vector<int>(R, 40), false, false, false};
  constexpr int kTimeoutMs = 1000;
  RankedCase c(s, R, 32, [](epConfig_t& cfg) { cfg.timeout_ms = kTimeoutMs; }, false);
  c.in[0].topk[3] = s.experts + 5;
  epResult_t first = epSuccess, next = epSuccess, after = epSuccess;
  std::string msg;
  RankBarrier ready(R);
  runRanks(R, [&](int r) {
    setUpRank(s, R, r, c.comms[r], c.in[r], c.g[r], ready);
    if (r != 0) return;  // the other ranks make no call
    epLowLatencyDispatchArgs_t a = ll::dispatchArgs(s, r, c.g[r]);
    epHandle_t h = nullptr;
    first = epLowLatencyDispatch(c.comms[r], &a, &h, c.g[r].stream);
    CK(cudaStreamSynchronize(c.g[r].stream));
    epLowLatencyCombineArgs_t ca = ll::combineArgs(c.g[r]);
    next = epLowLatencyCombine(c.comms[r], &ca, h, c.g[r].stream);
    msg = epGetLastError(c.comms[r]);
    after = epLowLatencyCombine(c.comms[r], &ca, h, c.g[r].stream);
    CK(cudaStreamSynchronize(c.g[r].stream));
    if (h != nullptr) epHandleDestroy(h);
  });
  c.close();
  const bool failed = first != epSuccess || next != epTimeout ||
                      msg.find("cannot be used any more") == std::string::npos ||
                      msg.find("it has not made the later ones") == std::string::npos || after == epSuccess;
  printf("eager  R=%d expert id out of range on rank 0, then a timeout: dispatch %s, next call %s (%s), the one "
         "after %s: %s\n",
         R, epGetErrorString(first), epGetErrorString(next), msg.c_str(), epGetErrorString(after),
         failed ? "FAILED" : "OK (the timeout reported)");
  return failed ? 1 : 0;
}

// Low-latency calls out of order among themselves: after a dispatch on
// every rank, rank 0 combines while the others dispatch again. The kernels
// have no look of their own for this (it would slow their waits); the host
// compares the ranks' call logs. Every rank's next call, half a second on,
// must return epInvalidUsage naming its own call (the second), well before
// the timeout (10 s), not epTimeout.
int runLowLatencyOutOfOrder(int R) {
  Shape s{512, 4, 4 * R, 40, std::vector<int>(R, 40), false, false, false};
  constexpr int kTimeoutMs = 10000;
  RankedCase c(s, R, 33, [](epConfig_t& cfg) { cfg.timeout_ms = kTimeoutMs; }, false);
  std::vector<epResult_t> res(R, epSuccess);
  std::vector<std::string> msg(R);
  std::vector<double> secs(R, 0.0);
  RankBarrier ready(R);
  runRanks(R, [&](int r) {
    GpuRank& g = c.g[r];
    setUpRank(s, R, r, c.comms[r], c.in[r], g, ready);
    epLowLatencyDispatchArgs_t a = ll::dispatchArgs(s, r, g);
    epHandle_t h = nullptr, h2 = nullptr;
    EK(g.comm, epLowLatencyDispatch(g.comm, &a, &h, g.stream));
    CK(cudaStreamSynchronize(g.stream));
    const auto t0 = std::chrono::steady_clock::now();
    epLowLatencyCombineArgs_t ca = ll::combineArgs(g);
    res[r] = r == 0 ? epLowLatencyCombine(g.comm, &ca, h, g.stream) : epLowLatencyDispatch(g.comm, &a, &h2, g.stream);
    cudaStreamSynchronize(g.stream);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    // The next call (valid on its own: a dispatch after the combine, or the
    // combine of the first dispatch) reports, and runs nothing.
    if (res[r] == epSuccess)
      res[r] = r == 0 ? epLowLatencyDispatch(g.comm, &a, &h2, g.stream) : epLowLatencyCombine(g.comm, &ca, h, g.stream);
    secs[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    msg[r] = epGetLastError(g.comm);
    cudaStreamSynchronize(g.stream);
    if (h2 != nullptr) epHandleDestroy(h2);
    epHandleDestroy(h);
  });
  bool failed = false;
  for (int r = 0; r < R; r++) {
    const std::string mine = r == 0 ? "a low-latency combine" : "a low-latency dispatch";
    printf("  rank %d: %s after %.2f s: %s\n", r, epGetErrorString(res[r]), secs[r], msg[r].c_str());
    failed |= res[r] != epInvalidUsage || secs[r] > 0.25 * kTimeoutMs / 1000.0 ||
              msg[r].find("ranks must issue the same collective calls in the same order") == std::string::npos ||
              msg[r].find("collective call 2 ") == std::string::npos ||
              msg[r].find("rank " + std::to_string(r) + "'s is " + mine) == std::string::npos;
  }
  c.close();
  printf("eager  R=%d rank 0 combines, the others dispatch again: %s\n", R,
         failed ? "FAILED" : "OK (reported as out of order)");
  return failed ? 1 : 0;
}

// Rank 0 in a low-latency dispatch of `tokens` tokens per rank (1: flagged
// records), the other ranks in a high-throughput one (calls out of step):
// every rank must get epInvalidUsage saying so well before the timeout (a
// wait looks for its peer in the other family after 2 ms), not hang, not
// time out and not report success.
int runModeMismatch(int R, int tokens) {
  Shape s{512, 4, 4 * R, 40, std::vector<int>(R, tokens), false, false, false};
  constexpr int kTimeoutMs = 2000;
  RankedCase c(s, R, 25, [](epConfig_t& cfg) { cfg.timeout_ms = kTimeoutMs; }, false);
  std::vector<epResult_t> res(R, epSuccess);
  std::vector<std::string> msg(R);
  std::vector<double> secs(R, 0.0);
  RankBarrier ready(R);
  runRanks(R, [&](int r) {
    setUpRank(s, R, r, c.comms[r], c.in[r], c.g[r], ready);
    const auto t0 = std::chrono::steady_clock::now();
    epHandle_t h = nullptr;
    res[r] = r == 0 ? ll::syncedLayer(s, r, c.g[r], &h)
                    : ll::htLayer(s, R, r, c.g[r], reinterpret_cast<uint8_t*>(c.g[r].scratch), &h);
    cudaStreamSynchronize(c.g[r].stream);
    secs[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    msg[r] = epGetLastError(c.comms[r]);
    if (h != nullptr) epHandleDestroy(h);
  });
  bool failed = false;
  for (int r = 0; r < R; r++) {
    printf("  rank %d (%s): %s after %.2f s: %s\n", r, r == 0 ? "low latency" : "high throughput",
           epGetErrorString(res[r]), secs[r], msg[r].c_str());
    failed |= res[r] != epInvalidUsage || secs[r] > 0.25 * kTimeoutMs / 1000.0 ||
              msg[r].find("ranks must issue the same collective calls in the same order") == std::string::npos ||
              msg[r].find(r == 0 ? "is in a high-throughput call" : "is in a low-latency call") == std::string::npos;
  }
  c.close();
  printf("eager  R=%d T=%d rank 0 low latency, the others high throughput: %s\n", R, tokens,
         failed ? "FAILED" : "OK (reported as out of step)");
  return failed ? 1 : 0;
}

// Low-latency and high-throughput layers in turn on one communicator, a rank
// late by 30 ms before each layer (rank layer % R), and in a high-throughput
// layer also before its dispatch and its combine (htLayer): its peers wait in
// every kind of kernel long past the 2 ms after which a wait looks for the
// late rank in another call, and must not find it there (every call
// succeeds); the last layer's outputs (low latency) are compared.
int runFamiliesInStep(int R) {
  Shape s{512, 4, 4 * R, 40, std::vector<int>(R, 40), false, false, false};
  s.tokens[R - 1] = 1;  // flagged records from one rank
  RankedCase c(s, R, 26);
  std::vector<int> bad(R, 0);
  RankBarrier ready(R);
  runRanks(R, [&](int r) {
    setUpRank(s, R, r, c.comms[r], c.in[r], c.g[r], ready);
    uint8_t* scratch = reinterpret_cast<uint8_t*>(c.g[r].scratch);
    for (int layer = 0; layer < 7; layer++) {  // a kernel's error surfaces at the next call: 7 checks 6
      if (layer % R == r) std::this_thread::sleep_for(std::chrono::milliseconds(30));
      epHandle_t h = nullptr;
      epResult_t res = epSuccess;
      if (layer % 2 == 0)
        res = ll::syncedLayer(s, r, c.g[r], &h);
      else
        res = ll::htLayer(s, R, r, c.g[r], scratch, &h, layer % R == r ? 30 : 0);
      CK(cudaStreamSynchronize(c.g[r].stream));
      if (h != nullptr) epHandleDestroy(h);
      if (res != epSuccess) {
        printf("  rank %d layer %d: %s: %s\n", r, layer, epGetErrorString(res), epGetLastError(c.comms[r]));
        bad[r] = 1;
        return;
      }
    }
  });
  const long long wrong = c.close("families in step");
  const bool failed = wrong != 0 || std::count(bad.begin(), bad.end(), 1) != 0;
  printf("eager  R=%d low-latency and high-throughput layers in turn, a rank 30 ms late: %s\n", R,
         failed ? "FAILED" : "OK");
  return failed ? 1 : 0;
}

// Rank 0's low-latency dispatch, waiting for its peers, which make no call:
// communicators of R ranks (timeout 60 s), rank 0's buffers and inputs; the
// dispatch is made and 200 ms have passed when the constructor returns.
struct WaitingDispatch {
  Shape s;
  std::vector<epComm_t> comms;
  GpuRank g;
  epLowLatencyDispatchArgs_t a;
  epHandle_t h = nullptr;
  WaitingDispatch(int R, uint64_t seed)
      : s{512, 4, 4 * R, 40, std::vector<int>(R, 40), false, false, false}, comms(R) {
    std::vector<RankData> in(R);
    epConfig_t cfg = configFor(s, epBackendCuda);
    cfg.timeout_ms = 60000;
    EK(nullptr, epCommInitAll(comms.data(), R, gpusOf(R).data(), &cfg));
    randomInputs(s, R, seed, in);
    g.comm = comms[0];
    CK(cudaSetDevice(0));
    allocRank(s, R, 0, g);
    upload(s, 0, in[0], g);
    a = ll::dispatchArgs(s, 0, g);
    EK(comms[0], epLowLatencyDispatch(comms[0], &a, &h, g.stream));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the kernel waits for the peers by now
  }
  // Rank 0's stream done, its handle and buffers freed (not its communicator).
  void finishRank0() {
    CK(cudaSetDevice(0));
    CK(cudaStreamSynchronize(g.stream));
    epHandleDestroy(h);
    freeRank(g);
  }
};

// epCommAbort of a communicator whose kernel waits for a peer that never
// comes (rank 1 makes no call): the abort makes the waits leave, so it returns
// at once instead of after the kernel's timeout (60 s here).
int runAbortWhileWaiting(int R) {
  WaitingDispatch w(R, 23);
  const auto t0 = std::chrono::steady_clock::now();
  const epResult_t res = epCommAbort(w.comms[0]);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  w.finishRank0();
  for (int r = 1; r < R; r++) epCommDestroy(w.comms[r]);
  const bool failed = res != epSuccess || secs > 5.0;
  printf("eager  R=%d epCommAbort while the dispatch waits for rank 1: %s in %.2f s: %s\n", R,
         epGetErrorString(res), secs, failed ? "FAILED" : "OK");
  return failed ? 1 : 0;
}

// Peers that leave while rank 0's dispatch waits for them (no call of their
// own): each aborts its communicator, or destroys it, 200 ms after the
// dispatch. Rank 0's kernel must end within 5 s (its peers' call logs say
// they left; timeout 60 s), its combine must return epRemoteError saying
// that a peer aborted (destroyed) its communicator, and its next call must
// be refused. A destroy waits for the destroying rank's own kernels, not
// for the GPU's: on a GPU shared with rank 0 in this process, not for rank
// 0's waiting kernel (docs/SEMANTICS.md).
int runPeersLeaveWhileWaiting(int R, bool abort) {
  const char* how = abort ? "aborted its communicator" : "destroyed its communicator";
  const char* name = abort ? "abort" : "destroy";
  WaitingDispatch w(R, 29);
  std::vector<epComm_t>& comms = w.comms;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<int> closed_ok(R, 1);
  {  // together: a rank's close can wait for rank 0's kernel, which waits for every peer
    std::vector<std::thread> closers;
    for (int r = 1; r < R; r++)
      closers.emplace_back([&, r] {
        closed_ok[r] = (abort ? epCommAbort(comms[r]) : epCommDestroy(comms[r])) == epSuccess;
      });
    for (std::thread& t : closers) t.join();
  }
  const bool closed = std::count(closed_ok.begin(), closed_ok.end(), 1) == R;
  CK(cudaSetDevice(0));
  CK(cudaStreamSynchronize(w.g.stream));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  epLowLatencyCombineArgs_t ca = ll::combineArgs(w.g);
  const epResult_t res = epLowLatencyCombine(comms[0], &ca, w.h, w.g.stream);
  const std::string msg = epGetLastError(comms[0]);
  epHandle_t h2 = nullptr;
  const epResult_t again = epLowLatencyDispatch(comms[0], &w.a, &h2, w.g.stream);
  if (h2) epHandleDestroy(h2);
  w.finishRank0();
  epCommDestroy(comms[0]);
  const bool failed = !closed || secs > 5.0 || res != epRemoteError || msg.find(how) == std::string::npos ||
                      again != epRemoteError;
  printf("eager  R=%d peers %s theirs while rank 0's dispatch waits: kernel done %.2f s after, combine %s (%s), "
         "next call %s: %s\n", R, name, secs, epGetErrorString(res), msg.c_str(), epGetErrorString(again),
         failed ? "FAILED" : "OK");
  return failed ? 1 : 0;
}

// Inputs written by lateCopyKernel right before the calls that read them
// (x, ids and weights before the dispatch, y before the combine), the
// buffers the calls read holding zeros and ids of -1 until then: every output
// must still match the reference, eager or captured in a graph (where the
// calls' kernels hang from programmatic edges). Fails if a kernel launched
// with programmatic dependent launch (EP_CUDA_LL_PDL) reads before its wait.
int runLateInputs(int R, int tokens, bool split, bool graph) {
  Shape s{512, 4, 4 * R, 40, std::vector<int>(R, tokens), true, false, split};
  RankedCase c(s, R, 41);
  struct Staged {  // the inputs where lateCopyKernel takes them from
    uint32_t *x, *topk, *w, *y;
    size_t nx, ntopk, nw, ny;  // 4-byte words
  };
  std::vector<Staged> st(R);
  RankBarrier ready(R);
  runRanks(R, [&](int r) {
    setUpRank(s, R, r, c.comms[r], c.in[r], c.g[r], ready, true);
    Staged& a = st[r];
    a.nx = c.in[r].x.size() / 2;
    a.ntopk = c.in[r].topk.size() * 2;
    a.nw = c.in[r].w.size();
    a.ny = c.in[r].y.size() / 2;
    for (auto [p, n] : {std::pair{&a.x, a.nx}, {&a.topk, a.ntopk}, {&a.w, a.nw}, {&a.y, a.ny}})
      CK(cudaMalloc(p, n * 4 + 4));
    CK(cudaMemcpy(a.x, c.in[r].x.data(), a.nx * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(a.topk, c.in[r].topk.data(), a.ntopk * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(a.w, c.in[r].w.data(), a.nw * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(a.y, c.in[r].y.data(), a.ny * 4, cudaMemcpyHostToDevice));
    CK(cudaMemset(c.g[r].x, 0, a.nx * 4));
    CK(cudaMemset(c.g[r].topk, 0xff, a.ntopk * 4));
    CK(cudaMemset(c.g[r].w, 0, a.nw * 4));
    CK(cudaMemset(c.g[r].y, 0, a.ny * 4));
    ready.wait();
    cudaGraph_t graph_def = nullptr;
    cudaGraphExec_t exec = nullptr;
    if (graph) CK(cudaStreamBeginCapture(c.g[r].stream, cudaStreamCaptureModeThreadLocal));
    const unsigned long long delay = 200000;  // 200 us
    auto late = [&](const uint32_t* src, void* dst, size_t n) {
      lateCopyKernel<<<8, 256, 0, c.g[r].stream>>>(src, static_cast<uint32_t*>(dst), n, delay);
    };
    late(a.x, c.g[r].x, a.nx);
    late(a.topk, c.g[r].topk, a.ntopk);
    late(a.w, c.g[r].w, a.nw);
    epHandle_t h = nullptr;
    epLowLatencyDispatchArgs_t da = ll::dispatchArgs(s, r, c.g[r]);  // EP_LL_SEND_ONLY when split
    EK(c.comms[r], epLowLatencyDispatch(c.comms[r], &da, &h, c.g[r].stream));
    if (split) EK(c.comms[r], epLowLatencyComplete(c.comms[r], h, c.g[r].stream));
    late(a.y, c.g[r].y, a.ny);
    epLowLatencyCombineArgs_t ca = ll::combineArgs(c.g[r], split ? EP_LL_SEND_ONLY : 0u);
    EK(c.comms[r], epLowLatencyCombine(c.comms[r], &ca, h, c.g[r].stream));
    if (split) EK(c.comms[r], epLowLatencyComplete(c.comms[r], h, c.g[r].stream));
    if (graph) {  // the kernels' programmatic edges are the graph's now
      CK(cudaStreamEndCapture(c.g[r].stream, &graph_def));
      CK(cudaGraphInstantiate(&exec, graph_def, 0));
      ready.wait();  // every rank captured before any launches
      CK(cudaGraphLaunch(exec, c.g[r].stream));
    }
    CK(cudaStreamSynchronize(c.g[r].stream));
    if (graph) {
      CK(cudaGraphExecDestroy(exec));
      CK(cudaGraphDestroy(graph_def));
    }
    epHandleDestroy(h);
  });
  for (int r = 0; r < R; r++) {
    CK(cudaSetDevice(gpuOf(r)));
    for (uint32_t* p : {st[r].x, st[r].topk, st[r].w, st[r].y}) CK(cudaFree(p));
  }
  const long long bad = c.close("late inputs");
  printf("%-6s R=%d T=%d%s inputs written by the kernel before each call, 200 us after it let the call in: %s\n",
         graph ? "graph" : "eager", R, tokens, split ? " split" : "", bad ? "FAILED" : "OK");
  return bad ? 1 : 0;
}

// config.max_nodes_per_token (gpu_ll_test --node-limit, run with
// EP_NODE_SIZE=1: each rank a node; the library reads its parameters once per
// process, hence a run of its own). Two ranks, sharing GPU 0 when only one is
// visible; random tokens, nearly all on both ranks' experts. With a bound of
// 1 the dispatch sends its rows as if no bound were declared and the next
// call (the combine) returns epInvalidArgument naming a token, having done
// nothing; made again, it runs, and every output equals the host reference
// (computed without a bound). With a bound of 2 the layer runs without a
// report.
int runNodeLimit() {
  const int R = 2;
  const Shape s{512, 4, 16, 40, std::vector<int>(R, 40), true, false, false};
  const std::string found = "selects experts on 2 nodes, more than config.max_nodes_per_token = 1";
  int failed = 0;
  for (int bound : {1, 2}) {  // the same inputs (seed 57) for both
    RankedCase c(s, R, 57, [bound](epConfig_t& cfg) { cfg.max_nodes_per_token = bound; });
    int num_nodes = 0;
    EK(c.comms[0], epCommNodes(c.comms[0], &num_nodes, nullptr));
    if (num_nodes != R) {
      printf("node limit: %d nodes, not one per rank: run it with EP_NODE_SIZE=1: FAILED\n", num_nodes);
      c.close();
      return 1;
    }
    std::vector<int> bad(R, 0);
    RankBarrier ready(R);
    runRanks(R, [&](int r) {
      setUpRank(s, R, r, c.comms[r], c.in[r], c.g[r], ready, true);
      bad[r] = layerAfterReport(s, r, c.g[r], bound == 1 ? epInvalidArgument : epSuccess, found,
                                "max_nodes_per_token = " + std::to_string(bound));
    });
    const long long wrong = c.close("node limit");
    const bool ok = wrong == 0 && bad[0] == 0 && bad[1] == 0;
    printf("eager  R=%d max_nodes_per_token = %d, tokens on 2 nodes: %s: %s\n", R, bound,
           bound == 1 ? "reported by the next call, outputs as without a bound" : "no report", ok ? "OK" : "FAILED");
    failed += ok ? 0 : 1;
  }
  return failed;
}

// The send half holds no SM while it waits: it waits for nothing. Rank 0's
// send-only dispatch and the work after it on its stream finish while rank 1
// has not called yet (it sleeps 300 ms first); then both complete and combine,
// and the outputs are checked.
int runSendHalfDoesNotWait(int R) {
  Shape s{2048, 8, 8 * R, 64, std::vector<int>(R, 64), true, false, true};
  RankedCase c(s, R, 31);
  std::vector<double> send_ms(R, 0.0);
  RankBarrier ready(R);
  runRanks(R, [&](int r) {
    setUpRank(s, R, r, c.comms[r], c.in[r], c.g[r], ready);
    epHandle_t warm = nullptr;  // a first layer: kernels loaded, sets in use
    ll::enqueueLayer(s, r, c.g[r], &warm, [&](int) {});
    CK(cudaStreamSynchronize(c.g[r].stream));
    epHandleDestroy(warm);
  });
  runRanks(R, [&](int r) {
    CK(cudaSetDevice(gpuOf(r)));
    poison(s, R, c.g[r]);
    CK(cudaStreamSynchronize(c.g[r].stream));
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const auto t0 = std::chrono::steady_clock::now();
    epLowLatencyDispatchArgs_t a = ll::dispatchArgs(s, r, c.g[r]);  // EP_LL_SEND_ONLY
    epHandle_t h = nullptr;
    EK(c.comms[r], epLowLatencyDispatch(c.comms[r], &a, &h, c.g[r].stream));
    busyKernel<<<64, 256, 0, c.g[r].stream>>>(c.g[r].scratch, 1 << 20);
    CK(cudaStreamSynchronize(c.g[r].stream));
    send_ms[r] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    EK(c.comms[r], epLowLatencyComplete(c.comms[r], h, c.g[r].stream));
    epLowLatencyCombineArgs_t ca = ll::combineArgs(c.g[r]);
    EK(c.comms[r], epLowLatencyCombine(c.comms[r], &ca, h, c.g[r].stream));
    CK(cudaStreamSynchronize(c.g[r].stream));
    epHandleDestroy(h);
  });
  const long long bad = c.close("send half");
  const bool failed = bad != 0 || send_ms[0] > 100.0;
  printf("eager  R=%d rank 0's send half and the work after it, rank 1 300 ms late: %.2f ms: %s\n", R, send_ms[0],
         failed ? "FAILED" : "OK");
  return failed ? 1 : 0;
}

// --random N [SEED [--first I]] (random_cases.h).
int runRandom(const random_cases::Run& run) {
  int passed = 0, failed = 0;
  for (int i = run.first; i < run.first + run.count; i++) {
    std::mt19937_64 g(run.caseSeed(i));
    const int R = random_cases::ranksOf(g);
    const Shape s = random_cases::llShape(g, R);
    const bool graph = random_cases::chance(g, 0.2);
    printf("[%d] ", i);
    if (runShape(s, R, run.caseSeed(i), graph) == 0) {
      passed++;
    } else {
      failed++;
      random_cases::printDrawAgain("gpu_ll_test", run, i);
    }
    fflush(stdout);
  }
  printf("gpu_ll_test --random: %d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}

}  // namespace

// --eager-bench: a layer (dispatch, then combine, then the stream
// synchronised) timed on the host clock, R ranks as threads.
void eagerBench(int R, int tokens) {
  Shape s{7168, 8, 288, ll::benchMaxTokens(tokens), std::vector<int>(R, tokens), true, false, false};
  std::vector<RankData> in(R);
  std::vector<GpuRank> g(R);
  std::vector<epComm_t> comms(R);
  epConfig_t cfg = configFor(s, epBackendCuda);
  EK(nullptr, epCommInitAll(comms.data(), R, gpusOf(R).data(), &cfg));
  for (int r = 0; r < R; r++) randomInputs(s, R, 99, r, &in[r]);
  const int warmup = 20, iters = 200;
  std::vector<std::vector<float>> t_layer(R), t_disp(R);
  runRanks(R, [&](int r) {
    CK(cudaSetDevice(gpuOf(r)));
    g[r].comm = comms[r];
    allocRank(s, R, g[r], 64 << 20);
    upload(s, r, in[r], g[r]);
    for (int i = 0; i < warmup + iters; i++) {
      epHandle_t h = nullptr;
      epLowLatencyDispatchArgs_t a = dispatchArgs(s, r, g[r]);
      a.flags = 0;
      const auto t0 = std::chrono::steady_clock::now();
      EK(comms[r], epLowLatencyDispatch(comms[r], &a, &h, g[r].stream));
      CK(cudaStreamSynchronize(g[r].stream));
      const auto t1 = std::chrono::steady_clock::now();
      epLowLatencyCombineArgs_t c = combineArgs(g[r]);
      EK(comms[r], epLowLatencyCombine(comms[r], &c, h, g[r].stream));
      CK(cudaStreamSynchronize(g[r].stream));
      const auto t2 = std::chrono::steady_clock::now();
      epHandleDestroy(h);
      if (i >= warmup) {
        t_layer[r].push_back(std::chrono::duration<float, std::micro>(t2 - t0).count());
        t_disp[r].push_back(std::chrono::duration<float, std::micro>(t1 - t0).count());
      }
    }
    freeRank(g[r]);
  });
  char backend[64] = "";
  for (auto c : comms) epCommDestroy(c);  // the staged path logs its copies' medians here (EP_DEBUG=INFO)
  // The staging leg's reference: plain copies device -> pinned host and back
  // of the bytes a call moves (x in, and the combined rows out), median of 200.
  {
    CK(cudaSetDevice(gpuOf(0)));
    const size_t bytes = size_t(tokens) * 7168 * 2;
    void *dev = nullptr, *pinned = nullptr;
    CK(cudaMalloc(&dev, bytes));
    CK(cudaHostAlloc(&pinned, bytes, cudaHostAllocPortable));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    std::vector<float> d2h, h2d;
    for (int i = 0; i < 220; i++) {
      const auto t0 = std::chrono::steady_clock::now();
      CK(cudaMemcpyAsync(pinned, dev, bytes, cudaMemcpyDeviceToHost, st));
      CK(cudaStreamSynchronize(st));
      const auto t1 = std::chrono::steady_clock::now();
      CK(cudaMemcpyAsync(dev, pinned, bytes, cudaMemcpyHostToDevice, st));
      CK(cudaStreamSynchronize(st));
      const auto t2 = std::chrono::steady_clock::now();
      if (i >= 20) {
        d2h.push_back(std::chrono::duration<float, std::micro>(t1 - t0).count());
        h2d.push_back(std::chrono::duration<float, std::micro>(t2 - t1).count());
      }
    }
    printf("reference: cudaMemcpyAsync + synchronize of %zu bytes: to pinned host median %.1f us (%.2f GB/s), "
           "back %.1f us (%.2f GB/s)\n",
           bytes, ll::percentile(d2h, 0.5), bytes / ll::percentile(d2h, 0.5) / 1e3, ll::percentile(h2d, 0.5),
           bytes / ll::percentile(h2d, 0.5) / 1e3);
    CK(cudaStreamDestroy(st));
    CK(cudaFree(dev));
    CK(cudaFreeHost(pinned));
  }
  const char* net = getenv("EP_CUDA_NETWORK");
  snprintf(backend, sizeof(backend), "%s", net && atoi(net) ? "staged across nodes" : "one node");
  for (int r = 0; r < R; r++)
    printf("LL eager EP%d %s rank %d tokens %d: dispatch median %.1f us p99 %.1f us | dispatch + combine median "
           "%.1f us p99 %.1f us\n",
           R, backend, r, tokens, ll::percentile(t_disp[r], 0.5), ll::percentile(t_disp[r], 0.99),
           ll::percentile(t_layer[r], 0.5), ll::percentile(t_layer[r], 0.99));
  fflush(stdout);
}

int main(int argc, char** argv) {
  const bool random = argc > 1 && std::string(argv[1]) == "--random";
  random_cases::Run run;
  if (random && !random_cases::parseRun(argc, argv, "gpu_ll_test", &run)) return 2;
  if (random) setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);  // ranks may share a GPU
  int ranks = ranksOption(argc, argv, "gpu_ll_test");  // 0: not given
  const int staged_ranks = stagedOption(argc, argv, "gpu_ll_test");
  const bool staged = staged_ranks > 0;
  if (staged) ranks = staged_ranks;
  const bool node_limit = argc > 1 && std::string(argv[1]) == "--node-limit";
  if (node_limit) setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);  // two ranks may share a GPU
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    printf("SKIPPED gpu_ll_test: no GPU visible\n");
    return 0;
  }
  const bool do_bench = argc > 1 && std::string(argv[1]) == "--bench";
  const int Rmax = std::min(ndev, 8);
  gpuCount() = Rmax;
  // The work this test enqueues between the split halves, loaded before any
  // call: under lazy loading its first launch could wait for a kernel of a
  // rank that shares the GPU, which waits for this rank (docs/SEMANTICS.md, ranks
  // sharing a GPU).
  cudaFuncAttributes busy_attr;
  for (int d = 0; d < Rmax; d++) {
    CK(cudaSetDevice(d));
    CK(cudaFuncGetAttributes(&busy_attr, busyKernel));
  }
  if (random) return runRandom(run);
  if (node_limit) {
    const int failed = runNodeLimit();
    printf("gpu_ll_test --node-limit: %d passed, %d failed\n", 2 - failed, failed);
    return failed ? 1 : 0;
  }
  if (argc > 3 && std::string(argv[1]) == "--eager-bench") {
    const int R = atoi(argv[2]);
    if (R < 1 || R > 8) {
      fprintf(stderr, "gpu_ll_test: --eager-bench takes 1..8 ranks\n");
      return 2;
    }
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
    for (const char* q = argv[3]; *q;) {
      eagerBench(R, atoi(q));
      while (*q && *q != ',') q++;
      if (*q == ',') q++;
    }
    return 0;
  }
  if (do_bench) {
    // --bench --ranks N: EP N, ranks sharing the visible GPUs as in the tests
    // (timing of the kernels' code paths for several sources on one GPU; the
    // link is not crossed).
    int R = Rmax;
    if (argc > 3 && std::string(argv[2]) == "--ranks") {
      R = atoi(argv[3]);
      if (R < 1 || R > 8) {
        fprintf(stderr, "gpu_ll_test: --bench --ranks takes 1..8\n");
        return 2;
      }
      setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
    }
    ll::benchStandard(R);
    return 0;
  }
  if (argc > 2 && std::string(argv[1]) == "--bench-tokens" && strchr(argv[2], '/')) {
    // A/B/...: one rank per entry with that many tokens (ranks share the
    // visible GPUs as in the tests).
    std::vector<int> per_rank;
    for (const char* q = argv[2]; *q;) {
      per_rank.push_back(atoi(q));
      while (*q && *q != '/') q++;
      if (*q == '/') q++;
    }
    const int R = int(per_rank.size());
    if (R > 8 || *std::min_element(per_rank.begin(), per_rank.end()) < 0 ||
        *std::max_element(per_rank.begin(), per_rank.end()) > 4096) {
      fprintf(stderr, "gpu_ll_test: --bench-tokens A/B/... takes 1..8 counts in 0..4096\n");
      return 2;
    }
    if (R > Rmax) setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
    ll::bench(R, 0, false, per_rank);
    return 0;
  }
  if (argc > 2 && std::string(argv[1]) == "--bench-tokens") {
    for (const char* q = argv[2]; *q;) {
      const int n = atoi(q);
      if (n < 1 || n > 4096) {
        fprintf(stderr, "gpu_ll_test: --bench-tokens takes counts in 1..4096\n");
        return 2;
      }
      ll::bench(Rmax, n, false);
      while (*q && *q != ',') q++;
      if (*q == ',') q++;
    }
    return 0;
  }
  int failed = 0, passed = 0;
  if (argc > 1 && std::string(argv[1]) == "--mixed") {
    // Ranks of different batch sizes only, two ranks (sharing the GPU when
    // there is one) or --ranks N after it.
    int R = 2;
    if (argc > 2) R = std::string(argv[2]) == "--ranks" ? ranksOption(argc - 1, argv + 1, "gpu_ll_test --mixed") : 0;
    if (R < 2 || argc == 3 || argc > 4) {
      fprintf(stderr, "gpu_ll_test: --mixed takes no argument but --ranks N, N in 2..8\n");
      return 2;
    }
    if (R > Rmax) setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
    for (const Shape& s : unevenShapes(R)) ((runShape(s, R, 7, false) == 0) ? passed : failed)++;
    printf("gpu_ll_test --mixed: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
  }
  std::vector<int> rank_counts = {1};
  if (Rmax >= 2) rank_counts.push_back(2);
  // --small: three small shapes (one with repeated experts), EP1 and EP2, for
  // compute-sanitizer (tests/gpu/run.sh).
  if (argc > 1 && std::string(argv[1]) == "--small") {
    for (int R : rank_counts) {
      std::vector<int> zero(R, 40);
      zero[0] = 0;
      const Shape small[] = {{512, 4, 4 * R, 40, zero, true, false, true},
                             {2048, 9, 16 * R, 64, std::vector<int>(R, 50), true, true, false},
                             {512, 4, 4 * R, 40, std::vector<int>(R, 40), true, false, false, true},
                             {512, 4, 4 * R, 8, std::vector<int>(R, 3), true, false, true}};  // flagged records
      for (const Shape& s : small) ((runShape(s, R, 7, false) == 0) ? passed : failed)++;
      // A graph of kGraphLayers layers (its pool grows under capture), small.
      ((runShape({512, 4, 4 * R, 16, std::vector<int>(R, 16), true, false, true}, R, 9, true) == 0) ? passed : failed)++;
      ((runDistinctLayers({512, 4, 4 * R, 16, std::vector<int>(R, 16), true, false, true}, R, 13) == 0) ? passed
                                                                                                       : failed)++;
    }
    printf("gpu_ll_test --small: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
  }
  if (Rmax > 2) rank_counts.push_back(Rmax);
  if (ranks) rank_counts = {ranks};
  for (int R : rank_counts) {
    std::vector<Shape> shapes = {
        {7168, 8, 288, 128, std::vector<int>(R, 128), true, false, false},
        {7168, 8, 288, 128, std::vector<int>(R, 128), false, false, true},
        {2048, 9, 16 * R, 64, std::vector<int>(R, 50), true, true, false},
        {16, 1, 2 * R, 8, std::vector<int>(R, 8), true, false, true},
        {48, 32, 32 * R, 33, std::vector<int>(R, 33), false, false, false},
        {1040, 32, 36 * R, 256, std::vector<int>(R, 200), true, false, false},
        {5120, 6, 8 * R, 1024, std::vector<int>(R, 1024), true, true, false},  // T = M = 1024
        // BF16 rows of 16 and 48 bytes at top-32; pow2 scales with a partial
        // last block of 128 values (hidden 1040).
        {8, 32, 32 * R, 16, std::vector<int>(R, 16), false, false, false},
        {24, 32, 32 * R, 16, std::vector<int>(R, 13), false, false, true},
        {1040, 8, 16 * R, 64, std::vector<int>(R, 60), true, true, false},
        // More (source, expert) counts than a block stages (R * L > 4096) and
        // more experts than the numbering blocks take in one batch.
        {128, 8, 2304 * R, 64, std::vector<int>(R, 60), true, false, false},
        // Decode-sized calls at the full hidden size: far fewer records than
        // blocks (the paths a small call takes: most blocks without work).
        {7168, 8, 288, 16, std::vector<int>(R, 3), true, false, false},
        {7168, 8, 288, 8, std::vector<int>(R, 1), false, false, true},
        // FP8 and split: the receive kernel of small calls, records in slices.
        {7168, 8, 288, 8, std::vector<int>(R, 2), true, false, true},
        // Experts repeated in a token's top-k (one row per token; expert 1
        // full): whole rows, and the small split call's slices.
        {7168, 8, 288, 128, std::vector<int>(R, 128), true, false, false, true},
        {7168, 8, 288, 8, std::vector<int>(R, 2), true, false, true, true},
    };
    std::vector<int> zero(R, 40);
    zero[0] = 0;  // rank 0 sends nothing
    shapes.push_back({512, 4, 4 * R, 40, zero, true, false, true});
    if (R > 1) {  // the last rank sends nothing, whole calls
      std::vector<int> last(R, 40);
      last[R - 1] = 0;
      shapes.push_back({512, 4, 4 * R, 40, last, true, false, false});
    }
    for (const Shape& u : unevenShapes(R)) shapes.push_back(u);
    // Flagged records at the default's largest flagged call (8 tokens; top-32
    // above EP2: fewer, llFlagTokensFit, and 8 go plain), repeats, BF16 and
    // FP8 split; at the full hidden size with 5 and 8 tokens per rank, and
    // with per-rank counts that differ. (tests/gpu/run.sh runs it again with
    // EP_CUDA_LL_FLAGGED=16: the 13- and 16-token shapes above go flagged.)
    shapes.push_back({1040, 32, 36 * R, 8, std::vector<int>(R, 8), false, false, true, true});
    shapes.push_back({1040, 32, 36 * R, 8, std::vector<int>(R, 8), true, true, true});
    shapes.push_back({7168, 8, 288, 8, std::vector<int>(R, 8), true, false, false});
    shapes.push_back({7168, 8, 288, 8, std::vector<int>(R, 5), true, false, true, true});
    for (const Shape& s : shapes) ((runShape(s, R, 7, false) == 0) ? passed : failed)++;
    if (staged) continue;  // the cases below: graphs and the kernels' own checks and waits
    Shape gs{7168, 8, 288, 64, std::vector<int>(R, 64), true, false, true};
    ((runShape(gs, R, 11, true) == 0) ? passed : failed)++;
    gs.split = false;
    ((runShape(gs, R, 12, true) == 0) ? passed : failed)++;
    gs.tokens.assign(R, 2);  // flagged records in a graph
    ((runShape(gs, R, 14, true) == 0) ? passed : failed)++;
    // Three layers of their own in one graph (alternating sets, each checked).
    ((runDistinctLayers({7168, 8, 288, 64, std::vector<int>(R, 64), true, false, false}, R, 21) == 0) ? passed
                                                                                                        : failed)++;
    ((runDistinctLayers({2048, 9, 16 * R, 32, std::vector<int>(R, 30), false, false, true}, R, 22) == 0) ? passed
                                                                                                          : failed)++;
    if (R >= 2) ((runWireMismatch(R) == 0) ? passed : failed)++;
    if (R >= 2) ((runBadId(R, 40) == 0) ? passed : failed)++;
    if (R >= 2) ((runBadId(R, 1) == 0) ? passed : failed)++;
    if (R >= 2) ((runAbortWhileWaiting(R) == 0) ? passed : failed)++;
    for (bool abort : {true, false})
      if (R >= 2) ((runPeersLeaveWhileWaiting(R, abort) == 0) ? passed : failed)++;
    if (R >= 2) ((runTimeoutAfterBadId(R) == 0) ? passed : failed)++;
    if (R >= 2) ((runLowLatencyOutOfOrder(R) == 0) ? passed : failed)++;
    if (R >= 2) ((runModeMismatch(R, 40) == 0) ? passed : failed)++;
    if (R >= 2) ((runModeMismatch(R, 1) == 0) ? passed : failed)++;
    if (R >= 2) ((runFamiliesInStep(R) == 0) ? passed : failed)++;
    if (R >= 2) ((runSendHalfDoesNotWait(R) == 0) ? passed : failed)++;
    for (bool graph : {false, true})
      for (int tokens : {1, 40})
        for (bool split : {false, true}) ((runLateInputs(R, tokens, split, graph) == 0) ? passed : failed)++;
  }
  printf("gpu_ll_test: %d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
