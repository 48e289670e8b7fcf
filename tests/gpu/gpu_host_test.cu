// The CUDA backend's host code, one case per promise of docs/SEMANTICS.md
// that its host code must keep (all but pending_caller_error were found
// broken by reading the code and shown by their case failing before the
// mend; that one guards a promise that held). Ranks are threads of this
// process on GPU 0 (two ranks share it; set CUDA_DEVICE_MAX_CONNECTIONS=32),
// so that a rank's freed buffers are really freed (across processes an IPC
// mapping keeps them alive).
//   gpu_host_test --list     the case names
//   gpu_host_test CASE       one case (a process per case: some leave the
//                            CUDA context unusable); exit 0 when it passed
// tests/gpu/host_cases.sh runs them all.
#include <cuda_runtime.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "gpu/gpu_common.h"

#include "alloc_count.h"

namespace {

using namespace ht;
using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

bool report(const char* name, bool ok, const std::string& detail) {
  printf("%s %s: %s\n", ok ? "PASS" : "FAIL", name, detail.c_str());
  fflush(stdout);
  return ok;
}

// Two ranks on GPU 0 (threads of this process), each with its stream and
// case c's inputs on the device.
struct TwoRanks {
  Case c{"EP2 bf16 h256 k4", 2, 256, 4, 16, std::vector<int>(2, 64)};
  std::vector<epComm_t> comms = std::vector<epComm_t>(2, nullptr);
  std::vector<RankIn> ins;
  std::vector<DevBufs> d = std::vector<DevBufs>(2);
  std::vector<cudaStream_t> s = std::vector<cudaStream_t>(2, nullptr);
  explicit TwoRanks(int timeout_ms = 20000) {
    epConfig_t cfg = configOf(c, epBackendCuda);
    cfg.timeout_ms = timeout_ms;
    const int devs[2] = {0, 0};
    EK(nullptr, epCommInitAll(comms.data(), 2, devs, &cfg));
    makeInputs(c, 11, &ins);
    for (int r = 0; r < 2; r++) {
      CK(cudaStreamCreateWithFlags(&s[r], cudaStreamNonBlocking));
      allocDev(c, ins[r], r, &d[r]);
      uploadInputs(c, ins[r], &d[r], s[r]);
      CK(cudaStreamSynchronize(s[r]));
    }
  }
  epDispatchArgs_t args(int r, bool capacity) {
    epDispatchArgs_t a = dispatchArgs(c, ins[r], r, d[r].x, d[r].scales, d[r].topk, d[r].w);
    a.recv_x = d[r].recv_x;
    a.recv_topk_idx = d[r].recv_idx;
    a.recv_topk_weights = d[r].recv_w;
    if (capacity) {
      a.flags = EP_DISPATCH_NO_HOST_SYNC;
      a.num_recv = d[r].num_recv;
    }
    return a;
  }
  // Buffers freed after their stream's work; communicators still live destroyed.
  void finish() {
    for (int r = 0; r < 2; r++) {
      cudaStreamSynchronize(s[r]);
      freeDev(&d[r]);
      cudaStreamDestroy(s[r]);
      if (comms[r] != nullptr) epCommDestroy(comms[r]);
    }
  }
};

// One rank on GPU 0 (EP1, BF16 rows of 256, top-4 of 16 experts, 64
// tokens) with inputs of `seed` on the device and a stream of its own; the
// destructor waits for the stream, then frees the buffers and the
// communicator.
struct OneRank {
  Case c{"EP1 bf16 h256 k4", 1, 256, 4, 16, std::vector<int>(1, 64)};
  epComm_t comm = nullptr;
  std::vector<RankIn> ins;
  DevBufs d;
  cudaStream_t s = nullptr;
  explicit OneRank(uint64_t seed) {
    epConfig_t cfg = configOf(c, epBackendCuda);
    const int dev = 0;
    EK(nullptr, epCommInitAll(&comm, 1, &dev, &cfg));
    makeInputs(c, seed, &ins);
    allocDev(c, ins[0], 0, &d);
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    uploadInputs(c, ins[0], &d, s);
    CK(cudaStreamSynchronize(s));
  }
  ~OneRank() {
    cudaStreamSynchronize(s);
    freeDev(&d);
    cudaStreamDestroy(s);
    epCommDestroy(comm);
  }
  OneRank(const OneRank&) = delete;
  OneRank& operator=(const OneRank&) = delete;
};

// 1. A prepared handle's first dispatch after a peer destroyed its
// communicator: refused on the host (epRemoteError naming it), never launched
// into the peer's freed buffers.
bool preparedAfterPeerDestroy() {
  TwoRanks t;
  std::vector<epHandle_t> h(2, nullptr);
  runRanks(2, [&](int r) {
    epDispatchArgs_t a = t.args(r, false);
    int64_t n = 0;
    a.num_recv = &n;
    EK(t.comms[r], epDispatchPrepare(t.comms[r], &a, &h[r], t.s[r]));
  });
  epHandleDestroy(h[1]);
  EK(t.comms[1], epCommDestroy(t.comms[1]));
  t.comms[1] = nullptr;
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // rank 0's watcher looks every 0.1 s
  epDispatchArgs_t a = t.args(0, false);
  int64_t n = 0;
  a.num_recv = &n;
  const epResult_t res = epDispatch(t.comms[0], &a, &h[0], t.s[0]);
  const std::string msg = epGetLastError(t.comms[0]);
  const bool ok = res == epRemoteError && contains(msg, "rank 1 destroyed its communicator");
  report("prepared_after_peer_destroy", ok,
         std::string("the first dispatch of rank 0's prepared handle gave ") + epGetErrorString(res) + " (" + msg + ")");
  epHandleDestroy(h[0]);
  t.finish();
  return ok;
}

// 2. epCommAbort while an exact-sized dispatch waits for its counts (rank 1
// makes no call): the dispatch returns epAborted, no handle, within 5 s.
bool abortDuringExactWait() {
  TwoRanks t;
  epHandle_t h = nullptr;
  epResult_t res = epSuccess;
  double secs = 0;
  std::thread caller([&] {
    epDispatchArgs_t a = t.args(0, false);
    int64_t n = 0;
    a.num_recv = &n;
    const auto t0 = Clock::now();
    res = epDispatch(t.comms[0], &a, &h, t.s[0]);
    secs = secondsSince(t0);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const epResult_t aborted = epCommAbort(t.comms[0]);
  caller.join();
  t.comms[0] = nullptr;
  const bool ok = aborted == epSuccess && res == epAborted && h == nullptr && secs < 5.0;
  report("abort_during_exact_wait", ok,
         std::string("the waiting dispatch gave ") + epGetErrorString(res) + (h ? " with a handle" : " and no handle") +
             " after " + std::to_string(secs) + " s; epCommAbort " + epGetErrorString(aborted));
  if (h) epHandleDestroy(h);
  t.finish();
  return ok;
}

// 3. A host num_recv for a handle whose counts are on the device only: refused
// before anything is launched (recv_x keeps its poison), and the same call
// with the flag then runs and gives the rows of the first dispatch.
bool hostNumRecvRefusedFirst() {
  OneRank one(12);
  const Case& c = one.c;
  epComm_t comm = one.comm;
  const std::vector<RankIn>& ins = one.ins;
  DevBufs& d = one.d;
  const Geometry g = geometryOf(c);
  const size_t bytes = size_t(g.cap) * g.drow;
  epDispatchArgs_t a = dispatchArgs(c, ins[0], 0, d.x, d.scales, d.topk, d.w);
  a.recv_x = d.recv_x;
  a.recv_topk_idx = d.recv_idx;
  a.flags = EP_DISPATCH_NO_HOST_SYNC;
  a.num_recv = d.num_recv;
  epHandle_t h = nullptr;
  EK(comm, epDispatch(comm, &a, &h, nullptr));
  CK(cudaDeviceSynchronize());
  const std::vector<uint8_t> first = download<uint8_t>(d.recv_x, bytes);
  CK(cudaMemset(d.recv_x, 0x5a, bytes));
  int64_t host_n = -1;
  a.flags = 0;
  a.num_recv = &host_n;
  const epResult_t refused = epDispatch(comm, &a, &h, nullptr);
  const std::string msg = epGetLastError(comm);
  CK(cudaDeviceSynchronize());
  const std::vector<uint8_t> after = download<uint8_t>(d.recv_x, bytes);
  bool untouched = true;
  for (uint8_t b : after) untouched &= b == 0x5a;
  a.flags = EP_DISPATCH_NO_HOST_SYNC;
  a.num_recv = d.num_recv;
  const epResult_t again = epDispatch(comm, &a, &h, nullptr);
  CK(cudaDeviceSynchronize());
  const bool same_rows = download<uint8_t>(d.recv_x, bytes) == first;
  const bool ok = refused == epInvalidUsage && contains(msg, "counts are on the device only") && untouched &&
                  again == epSuccess && same_rows;
  report("host_num_recv_refused_first", ok,
         std::string("refused: ") + epGetErrorString(refused) + " (" + msg + "), recv_x " +
             (untouched ? "untouched" : "WRITTEN by the refused call") + "; with the flag again: " +
             epGetErrorString(again) + (same_rows ? ", the same rows" : ", OTHER rows"));
  epHandleDestroy(h);
  return ok;
}

__global__ void emptyKernel() {}
__global__ void writeTo(int* p) { *p = 1; }

// 4a. An error of the caller's own earlier work left pending (a launch with
// too many threads): every call of a whole case succeeds beside it, its
// outputs equal the host backend's, and the error is still the caller's to
// read afterwards. (The library's CUDA runtime is its own, linked in, so an
// error pending in the caller's runtime never reached it: this case passed
// before the launches were judged by their own result too.)
bool pendingCallerError() {
  Case c{"EP1 bf16 h512 k6 (a caller's error pending)", 1, 512, 6, 24, std::vector<int>(1, 200)};
  c.bias = true;
  epComm_t host = nullptr, gpu = nullptr;
  const int dev = 0;
  epConfig_t hc = configOf(c, epBackendHost);
  EK(nullptr, epCommInitAll(&host, 1, &dev, &hc));
  epConfig_t gc = configOf(c, epBackendCuda);
  EK(nullptr, epCommInitAll(&gpu, 1, &dev, &gc));
  std::vector<RankIn> ins;
  makeInputs(c, 13, &ins);
  RankOut ref, got;
  hostRank(c, host, ins[0], 0, &ref);
  emptyKernel<<<1, 4096>>>();  // more threads than a block may have: an error left pending
  const cudaError_t planted = cudaPeekAtLastError();
  gpuRank(c, gpu, ins[0], 0, false, &got);  // exits with the call's error if one fails
  const int before = g_failures;
  compareRank(c, c.name, 0, got, ref, false);
  const cudaError_t left = cudaGetLastError();
  const bool ok = planted != cudaSuccess && g_failures == before && left == planted;
  report("pending_caller_error", ok,
         std::string("layout, dispatch, combine and a cached re-dispatch ran beside the caller's ") +
             cudaGetErrorName(planted) + (g_failures == before ? ", outputs equal the host's" : ", outputs DIFFER") +
             "; afterwards CUDA still holds " + cudaGetErrorName(left));
  epCommDestroy(gpu);
  epCommDestroy(host);
  return ok;
}

// 4b. A sticky error of the caller's kernel (an illegal address) before a
// call: the call fails, saying that CUDA held the error before libmoeep
// launched anything.
bool stickyCallerError() {
  OneRank one(14);
  const Case& c = one.c;
  epComm_t comm = one.comm;
  DevBufs& d = one.d;
  CK(cudaDeviceSynchronize());
  writeTo<<<1, 1>>>(reinterpret_cast<int*>(8));
  const cudaError_t sticky = cudaDeviceSynchronize();
  epLayoutArgs_t la = layoutArgs(c, 0, d);
  const epResult_t res = epLayout(comm, &la, nullptr);
  const std::string msg = epGetLastError(comm);
  const bool ok = sticky != cudaSuccess && res == epUnhandledCudaError &&
                  contains(msg, "already held before libmoeep launched anything");
  report("sticky_caller_error", ok,
         std::string("after the caller's ") + cudaGetErrorName(sticky) + " epLayout gave " + epGetErrorString(res) +
             " (" + msg + ")");
  fflush(stdout);
  _exit(ok ? 0 : 1);  // the context is unusable: no teardown
  return ok;
}

long deviceFree() {
  size_t free_b = 0, total = 0;
  CK(cudaMemGetInfo(&free_b, &total));
  return long(free_b);
}

// The bootstrap root of an init that failed before every rank reached it
// serves until EP_TIMEOUT_MS (the root's, from the environment: the config
// is not known to it), holding its memory: the sweeps below set it to this
// before the library reads it, and wait for it before they count what is
// left.
constexpr int kInitTimeoutMs = 3000;
void shortRootTimeout() { setenv("EP_TIMEOUT_MS", std::to_string(kInitTimeoutMs).c_str(), 1); }

// One CUDA communicator of `R` ranks on GPU 0 with low-latency buffers, made
// and destroyed; the init's result. fail_after >= 0: that many host
// allocations (operator new) succeed, the next one throws; *grown: blocks
// allocated by the init and its destroy and not freed; *hit: the failure was
// reached. The message of a failed init goes to msg.
epResult_t initOnce(int R, long fail_after, long* grown, bool* hit, char* msg, size_t len) {
  Case c{"init", R, 1024, 8, 16 * R, std::vector<int>(R, 256)};
  epConfig_t cfg = configOf(c, epBackendCuda);
  cfg.low_latency = 1;
  cfg.timeout_ms = kInitTimeoutMs;  // a peer of a rank whose init failed is told at once; this bounds a miss
  std::vector<epComm_t> comms(R, nullptr);
  const std::vector<int> devs(R, 0);
  const long live = g_live.load();
  g_fail_after.store(fail_after);
  const epResult_t res = epCommInitAll(comms.data(), R, devs.data(), &cfg);
  *hit = fail_after >= 0 && g_fail_after.load() < 0;
  g_fail_after.store(-1);
  snprintf(msg, len, "%s", epGetLastError(nullptr));
  for (epComm_t comm : comms)
    if (comm != nullptr) epCommDestroy(comm);
  *grown = g_live.load() - live;
  return res;
}

// 5a. Every checked CUDA step of init failing in turn (EP_TEST_CUDA_FAIL_STEP,
// with EP_CUDA_LL_TIMING=1 so that the timing buffer's steps are there too):
// each init fails with an error, none crashes or hangs, no host block stays
// allocated, and at the end no device memory is missing (cudaMemGetInfo;
// host_cases.sh also runs this case under compute-sanitizer --leak-check
// full, which sees allocations too small for that).
bool initSteps(int R) {
  setenv("EP_CUDA_LL_TIMING", "1", 1);  // read once per process: before the first init
  shortRootTimeout();
  char msg[1024];
  long grown = 0;
  bool hit = false;
  EK(nullptr, initOnce(R, -1, &grown, &hit, msg, sizeof(msg)));  // CUDA's first-use allocations before the count
  const long free0 = deviceFree();
  const long live0 = g_live.load();
  int step = 1, failed = 0;
  for (; step < 1000; step++) {
    setenv("EP_TEST_CUDA_FAIL_STEP", std::to_string(step).c_str(), 1);
    const long free_before = deviceFree();
    const epResult_t res = initOnce(R, -1, &grown, &hit, msg, sizeof(msg));
    if (res == epSuccess) break;
    failed++;
    const long step_lost = free_before - deviceFree();
    if (step <= 3 || step_lost > 0)
      printf("  step %d: %s (%s), device memory missing after it: %ld bytes\n", step, epGetErrorString(res), msg,
             step_lost);
  }
  unsetenv("EP_TEST_CUDA_FAIL_STEP");
  CK(cudaDeviceSynchronize());
  const long lost = free0 - deviceFree();
  std::this_thread::sleep_for(std::chrono::milliseconds(kInitTimeoutMs + 1000));  // bootstrap roots of failed inits end
  const long left = g_live.load() - live0;  // after the good init that ended the sweep
  const bool ok = failed >= 10 && step < 1000 && lost <= 0 && left == 0;
  char detail[256];
  snprintf(detail, sizeof(detail), "EP%d: %d steps, each failing init with an error, then init succeeded; "
           "device memory missing after them: %ld bytes, host blocks: %ld", R, failed, lost, left);
  return report(R == 1 ? "init_steps_ep1" : "init_steps_ep2", ok, detail);
}

// 5b. Out of host memory at every allocation of a CUDA communicator's init in
// turn: each init fails (epOutOfMemory; epSystemError where a thread could
// not start; epRemoteError where the root's thread of this process failed
// before the rank reached it) or works around the failure, none crashes or
// hangs, and once an init
// succeeds again and the failed inits' roots have ended
// as many blocks are allocated as before the sweep. (Per failed init the
// count may differ: the library keeps the last failure's message until the
// next call replaces it.)
bool initOutOfHostMemory() {
  shortRootTimeout();
  char msg[1024];
  long grown = 0;
  bool hit = false;
  EK(nullptr, initOnce(1, -1, &grown, &hit, msg, sizeof(msg)));  // the process's first-use allocations
  const long live0 = g_live.load();
  const auto t0 = Clock::now();
  long n = 0;
  int failed = 0;
  bool clean = true;
  for (; n < 1000000; n++) {
    const epResult_t res = initOnce(1, n, &grown, &hit, msg, sizeof(msg));
    if (n < 2) printf("  allocation %ld: %s (%s), reached: %d\n", n, epGetErrorString(res), msg, int(hit));
    if (n == 0 && !hit) {
      // Not one allocation of init came here: the library has an operator
      // new of its own, a libstdc++ linked statically and hidden (a compiler
      // that ships only libstdc++.a does that), so nothing can be counted.
      printf("SKIPPED init_out_of_host_memory: libmoeep.so does not allocate through the process's operator new "
             "(a static libstdc++ inside it); build it with a compiler whose libstdc++ is shared "
             "(make CUDA=1 CXX=/usr/bin/g++) to run this case\n");
      return true;
    }
    // What an init left allocated (its message, kept until the next call,
    // is one block): a step that leaves more than the one before points at
    // the path that leaks.
    if (grown != 0) fprintf(stderr, "  allocation %ld: %s, blocks left by it: %ld\n", n, epGetErrorString(res), grown);
    if (!hit) break;  // init made fewer allocations than n, and succeeded
    failed++;
    // epSuccess: an allocation whose failure the library works around (the
    // root's thread after every rank reached it, say).
    if (res != epSuccess && res != epOutOfMemory && res != epSystemError && res != epRemoteError) {
      if (clean) printf("  allocation %ld: %s (%s)\n", n, epGetErrorString(res), msg);
      clean = false;
    }
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(kInitTimeoutMs + 1000));  // bootstrap roots of failed inits end
  const long left = g_live.load() - live0;
  char detail[240];
  snprintf(detail, sizeof(detail), "%d allocations of init failed in turn (%.1f s), no crash or hang; "
           "blocks left allocated after the sweep and a good init: %ld", failed, secondsSince(t0), left);
  return report("init_out_of_host_memory", clean && failed > 10 && left == 0, detail);
}

// 6a. The errors of epDispatchPrepare name it: refused under capture, and an
// earlier kernel's report.
bool prepareNamesItself() {
  OneRank one(15);
  const Case& c = one.c;
  epComm_t comm = one.comm;
  const std::vector<RankIn>& ins = one.ins;
  DevBufs& d = one.d;
  cudaStream_t s = one.s;
  epDispatchArgs_t a = dispatchArgs(c, ins[0], 0, d.x, d.scales, d.topk, d.w);
  int64_t n = 0;
  a.num_recv = &n;
  epHandle_t h = nullptr;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  const epResult_t captured = epDispatchPrepare(comm, &a, &h, s);
  const std::string msg1 = epGetLastError(comm);
  cudaGraph_t graph = nullptr;
  CK(cudaStreamEndCapture(s, &graph));
  if (graph) cudaGraphDestroy(graph);
  const int64_t bad = c.E + 2;
  CK(cudaMemcpy(static_cast<int64_t*>(d.topk) + 6, &bad, 8, cudaMemcpyHostToDevice));
  epLayoutArgs_t la = layoutArgs(c, 0, d);
  EK(comm, epLayout(comm, &la, s));
  CK(cudaStreamSynchronize(s));
  const epResult_t reported = epDispatchPrepare(comm, &a, &h, s);
  const std::string msg2 = epGetLastError(comm);
  const bool ok = captured == epInvalidUsage && msg1.rfind("epDispatchPrepare:", 0) == 0 &&
                  reported == epInvalidArgument && msg2.rfind("epDispatchPrepare:", 0) == 0;
  report("prepare_names_itself", ok, "under capture: " + msg1 + "; an earlier bad id: " + msg2);
  if (h) epHandleDestroy(h);
  return ok;
}

// 6b. A kernel's report read by a call being captured must not leave the
// error claim to the graph: an eager call's bad id right after (the graph
// never launched) is reported at the next call.
bool captureLeavesClaim() {
  OneRank one(16);
  const Case& c = one.c;
  epComm_t comm = one.comm;
  const std::vector<RankIn>& ins = one.ins;
  DevBufs& d = one.d;
  cudaStream_t s = one.s;
  int64_t* topk = static_cast<int64_t*>(d.topk);
  auto setId = [&](int at, int64_t v) { CK(cudaMemcpy(topk + at, &v, 8, cudaMemcpyHostToDevice)); };
  epLayoutArgs_t la = layoutArgs(c, 0, d);
  setId(5, c.E + 1);
  EK(comm, epLayout(comm, &la, s));  // the kernel reports entry 5
  CK(cudaStreamSynchronize(s));
  setId(5, ins[0].topk[5]);
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  const epResult_t in_capture = epLayout(comm, &la, s);  // reads the report of entry 5
  cudaGraph_t graph = nullptr;
  CK(cudaStreamEndCapture(s, &graph));
  if (graph) cudaGraphDestroy(graph);  // never launched
  setId(9, c.E + 4);
  EK(comm, epLayout(comm, &la, s));  // the kernel must be able to report entry 9
  CK(cudaStreamSynchronize(s));
  setId(9, ins[0].topk[9]);
  const epResult_t next = epLayout(comm, &la, s);
  const std::string msg = epGetLastError(comm);
  const bool ok = in_capture == epInvalidArgument && next == epInvalidArgument &&
                  contains(msg, ("topk_idx entry 9 (flat index) = " + std::to_string(c.E + 4)).c_str());
  report("capture_leaves_claim", ok,
         std::string("the call under capture ") + epGetErrorString(in_capture) + ", the eager bad id after it: " +
             epGetErrorString(next) + " (" + msg + ")");
  return ok;
}

// 7. Rank 0 destroys its communicator while rank 1's combine, on the same
// GPU in this process, waits for rank 0's rows (rank 0 makes no combine).
// The destroy must not wait for rank 1's kernel: rank 0 returns, and rank
// 1's kernel ends, within 5 s (timeout 20 s), its next call epRemoteError
// saying that rank 0 destroyed its communicator.
bool sharedGpuDestroy() {
  TwoRanks t;
  std::vector<epHandle_t> h(2, nullptr);
  runRanks(2, [&](int r) {
    epDispatchArgs_t a = t.args(r, true);
    EK(t.comms[r], epDispatch(t.comms[r], &a, &h[r], t.s[r]));
    CK(cudaStreamSynchronize(t.s[r]));
  });
  epCombineArgs_t ca = EP_COMBINE_ARGS_INITIALIZER;
  ca.y = t.d[1].recv_x;
  ca.out = t.d[1].out;
  EK(t.comms[1], epCombine(t.comms[1], &ca, h[1], t.s[1]));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto t0 = Clock::now();
  epHandleDestroy(h[0]);
  double destroy_secs = 0;
  std::thread destroyer([&] {
    const epResult_t res = epCommDestroy(t.comms[0]);
    destroy_secs = res == epSuccess ? secondsSince(t0) : 1e9;
  });
  CK(cudaStreamSynchronize(t.s[1]));
  const double kernel_secs = secondsSince(t0);
  destroyer.join();
  t.comms[0] = nullptr;
  epLayoutArgs_t la = layoutArgs(t.c, 1, t.d[1]);
  const epResult_t next = epLayout(t.comms[1], &la, t.s[1]);
  const std::string msg = epGetLastError(t.comms[1]);
  epHandleDestroy(h[1]);
  const bool ok = destroy_secs < 5.0 && kernel_secs < 5.0 && next == epRemoteError &&
                  contains(msg, "rank 0 destroyed its communicator");
  char detail[160];
  snprintf(detail, sizeof(detail), "rank 0's destroy took %.2f s, rank 1's waiting combine ended after %.2f s; ",
           destroy_secs, kernel_secs);
  report("shared_gpu_destroy", ok, detail + std::string("rank 1's next call: ") + epGetErrorString(next) + " (" + msg + ")");
  t.finish();
  return ok;
}

const std::map<std::string, std::function<bool()>>& cases() {
  static const std::map<std::string, std::function<bool()>> all = {
      {"prepared_after_peer_destroy", preparedAfterPeerDestroy},
      {"abort_during_exact_wait", abortDuringExactWait},
      {"host_num_recv_refused_first", hostNumRecvRefusedFirst},
      {"pending_caller_error", pendingCallerError},
      {"sticky_caller_error", stickyCallerError},
      {"init_steps_ep1", [] { return initSteps(1); }},
      {"init_steps_ep2", [] { return initSteps(2); }},
      {"init_out_of_host_memory", initOutOfHostMemory},
      {"prepare_names_itself", prepareNamesItself},
      {"capture_leaves_claim", captureLeavesClaim},
      {"shared_gpu_destroy", sharedGpuDestroy},
  };
  return all;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: gpu_host_test --list | CASE\n");
    return 2;
  }
  const std::string name = argv[1];
  if (name == "--list") {
    for (const auto& [n, fn] : cases()) printf("%s\n", n.c_str());
    return 0;
  }
  const auto it = cases().find(name);
  if (it == cases().end()) {
    fprintf(stderr, "gpu_host_test: no case %s (--list names them)\n", name.c_str());
    return 2;
  }
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);  // two ranks' streams on one GPU (gpu_common.h)
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    printf("SKIPPED gpu_host_test %s: no GPU\n", name.c_str());
    return 0;
  }
  gpuCount() = 1;  // every rank on GPU 0
  return it->second() ? 0 : 1;
}
