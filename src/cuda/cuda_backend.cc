// The CUDA backend: the SPEC operations on device memory between the GPUs of
// one node, through peer-mapped buffers set up by the cuda_ipc transport.
// Host code only: it sizes and maps the communication buffers, keeps the
// per-handle device state, launches the kernels of layout.cu / dispatch.cu /
// combine.cu on the caller's stream and turns the kernels' error slot into
// result codes. Outputs match the host backend bit for bit.
//
// Host-visible points (where a kernel's error is reported): the start of every
// call, and the count wait of a dispatch without EP_DISPATCH_NO_HOST_SYNC.
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../backend.h"
#include "../bootstrap.h"
#include "../checks.h"
#include "../ll_layout.h"
#include "../params.h"
#include "../transport.h"
#include "cuda_check.h"
#include "cuda_common.h"
#include "gpu_arch.h"
#include "gpu_share.h"
#include "host_notices.h"
#include "node_limit.h"
#include "ll_engine.h"
#include "own_work.h"

namespace ep {
namespace {

using cuda::CommView;
using cuda::HandleView;
using cuda::HState;
using cuda::kMaxChannels;
using cuda::kMaxRanks;

size_t roundUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

// Makes dev current for the life of the guard and restores the caller's device.
class DeviceGuard {
 public:
  explicit DeviceGuard(int dev) {
    if (cudaGetDevice(&prev_) != cudaSuccess) prev_ = -1;
    if (prev_ != dev) cudaSetDevice(dev);
    else prev_ = -1;
  }
  ~DeviceGuard() {
    if (prev_ >= 0) cudaSetDevice(prev_);
  }

 private:
  int prev_ = -1;
};

struct RankDevice {
  int device;
  int channels;  // this rank's high-throughput channels before they are agreed
  int sms;       // its GPU's SMs
  char bus_id[16];
};

struct HandleSlot {
  void* mem = nullptr;
  HandleView hv{};
};

// "A,B" -> two ints (warps of the two roles of a kernel).
void parseWarps(const char* name, int* a, int* b) {
  const char* v = paramEnv(name);
  if (v == nullptr) return;
  int x = 0, y = 0;
  if (sscanf(v, "%d,%d", &x, &y) == 2 && x > 0 && y > 0 && x + y <= 16) {
    *a = x;
    *b = y;
  } else {
    EP_WARN(kSubsysCuda, "EP_%s=\"%s\" is not two positive counts with a sum <= 16: ignored", name, v);
  }
}

class CudaBackend : public Backend {
 public:
  explicit CudaBackend(epComm* comm) : comm_(comm) {}
  ~CudaBackend() override;
  epResult_t init();

  const char* name() const override { return "cuda"; }
  size_t bufferBytes() const override { return buffer_bytes_ + (ll_ ? ll_->bytes() : 0); }
  epResult_t layout(const epLayoutArgs_t& args, epStream_t stream) override;
  epResult_t prepare(const char* fn, const epDispatchArgs_t& args, epHandle* h, epStream_t stream) override;
  epResult_t dispatch(const epDispatchArgs_t& args, epHandle* h, bool ids_routed, epStream_t stream) override;
  epResult_t combine(const epCombineArgs_t& args, epHandle* h, epStream_t stream) override;
  void releaseHandle(epHandle* h) override;
  // epCommAbort: this rank's waits leave, and the peers' waits for it too
  // (its call log says it aborted: their watchers mark it gone).
  void abort() override {
    if (!notices_) return;
    notices_->abort();
    notices_->announceClosed(kClosedAborted);
  }
  // The low-latency calls report both families' kernel errors first
  // (checkKernelErrors: this slot, then the engine's), as every call does.
  epResult_t llDispatch(const epLowLatencyDispatchArgs_t& args, epHandle* h, bool send_only,
                        epStream_t stream) override {
    DeviceGuard g(dev_);
    cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
    EPCHECK(checkKernelErrors("epLowLatencyDispatch", s));
    const epResult_t res = ll_->dispatch(args, h, send_only, s);
    own_work_.mark(s);  // also after a failure: a kernel of the call may have been launched
    return res;
  }
  epResult_t llCombine(const epLowLatencyCombineArgs_t& args, epHandle* h, bool send_only,
                       epStream_t stream) override {
    DeviceGuard g(dev_);
    cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
    EPCHECK(checkKernelErrors("epLowLatencyCombine", s));
    const epResult_t res = ll_->combine(args, h, send_only, s);
    own_work_.mark(s);  // also after a failure: a kernel of the call may have been launched
    return res;
  }
  epResult_t llComplete(epHandle* h, epStream_t stream) override {
    DeviceGuard g(dev_);
    cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
    EPCHECK(checkKernelErrors("epLowLatencyComplete", s));
    const epResult_t res = ll_->complete(h, s);
    own_work_.mark(s);  // also after a failure: a kernel of the call may have been launched
    return res;
  }

 private:
  epResult_t checkArch(const cudaDeviceProp& prop);
  void limitExpertCounters(const cudaDeviceProp& prop);
  epResult_t checkExpertCounters(const char* fn) const;
  // What the kernels and the watcher reported, in order (below); with
  // argument_errors false only what ends the communicator (failed waits,
  // ranks out of step, a peer that left), for a call that must go ahead
  // whatever argument error is pending (a handle's first dispatch).
  epResult_t checkKernelErrors(const char* fn, cudaStream_t stream, bool argument_errors = true);
  // An argument error's claim word cleared for the next report: on the
  // caller's stream, or beside it while that stream captures a graph. A
  // clearing that fails is logged and tried again at the next call (until
  // then the kernels cannot report a new argument error).
  void clearErrorClaim(int* claim, cudaStream_t stream);
  std::vector<int*> claims_to_clear_;
  // A kernel's wait failed (timeout, exited peer, ranks out of step): the
  // communicator cannot go on (the argument errors it reports can).
  bool kernelFailedForGood() const { return notices_->kernelsReportedFailure() || notices_->outOfStep(); }
  epResult_t reportFailedWait(const char* fn);
  epResult_t reportArgumentError(const char* fn, cudaStream_t stream);
  epResult_t refuseHostCount() const {
    return setError(comm_, epInvalidUsage,
                    "epDispatch: num_recv is a host pointer but the handle's counts are on the device only (it "
                    "came from a dispatch with EP_DISPATCH_NO_HOST_SYNC): pass the flag again");
  }
  epResult_t allocSlot(HandleSlot** out);
  epResult_t watchOtherFamily();
  CommView view() const;

  epComm* comm_;
  int dev_ = 0;
  int channels_ = 32;
  // Measured on 2 x H200, EP2, 4096 and 8192 tokens, 32 SMs (docs/BENCHMARKS.md);
  // the dispatch split depends on the row size (set in init).
  int send_warps_ = 6, recv_warps_ = 10, push_warps_ = 4, reduce_warps_ = 12;
  int chunk_tokens_ = 16;
  std::string counters_too_small_;  // why epLayout / epDispatch cannot run here (limitExpertCounters)
  size_t row_stride_ = 0, meta_stride_ = 0, rows_off_ = 0, meta_off_ = 0, buffer_bytes_ = 0;
  size_t slot_bytes_ = 0, tok_pos_off_ = 0, chan_off_ = 0, expert_off_ = 0;
  const TransportEntry* ipc_ = nullptr;
  void* own_mem_ = nullptr;
  std::vector<char*> bufs_;
  std::vector<void*> conns_;
  cuda::DevLocal* local_ = nullptr;
  int* layout_scratch_ = nullptr;
  uint64_t* route_scratch_ = nullptr;  // routing kernel's per-tile counts
  cuda::ErrorInfo* err_host_ = nullptr;
  cuda::ErrorInfo* err_dev_ = nullptr;
  HState* hs_host_ = nullptr;  // pinned, for the exact-sizing count wait
  std::unique_ptr<cuda::LLEngine> ll_;  // config.low_latency = 1
  std::unique_ptr<cuda::HostNotices> notices_;  // exited peers, calls out of step, abort
  cuda::OwnWork own_work_;  // what the destroy waits for (own_work.h)
  std::mutex slots_mu_;
  std::vector<HandleSlot*> free_slots_;
  std::vector<HandleSlot*> all_slots_;
};

CudaBackend::~CudaBackend() {
  DeviceGuard g(dev_);
  // Kernels of this rank may still run: wait for them (the watcher still
  // ends their waits for a peer that left). Peers only write into this
  // buffer during operations this rank takes part in, so once they are done
  // nobody touches it any more. Then the peers may learn that this rank
  // left: everything it sent has landed. On a GPU that another rank of this
  // process drives, only this rank's own calls are waited for (own_work.h).
  own_work_.wait();
  if (notices_) notices_->announceClosed(kClosedDestroyed);
  // What follows frees memory, and a cudaFree waits for the whole device
  // while holding up other threads' copies (tests/gpu/notice_probe.cu): the
  // copy by which the watcher of a rank sharing this GPU in this process
  // ends its kernels' waits for this one. So first the whole device, which
  // lets those copies through: such a kernel ends within about 0.1 s of the
  // announcement, and the frees below find nothing running.
  if (own_work_.tracking()) cudaDeviceSynchronize();
  notices_.reset();  // the watcher stops before what it writes into goes
  ll_.reset();
  if (ipc_ != nullptr) {
    for (void* c : conns_)
      if (c) ipc_->table->close(ipc_->ctx, c);
    if (own_mem_) ipc_->table->dereg_mem(ipc_->ctx, own_mem_);
  }
  for (HandleSlot* s : all_slots_) {
    cudaFree(s->mem);
    delete s;
  }
  own_work_.release();
  if (local_) cudaFree(local_);
  if (err_host_) cudaFreeHost(err_host_);
  if (hs_host_) cudaFreeHost(hs_host_);
  cudaGetLastError();
}

CommView CudaBackend::view() const {
  CommView v{};
  v.rank = comm_->rank;
  v.nranks = comm_->nranks;
  v.channels = channels_;
  v.num_experts = comm_->cfg.num_experts;
  v.experts_per_rank = comm_->num_local_experts;
  for (int r = 0; r < comm_->nranks; r++) v.bufs[r] = bufs_[r];
  v.rows_off = rows_off_;
  v.meta_off = meta_off_;
  v.row_stride = row_stride_;
  v.meta_stride = meta_stride_;
  v.local = local_;
  v.err = err_dev_;
  v.timeout_ns = (unsigned long long)comm_->cfg.timeout_ms * 1000000ull;
  return v;
}

// Kernels built for another architecture cannot load on this GPU: said here,
// with the build that would run, rather than as CUDA's "no kernel image" at
// the first kernel (gpu_arch.h). Loading one kernel decides (a build given
// PTX through NVCC_GENCODE runs on later GPUs than its list says); the
// build's list makes the advice.
epResult_t CudaBackend::checkArch(const cudaDeviceProp& prop) {
  const cudaError_t load = cudaError_t(cuda::preloadLayoutKernels());
  if (load == cudaErrorNoKernelImageForDevice || load == cudaErrorInvalidDeviceFunction) {
    cudaGetLastError();
    const std::vector<int> archs = cuda::parseArchs(EP_CUDA_ARCHS);
    if (cuda::anyArchRunsOn(archs, prop.major, prop.minor))  // the objects are not what the list says
      return setError(comm_, epNotSupported,
                      "libmoeep's CUDA kernels have no image for GPU %d (%s, compute capability %d.%d) although "
                      "the build lists %s: objects of another CUDA_ARCHS remain; rebuild the library from clean (%s)",
                      dev_, prop.name, prop.major, prop.minor, cuda::archNames(archs).c_str(),
                      cudaGetErrorString(load));
    return setError(comm_, epNotSupported, "%s (loading a kernel: %s)",
                    cuda::archRefusal(archs, dev_, prop.name, prop.major, prop.minor).c_str(),
                    cudaGetErrorString(load));
  }
  CUDACHECK(load);
  return epSuccess;
}

epResult_t CudaBackend::init() {
  int64_t fail_step = 0;  // tests only: cuda_check.h, InitFaults
  if (const char* v = paramEnv("TEST_CUDA_FAIL_STEP")) parseInt64(v, &fail_step);
  const cuda::InitFaults faults{long(fail_step)};
  const Config& cfg = comm_->cfg;
  const int R = comm_->nranks, me = comm_->rank;
  if (R > kMaxRanks)
    return setError(comm_, epNotSupported, "the CUDA backend serves up to %d ranks of one node; this communicator has %d",
                    kMaxRanks, R);
  if (cfg.device >= 0) {
    dev_ = cfg.device;
  } else {
    CUDACHECK(cudaGetDevice(&dev_));
  }
  int ndev = 0;
  CUDACHECK(cudaGetDeviceCount(&ndev));
  if (dev_ >= ndev)
    return setError(comm_, epInvalidArgument, "config.device = %d but only %d GPUs are visible", dev_, ndev);
  CUDACHECK(cudaSetDevice(dev_));  // this thread works on the rank's GPU from now on
  logSetDevice(dev_);
  cudaDeviceProp prop;
  CUDACHECK(cudaGetDeviceProperties(&prop, dev_));
  EPCHECK(checkArch(prop));
  limitExpertCounters(prop);
  channels_ = cfg.num_sms > 0 ? cfg.num_sms : 32;
  channels_ = std::min({channels_, kMaxChannels, prop.multiProcessorCount});
  if (dataTypeSize(cfg.dispatch_type) == 1) {
    // FP8 rows: per-row sender costs (scales, ids, weights) weigh more.
    send_warps_ = 12;
    recv_warps_ = 4;
  }
  parseWarps("CUDA_DISPATCH_WARPS", &send_warps_, &recv_warps_);
  parseWarps("CUDA_COMBINE_WARPS", &push_warps_, &reduce_warps_);
  if (const int64_t chunk = param::CUDA_DISPATCH_CHUNK(); chunk != 0) {
    if (chunk >= 1 && chunk <= 1024) chunk_tokens_ = int(chunk);
    else EP_WARN(kSubsysCuda, "EP_CUDA_DISPATCH_CHUNK=%lld is not in 1..1024: ignored", (long long)chunk);
  }

  std::string why;
  ipc_ = transportFind("cuda_ipc", &why);
  if (ipc_ == nullptr)
    return setError(comm_, epNotSupported, "the CUDA backend needs the cuda_ipc transport: %s", why.c_str());

  // Which GPU each rank drives.
  std::vector<RankDevice> devs(R);
  memset(devs.data(), 0, sizeof(RankDevice) * R);
  devs[me].device = dev_;
  devs[me].channels = channels_;
  devs[me].sms = prop.multiProcessorCount;
  CUDACHECK(cudaDeviceGetPCIBusId(devs[me].bus_id, sizeof(devs[me].bus_id), dev_));
  EPCHECK(bootstrapAllGather(comm_->bootstrap, devs.data(), sizeof(RankDevice)));
  std::vector<epPeerInfo_v1_t> peers = comm_->peers;
  for (int r = 0; r < R; r++) {
    peers[r].cuda_device = devs[r].device;
    memcpy(peers[r].bus_id, devs[r].bus_id, sizeof(peers[r].bus_id));
    peers[r].bus_id[sizeof(peers[r].bus_id) - 1] = '\0';
  }
  // Ranks that drive the same GPU split its SMs: their kernels wait for each
  // other, so all their blocks must be resident at once.
  const int sharing = cuda::ranksOnGpuOf(peers, me);
  if (sharing > 1) {
    bool other_process = false, this_process = false;
    for (int r = 0; r < R; r++) {
      if (r == me || !cuda::sameGpu(peers[r], peers[me])) continue;
      other_process |= peers[r].pid != peers[me].pid;
      this_process |= peers[r].pid == peers[me].pid;
    }
    if (this_process) own_work_.track();  // the destroy must not wait for that rank's kernels
    const char* conns = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
    if (other_process)
      EP_WARN(kSubsysInit,
              "%d ranks drive GPU %s, not all from this process: their kernels wait for each other and run "
              "at the same time only under MPS; without it the GPU gives the processes time slices in turn "
              "and each call takes milliseconds",
              sharing, peers[me].bus_id);
    else if (conns == nullptr || atoi(conns) < 32)
      EP_WARN(kSubsysInit,
              "%d ranks of this process drive GPU %s: their kernels wait for each other, so their streams "
              "must not share a hardware queue; set CUDA_DEVICE_MAX_CONNECTIONS=32 before CUDA starts "
              "(it is %s), or calls can stall until the timeout",
              sharing, peers[me].bus_id, conns ? conns : "unset: 8 queues");
    EP_INFO(kSubsysInit, "%d ranks share GPU %s: this one's kernels take at most %d of its %d SMs", sharing,
            peers[me].bus_id, cuda::smShare(prop.multiProcessorCount, sharing), prop.multiProcessorCount);
  }
  {
    std::vector<int> wanted(R), sms(R);
    for (int r = 0; r < R; r++) {
      wanted[r] = devs[r].channels;
      sms[r] = devs[r].sms;
    }
    channels_ = cuda::agreedChannels(peers, wanted, sms);
  }
  for (int r = 0; r < R; r++) {
    if (r == me) continue;
    // A peer in this process names its GPU by ordinal; across processes the bus id decides.
    epPeerInfo_v1_t p = peers[r];
    if (p.pid == peers[me].pid) p.bus_id[0] = '\0';
    int ok = 0;
    EPCHECK(ipc_->table->can_connect(ipc_->ctx, &peers[me], &p, &ok));
    if (!ok)
      return setError(comm_, epNotSupported,
                      "GPU %s (rank %d, device %d) cannot reach GPU %s (rank %d, device %d) by P2P "
                      "(NVLink or PCIe peer access): the CUDA backend needs P2P between all GPUs of a node",
                      peers[me].bus_id, me, dev_, peers[r].bus_id, r, devs[r].device);
  }

  // Buffer geometry (worst case: every rank sends every token to this one).
  const int nb = cfg.dispatch_type == epFloat8E4M3 ? (cfg.hidden + 127) / 128 : 0;
  const size_t drow = size_t(cfg.hidden) * dataTypeSize(cfg.dispatch_type);
  const size_t crow = size_t(cfg.hidden) * dataTypeSize(cfg.combine_type);
  row_stride_ = roundUp(std::max(drow, crow), 16);
  meta_stride_ = roundUp(size_t(nb) * 4 + size_t(cfg.max_topk) * 8, 16);
  const size_t slots = size_t(R) * size_t(std::max(cfg.max_tokens_per_rank, 1));
  rows_off_ = roundUp(sizeof(cuda::Ctrl), 4096);
  meta_off_ = rows_off_ + roundUp(slots * row_stride_, 4096);
  buffer_bytes_ = meta_off_ + roundUp(slots * meta_stride_, 4096);
  if (cfg.buffer_bytes_cap > 0 && buffer_bytes_ > cfg.buffer_bytes_cap)
    return setError(comm_, epInvalidArgument,
                    "buffer_bytes_cap = %zu (config, else EP_BUFFER_BYTES_CAP) is too small: the CUDA backend needs %zu bytes for %d "
                    "ranks x %d tokens of %zu-byte rows",
                    cfg.buffer_bytes_cap, buffer_bytes_, R, cfg.max_tokens_per_rank, row_stride_);
  EP_INFO(kSubsysInit, "cuda backend: device %d, %d channels, dispatch warps %d+%d (chunk %d tokens), combine warps %d+%d, buffer %zu bytes",
          dev_, channels_, send_warps_, recv_warps_, chunk_tokens_, push_warps_, reduce_warps_, buffer_bytes_);

  // Register, exchange, map.
  std::vector<char> handles(size_t(R) * EP_TRANSPORT_HANDLE_BYTES, 0);
  void* own_ptr = nullptr;
  epResult_t res = ipc_->table->reg_mem(ipc_->ctx, buffer_bytes_, EP_TRANSPORT_MEM_DEVICE, &own_ptr,
                                        &handles[size_t(me) * EP_TRANSPORT_HANDLE_BYTES], &own_mem_);
  if (res != epSuccess)
    return setError(comm_, res, "cuda backend: cannot allocate the %zu-byte communication buffer on device %d",
                    buffer_bytes_, dev_);
  EPCHECK(bootstrapAllGather(comm_->bootstrap, handles.data(), EP_TRANSPORT_HANDLE_BYTES));
  bufs_.assign(R, nullptr);
  conns_.assign(R, nullptr);
  bufs_[me] = static_cast<char*>(own_ptr);
  for (int r = 0; r < R; r++) {
    if (r == me) continue;
    void* p = nullptr;
    res = ipc_->table->connect(ipc_->ctx, &peers[r], &handles[size_t(r) * EP_TRANSPORT_HANDLE_BYTES], &p, &conns_[r]);
    if (res != epSuccess)
      return setError(comm_, res, "cuda backend: cannot map rank %d's buffer (GPU %s) on GPU %s", r,
                      peers[r].bus_id, peers[me].bus_id);
    bufs_[r] = static_cast<char*>(p);
  }

  // Rank-private device state and the host-mapped error slot.
  const int E = cfg.num_experts;
  const size_t scratch_ints = size_t(E + R + comm_->nodes.num_nodes);
  static_assert(sizeof(cuda::DevLocal) <= 256, "DevLocal outgrew its slot");
  const size_t route_off = roundUp(256 + scratch_ints * sizeof(int), 256);
  const size_t local_bytes = route_off + cuda::routeScratchBytes(cfg.max_tokens_per_rank);
  void* mem = nullptr;
  CUDACHECK(cudaMalloc(&mem, local_bytes));
  local_ = static_cast<cuda::DevLocal*>(mem);  // owned from here: the destructor frees it if a step below fails
  CUDACHECK(cudaMemset(mem, 0, local_bytes));
  layout_scratch_ = reinterpret_cast<int*>(static_cast<char*>(mem) + 256);
  route_scratch_ = reinterpret_cast<uint64_t*>(static_cast<char*>(mem) + route_off);
  void* hp = nullptr;
  CUDACHECK(cudaHostAlloc(&hp, cuda::kErrorSlots * sizeof(cuda::ErrorInfo), cudaHostAllocMapped));
  memset(hp, 0, cuda::kErrorSlots * sizeof(cuda::ErrorInfo));
  err_host_ = static_cast<cuda::ErrorInfo*>(hp);
  void* dp = nullptr;
  CUDACHECK(cudaHostGetDevicePointer(&dp, hp, 0));
  err_dev_ = static_cast<cuda::ErrorInfo*>(dp);
  CUDACHECK(cudaHostAlloc(&hp, sizeof(HState), cudaHostAllocDefault));
  hs_host_ = static_cast<HState*>(hp);

  // Handle slots: routing state of one handle.
  const int EL = comm_->num_local_experts;
  tok_pos_off_ = roundUp(sizeof(HState), 256);
  chan_off_ = tok_pos_off_ + roundUp(size_t(cfg.max_tokens_per_rank + 1) * R * sizeof(int), 256);
  expert_off_ = chan_off_ + roundUp(size_t(2) * R * channels_ * sizeof(int), 256);
  slot_bytes_ = expert_off_ + roundUp((size_t(2) * EL + 1) * sizeof(int), 256);
  // A few up front, so that most calls allocate nothing (more come when more
  // handles are alive, under stream capture too: allocSlot).
  for (int i = 0; i < 4; i++) {
    HandleSlot* s = nullptr;
    EPCHECK(allocSlot(&s));
    free_slots_.push_back(s);
  }
  // Every kernel loaded now, not at its first launch (preload.cuh says why).
  CUDACHECK(cudaError_t(cuda::preloadLayoutKernels()));
  CUDACHECK(cudaError_t(cuda::preloadDispatchKernels()));
  CUDACHECK(cudaError_t(cuda::preloadCombineKernels()));
  if (cfg.low_latency) {
    CUDACHECK(cudaError_t(cuda::preloadLLDispatchKernels()));
    CUDACHECK(cudaError_t(cuda::preloadLLDispatchSlicesKernels()));
    CUDACHECK(cudaError_t(cuda::preloadLLCombineKernels()));
  }
  CUDACHECK(cudaDeviceSynchronize());
  if (cfg.low_latency) {  // collective, like everything above
    // The cap bounds what epCommBufferBytes reports: both buffers together.
    const size_t ll_bytes =
        llBufferBytes(R, cfg.max_tokens_per_rank, cfg.hidden, cfg.max_topk, cfg.num_experts);
    if (cfg.buffer_bytes_cap > 0 && buffer_bytes_ + ll_bytes > cfg.buffer_bytes_cap)
      return setError(comm_, epInvalidArgument,
                      "buffer_bytes_cap = %zu (config, else EP_BUFFER_BYTES_CAP) is too small: the CUDA backend needs %zu bytes for the "
                      "high-throughput buffer and %zu for the low-latency buffers",
                      cfg.buffer_bytes_cap, buffer_bytes_, ll_bytes);
    // Ranks sharing a GPU split its SMs, as for the high-throughput kernels:
    // every block of every rank's fused kernel must be resident at once.
    const long long want = param::CUDA_LL_SMS();
    bool ignored = false;
    const int ll_sms = cuda::llBlocks(prop.multiProcessorCount, sharing, want, &ignored);
    if (ignored)
      EP_WARN(kSubsysCuda, "EP_CUDA_LL_SMS=%lld is not in 1..%d (this rank's SMs): ignored", want, ll_sms);
    ll_ = std::make_unique<cuda::LLEngine>(comm_, dev_, ll_sms);
    EPCHECK(ll_->init(ipc_, peers));
  }
  EPCHECK(watchOtherFamily());
  notices_ = std::make_unique<cuda::HostNotices>(comm_, dev_);
  EPCHECK(notices_->init());
  notices_->addTarget(&local_->timed_out, local_->gone, err_host_);
  if (ll_) {
    notices_->addTarget(&ll_->deviceLocal()->timed_out, ll_->deviceLocal()->gone, ll_->errorSlots());
    ll_->setNotices(notices_.get());
  }
  notices_->watch();
  EPCHECK(bootstrapBarrier(comm_->bootstrap));
  ipc_->table->connected(ipc_->ctx, own_mem_);
  return epSuccess;
}

// What the high-throughput waits compare to find a peer in another call:
// the words the peers wrote into this rank's Ctrl and, with low-latency
// buffers, this rank's low-latency signal counters; and
// where they tell a peer found in a low-latency call (its LLLocal::gone
// bytes, as mapped here). FamilyWatch.
epResult_t CudaBackend::watchOtherFamily() {
  cuda::FamilyWatch w{};
  w.ht_ctrl = reinterpret_cast<const cuda::Ctrl*>(bufs_[comm_->rank]);
  w.channels = channels_;
  if (ll_) {
    w.ll_counters = ll_->signalCounters();
    for (int r = 0; r < comm_->nranks; r++) w.peer_ll_gone[r] = ll_->peerLocal(r)->gone;
  }
  w.rank = comm_->rank;
  w.nranks = comm_->nranks;
  CUDACHECK(cudaMemcpy(&local_->watch, &w, sizeof(w), cudaMemcpyHostToDevice));
  return epSuccess;
}

epResult_t CudaBackend::allocSlot(HandleSlot** out) {
  auto* s = new HandleSlot();
  cuda::RelaxedCaptureScope relaxed;  // a dispatch under capture may get here (more handles alive than slots)
  cudaError_t e = cuda::injectedInitFailure() ? cudaErrorMemoryAllocation : cudaMalloc(&s->mem, slot_bytes_);
  if (e == cudaSuccess)  // expert_acc starts (and is left) zeroed
    e = cuda::injectedInitFailure() ? cudaErrorMemoryAllocation : cuda::zeroDeviceMemory(s->mem, slot_bytes_);
  if (e != cudaSuccess) {
    cudaGetLastError();
    if (s->mem) cudaFree(s->mem);
    delete s;
    return setError(comm_, epUnhandledCudaError, "cannot allocate %zu bytes of routing state on device %d: %s",
                    slot_bytes_, dev_, cudaGetErrorString(e));
  }
  char* base = static_cast<char*>(s->mem);
  const int R = comm_->nranks, EL = comm_->num_local_experts;
  s->hv.hs = reinterpret_cast<HState*>(base);
  s->hv.tok_pos = reinterpret_cast<int*>(base + tok_pos_off_);
  s->hv.chan_start = reinterpret_cast<int*>(base + chan_off_);
  s->hv.chan_count = s->hv.chan_start + R * channels_;
  s->hv.expert_acc = reinterpret_cast<int*>(base + expert_off_);
  s->hv.expert_saved = s->hv.expert_acc + EL;
  s->hv.rows_without_ids = s->hv.expert_saved + EL;
  all_slots_.push_back(s);
  *out = s;
  return epSuccess;
}

void CudaBackend::releaseHandle(epHandle* h) {
  if (h->low_latency) {
    if (ll_) ll_->release(h);
    return;
  }
  auto* s = static_cast<HandleSlot*>(h->backend_state);
  if (s == nullptr) return;
  std::lock_guard<std::mutex> lock(slots_mu_);
  free_slots_.push_back(s);
  h->backend_state = nullptr;
}

// The layout kernel counts every expert (and rank and node) in shared memory,
// the dispatch kernel every local expert: more than a block holds would fail
// at launch, after the peers started waiting. Those calls are refused instead,
// on every rank alike (the config is the same); low latency has no such limit.
void CudaBackend::limitExpertCounters(const cudaDeviceProp& prop) {
  const Config& cfg = comm_->cfg;
  const size_t limit = prop.sharedMemPerBlockOptin > 1024 ? prop.sharedMemPerBlockOptin - 1024 : 0;  // static smem
  const size_t need = size_t(cfg.num_experts + 2 * comm_->nranks) * sizeof(int);
  if (need <= limit) return;
  char msg[1024];
  snprintf(msg, sizeof(msg),
           "config.num_experts = %d: the CUDA backend's layout and dispatch count experts in shared memory, "
           "%zu bytes per block, and GPU %d (%s) allows %zu: at most %zu experts with %d ranks (the "
           "low-latency calls and the host backend have no such limit)",
           cfg.num_experts, need, dev_, prop.name, limit, limit / sizeof(int) - 2 * comm_->nranks, comm_->nranks);
  counters_too_small_ = msg;
}

epResult_t CudaBackend::checkExpertCounters(const char* fn) const {
  if (counters_too_small_.empty()) return epSuccess;
  return setError(comm_, epNotSupported, "%s: %s", fn, counters_too_small_.c_str());
}

const char* whatName(int what) {
  switch (what) {
    case cuda::kWhatPrevious: return "the end of its previous call";
    case cuda::kWhatCounts: return "dispatch counts";
    case cuda::kWhatDispatchInfo: return "dispatch channel info";
    case cuda::kWhatDispatchData: return "dispatch rows";
    case cuda::kWhatCombineData: return "combine rows";
    default: return "?";
  }
}

// The kernels' kinds are the call log's, so a report names them as it does.
static_assert(int(cuda::kHtRouting) == kCallRouting && int(cuda::kHtDispatch) == kCallDispatch &&
                  int(cuda::kHtCombine) == kCallCombine,
              "a high-throughput kernel's kind is its call's (callKindName)");

// Ranks found out of step by the host (HostNotices: the call logs differ)
// first, then the failure slots (the communicator is broken; a rank whose
// low-latency call failed, because a peer found it out of step say, learns it
// at its next call of either family, not only at its next low-latency one),
// then a peer that left its communicator while no kernel waited for it, then
// the argument errors of the low-latency kernels and of this family.
epResult_t CudaBackend::checkKernelErrors(const char* fn, cudaStream_t stream, bool argument_errors) {
  if (!claims_to_clear_.empty()) {  // a clearing that failed before (clearErrorClaim)
    std::vector<int*> pending;
    pending.swap(claims_to_clear_);
    for (int* claim : pending) clearErrorClaim(claim, stream);
  }
  if (const char* out_of_step = notices_->outOfStep()) {
    comm_->broken.store(epInvalidUsage);
    return setError(comm_, epInvalidUsage, "%s: %s", fn, out_of_step);
  }
  if (err_host_[cuda::kFailSlot].code != 0) return reportFailedWait(fn);
  if (ll_ && ll_->waitFailed()) return ll_->reportFailedWait(fn);
  const int closed = notices_->closedPeer();
  if (closed >= 0) {  // no kernel waited for it: refused before any kernel writes into its buffers
    comm_->broken.store(epRemoteError);
    return setError(comm_, epRemoteError,
                    "%s: %s, so rank %d (GPU %d) cannot make collective calls on it any more; destroy this "
                    "communicator",
                    fn, notices_->goneWhat(closed).c_str(), comm_->rank, dev_);
  }
  if (!argument_errors) return epSuccess;
  if (ll_ && ll_->argumentErrorPending()) {
    const epResult_t reported = ll_->reportArgumentError(fn);  // read and cleared before the claim is
    clearErrorClaim(&ll_->deviceLocal()->err_claim, stream);
    return reported;
  }
  if (err_host_[cuda::kArgSlot].code != 0) return reportArgumentError(fn, stream);
  return epSuccess;
}

// The claim is the first-writer-wins word of the argument slot: cleared
// behind the report so that a later kernel can report. On the caller's
// stream, in order after the kernels before it; but a stream that is
// capturing a graph would take the clearing into the graph (the claim would
// stay taken until the graph runs, hiding an eager call's report meanwhile,
// and each replay would clear it again, wiping a report it did not read):
// then it is cleared at once on a stream of its own.
void CudaBackend::clearErrorClaim(int* claim, cudaStream_t stream) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  cudaError_t e = cudaStreamIsCapturing(stream, &st);
  if (e == cudaSuccess && st == cudaStreamCaptureStatusNone) {
    e = cudaMemsetAsync(claim, 0, sizeof(int), stream);
  } else if (e == cudaSuccess) {
    cuda::RelaxedCaptureScope relaxed;
    e = cuda::zeroDeviceMemory(claim, sizeof(int));
  }
  if (e == cudaSuccess) return;
  cudaGetLastError();
  EP_WARN(kSubsysCuda, "cannot clear the kernels' error claim (%s): tried again at the next call; until then a "
          "new argument error found by a kernel is not reported", cudaGetErrorString(e));
  if (std::find(claims_to_clear_.begin(), claims_to_clear_.end(), claim) == claims_to_clear_.end())
    claims_to_clear_.push_back(claim);
}

// A wait of a high-throughput kernel failed (err[kFailSlot], never cleared).
epResult_t CudaBackend::reportFailedWait(const char* fn) {
  const cuda::ErrorInfo& e = err_host_[cuda::kFailSlot];
  const int code = e.code, what = e.what, peer = e.peer, channel = e.channel;
  const long long a = e.a, b = e.b;
  if (code == epRemoteError) {
    comm_->broken.store(epRemoteError);
    return setError(comm_, epRemoteError,
                    "%s: %s while rank %d (GPU %d) waited for it in %s (channel %d); the communicator cannot be "
                    "used any more",
                    fn, notices_->describeGone(peer).c_str(), comm_->rank, dev_, whatName(what), channel);
  }
  if (code == epTimeout) {
    comm_->broken.store(epTimeout);
    const std::string progress = notices_->progressNote(peer);
    return setError(comm_, epTimeout,
                    "%s: rank %d (GPU %d) waited more than %d ms for rank %d in %s (channel %d): that rank "
                    "stopped, or is in another call (calls out of order, or a low-latency call against a "
                    "high-throughput one)%s; the communicator cannot be used any more",
                    fn, comm_->rank, dev_, comm_->cfg.timeout_ms, peer, whatName(what), channel, progress.c_str());
  }
  comm_->broken.store(epInvalidUsage);  // a wait found the peer in another call (device.cuh: peerOutOfStep)
  if (b == cuda::kOutOfStepLowLatency)
    return setError(comm_, epInvalidUsage,
                    "%s: rank %d is in a low-latency call while rank %d (GPU %d) waited for it in %s of a "
                    "high-throughput call: ranks must issue the same collective calls in the same order; the "
                    "communicator cannot be used any more",
                    fn, peer, comm_->rank, dev_, whatName(what));
  return setError(comm_, epInvalidUsage,
                  "%s: rank %d is in %s while rank %d (GPU %d) waited for it in %s of %s (collective kernel %lld "
                  "of each): ranks must issue the same collective calls in the same order; the communicator "
                  "cannot be used any more",
                  fn, peer, callKindName(int(b >> 8)), comm_->rank, dev_, whatName(what), callKindName(int(b & 0xff)),
                  a);
}

// An argument error found by a kernel (err[kArgSlot]): reported once, then
// the communicator goes on.
epResult_t CudaBackend::reportArgumentError(const char* fn, cudaStream_t stream) {
  cuda::ErrorInfo& e = err_host_[cuda::kArgSlot];
  const int code = e.code, what = e.what, peer = e.peer;
  const long long a = e.a, b = e.b;
  e.code = 0;
  clearErrorClaim(&local_->err_claim, stream);
  if (what == cuda::kWhatBadTopk) {
    return setError(comm_, epInvalidArgument,
                    "%s: an earlier call on this stream had topk_idx entry %lld (flat index) = %lld, not -1 "
                    "or an expert id in [0, %d); it was treated as -1",
                    fn, a, b, comm_->cfg.num_experts);
  }
  if (what == cuda::kWhatCapacity)
    return setError(comm_, epInvalidArgument,
                    "%s: an earlier dispatch received %lld rows but recv_capacity was %lld; no row was "
                    "written",
                    fn, a, b);
  if (what == cuda::kWhatNodeLimit)
    return setError(comm_, epInvalidArgument,
                    "%s: token %lld of a layout or dispatch on this stream (an earlier call, or this exact-sized "
                    "dispatch after its rows moved) selects experts on %lld nodes, more than "
                    "config.max_nodes_per_token = %d",
                    fn, a, b, comm_->cfg.max_nodes_per_token);
  if (what == cuda::kWhatWiderTopk)
    return setError(comm_, epInvalidUsage,
                    "%s: in an earlier dispatch rank %d passed num_topk = %lld, more than this rank's %lld (the "
                    "columns of recv_topk_idx): a rank may pass fewer top-k columns than its peers, not more; "
                    "that dispatch's recv_topk_idx / weights and recv_tokens_per_expert are not valid",
                    fn, peer, a, b);
  return setError(comm_, epResult_t(code), "%s: an earlier kernel failed (what %d)", fn, what);
}

epResult_t CudaBackend::layout(const epLayoutArgs_t& a, epStream_t stream) {
  DeviceGuard g(dev_);
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  EPCHECK(checkKernelErrors("epLayout", s));
  EPCHECK(checkExpertCounters("epLayout"));
  cuda::LayoutParams p{};
  p.topk = a.topk_idx;
  p.idx64 = a.topk_idx_type == epInt64;
  p.num_tokens = a.num_tokens;
  p.num_topk = a.num_topk;
  p.num_experts = comm_->cfg.num_experts;
  p.experts_per_rank = comm_->num_local_experts;
  p.nranks = comm_->nranks;
  p.num_nodes = comm_->nodes.num_nodes;
  for (int r = 0; r < comm_->nranks; r++) p.node_of_rank[r] = comm_->nodes.node_of_rank[r];
  p.max_nodes = cuda::nodeLimitToCheck(comm_);
  p.tokens_per_rank = a.tokens_per_rank;
  p.tokens_per_node = a.tokens_per_node;
  p.tokens_per_expert = a.tokens_per_expert;
  p.is_token_in_rank = a.is_token_in_rank;
  p.scratch = layout_scratch_;
  p.local = local_;
  p.err = err_dev_;
  const cudaError_t pending = cudaPeekAtLastError();
  if (const int err = cuda::launchLayout(p, s))
    return cuda::launchFailure(comm_, "epLayout", "the layout kernel", pending, err);
  own_work_.mark(s);
  return epSuccess;
}

epResult_t CudaBackend::prepare(const char* fn, const epDispatchArgs_t& a, epHandle* h, epStream_t stream) {
  DeviceGuard g(dev_);
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  EPCHECK(checkKernelErrors(fn, s));
  EPCHECK(checkExpertCounters(fn));
  const bool sync = !(a.flags & EP_DISPATCH_NO_HOST_SYNC);
  if (sync) {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    CUDACHECK(cudaStreamIsCapturing(s, &st));
    if (st != cudaStreamCaptureStatusNone)
      return setError(comm_, epInvalidUsage,
                      "%s: the stream is being captured: exact output sizing needs a host wait; "
                      "pass EP_DISPATCH_NO_HOST_SYNC with a recv_capacity",
                      fn);
  }
  HandleSlot* slot = nullptr;
  {
    std::lock_guard<std::mutex> lock(slots_mu_);
    if (!free_slots_.empty()) {
      slot = free_slots_.back();
      free_slots_.pop_back();
    }
  }
  if (slot == nullptr) EPCHECK(allocSlot(&slot));
  if (h->backend_state) releaseHandle(h);
  h->backend_state = slot;
  cuda::RoutingParams p{};
  p.cv = view();
  p.hv = slot->hv;
  p.scratch = route_scratch_;
  p.topk = a.topk_idx;
  p.idx64 = a.topk_idx_type == epInt64;
  p.num_tokens = a.num_tokens;
  p.num_topk = a.num_topk;
  p.max_nodes = cuda::nodeLimitToCheck(comm_);
  cuda::nodeRanks(comm_, p.node_ranks);
  const cudaError_t pending = cudaPeekAtLastError();
  if (const int err = cuda::launchRouting(p, s))
    return cuda::launchFailure(comm_, fn, "the routing kernel", pending, err);
  notices_->recordCall(kCallRouting, s);
  own_work_.mark(s);
  h->routing = Routing();
  h->routing.nranks = comm_->nranks;
  h->routing.num_tokens = a.num_tokens;
  h->routing.num_topk = a.num_topk;
  h->counts_known = false;
  if (!sync) return epSuccess;
  // Exact sizing: the documented device-to-host wait for the counts.
  CUDACHECK(cudaMemcpyAsync(hs_host_, slot->hv.hs, sizeof(HState), cudaMemcpyDeviceToHost, s));
  CUDACHECK(cudaStreamSynchronize(s));
  if (kernelFailedForGood()) return checkKernelErrors(fn, s);
  // epCommAbort from another thread ended the routing kernel's waits (they
  // leave without a report): the counts are those of an unfinished routing.
  if (comm_->abort_flag.load())
    return setError(comm_, epAborted, "%s: the communicator was aborted while this rank waited for the dispatch "
                    "counts", fn);
  std::vector<int> recv_count(hs_host_->recv_count, hs_host_->recv_count + comm_->nranks);
  buildRecvSide(recv_count, &h->routing);
  h->counts_known = true;
  return epSuccess;
}

epResult_t CudaBackend::dispatch(const epDispatchArgs_t& a, epHandle* h, bool ids_routed, epStream_t stream) {
  DeviceGuard g(dev_);
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  // A handle's first dispatch is launched whatever argument error the kernels
  // reported meanwhile (its own routing kernel may have found a bad id just
  // now): the peers' dispatches wait for its rows. What ends the
  // communicator stops it as it stops any call: a failed wait, ranks out of
  // step, and a peer that destroyed or aborted its communicator (whose
  // buffers the kernel would write into after they were freed). With exact
  // sizing the dispatch reports an argument error already there after the
  // rows moved (its own kernel's reports come at the next call, as always);
  // in capacity mode the next call does.
  const bool first = !h->dispatched;
  const bool report_after = first && h->counts_known && err_host_[cuda::kArgSlot].code != 0;
  EPCHECK(checkKernelErrors("epDispatch", s, !first));
  if (comm_->abort_flag.load())  // an abort since prepare's wait: its kernels would leave at once
    return setError(comm_, epAborted, "epDispatch: the communicator was aborted during the call");
  auto* slot = static_cast<HandleSlot*>(h->backend_state);
  if (slot == nullptr) return setError(comm_, epInternalError, "epDispatch: handle without routing state");
  const Config& cfg = comm_->cfg;
  const bool capacity_mode = (a.flags & EP_DISPATCH_NO_HOST_SYNC) != 0;
  // A host num_recv for counts that are on the device only: a cached
  // re-dispatch is refused before anything is launched, so that it can be
  // made again; a handle's first dispatch is launched all the same (the
  // peers wait for its rows) and refused after.
  const bool host_count_unknown = !capacity_mode && a.num_recv && !h->counts_known;
  if (host_count_unknown && !first) return refuseHostCount();
  cuda::DispatchParams p{};
  p.cv = view();
  p.hv = slot->hv;
  p.row_bytes = size_t(cfg.hidden) * dataTypeSize(cfg.dispatch_type);
  p.x = static_cast<const char*>(a.x);
  p.x_stride = a.x_stride ? a.x_stride : p.row_bytes;
  p.nb = cfg.dispatch_type == epFloat8E4M3 ? (cfg.hidden + 127) / 128 : 0;
  p.x_scales = a.x_scales;
  p.s_tok = a.scales_token_stride ? a.scales_token_stride : size_t(p.nb);
  p.s_blk = a.scales_block_stride ? a.scales_block_stride : 1;
  p.topk = a.topk_idx;
  p.idx64 = a.topk_idx_type == epInt64;
  p.check_ids = ids_routed ? 0 : 1;
  p.topk_w = a.topk_weights;
  p.num_tokens = h->routing.num_tokens;
  p.num_topk = a.topk_idx ? a.num_topk : h->routing.num_topk;
  p.max_topk = cfg.max_topk;
  p.recv_x = static_cast<char*>(a.recv_x);
  p.recv_scales = a.recv_scales;
  p.recv_idx = reinterpret_cast<long long*>(a.recv_topk_idx);
  p.recv_w = a.recv_topk_weights;
  p.capacity = a.recv_capacity;
  p.recv_tpe = a.recv_tokens_per_expert;
  p.num_recv_dev = capacity_mode ? reinterpret_cast<long long*>(a.num_recv) : nullptr;
  p.alignment = a.expert_alignment;
  const bool too_small = h->counts_known && h->routing.num_recv > a.recv_capacity;
  p.drop = too_small ? 1 : 0;
  p.capacity_mode = capacity_mode ? 1 : 0;
  p.send_warps = send_warps_;
  p.recv_warps = recv_warps_;
  p.chunk_tokens = chunk_tokens_;
  const cudaError_t pending = cudaPeekAtLastError();
  if (const int err = cuda::launchDispatch(p, channels_, s))
    return cuda::launchFailure(comm_, "epDispatch", "the dispatch kernel", pending, err);
  notices_->recordCall(kCallDispatch, s);
  own_work_.mark(s);
  h->dispatched = true;  // launched: a call made again is a re-dispatch, not a second first one
  if (too_small)
    return setError(comm_, epInvalidArgument,
                    "epDispatch: recv_capacity = %lld is less than the %lld rows this rank receives (the "
                    "rows were sent so the other ranks complete; nothing was written)",
                    (long long)a.recv_capacity, (long long)h->routing.num_recv);
  if (report_after) EPCHECK(checkKernelErrors("epDispatch", s));
  if (host_count_unknown) return refuseHostCount();
  if (!capacity_mode && a.num_recv) *a.num_recv = h->routing.num_recv;
  return epSuccess;
}

epResult_t CudaBackend::combine(const epCombineArgs_t& a, epHandle* h, epStream_t stream) {
  DeviceGuard g(dev_);
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  EPCHECK(checkKernelErrors("epCombine", s));
  auto* slot = static_cast<HandleSlot*>(h->backend_state);
  if (slot == nullptr) return setError(comm_, epInternalError, "epCombine: handle without routing state");
  const Config& cfg = comm_->cfg;
  cuda::CombineParams p{};
  p.cv = view();
  p.hv = slot->hv;
  p.row_bytes = size_t(cfg.hidden) * dataTypeSize(cfg.combine_type);
  p.y = static_cast<const char*>(a.y);
  p.y_stride = a.y_stride ? a.y_stride : p.row_bytes;
  p.recv_w = a.recv_topk_weights;
  p.num_topk = a.num_topk;
  p.bias = static_cast<const char*>(a.bias);
  p.out = static_cast<char*>(a.out);
  p.out_w = a.out_topk_weights;
  p.type = cfg.combine_type == epBfloat16 ? 0 : cfg.combine_type == epFloat16 ? 1 : 2;
  p.push_warps = push_warps_;
  p.reduce_warps = reduce_warps_;
  const cudaError_t pending = cudaPeekAtLastError();
  if (const int err = cuda::launchCombine(p, channels_, s))
    return cuda::launchFailure(comm_, "epCombine", "the combine kernel", pending, err);
  notices_->recordCall(kCallCombine, s);
  own_work_.mark(s);
  return epSuccess;
}

}  // namespace

bool cudaBackendAvailable() {
  static int available = -1;
  static std::once_flag once;
  std::call_once(once, [] {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) cudaGetLastError();
    available = (e == cudaSuccess && n > 0) ? 1 : 0;
  });
  return available == 1;
}

epResult_t createCudaBackend(epComm* comm, std::unique_ptr<Backend>* out) {
  if (!cudaBackendAvailable())
    return setError(comm, epNotSupported, "the CUDA backend needs a visible GPU and a CUDA driver");
  auto backend = std::make_unique<CudaBackend>(comm);
  EPCHECK(backend->init());
  *out = std::move(backend);
  return epSuccess;
}

}  // namespace ep
