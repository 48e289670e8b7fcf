// The proxy protocol with a GPU as its producer (docs/PROXY.md): a kernel
// writes commands into the host-mapped ring (src/proxy/device_ring.cuh), the
// proxy thread posts them and answers through flags in device memory written
// by stream writes of values (src/cuda/stream_flags.h); the kernel waits on
// those flags, never on host memory.
//
// The transport is a loopback in this process (LoopSink): a put copies the
// bytes of this rank's segment into the "peer's" host buffer and stores the
// signal word there; the proxy watches that word and mirrors it into a
// device flag, so a kernel can wait for a peer's signal as it will across
// nodes. The network transports themselves are tested elsewhere (socket over
// loopback, ibverbs in the Soft-RoCE VMs).
//
// Cases:
//   puts       1000 puts of 4 KiB written by a kernel (the ring of 64 slots
//              wraps: its credits come from the consumed flag), each put's
//              signal mirrored back; every byte and signal checked
//   latency    a kernel pushes a signal-only put and waits for its mirror,
//              2000 times: the median and 99th percentile of the round trip
//   error      the transport fails a put to rank 1: the kernel's wait returns
//              the proxy's error naming rank 1
//   stalled    the proxy stops while a kernel waits: its wait ends through
//              the heartbeat within the stall bound
// Also the host's cost of one stream write of a flag.
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "proxy/device_ring.cuh"
#include "proxy/proxy.h"
#include "cuda/stream_flags.h"

using namespace ep::proxy;

namespace {

#define CK(x)                                                                                     \
  do {                                                                                            \
    cudaError_t e_ = (x);                                                                         \
    if (e_ != cudaSuccess) {                                                                      \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));         \
      exit(1);                                                                                    \
    }                                                                                             \
  } while (0)

constexpr int kFlags = kFlagMirrorFirst + 1;
constexpr uint32_t kSlots = 64;
constexpr size_t kChunk = 4096;
constexpr int kPuts = 1000;
constexpr size_t kSegment = kChunk * kPuts;
constexpr size_t kSignal = kSegment;  // the peer's signal word, after its data
constexpr uint64_t kSecond = 1000000000ull;

// The "network": puts land at once in the peer's buffer, in order; a put
// completes on the next test. fail_peer: puts to it fail after fail_after.
class LoopSink : public PutSink {
 public:
  LoopSink(const uint8_t* mine, uint8_t* peers) : mine_(mine), peers_(peers) {}
  std::atomic<int> fail_peer{-1};
  int fail_after = 0;

  epResult_t put(int peer, size_t local, size_t remote, size_t bytes, size_t sig, uint64_t value,
                 uint64_t* request) override {
    if (peer == fail_peer && puts_ >= fail_after) return epRemoteError;
    puts_++;
    if (bytes) memcpy(peers_ + remote, mine_ + local, bytes);
    __atomic_store_n(reinterpret_cast<uint64_t*>(peers_ + sig), value, __ATOMIC_RELEASE);
    *request = ++requests_;
    return epSuccess;
  }
  epResult_t test(int, uint64_t, int* done) override {
    *done = 1;
    return epSuccess;
  }
  epResult_t progress(int*, std::string*) override { return epSuccess; }

 private:
  const uint8_t* mine_;
  uint8_t* peers_;
  int puts_ = 0;
  uint64_t requests_ = 0;
};

__host__ __device__ inline uint8_t pattern(int chunk, size_t i) { return uint8_t((chunk * 131 + i * 7 + 3) & 0xff); }

struct Result {
  int status;           // DeviceWait of the first wait that did not end in kWaitDone
  int done;             // commands pushed
  uint64_t error_word;  // kWaitProxyError: the proxy's error flag
  uint64_t ns;          // the kernel's time
};

// Writes chunk i of the segment (every thread), then thread 0 pushes its put.
__global__ void putsKernel(Command* slots, uint8_t* segment, const uint64_t* flags, Result* out) {
  uint64_t head = 0, err = 0;
  const uint64_t t0 = deviceNowNs();
  __shared__ int status;
  if (threadIdx.x == 0) status = kWaitDone;
  __syncthreads();
  int i = 0;
  for (; i < kPuts; i++) {
    for (size_t j = threadIdx.x; j < kChunk; j += blockDim.x) segment[size_t(i) * kChunk + j] = pattern(i, j);
    __threadfence_system();  // each thread's bytes reach the host before thread 0 publishes the put
    __syncthreads();
    if (threadIdx.x == 0) {
      Command c{};
      c.op = kOpPut;
      c.peer = 1;
      c.local_offset = size_t(i) * kChunk;
      c.remote_offset = size_t(i) * kChunk;
      c.bytes = kChunk;
      c.signal_offset = kSignal;
      c.signal_value = uint64_t(i) + 1;
      status = pushCommand(slots, kSlots, &head, flags, c, 20 * kSecond, kSecond, &err);
    }
    __syncthreads();
    if (status != kWaitDone) break;
  }
  if (threadIdx.x == 0) {
    if (status == kWaitDone) status = waitFlagDevice(flags, kFlagCompleted, kPuts, 20 * kSecond, kSecond, &err);
    if (status == kWaitDone) status = waitFlagDevice(flags, kFlagMirrorFirst, kPuts, 20 * kSecond, kSecond, &err);
    out->status = status;
    out->done = i;
    out->error_word = err;
    out->ns = deviceNowNs() - t0;
  }
}

// Round trips: a signal-only put, then the wait for its mirror.
__global__ void latencyKernel(Command* slots, const uint64_t* flags, int n, uint64_t* ns, Result* out) {
  uint64_t head = 0, err = 0;
  int status = kWaitDone, i = 0;
  for (; i < n && status == kWaitDone; i++) {
    Command c{};
    c.op = kOpPut;
    c.peer = 1;
    c.signal_offset = kSignal;
    c.signal_value = uint64_t(i) + 1;
    const uint64_t t = deviceNowNs();
    status = pushCommand(slots, kSlots, &head, flags, c, 5 * kSecond, kSecond, &err);
    if (status == kWaitDone) status = waitFlagDevice(flags, kFlagMirrorFirst, uint64_t(i) + 1, 5 * kSecond, kSecond, &err);
    ns[i] = deviceNowNs() - t;
  }
  out->status = status;
  out->done = i;
  out->error_word = err;
}

// Waits for a flag that never comes (the stall case).
__global__ void waitKernel(const uint64_t* flags, uint64_t stall_ns, Result* out) {
  uint64_t err = 0;
  const uint64_t t0 = deviceNowNs();
  out->status = waitFlagDevice(flags, kFlagFlushed, 1, 30 * kSecond, stall_ns, &err);
  out->error_word = err;
  out->ns = deviceNowNs() - t0;
}

int failures = 0;
void check(bool ok, const char* what) {
  printf("  %s: %s\n", ok ? "ok" : "FAIL", what);
  failures += !ok;
}

// One proxy with its ring, device flags and loopback transport.
struct Setup {
  Command* slots = nullptr;  // host-mapped
  Command* slots_dev = nullptr;
  uint8_t* segment = nullptr;  // host-mapped: this rank's registered segment
  uint8_t* segment_dev = nullptr;
  std::vector<uint8_t> peer;   // the peer's segment and signal word
  uint64_t* flags = nullptr;   // device
  Result* result = nullptr;    // host-mapped
  std::unique_ptr<LoopSink> sink;
  std::unique_ptr<StreamFlags> writer;
  std::unique_ptr<Proxy> proxy;

  // A failure is a failed check, with its reason.
  bool init() {
    std::string why;
    const bool ok = start(&why);
    if (!ok) check(false, ("setup: " + why).c_str());
    return ok;
  }
  bool start(std::string* why) {
    CK(cudaHostAlloc(&slots, kSlots * sizeof(Command), cudaHostAllocMapped));
    memset(slots, 0, kSlots * sizeof(Command));
    CK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&slots_dev), slots, 0));
    CK(cudaHostAlloc(&segment, kSegment, cudaHostAllocMapped));
    memset(segment, 0, kSegment);
    CK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&segment_dev), segment, 0));
    CK(cudaHostAlloc(&result, sizeof(Result), cudaHostAllocMapped));
    memset(result, 0, sizeof(Result));
    peer.assign(kSegment + 64, 0);
    CK(cudaMalloc(&flags, kFlags * sizeof(uint64_t)));
    CK(cudaMemset(flags, 0, kFlags * sizeof(uint64_t)));
    sink = std::make_unique<LoopSink>(segment, peer.data());
    if (!StreamFlags::create(0, flags, kFlags, &writer, why)) return false;
    ProxyOptions opt;
    opt.nranks = 2;
    opt.heartbeat_ms = 10;
    proxy = std::make_unique<Proxy>(Ring{slots, kSlots}, sink.get(), writer.get(), opt);
    if (proxy->watch(reinterpret_cast<const uint64_t*>(peer.data() + kSignal)) != 0) {
      *why = "watch";
      return false;
    }
    if (proxy->start() != epSuccess) {
      *why = "the proxy does not start";
      return false;
    }
    return true;
  }
  ~Setup() {
    proxy.reset();
    writer.reset();
    cudaFreeHost(slots);
    cudaFreeHost(segment);
    cudaFreeHost(result);
    cudaFree(flags);
  }
};

const char* waitName(int s) {
  switch (s) {
    case kWaitDone: return "done";
    case kWaitProxyError: return "proxy error";
    case kWaitStalled: return "stalled";
    case kWaitTimeout: return "timeout";
    default: return "?";
  }
}

void casePuts(cudaStream_t s) {
  printf("--- puts: %d puts of %zu bytes through a ring of %u slots\n", kPuts, kChunk, kSlots);
  Setup st;
  if (!st.init()) return;
  putsKernel<<<1, 256, 0, s>>>(st.slots_dev, st.segment_dev, st.flags, st.result);
  CK(cudaStreamSynchronize(s));
  const Result r = *st.result;
  printf("  kernel: %s after %d puts, %.1f us per put\n", waitName(r.status), r.done, r.ns / 1e3 / std::max(1, r.done));
  check(r.status == kWaitDone && r.done == kPuts, "every put pushed, completed and its signal mirrored");
  bool bytes_ok = true;
  for (int i = 0; i < kPuts && bytes_ok; i++)
    for (size_t j = 0; j < kChunk; j++)
      if (st.peer[size_t(i) * kChunk + j] != pattern(i, j)) {
        printf("  byte %zu of put %d: %u, want %u\n", j, i, st.peer[size_t(i) * kChunk + j], pattern(i, j));
        bytes_ok = false;
        break;
      }
  check(bytes_ok, "the peer holds every byte the kernel wrote");
  uint64_t sig;
  memcpy(&sig, st.peer.data() + kSignal, 8);
  check(sig == kPuts, "the peer's signal is the last put's");
  check(st.proxy->error().empty(), "no proxy error");
}

void caseLatency(cudaStream_t s) {
  const int n = 2000;
  printf("--- latency: %d round trips kernel -> proxy -> signal -> mirrored flag -> kernel\n", n);
  Setup st;
  if (!st.init()) return;
  uint64_t* ns = nullptr;
  CK(cudaMalloc(&ns, n * sizeof(uint64_t)));
  latencyKernel<<<1, 1, 0, s>>>(st.slots_dev, st.flags, n, ns, st.result);
  CK(cudaStreamSynchronize(s));
  std::vector<uint64_t> host(n);
  CK(cudaMemcpy(host.data(), ns, n * sizeof(uint64_t), cudaMemcpyDeviceToHost));
  cudaFree(ns);
  const Result r = *st.result;
  check(r.status == kWaitDone && r.done == n, "every round trip ended");
  if (r.done == n) {
    std::vector<uint64_t> sorted(host.begin() + 100, host.end());  // the first 100 warm up
    std::sort(sorted.begin(), sorted.end());
    printf("  round trip: median %.2f us, p10 %.2f us, p99 %.2f us (%zu samples)\n", sorted[sorted.size() / 2] / 1e3,
           sorted[sorted.size() / 10] / 1e3, sorted[sorted.size() * 99 / 100] / 1e3, sorted.size());
  }
}

void caseError(cudaStream_t s) {
  printf("--- error: the transport fails the 10th put to rank 1\n");
  Setup st;
  if (!st.init()) return;
  st.sink->fail_after = 9;
  st.sink->fail_peer = 1;
  putsKernel<<<1, 256, 0, s>>>(st.slots_dev, st.segment_dev, st.flags, st.result);
  CK(cudaStreamSynchronize(s));
  const Result r = *st.result;
  printf("  kernel: %s after %d puts; proxy: %s\n", waitName(r.status), r.done, st.proxy->error().c_str());
  check(r.status == kWaitProxyError, "the kernel's wait returns the proxy's error");
  check(errorResult(r.error_word) == epRemoteError && errorPeer(r.error_word) == 1,
        "the error flag says epRemoteError, rank 1");
}

void caseStalled(cudaStream_t s) {
  printf("--- stalled: the proxy stops while a kernel waits (stall bound 300 ms)\n");
  Setup st;
  if (!st.init()) return;
  waitKernel<<<1, 1, 0, s>>>(st.flags, 300000000ull, st.result);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto t = std::chrono::steady_clock::now();
  st.proxy->stop();
  CK(cudaStreamSynchronize(s));
  const double after = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  const Result r = *st.result;
  printf("  kernel: %s after %.3f s in all, %.3f s after the stop\n", waitName(r.status), r.ns / 1e9, after);
  check(r.status == kWaitStalled, "the wait ends as stalled");
  check(after < 1.0, "within the stall bound (and well before its 30 s timeout)");
}

void writeCost() {
  uint64_t* flags = nullptr;
  CK(cudaMalloc(&flags, kFlags * sizeof(uint64_t)));
  std::unique_ptr<StreamFlags> w;
  std::string why;
  if (!StreamFlags::create(0, flags, kFlags, &w, &why)) {
    check(false, why.c_str());
    return;
  }
  const int n = 20000;
  const auto t = std::chrono::steady_clock::now();
  for (int i = 0; i < n; i++) w->write(kFlagHeartbeat, uint64_t(i) + 1);
  const double enq = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  w->drain();
  const double all = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  uint64_t last = 0;
  CK(cudaMemcpy(&last, flags + kFlagHeartbeat, 8, cudaMemcpyDeviceToHost));
  printf("--- stream writes of a flag: %.2f us each to enqueue, %.2f us each until done (%d writes)\n", enq / n * 1e6,
         all / n * 1e6, n);
  check(last == uint64_t(n) && w->error().empty(), "the last value is in device memory");
  w.reset();
  cudaFree(flags);
}

}  // namespace

int main() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    printf("SKIPPED proxy_gpu_test: no GPU\n");
    return 77;
  }
  CK(cudaSetDevice(0));
  cudaDeviceProp p;
  CK(cudaGetDeviceProperties(&p, 0));
  printf("proxy_gpu_test on %s\n", p.name);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  writeCost();
  casePuts(s);
  caseLatency(s);
  caseError(s);
  caseStalled(s);
  CK(cudaStreamDestroy(s));
  printf("proxy_gpu_test: %s (%d failed)\n", failures ? "FAILED" : "passed", failures);
  return failures ? 1 : 0;
}
