// GPU tests of the CUDA backend: every output element of layout, dispatch
// (exact and capacity sizing, cached re-dispatch) and combine compared with the
// host backend run on the same random inputs (bit for bit), CUDA graph capture
// and replay with new data. Ranks are threads of this process (epCommInitAll).
//   gpu_test            all cases
//   gpu_test --small    small cases only (for compute-sanitizer)
//   EP_NODE_SIZE=1 gpu_test --node-limit   config.max_nodes_per_token only
//   gpu_test --ranks N  all cases at EP N only (1..8), ranks spread over the
//                       visible GPUs (rank r on GPU r % GPUs): with fewer GPUs
//                       than N, ranks share a GPU and split its SMs
//   gpu_test --staged [R]
//                       the staged path of GPU ranks on different nodes: R
//                       ranks (default 2), each a node unless EP_NODE_SIZE
//                       says otherwise, joined over the socket transport on
//                       loopback (EP_CUDA_NETWORK=1); the cases below
//                       against the host backend, every remote peer reached
//                       by socket, and graph capture refused
//   gpu_test --random N [SEED]
//                       N cases drawn at random (tests/gpu/random_cases.h):
//                       1 to 8 ranks (sharing GPUs as above), every option of
//                       a case; a failure prints the seed and case number that
//                       draw it again
// Prints SKIPPED and exits 0 when no GPU is visible (tests/gpu/run.sh turns
// that into a failure of `make gpu-test`).
#include <algorithm>
#include <chrono>
#include <string>

#include "gpu/gpu_common.h"
#include "random_cases.h"

namespace {

using namespace ht;  // Case, the inputs, one rank's host / GPU run and its comparison (gpu_common.h)

// The reference: the host backend.
void runHost(const Case& c, epComm_t* comms, const std::vector<RankIn>& ins, std::vector<RankOut>* outs) {
  outs->assign(c.R, RankOut());
  runRanks(c.R, [&](int r) { hostRank(c, comms[r], ins[r], r, &(*outs)[r]); });
}

// Dispatch + combine + cached dispatch on the GPU, compared with the reference.
void runGpuCase(const Case& c, epComm_t* comms, const std::vector<RankIn>& ins, const std::vector<RankOut>& ref,
                bool capacity) {
  const std::string cname = c.name + (capacity ? " [capacity]" : " [exact]");
  std::vector<RankOut> got(c.R);
  runRanks(c.R, [&](int r) { gpuRank(c, comms[r], ins[r], r, capacity, &got[r]); });
  int before = g_failures;
  for (int r = 0; r < c.R; r++) compareRank(c, cname, r, got[r], ref[r], capacity);
  printf("%s %s (R=%d H=%d K=%d E=%d T=%d..)\n", g_failures == before ? "PASS" : "FAIL", cname.c_str(), c.R, c.H,
         c.K, c.E, c.T[0]);
  fflush(stdout);
}

// Dispatch (NO_HOST_SYNC) + combine captured in one CUDA graph per rank,
// replayed with new data each time. kGraphLayers layers of the same call, each
// handle kept for the graph's life: more handles alive under capture than the
// communicator holds ready (4), so its pool grows while the stream captures.
constexpr int kGraphLayers = 6;
void runGraphCase(const Case& c, epComm_t* gpu, epComm_t* host) {
  const Geometry g = geometryOf(c);
  const std::string cname = c.name + " [graph]";
  std::vector<DevBufs> d(c.R);
  std::vector<cudaStream_t> streams(c.R);
  std::vector<cudaGraphExec_t> execs(c.R);
  std::vector<std::vector<epHandle_t>> handles(c.R, std::vector<epHandle_t>(kGraphLayers, nullptr));
  std::vector<RankIn> ins;
  makeInputs(c, 777, &ins);
  runRanks(c.R, [&](int r) {
    CK(cudaSetDevice(gpuOf(r)));
    CK(cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking));
    allocDev(c, ins[r], r, &d[r]);
    cudaStream_t s = streams[r];
    epDispatchArgs_t a = dispatchArgs(c, ins[r], r, d[r].x, d[r].scales, d[r].topk, d[r].w);
    a.flags = EP_DISPATCH_NO_HOST_SYNC;
    a.recv_x = d[r].recv_x;
    a.recv_scales = g.nb ? d[r].recv_scales : nullptr;
    a.recv_topk_idx = d[r].recv_idx;
    a.recv_topk_weights = c.weights ? d[r].recv_w : nullptr;
    a.recv_tokens_per_expert = d[r].tpe;
    a.num_recv = d[r].num_recv;
    epCombineArgs_t ca = EP_COMBINE_ARGS_INITIALIZER;
    ca.y = d[r].y;
    ca.y_type = c.ct;
    ca.recv_topk_weights = c.weights ? d[r].recv_w : nullptr;
    ca.num_topk = c.kOf(r);
    ca.bias = c.bias ? d[r].bias : nullptr;
    ca.out = d[r].out;
    ca.out_topk_weights = c.weights ? d[r].out_w : nullptr;
    cudaGraph_t graph;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int layer = 0; layer < kGraphLayers; layer++) {  // each layer the same: the outputs are one layer's
      EK(gpu[r], epDispatch(gpu[r], &a, &handles[r][layer], s));
      EK(gpu[r], epCombine(gpu[r], &ca, handles[r][layer], s));
    }
    CK(cudaStreamEndCapture(s, &graph));
    CK(cudaGraphInstantiate(&execs[r], graph, 0));
    CK(cudaGraphDestroy(graph));
  });
  for (int rep = 0; rep < 3; rep++) {
    makeInputs(c, 1000 + rep, &ins);
    std::vector<RankOut> ref;
    runHost(c, host, ins, &ref);
    std::vector<RankOut> got(c.R);
    runRanks(c.R, [&](int r) {
      CK(cudaSetDevice(gpuOf(r)));
      cudaStream_t s = streams[r];
      uploadInputs(c, ins[r], &d[r], s);
      poison(c, r, &d[r], s);
      CK(cudaGraphLaunch(execs[r], s));
      CK(cudaStreamSynchronize(s));
      RankOut& o = got[r];
      o.num_recv = download<int64_t>(d[r].num_recv, 1)[0];
      o.recv_x = download<uint8_t>(d[r].recv_x, size_t(g.cap) * g.drow);
      o.idx = download<int64_t>(d[r].recv_idx, size_t(g.cap) * c.kOf(r));
      o.w = download<float>(d[r].recv_w, size_t(g.cap) * c.kOf(r));
      o.tpe = download<int>(d[r].tpe, g.EL);
      o.out = download<uint8_t>(d[r].out, size_t(c.T[r]) * g.crow);
      o.out_w = download<float>(d[r].out_w, size_t(c.T[r]) * c.kOf(r));
    });
    int before = g_failures;
    for (int r = 0; r < c.R; r++) {
      const RankOut& o = got[r];
      const RankOut& e = ref[r];
      if (o.num_recv != e.num_recv) {
        printf("  FAIL %s rank %d replay %d num_recv gpu %lld host %lld\n", cname.c_str(), r, rep,
               (long long)o.num_recv, (long long)e.num_recv);
        g_failures++;
        continue;
      }
      const size_t n = size_t(e.num_recv);
      same("recv_x", cname, r, o.recv_x.data(), e.recv_x.data(), n * g.drow, 2);
      same("recv_topk_idx", cname, r, o.idx.data(), e.idx.data(), n * c.kOf(r) * 8, 8);
      std::vector<int64_t> minus(size_t(g.cap - n) * c.kOf(r), -1);
      same("unused rows", cname, r, o.idx.data() + n * c.kOf(r), minus.data(), minus.size() * 8, 8);
      if (c.weights) same("recv_topk_weights", cname, r, o.w.data(), e.w.data(), n * c.kOf(r) * 4, 4);
      same("recv_tokens_per_expert", cname, r, o.tpe.data(), e.tpe.data(), g.EL * 4, 4);
      same("combine out", cname, r, o.out.data(), e.out.data(), c.T[r] * g.crow, 2);
      if (c.weights) same("out_topk_weights", cname, r, o.out_w.data(), e.out_w.data(), size_t(c.T[r]) * c.kOf(r) * 4, 4);
    }
    printf("%s %s replay %d\n", g_failures == before ? "PASS" : "FAIL", cname.c_str(), rep);
    fflush(stdout);
  }
  runRanks(c.R, [&](int r) {
    CK(cudaSetDevice(gpuOf(r)));
    for (epHandle_t h : handles[r]) epHandleDestroy(h);
    CK(cudaGraphExecDestroy(execs[r]));
    freeDev(&d[r]);
    CK(cudaStreamDestroy(streams[r]));
  });
}

// Rank 0 passes num_topk 8 and sends to rank 1, which passes 4: rank 1's rows
// from rank 0 do not fit its recv_topk_idx. Its next call reports it
// (epInvalidUsage naming rank 0); rank 0's does not.
// One rank's side of a multi-rank check, in its own thread: its GPU, a
// stream and case c's inputs on the device, freed (after the stream's work)
// when it goes.
struct RankSide {
  cudaStream_t s = nullptr;
  DevBufs d;
  RankSide(const Case& c, const RankIn& in, int r) {
    CK(cudaSetDevice(gpuOf(r)));
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    allocDev(c, in, r, &d);
    uploadInputs(c, in, &d, s);
    CK(cudaStreamSynchronize(s));
  }
  ~RankSide() {
    CK(cudaStreamSynchronize(s));
    freeDev(&d);
    CK(cudaStreamDestroy(s));
  }
};

// A check of case c on ranks of its own (SKIPPED with fewer GPUs): the CUDA
// communicators (configOf, then `edit`), random inputs of `seed`, then on
// each rank's thread a dispatch of its inputs sized to capacity (no host
// sync, waited for) and `body(r, comm, side, handle)`; the handle is
// destroyed after it. Prints PASS / FAIL with `what` (failures counted in
// g_failures by the body).
void afterDispatchOnRanks(const Case& c, int max_ranks, uint64_t seed, const std::function<void(epConfig_t&)>& edit,
                          const char* what,
                          const std::function<void(int, epComm_t, RankSide&, epDispatchArgs_t&, epHandle_t)>& body) {
  if (c.R > max_ranks) {
    printf("SKIPPED %s: needs %d GPUs, %d visible\n", c.name.c_str(), c.R, max_ranks);
    return;
  }
  std::vector<epComm_t> comms(c.R);
  epConfig_t cfg = configOf(c, epBackendCuda);
  if (edit) edit(cfg);
  EK(nullptr, epCommInitAll(comms.data(), c.R, gpusOf(c.R).data(), &cfg));
  std::vector<RankIn> ins;
  makeInputs(c, seed, &ins);
  int before = g_failures;
  runRanks(c.R, [&](int r) {
    RankSide side(c, ins[r], r);
    DevBufs& d = side.d;
    epDispatchArgs_t a = dispatchArgs(c, ins[r], r, d.x, d.scales, d.topk, d.w);
    a.flags = EP_DISPATCH_NO_HOST_SYNC;
    a.recv_x = d.recv_x;
    a.recv_topk_idx = d.recv_idx;
    a.recv_topk_weights = d.recv_w;
    a.num_recv = d.num_recv;
    epHandle_t h = nullptr;
    EK(comms[r], epDispatch(comms[r], &a, &h, side.s));
    CK(cudaStreamSynchronize(side.s));
    body(r, comms[r], side, a, h);
    CK(cudaStreamSynchronize(side.s));
    epHandleDestroy(h);
  });
  for (int r = 0; r < c.R; r++) epCommDestroy(comms[r]);
  printf("%s %s: %s\n", g_failures == before ? "PASS" : "FAIL", c.name.c_str(), what);
  fflush(stdout);
}

void runWiderTopk(int max_ranks) {
  Case c{"EP2 bf16 h256 k8 into k4", 2, 256, 8, 16, std::vector<int>(2, 64)};
  c.Kr = {8, 4};
  afterDispatchOnRanks(c, max_ranks, 5, nullptr, "rank 1 reports it",
                       [&](int r, epComm_t comm, RankSide& side, epDispatchArgs_t&, epHandle_t) {
                         epLayoutArgs_t la = layoutArgs(c, r, side.d);
                         const epResult_t res = epLayout(comm, &la, side.s);
                         const std::string msg = epGetLastError(comm);
                         const bool ok =
                             r == 0 ? res == epSuccess
                                    : res == epInvalidUsage &&
                                          msg.find("rank 0 passed num_topk = 8, more than this rank's 4") !=
                                              std::string::npos;
                         if (!ok) {
                           printf("  FAIL %s rank %d: the next call gave %s (%s)\n", c.name.c_str(), r,
                                  epGetErrorString(res), msg.c_str());
                           g_failures++;
                         }
                       });
}

// Ranks in different high-throughput calls at the same point (calls out of
// order): after a dispatch on both, `second` 0: rank 0 combines while rank 1
// makes a cached re-dispatch; 1: rank 0 makes a cached re-dispatch while rank
// 1 dispatches new ids (its routing kernel); 2: every token to rank 0, then
// rank 1 combines (sending rank 0 no rows, so that rank 0's kernel sees no
// word of it) while rank 0 makes a cached re-dispatch. Both ranks must
// report epInvalidUsage naming this rank's call, within 2 s (timeout 20 s),
// not epTimeout: found by the kernels (their message names the waits: "of"
// this call), or in case 2 on rank 0 by the host's comparison of the ranks'
// call logs ("rank 0's is" this call).
void runOutOfOrder(int max_ranks, int second) {
  const char* names[] = {"EP2 bf16 h256 k4 combine against re-dispatch", "EP2 bf16 h256 k4 re-dispatch against new ids",
                         "EP2 bf16 h256 k4 combine sending no rows against re-dispatch"};
  Case c{names[second], 2, 256, 4, 16, std::vector<int>(2, 64)};
  if (second == 2) c.only_rank = 0;
  // Neither rank frees its buffers (cudaFree waits for the whole GPU, and
  // holds up the host's notice to the other rank's kernel on a shared GPU)
  // before both reported.
  RankBarrier reported(2);
  afterDispatchOnRanks(
      c, max_ranks, 6, [](epConfig_t& cfg) { cfg.timeout_ms = 20000; }, "both ranks report the calls out of order",
      [&](int r, epComm_t comm, RankSide& side, epDispatchArgs_t& a, epHandle_t h) {
        DevBufs& d = side.d;
        const auto t0 = std::chrono::steady_clock::now();
        epResult_t res;
        const char* mine;
        if ((r == 0 && second == 0) || (r == 1 && second == 2)) {
          epCombineArgs_t ca = EP_COMBINE_ARGS_INITIALIZER;
          ca.y = d.recv_x;
          ca.out = d.out;
          res = epCombine(comm, &ca, h, side.s);
          mine = "a combine (epCombine)";
        } else if (r == 1 && second == 1) {
          epHandle_t h2 = nullptr;
          res = epDispatch(comm, &a, &h2, side.s);  // new ids: a routing kernel first
          if (h2 != nullptr) epHandleDestroy(h2);
          mine = "the routing of a dispatch";
        } else {
          a.topk_idx = nullptr;  // cached re-dispatch of the handle
          a.topk_weights = nullptr;
          res = epDispatch(comm, &a, &h, side.s);
          mine = "a dispatch (epDispatch)";
        }
        CK(cudaStreamSynchronize(side.s));
        epLayoutArgs_t la = layoutArgs(c, r, d);
        if (res == epSuccess) res = epLayout(comm, &la, side.s);  // the kernel's report comes at the next call
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const std::string msg = epGetLastError(comm);
        const bool ok = res == epInvalidUsage && secs < 2.0 &&
                        msg.find("ranks must issue the same collective calls in the same order") != std::string::npos &&
                        (msg.find(std::string("of ") + mine) != std::string::npos ||
                         msg.find("rank " + std::to_string(r) + "'s is " + mine) != std::string::npos);
        printf("  %s %s rank %d: %s after %.2f s: %s\n", ok ? "ok  " : "FAIL", c.name.c_str(), r,
               epGetErrorString(res), secs, msg.c_str());
        if (!ok) g_failures++;
        reported.wait();
      });
}

// A wait that fails after an argument error of the same kernel: after a
// dispatch on both ranks, rank 0 dispatches new ids, one of them out of range
// (the routing kernel reports it), while rank 1 makes no call, so rank 0's
// waits time out. Rank 0's next call must report the timeout (the kernels'
// failed waits have a slot of their own, which the bad id does not hold),
// saying that rank 1's host has not made the calls (the call logs), and
// the one after it must fail too (the communicator is broken); neither may
// succeed as if the kernels had run.
void runTimeoutAfterBadId(int max_ranks) {
  Case c{"EP2 bf16 h256 k4 timeout after a bad id", 2, 256, 4, 16, std::vector<int>(2, 64)};
  constexpr int kTimeoutMs = 1000;
  // Rank 1 frees nothing before rank 0 reported: on a shared GPU its cudaFree
  // would wait for rank 0's kernel and hold up rank 0's calls meanwhile
  // (docs/SEMANTICS.md, ranks sharing a GPU).
  RankBarrier reported(2);
  afterDispatchOnRanks(
      c, max_ranks, 7, [](epConfig_t& cfg) { cfg.timeout_ms = kTimeoutMs; }, "rank 0 reports the timeout",
      [&](int r, epComm_t comm, RankSide& side, epDispatchArgs_t& a, epHandle_t) {
        if (r != 0) {  // rank 1 makes no call
          reported.wait();
          return;
        }
        DevBufs& d = side.d;
        const int64_t bad = c.E + 3;
        CK(cudaMemcpy(static_cast<int64_t*>(d.topk) + 5, &bad, 8, cudaMemcpyHostToDevice));
        epHandle_t h2 = nullptr;
        const epResult_t first = epDispatch(comm, &a, &h2, side.s);
        CK(cudaStreamSynchronize(side.s));
        epLayoutArgs_t la = layoutArgs(c, r, d);
        const epResult_t next = epLayout(comm, &la, side.s);
        const std::string msg = epGetLastError(comm);
        const epResult_t after = epLayout(comm, &la, side.s);
        if (h2 != nullptr) epHandleDestroy(h2);
        // The call logs tell that rank 1's host never made the calls.
        const bool ok = first == epSuccess && next == epTimeout &&
                        msg.find("cannot be used any more") != std::string::npos &&
                        msg.find("it has not made the later ones") != std::string::npos && after != epSuccess;
        printf("  %s %s: dispatch %s, next call %s (%s), the one after %s\n", ok ? "ok  " : "FAIL", c.name.c_str(),
               epGetErrorString(first), epGetErrorString(next), msg.c_str(), epGetErrorString(after));
        if (!ok) g_failures++;
        reported.wait();
      });
}

// config.max_nodes_per_token on the GPU (gpu_test --node-limit, run with
// EP_NODE_SIZE=1: each rank a node; the library reads its parameters once per
// process, hence a run of its own). With a bound of 1, random tokens on both
// ranks' experts are found by the kernels: a layout's at the next call, an
// exact dispatch's by that dispatch after its rows moved; each reported once,
// then the communicator goes on. With a bound of 2 the same calls pass. Two
// ranks, sharing GPU 0 when only one is visible.
void runNodeLimit() {
  Case c{"EP2 bf16 h256 k4 max_nodes_per_token", 2, 256, 4, 16, std::vector<int>(2, 40)};
  std::vector<RankIn> ins;
  makeInputs(c, 9, &ins);
  const std::string found = "selects experts on 2 nodes, more than config.max_nodes_per_token = 1";
  int before = g_failures;
  for (int bound : {1, 2}) {
    std::vector<epComm_t> comms(c.R);
    epConfig_t cfg = configOf(c, epBackendCuda);
    cfg.max_nodes_per_token = bound;
    EK(nullptr, epCommInitAll(comms.data(), c.R, gpusOf(c.R).data(), &cfg));
    int num_nodes = 0;
    EK(comms[0], epCommNodes(comms[0], &num_nodes, nullptr));
    if (num_nodes != c.R) {
      printf("FAIL %s: %d nodes, not one per rank: run it with EP_NODE_SIZE=1\n", c.name.c_str(), num_nodes);
      g_failures++;
      for (epComm_t comm : comms) epCommDestroy(comm);
      return;
    }
    RankBarrier set_up(c.R);
    runRanks(c.R, [&](int r) {
      RankSide side(c, ins[r], r);
      cudaStream_t s = side.s;
      DevBufs& d = side.d;
      set_up.wait();  // no rank allocates while a peer's kernel waits for it (ranks sharing a GPU)
      auto expect = [&](const char* step, epResult_t res, bool refused) {
        const std::string msg = epGetLastError(comms[r]);
        const bool ok = refused ? res == epInvalidArgument && msg.find(found) != std::string::npos : res == epSuccess;
        if (!ok) {
          printf("  FAIL %s bound %d rank %d: %s gave %s (%s)\n", c.name.c_str(), bound, r, step,
                 epGetErrorString(res), msg.c_str());
          g_failures++;
        }
      };
      epLayoutArgs_t la = layoutArgs(c, r, d);
      expect("layout", epLayout(comms[r], &la, s), false);
      CK(cudaStreamSynchronize(s));
      expect("the call after the layout", epLayout(comms[r], &la, s), bound == 1);
      CK(cudaStreamSynchronize(s));
      epDispatchArgs_t a = dispatchArgs(c, ins[r], r, d.x, d.scales, d.topk, d.w);
      a.recv_x = d.recv_x;
      a.recv_topk_idx = d.recv_idx;
      int64_t num_recv = 0;
      a.num_recv = &num_recv;
      epHandle_t h = nullptr;
      expect("exact dispatch", epDispatch(comms[r], &a, &h, s), bound == 1);
      CK(cudaStreamSynchronize(s));
      expect("the call after the dispatch", epLayout(comms[r], &la, s), false);
      CK(cudaStreamSynchronize(s));
      epHandleDestroy(h);
    });
    for (int r = 0; r < c.R; r++) epCommDestroy(comms[r]);
  }
  printf("%s %s: reported with a bound of 1, not with 2\n", g_failures == before ? "PASS" : "FAIL", c.name.c_str());
  fflush(stdout);
}

// One rank on GPU 0 with case c's inputs on the device, for the single-rank
// checks below.
struct OneRank {
  epComm_t comm = nullptr;
  std::vector<RankIn> ins;
  DevBufs d;
  OneRank(const Case& c, uint64_t seed) {
    epConfig_t cfg = configOf(c, epBackendCuda);
    const int dev = 0;
    EK(nullptr, epCommInitAll(&comm, 1, &dev, &cfg));
    makeInputs(c, seed, &ins);
    allocDev(c, ins[0], 0, &d);
    uploadInputs(c, ins[0], &d, nullptr);
  }
  ~OneRank() {
    freeDev(&d);
    epCommDestroy(comm);
  }
};

// Ids the routing kernel did not see are range-checked by the dispatch kernel
// and reported at the next call: a cached re-dispatch's, and (prepared) the
// first dispatch of a handle from epDispatchPrepare given other ids than the
// prepare was.
void runUncheckedBadId(bool prepared) {
  Case c{prepared ? "EP1 prepared handle's dispatch with a bad id" : "EP1 cached re-dispatch with a bad id", 1,
         256, 4, 16, std::vector<int>(1, 50)};
  OneRank one(c, 4);
  epComm_t comm = one.comm;
  const std::vector<RankIn>& ins = one.ins;
  DevBufs& d = one.d;
  epDispatchArgs_t a = dispatchArgs(c, ins[0], 0, d.x, d.scales, d.topk, d.w);
  a.recv_x = d.recv_x;
  a.recv_topk_idx = d.recv_idx;
  int64_t num_recv = 0;
  a.num_recv = &num_recv;
  epHandle_t h = nullptr;
  EK(comm, prepared ? epDispatchPrepare(comm, &a, &h, nullptr) : epDispatch(comm, &a, &h, nullptr));
  const int64_t bad = c.E + 5;
  CK(cudaMemcpy(static_cast<int64_t*>(d.topk) + 7, &bad, 8, cudaMemcpyHostToDevice));  // token 1, entry 3
  const epResult_t unchecked = epDispatch(comm, &a, &h, nullptr);
  CK(cudaDeviceSynchronize());  // the kernel's report is read at the next call's start
  epLayoutArgs_t la = layoutArgs(c, 0, d);
  CK(cudaMemcpy(static_cast<int64_t*>(d.topk) + 7, &ins[0].topk[7], 8, cudaMemcpyHostToDevice));
  const epResult_t next = epLayout(comm, &la, nullptr);
  const std::string msg = epGetLastError(comm);
  const bool ok = unchecked == epSuccess && next == epInvalidArgument &&
                  msg.find("topk_idx entry 7 (flat index) = " + std::to_string(bad)) != std::string::npos;
  if (!ok) {
    printf("  FAIL %s: dispatch %s, next call %s (%s)\n", c.name.c_str(), epGetErrorString(unchecked),
           epGetErrorString(next), msg.c_str());
    g_failures++;
  }
  epHandleDestroy(h);
  printf("%s %s: reported at the next call\n", ok ? "PASS" : "FAIL", c.name.c_str());
}

// More experts than the kernels' shared-memory counters hold: epLayout and
// epDispatch refuse (epNotSupported saying so) instead of failing at launch;
// the communicator itself is made (its low-latency calls have no such limit).
void runTooManyExperts() {
  Case c{"EP1 2^20 experts", 1, 128, 8, 1 << 20, std::vector<int>(1, 4)};
  OneRank one(c, 3);
  epComm_t comm = one.comm;
  const std::vector<RankIn>& ins = one.ins;
  DevBufs& d = one.d;
  epLayoutArgs_t la = layoutArgs(c, 0, d);
  const epResult_t lres = epLayout(comm, &la, nullptr);
  const std::string lmsg = epGetLastError(comm);
  epDispatchArgs_t a = dispatchArgs(c, ins[0], 0, d.x, d.scales, d.topk, d.w);
  a.recv_x = d.recv_x;
  epHandle_t h = nullptr;
  int64_t num_recv = 0;
  a.num_recv = &num_recv;
  const epResult_t dres = epDispatch(comm, &a, &h, nullptr);
  const std::string dmsg = epGetLastError(comm);
  const char* want = "count experts in shared memory";
  const bool ok = lres == epNotSupported && lmsg.find(want) != std::string::npos && dres == epNotSupported &&
                  dmsg.find(want) != std::string::npos && h == nullptr;
  if (!ok) {
    printf("  FAIL %s: epLayout gave %s (%s), epDispatch %s (%s)\n", c.name.c_str(), epGetErrorString(lres),
           lmsg.c_str(), epGetErrorString(dres), dmsg.c_str());
    g_failures++;
  }
  printf("%s %s: layout and dispatch refuse it\n", ok ? "PASS" : "FAIL", c.name.c_str());
}

// Low latency with 2^20 experts x 4096 tokens: more rows than the kernels'
// 32-bit indices reach; init refuses it.
void runTooManyLowLatencyRows() {
  Case big{"EP1 LL 2^20 experts x 4096 tokens", 1, 128, 8, 1 << 20, std::vector<int>(1, 4096)};
  epConfig_t cfg = configOf(big, epBackendCuda);
  cfg.low_latency = 1;
  epComm_t comm = nullptr;
  const int dev = 0;
  const epResult_t res = epCommInitAll(&comm, 1, &dev, &cfg);
  const std::string msg = epGetLastError(nullptr);
  const bool ll_ok = res == epNotSupported && msg.find("below 2^31") != std::string::npos;
  if (!ll_ok) {
    printf("  FAIL %s: init gave %s (%s)\n", big.name.c_str(), epGetErrorString(res), msg.c_str());
    g_failures++;
  }
  if (comm) epCommDestroy(comm);
  printf("%s %s: init refuses it\n", ll_ok ? "PASS" : "FAIL", big.name.c_str());
}

// config.buffer_bytes_cap bounds both buffers together (what
// epCommBufferBytes reports): one byte less than their sum is refused.
void runBufferCapCoversBoth() {
  Case c{"EP1 buffer_bytes_cap", 1, 1024, 8, 64, std::vector<int>(1, 128)};
  epConfig_t cfg = configOf(c, epBackendCuda);
  epComm_t comm = nullptr;
  const int dev = 0;
  size_t ht = 0, ll = 0, both = 0;
  EK(nullptr, epCommInitAll(&comm, 1, &dev, &cfg));
  EK(comm, epCommBufferBytes(comm, &ht));
  epCommDestroy(comm);
  cfg.low_latency = 1;
  EK(nullptr, epLowLatencyBufferBytes(&cfg, 1, &ll));
  cfg.buffer_bytes_cap = ht + ll;
  EK(nullptr, epCommInitAll(&comm, 1, &dev, &cfg));
  EK(comm, epCommBufferBytes(comm, &both));
  epCommDestroy(comm);
  comm = nullptr;
  cfg.buffer_bytes_cap = ht + ll - 1;
  const epResult_t res = epCommInitAll(&comm, 1, &dev, &cfg);
  const std::string msg = epGetLastError(nullptr);
  const bool ok = both == ht + ll && res == epInvalidArgument && msg.find("low-latency buffers") != std::string::npos;
  if (!ok) {
    printf("  FAIL %s: %zu + %zu bytes reported %zu; a cap one byte short gave %s (%s)\n", c.name.c_str(), ht, ll,
           both, epGetErrorString(res), msg.c_str());
    g_failures++;
  }
  if (comm) epCommDestroy(comm);
  printf("%s %s: covers both buffers\n", ok ? "PASS" : "FAIL", c.name.c_str());
}

// max_ranks: the most ranks the visible GPUs take (more with --ranks).
void runCase(const Case& c, int max_ranks, bool graph, uint64_t seed = 42) {
  if (c.R > max_ranks) {
    printf("SKIPPED %s: needs %d GPUs, %d visible\n", c.name.c_str(), c.R, max_ranks);
    return;
  }
  std::vector<epComm_t> gpu(c.R), host(c.R);
  epConfig_t gc = configOf(c, epBackendCuda), hc = configOf(c, epBackendHost);
  EK(nullptr, epCommInitAll(gpu.data(), c.R, gpusOf(c.R).data(), &gc));
  EK(nullptr, epCommInitAll(host.data(), c.R, nullptr, &hc));
  std::vector<RankIn> ins;
  makeInputs(c, seed, &ins);
  std::vector<RankOut> ref;
  runHost(c, host.data(), ins, &ref);
  runGpuCase(c, gpu.data(), ins, ref, false);
  runGpuCase(c, gpu.data(), ins, ref, true);
  if (graph) runGraphCase(c, gpu.data(), host.data());
  for (int r = 0; r < c.R; r++) {
    epCommDestroy(gpu[r]);
    epCommDestroy(host[r]);
  }
}

// --random N [SEED [--first I]] (random_cases.h).
int runRandom(const random_cases::Run& run) {
  for (int i = run.first; i < run.first + run.count; i++) {
    std::mt19937_64 g(run.caseSeed(i));
    const int R = random_cases::ranksOf(g);
    Case c = random_cases::htCase(g, R, i);
    const int before = g_failures;
    runCase(c, 8, random_cases::chance(g, 0.15), run.caseSeed(i));
    if (g_failures != before) random_cases::printDrawAgain("gpu_test", run, i);
  }
  printf("%s: %d failures\n", g_failures ? "FAILED" : "ALL PASSED", g_failures);
  return g_failures ? 1 : 0;
}

}  // namespace

// --staged: every remote peer of every rank is reached through the socket
// transport (not CUDA IPC), and a dispatch under stream capture is refused.
void checkStagedComms(int R) {
  Case c{"EP" + std::to_string(R) + " staged: peers and capture", R, 256, 4, 16, std::vector<int>(R, 20)};
  std::vector<epComm_t> gpu(R);
  epConfig_t gc = configOf(c, epBackendCuda);
  EK(nullptr, epCommInitAll(gpu.data(), R, gpusOf(R).data(), &gc));
  int before = g_failures, sockets = 0;
  for (int r = 0; r < R; r++)
    for (int p = 0; p < R; p++) {
      if (p == r) continue;
      epCommPeerInfo_t info = EP_COMM_PEER_INFO_INITIALIZER;
      EK(gpu[r], epCommPeerInfo(gpu[r], p, &info));
      const std::string t = info.transport;
      sockets += t == "socket";
      if (t != "socket" && t != "shm") {
        printf("  FAIL rank %d reaches rank %d through %s, not the staged path's transports\n", r, p, t.c_str());
        g_failures++;
      }
    }
  if (sockets == 0) {
    printf("  FAIL no rank reaches another through socket: the ranks are not on several nodes\n");
    g_failures++;
  }
  {  // capture: refused, saying why, and the capture ended cleanly
    std::vector<RankIn> ins;
    makeInputs(c, 7, &ins);
    CK(cudaSetDevice(gpusOf(R)[0]));
    DevBufs d;
    allocDev(c, ins[0], 0, &d);
    uploadInputs(c, ins[0], &d, nullptr);
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    epDispatchArgs_t a = dispatchArgs(c, ins[0], 0, d.x, d.scales, d.topk, d.w);
    a.flags = EP_DISPATCH_NO_HOST_SYNC;
    a.recv_x = d.recv_x;
    a.recv_capacity = 1;
    epHandle_t h = nullptr;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    const epResult_t res = epDispatch(gpu[0], &a, &h, s);
    cudaGraph_t graph = nullptr;
    cudaStreamEndCapture(s, &graph);
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    const std::string msg = epGetLastError(gpu[0]);
    if (res != epInvalidUsage || msg.find("graph") == std::string::npos) {
      printf("  FAIL a captured dispatch gave %s (%s), not epInvalidUsage\n", epGetErrorString(res), msg.c_str());
      g_failures++;
    }
    CK(cudaStreamDestroy(s));
    freeDev(&d);
  }
  for (int r = 0; r < R; r++) epCommDestroy(gpu[r]);
  printf("%s %s\n", g_failures == before ? "PASS" : "FAIL", c.name.c_str());
}

int main(int argc, char** argv) {
  const bool random = argc > 1 && std::string(argv[1]) == "--random";
  random_cases::Run run;
  if (random && !random_cases::parseRun(argc, argv, "gpu_test", &run)) return 2;
  if (random) setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);  // ranks may share a GPU
  bool small = argc > 1 && std::string(argv[1]) == "--small";
  const bool node_limit = argc > 1 && std::string(argv[1]) == "--node-limit";
  if (node_limit) setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);  // two ranks may share a GPU
  int ranks = ranksOption(argc, argv, "gpu_test");  // 0: not given
  const int staged_ranks = stagedOption(argc, argv, "gpu_test");
  const bool staged = staged_ranks > 0;
  if (staged) ranks = staged_ranks;
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    printf("SKIPPED gpu_test: no GPU visible (%s)\n", cudaGetErrorString(cudaGetLastError()));
    return 0;
  }
  ndev = std::min(ndev, 8);
  // Under compute-sanitizer kernels of different GPUs may not run at once: one rank only.
  if (small) ndev = 1;
  gpuCount() = ndev;
  if (random) return runRandom(run);
  if (node_limit) {
    runNodeLimit();
    printf("%s: %d failures\n", g_failures ? "FAILED" : "ALL PASSED", g_failures);
    return g_failures ? 1 : 0;
  }
  const int max_ranks = ranks ? ranks : ndev;
  if (staged) checkStagedComms(ranks);
  std::vector<Case> cases;
  auto add = [&](Case c) {
    c.E = (c.E + c.R - 1) / c.R * c.R;  // whole experts per rank (--ranks 4 or 8)
    cases.push_back(c);
  };
  const std::vector<int> rank_counts = ranks ? std::vector<int>{ranks} : std::vector<int>{1, 2};
  for (int R : rank_counts) {
    std::string ep = "EP" + std::to_string(R) + " ";
    Case c;
    c = Case{ep + "bf16 h16 k1", R, 16, 1, 8, std::vector<int>(R, 37)};
    add(c);
    c = Case{ep + "bf16 h24 k9 neg", R, 24, 9, 18, std::vector<int>(R, 100)};
    c.neg = 0.3;
    c.bias = true;
    c.align = 4;
    if (R == 2) c.T[1] = 0;  // a rank with no tokens
    add(c);
    c = Case{ep + "fp8 h1040 k4 transposed scales idx32", R, 1040, 4, 16, std::vector<int>(R, 64)};
    c.dt = epFloat8E4M3;
    c.transposed_scales = true;
    c.idx32 = true;
    add(c);
    // Experts repeated in a token's top-k: one row per rank, every entry kept.
    c = Case{ep + "bf16 h256 k6 repeats", R, 256, 6, 32, std::vector<int>(R, 200)};
    c.repeats = true;
    c.neg = 0.1;
    c.bias = true;
    c.align = 4;
    add(c);
    // Ranks with different num_topk (rank 0 wider, sending only to itself);
    // a rank without tokens that passes no ids; a cached re-dispatch where
    // rank 0 passes no ids: the receivers decode the senders' columns.
    c = Case{ep + "bf16 h512 k8/4 mixed topk", R, 512, 8, 32, std::vector<int>(R, 150)};
    c.Kr.assign(R, 4);
    c.Kr[0] = 8;
    c.own_experts_rank = 0;
    c.neg = 0.1;
    c.bias = true;
    add(c);
    c = Case{ep + "bf16 h256 k6 no ids: empty rank, cached on rank 0", R, 256, 6, 24, std::vector<int>(R, 120)};
    if (R > 1) c.T[R - 1] = 0;
    c.null_topk_if_empty = true;
    c.cached_without_ids = 0;
    c.align = 4;
    add(c);
    // x, the cached x and y with strides (x_stride / y_stride): FP8 rows of
    // 1040 bytes 48 apart beyond, BF16 rows of 2080 bytes 16 apart beyond.
    c = Case{ep + "fp8 h1040 k4 strided x and y", R, 1040, 4, 16, std::vector<int>(R, 96)};
    c.dt = epFloat8E4M3;
    c.row_pad = 48;
    c.bias = true;
    add(c);
    if (small) continue;
    c = Case{ep + "bf16 h1040 k6 strided x and y", R, 1040, 6, 24, std::vector<int>(R, 200)};
    c.row_pad = 16;
    c.neg = 0.1;
    c.align = 4;
    add(c);
    // Every token of every rank to rank 0: its worst-case capacity exactly full.
    c = Case{ep + "bf16 h512 k4 all to rank 0", R, 512, 4, 8 * R, std::vector<int>(R, 90)};
    c.only_rank = 0;
    c.bias = true;
    add(c);
    // The smallest FP8 row (16 bytes, one scale), no weights, 3 blocks.
    c = Case{ep + "fp8 h16 k4 no weights 3 SMs", R, 16, 4, 16, std::vector<int>(R, 77)};
    c.dt = epFloat8E4M3;
    c.weights = false;
    c.num_sms = 3;
    add(c);
    c = Case{ep + "bf16 h1000 k32", R, 1000, 32, 64, std::vector<int>(R, 300)};
    c.neg = 0.1;
    c.bias = true;
    add(c);
    c = Case{ep + "fp16 h256", R, 256, 8, 32, std::vector<int>(R, 500)};
    c.dt = epFloat16;
    c.ct = epFloat16;
    c.bias = true;
    add(c);
    c = Case{ep + "fp32 h128", R, 128, 6, 32, std::vector<int>(R, 333)};
    c.dt = epFloat32;
    c.ct = epFloat32;
    c.bias = true;
    add(c);
    c = Case{ep + "bf16 h2560 k6 e64", R, 2560, 6, 64, std::vector<int>(R, 1000)};
    c.align = 128;
    add(c);
    c = Case{ep + "fp8 h7168 k8 e256", R, 7168, 8, 256, std::vector<int>(R, 1024)};
    c.dt = epFloat8E4M3;
    add(c);
    c = Case{ep + "bf16 h7168 k8 e256", R, 7168, 8, 256, std::vector<int>(R, 4096)};
    add(c);
  }
  for (const Case& c : cases) runCase(c, max_ranks, false);
  if (staged) {  // the GPU-specific cases below test the kernels' own checks and graphs
    printf("%s: %d failures\n", g_failures ? "FAILED" : "ALL PASSED", g_failures);
    return g_failures ? 1 : 0;
  }
  if (!ranks || ranks == 2) runWiderTopk(max_ranks);
  if (!ranks || ranks == 2) runOutOfOrder(max_ranks, 0);
  if (!ranks || ranks == 2) runOutOfOrder(max_ranks, 1);
  if (!ranks || ranks == 2) runOutOfOrder(max_ranks, 2);
  if (!ranks || ranks == 2) runTimeoutAfterBadId(max_ranks);
  if (!ranks) runTooManyExperts();
  if (!ranks) runTooManyLowLatencyRows();
  if (!ranks) runUncheckedBadId(false);
  if (!ranks) runUncheckedBadId(true);
  if (!ranks) runBufferCapCoversBoth();
  // Graph capture, EP2 (or EP1 on one GPU; EP N with --ranks).
  {
    int R = ranks ? ranks : std::min(ndev, 2);
    Case c{"EP" + std::to_string(R) + " bf16 h2560 k6 e64", R, 2560, 6, 64, std::vector<int>(R, small ? 64 : 1000)};
    c.bias = true;
    runCase(c, max_ranks, true);
  }
  printf("%s: %d failures\n", g_failures ? "FAILED" : "ALL PASSED", g_failures);
  return g_failures ? 1 : 0;
}
