// Low-latency mode on GPUs against the host backend, element by element, and
// its latency in CUDA graphs.
//
//   gpu_ll_test            correctness: shapes x wire types, split halves with
//                          other work between them, 3 layers captured in a graph
//                          and replayed on new data, ranks sending 0 tokens
//   gpu_ll_test --bench    latency per call (median / p99 over >= 100 calls,
//                          inside a CUDA graph), EP = number of visible GPUs
#include <algorithm>
#include <cmath>
#include <string>

#include "gpu_common.h"

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

// Runs dispatch (+ combine) on the host backend: the reference.
void runHost(const Shape& s, int R, std::vector<RankData>& in, std::vector<Outputs>& ref) {
  std::vector<epComm_t> comms(R);
  epConfig_t cfg = configFor(s, epBackendHost);
  EK(nullptr, epCommInitAll(comms.data(), R, nullptr, &cfg));
  runRanks(R, [&](int r) { ll::runHost(s, R, r, comms[r], in[r], &ref[r]); });
  for (auto c : comms) epCommDestroy(c);
}

void randomInputs(const Shape& s, int R, uint64_t seed, std::vector<RankData>& in) {
  for (int r = 0; r < R; r++) ll::randomInputs(s, R, seed, r, &in[r]);
}

void allocRank(const Shape& s, int R, int r, GpuRank& g) {
  CK(cudaSetDevice(r));
  ll::allocRank(s, R, g, 64 << 20);  // busyKernel's 16 << 20 floats
}

// Enqueues one dispatch + combine (halves split by other work when asked).
void enqueueLayer(const Shape& s, int r, GpuRank& g, epHandle_t* h) {
  ll::enqueueLayer(s, r, g, h, [&](int) { busyKernel<<<64, 256, 0, g.stream>>>(g.scratch, 16 << 20); });
}

int runShape(const Shape& s, int R, uint64_t seed, bool graph) {
  std::vector<RankData> in(R);
  std::vector<Outputs> ref(R);
  std::vector<GpuRank> g(R);
  std::vector<epComm_t> comms(R);
  epConfig_t cfg = configFor(s, epBackendCuda);
  EK(nullptr, epCommInitAll(comms.data(), R, nullptr, &cfg));
  for (int r = 0; r < R; r++) {
    g[r].comm = comms[r];
    allocRank(s, R, r, g[r]);
  }
  long long bad = 0;
  const int rounds = graph ? 3 : 2;  // graph: 3 replays of a 3-layer graph
  std::vector<cudaGraphExec_t> exec(R, nullptr);
  for (int round = 0; round < rounds; round++) {
    randomInputs(s, R, seed + round, in);
    runHost(s, R, in, ref);
    runRanks(R, [&](int r) {
      CK(cudaSetDevice(r));
      upload(s, r, in[r], g[r]);
      poison(s, R, g[r]);
      if (!graph) {
        epHandle_t h = nullptr;
        enqueueLayer(s, r, g[r], &h);
        CK(cudaStreamSynchronize(g[r].stream));
        epHandleDestroy(h);
        return;
      }
      if (exec[r] == nullptr) {  // 3 layers with alternating buffer sets, captured once
        cudaGraph_t graph_def;
        epHandle_t hs[3] = {nullptr, nullptr, nullptr};
        CK(cudaStreamSynchronize(g[r].stream));
        CK(cudaStreamBeginCapture(g[r].stream, cudaStreamCaptureModeThreadLocal));
        for (int layer = 0; layer < 3; layer++) enqueueLayer(s, r, g[r], &hs[layer]);
        CK(cudaStreamEndCapture(g[r].stream, &graph_def));
        CK(cudaGraphInstantiate(&exec[r], graph_def, 0));
        CK(cudaGraphDestroy(graph_def));
        // The handles' device state is used by the graph: keep them for its life.
      }
      CK(cudaGraphLaunch(exec[r], g[r].stream));
      CK(cudaStreamSynchronize(g[r].stream));
    });
    for (int r = 0; r < R; r++) {
      CK(cudaSetDevice(r));
      bad += compare(s, R, r, g[r], ref[r], graph ? "graph" : "eager");
    }
  }
  for (int r = 0; r < R; r++) {
    CK(cudaSetDevice(r));
    if (exec[r]) cudaGraphExecDestroy(exec[r]);
    freeRank(g[r]);
    epCommDestroy(comms[r]);
  }
  printf("%-6s R=%d H=%-5d K=%-2d E=%-3d M=%-4d T=[", graph ? "graph" : "eager", R, s.hidden, s.topk, s.experts, s.max_tokens);
  for (int r = 0; r < R; r++) printf("%s%d", r ? "," : "", s.tokens[r]);
  printf("] %s%s%s: %s\n", s.fp8 ? "fp8" : "bf16", s.pow2 ? " pow2" : "", s.split ? " split" : "", bad ? "FAILED" : "OK");
  return bad ? 1 : 0;
}

double percentile(std::vector<float> v, double q) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(q * (v.size() - 1) + 0.5))];
}

// Latency of dispatch and combine inside one CUDA graph of `layers` layers.
void bench(int R, int tokens, bool split) {
  Shape s{7168, 8, 288, 128, std::vector<int>(R, tokens), true, false, split};
  std::vector<RankData> in(R);
  std::vector<GpuRank> g(R);
  std::vector<epComm_t> comms(R);
  epConfig_t cfg = configFor(s, epBackendCuda);
  EK(nullptr, epCommInitAll(comms.data(), R, nullptr, &cfg));
  randomInputs(s, R, 99, in);
  const int layers = 100;
  std::vector<std::vector<float>> t_disp(R), t_comb(R), t_send(R), t_recv(R);
  std::vector<float> t_layer(R);
  runRanks(R, [&](int r) {
    CK(cudaSetDevice(r));
    g[r].comm = comms[r];
    allocRank(s, R, r, g[r]);
    upload(s, r, in[r], g[r]);
    std::vector<cudaEvent_t> ev(4 * layers + 1);
    for (auto& e : ev) CK(cudaEventCreate(&e));
    std::vector<epHandle_t> hs(layers, nullptr);
    // Eager warm-up with all handles alive at once: the handle pool grows to
    // `layers` here, so the capture below allocates nothing.
    for (int l = 0; l < layers; l++) {
      epLowLatencyDispatchArgs_t a = EP_LL_DISPATCH_ARGS_INITIALIZER;
      a.x = g[r].x; a.topk_idx = g[r].topk; a.topk_weights = g[r].w;
      a.num_tokens = tokens; a.num_topk = 8; a.wire_type = epFloat8E4M3;
      a.recv_x = g[r].recv_x; a.recv_scales = g[r].recv_scales; a.recv_count = g[r].recv_count; a.recv_src = g[r].recv_src;
      EK(comms[r], epLowLatencyDispatch(comms[r], &a, &hs[l], g[r].stream));
      epLowLatencyCombineArgs_t c = EP_LL_COMBINE_ARGS_INITIALIZER;
      c.y = g[r].y; c.out = g[r].out;
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
        epLowLatencyDispatchArgs_t a = EP_LL_DISPATCH_ARGS_INITIALIZER;
        a.flags = split ? EP_LL_SEND_ONLY : 0u;
        a.x = g[r].x; a.topk_idx = g[r].topk; a.topk_weights = g[r].w;
        a.num_tokens = tokens; a.num_topk = 8; a.wire_type = epFloat8E4M3;
        a.recv_x = g[r].recv_x; a.recv_scales = g[r].recv_scales; a.recv_count = g[r].recv_count; a.recv_src = g[r].recv_src;
        mark(4 * l);
        EK(comms[r], epLowLatencyDispatch(comms[r], &a, &hs[l], g[r].stream));
        mark(4 * l + 1);
        if (split) EK(comms[r], epLowLatencyComplete(comms[r], hs[l], g[r].stream));
        mark(4 * l + 2);
        epLowLatencyCombineArgs_t c = EP_LL_COMBINE_ARGS_INITIALIZER;
        c.y = g[r].y; c.out = g[r].out;
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
  // DeepEP's accounting: bytes of (token, expert) pairs; FP8 rows + scales for dispatch, BF16 for combine.
  const double pairs = double(tokens) * 8;
  const double disp_bytes = pairs * (7168 + 56 * 4), comb_bytes = pairs * 7168 * 2;
  for (int r = 0; r < R; r++) {
    double d = percentile(t_disp[r], 0.5), c = percentile(t_comb[r], 0.5);
    printf("LL EP%d rank %d tokens %d%s: dispatch fp8 median %.1f us p99 %.1f us (%.0f GB/s) | combine bf16 median %.1f us p99 %.1f us (%.0f GB/s)",
           R, r, tokens, split ? " split" : "", d, percentile(t_disp[r], 0.99), disp_bytes / d / 1e3, c,
           percentile(t_comb[r], 0.99), comb_bytes / c / 1e3);
    if (split) printf(" | send half %.1f us, receive half %.1f us", percentile(t_send[r], 0.5), percentile(t_recv[r], 0.5));
    printf(" | graph without events: %.1f us per layer (dispatch + combine)\n", t_layer[r]);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    printf("SKIPPED gpu_ll_test: no GPU visible\n");
    return 0;
  }
  const bool do_bench = argc > 1 && std::string(argv[1]) == "--bench";
  const int Rmax = std::min(ndev, 8);
  if (do_bench) {
    bench(Rmax, 128, false);
    bench(Rmax, 128, true);
    bench(Rmax, 1, false);
    return 0;
  }
  int failed = 0, passed = 0;
  std::vector<int> rank_counts = {1};
  if (Rmax >= 2) rank_counts.push_back(2);
  if (Rmax > 2) rank_counts.push_back(Rmax);
  for (int R : rank_counts) {
    std::vector<Shape> shapes = {
        {7168, 8, 288, 128, std::vector<int>(R, 128), true, false, false},
        {7168, 8, 288, 128, std::vector<int>(R, 128), false, false, true},
        {2048, 9, 16 * R, 64, std::vector<int>(R, 50), true, true, false},
        {16, 1, 2 * R, 8, std::vector<int>(R, 8), true, false, true},
        {48, 32, 32 * R, 33, std::vector<int>(R, 33), false, false, false},
        {1040, 32, 36 * R, 256, std::vector<int>(R, 200), true, false, false},
        {5120, 6, 8 * R, 1024, std::vector<int>(R, 1000), true, true, false},
    };
    std::vector<int> zero(R, 40);
    zero[0] = 0;  // rank 0 sends nothing
    shapes.push_back({512, 4, 4 * R, 40, zero, true, false, true});
    for (const Shape& s : shapes) ((runShape(s, R, 7, false) == 0) ? passed : failed)++;
    Shape gs{7168, 8, 288, 64, std::vector<int>(R, 64), true, false, true};
    ((runShape(gs, R, 11, true) == 0) ? passed : failed)++;
    gs.split = false;
    ((runShape(gs, R, 12, true) == 0) ? passed : failed)++;
  }
  printf("gpu_ll_test: %d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
