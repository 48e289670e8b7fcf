// The CUDA backend's life: init, step by step, and the destroy. Each step
// owns what it allocates (an owner object that it keeps only once it
// succeeded), so a step that fails frees its own part at once, and the
// destructor, which the failed init's caller runs, unwinds the steps before
// it in reverse order. The calls: cuda_calls.cc.
//
// EP_TEST_CUDA_FAIL_STEP=N fails the Nth checked CUDA step of init
// (cuda_check.h); the message of such a failure names the init step it was
// in (tests/gpu/gpu_host_test.cu fails each in turn).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../bootstrap.h"
#include "../checks.h"
#include "../data_types.h"
#include "../ll_layout.h"
#include "../params.h"
#include "../sizes.h"
#include "cuda_backend.h"
#include "cuda_check.h"
#include "gpu_arch.h"
#include "gpu_share.h"

namespace ep {
namespace cuda {

namespace {

// What a rank tells the others of its GPU.
struct RankDevice {
  int device;
  int channels;  // this rank's high-throughput channels before they are agreed
  int sms;       // its GPU's SMs
  char bus_id[16];
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

}  // namespace

// What init's steps learn and hand on to the steps after them.
struct CudaBackend::InitContext {
  cudaDeviceProp prop{};
  std::vector<RankDevice> devs;        // [R] what each rank told of its GPU
  std::vector<epPeerInfo_v1_t> peers;  // [R] the ranks, each with the GPU it drives
  int sharing = 1;                     // ranks that drive this rank's GPU, itself included
};

struct CudaBackend::InitStep {
  const char* name;  // in the log, and in the message of a failure injected into the step
  epResult_t (CudaBackend::*run)(InitContext& ctx);
};

const CudaBackend::InitStep CudaBackend::kInitSteps[] = {
    {"choose the GPU", &CudaBackend::chooseDevice},
    {"read the tuning", &CudaBackend::readTuning},
    {"find the cuda_ipc transport", &CudaBackend::findTransport},
    {"share the GPUs", &CudaBackend::shareGpus},
    {"check peer access", &CudaBackend::checkPeerAccess},
    {"size the buffer", &CudaBackend::sizeBuffer},
    {"map the buffers", &CudaBackend::mapBuffer},
    {"allocate the rank's state", &CudaBackend::allocateRankState},
    {"allocate handle slots", &CudaBackend::allocateHandleSlots},
    {"load the kernels", &CudaBackend::loadKernels},
    {"start the low-latency engine", &CudaBackend::startLowLatency},
    {"start the watcher", &CudaBackend::startWatcher},
    {"finish the setup", &CudaBackend::finishSetup},
};

epResult_t CudaBackend::init() {
  int64_t fail_step = 0;  // tests only: cuda_check.h, InitFaults
  if (const char* v = paramEnv("TEST_CUDA_FAIL_STEP")) parseInt64(v, &fail_step);
  const InitFaults faults{long(fail_step)};
  InitContext ctx;
  const int count = int(sizeof(kInitSteps) / sizeof(kInitSteps[0]));
  for (int i = 0; i < count; i++) {
    const InitStep& step = kInitSteps[i];
    initStepName() = step.name;
    EP_TRACE(kSubsysInit, "cuda backend init, step %d of %d: %s", i + 1, count, step.name);
    const epResult_t res = (this->*step.run)(ctx);
    initStepName() = nullptr;
    if (res != epSuccess) {
      EP_INFO(kSubsysInit, "cuda backend init failed at step %d of %d (%s): %s", i + 1, count, step.name,
              epGetErrorString(res));
      return res;
    }
  }
  return epSuccess;
}

// The steps' owners, in the reverse order of the steps that made them.
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
  buffer_.reset();  // the peers' buffers unmapped, then this rank's freed
  slots_.reset();
  state_.reset();
  own_work_.release();  // its events, with this rank's device current
  cudaGetLastError();
}

RankState::~RankState() {
  if (local) cudaFree(local);
  if (err_host) cudaFreeHost(err_host);
  if (hs_host) cudaFreeHost(hs_host);
}

// ---- 1. choose the GPU ----------------------------------------------------------
// The rank's device (config.device, else the current one), made current for
// this thread; refused where the build's kernels cannot run on it.
epResult_t CudaBackend::chooseDevice(InitContext& ctx) {
  const Config& cfg = comm_.config();
  const int R = comm_.nranks();
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
  CUDACHECK(cudaGetDeviceProperties(&ctx.prop, dev_));
  EPCHECK(checkArch(ctx.prop));
  limitExpertCounters(ctx.prop);
  return epSuccess;
}

// Kernels built for another architecture cannot load on this GPU: said here,
// with the build that would run, rather than as CUDA's "no kernel image" at
// the first kernel (gpu_arch.h). Loading one kernel decides (a build given
// PTX through NVCC_GENCODE runs on later GPUs than its list says); the
// build's list makes the advice.
epResult_t CudaBackend::checkArch(const cudaDeviceProp& prop) {
  const cudaError_t load = cudaError_t(preloadLayoutKernels());
  if (load == cudaErrorNoKernelImageForDevice || load == cudaErrorInvalidDeviceFunction) {
    cudaGetLastError();
    const std::vector<int> archs = parseArchs(EP_CUDA_ARCHS);
    if (anyArchRunsOn(archs, prop.major, prop.minor))  // the objects are not what the list says
      return setError(comm_, epNotSupported,
                      "libmoeep's CUDA kernels have no image for GPU %d (%s, compute capability %d.%d) although "
                      "the build lists %s: objects of another CUDA_ARCHS remain; rebuild the library from clean (%s)",
                      dev_, prop.name, prop.major, prop.minor, archNames(archs).c_str(), cudaGetErrorString(load));
    return setError(comm_, epNotSupported, "%s (loading a kernel: %s)",
                    archRefusal(archs, dev_, prop.name, prop.major, prop.minor).c_str(), cudaGetErrorString(load));
  }
  CUDACHECK(load);
  return epSuccess;
}

// The layout kernel counts every expert (and rank and node) in shared memory,
// the dispatch kernel every local expert: more than a block holds would fail
// at launch, after the peers started waiting. Those calls are refused instead,
// on every rank alike (the config is the same); low latency has no such limit.
void CudaBackend::limitExpertCounters(const cudaDeviceProp& prop) {
  const Config& cfg = comm_.config();
  const size_t limit = prop.sharedMemPerBlockOptin > 1024 ? prop.sharedMemPerBlockOptin - 1024 : 0;  // static smem
  const size_t need = size_t(cfg.num_experts + 2 * comm_.nranks()) * sizeof(int);
  if (need <= limit) return;
  char msg[1024];
  snprintf(msg, sizeof(msg),
           "config.num_experts = %d: the CUDA backend's layout and dispatch count experts in shared memory, "
           "%zu bytes per block, and GPU %d (%s) allows %zu: at most %zu experts with %d ranks (the "
           "low-latency calls and the host backend have no such limit)",
           cfg.num_experts, need, dev_, prop.name, limit, limit / sizeof(int) - size_t(2) * comm_.nranks(), comm_.nranks());
  counters_too_small_ = msg;
}

// ---- 2. read the tuning -----------------------------------------------------------
// This rank's channels (SMs of the high-throughput kernels) and warp splits,
// from the config and the EP_CUDA_* variables.
epResult_t CudaBackend::readTuning(InitContext& ctx) {
  const Config& cfg = comm_.config();
  channels_ = cfg.num_sms > 0 ? cfg.num_sms : 32;
  channels_ = std::min({channels_, kMaxChannels, ctx.prop.multiProcessorCount});
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
  return epSuccess;
}

// ---- 3. find the cuda_ipc transport -----------------------------------------------
epResult_t CudaBackend::findTransport(InitContext&) {
  std::string why;
  ipc_ = transportFind("cuda_ipc", &why);
  if (ipc_ == nullptr)
    return setError(comm_, epNotSupported, "the CUDA backend needs the cuda_ipc transport: %s", why.c_str());
  return epSuccess;
}

// ---- 4. share the GPUs ------------------------------------------------------------
// Which GPU each rank drives (collective), what sharing one means here (the
// warnings about MPS and hardware queues), and the channels every rank uses.
epResult_t CudaBackend::shareGpus(InitContext& ctx) {
  const int R = comm_.nranks(), me = comm_.rank();
  ctx.devs.resize(size_t(R));
  memset(ctx.devs.data(), 0, sizeof(RankDevice) * R);
  RankDevice& mine = ctx.devs[size_t(me)];
  mine.device = dev_;
  mine.channels = channels_;
  mine.sms = ctx.prop.multiProcessorCount;
  CUDACHECK(cudaDeviceGetPCIBusId(mine.bus_id, sizeof(mine.bus_id), dev_));
  EPCHECK(bootstrapAllGather(comm_.bootstrap(), ctx.devs.data(), sizeof(RankDevice)));
  std::vector<epPeerInfo_v1_t>& peers = ctx.peers;
  peers = comm_.peers();
  for (int r = 0; r < R; r++) {
    peers[r].cuda_device = ctx.devs[r].device;
    memcpy(peers[r].bus_id, ctx.devs[r].bus_id, sizeof(peers[r].bus_id));
    peers[r].bus_id[sizeof(peers[r].bus_id) - 1] = '\0';
  }
  // Ranks that drive the same GPU split its SMs: their kernels wait for each
  // other, so all their blocks must be resident at once.
  ctx.sharing = ranksOnGpuOf(peers, me);
  if (ctx.sharing > 1) {
    bool other_process = false, this_process = false;
    for (int r = 0; r < R; r++) {
      if (r == me || !sameGpu(peers[r], peers[me])) continue;
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
              ctx.sharing, peers[me].bus_id);
    else if (conns == nullptr || atoi(conns) < 32)
      EP_WARN(kSubsysInit,
              "%d ranks of this process drive GPU %s: their kernels wait for each other, so their streams "
              "must not share a hardware queue; set CUDA_DEVICE_MAX_CONNECTIONS=32 before CUDA starts "
              "(it is %s), or calls can stall until the timeout",
              ctx.sharing, peers[me].bus_id, conns ? conns : "unset: 8 queues");
    EP_INFO(kSubsysInit, "%d ranks share GPU %s: this one's kernels take at most %d of its %d SMs", ctx.sharing,
            peers[me].bus_id, smShare(ctx.prop.multiProcessorCount, ctx.sharing), ctx.prop.multiProcessorCount);
  }
  std::vector<int> wanted(R), sms(R);
  for (int r = 0; r < R; r++) {
    wanted[r] = ctx.devs[r].channels;
    sms[r] = ctx.devs[r].sms;
  }
  channels_ = agreedChannels(peers, wanted, sms);
  return epSuccess;
}

// ---- 5. check peer access -----------------------------------------------------------
// Every GPU of the communicator reaches this one by P2P (cuda_ipc's can_connect).
epResult_t CudaBackend::checkPeerAccess(InitContext& ctx) {
  const int R = comm_.nranks(), me = comm_.rank();
  const std::vector<epPeerInfo_v1_t>& peers = ctx.peers;
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
                      "(NVLink or PCIe peer access): the CUDA backend needs P2P between all GPUs of a node "
                      "(EP_NODE_SIZE=1 EP_CUDA_NETWORK=1 makes each rank a node of its own and joins them "
                      "through host staging instead, docs/PROXY.md)",
                      peers[me].bus_id, me, dev_, peers[r].bus_id, r, ctx.devs[r].device);
  }
  return epSuccess;
}

// ---- 6. size the buffer -------------------------------------------------------------
// The high-throughput buffer's geometry, for the worst case: every rank
// sends every token to this one.
epResult_t CudaBackend::sizeBuffer(InitContext&) {
  const Config& cfg = comm_.config();
  const int R = comm_.nranks();
  const int nb = cfg.dispatch_type == epFloat8E4M3 ? fp8ScaleBlocks(cfg.hidden) : 0;
  const size_t drow = size_t(cfg.hidden) * dataTypeSize(cfg.dispatch_type);
  const size_t crow = size_t(cfg.hidden) * dataTypeSize(cfg.combine_type);
  row_stride_ = roundUp(std::max(drow, crow), 16);
  meta_stride_ = roundUp(size_t(nb) * 4 + size_t(cfg.max_topk) * 8, 16);
  const size_t slots = size_t(R) * size_t(std::max(cfg.max_tokens_per_rank, 1));
  rows_off_ = roundUp(sizeof(Ctrl), 4096);
  meta_off_ = rows_off_ + roundUp(slots * row_stride_, 4096);
  buffer_bytes_ = meta_off_ + roundUp(slots * meta_stride_, 4096);
  if (cfg.buffer_bytes_cap > 0 && buffer_bytes_ > cfg.buffer_bytes_cap)
    return setError(comm_, epInvalidArgument,
                    "buffer_bytes_cap = %zu (config, else EP_BUFFER_BYTES_CAP) is too small: the CUDA backend needs %zu bytes for %d "
                    "ranks x %d tokens of %zu-byte rows",
                    cfg.buffer_bytes_cap, buffer_bytes_, R, cfg.max_tokens_per_rank, row_stride_);
  EP_INFO(kSubsysInit, "cuda backend: device %d, %d channels, dispatch warps %d+%d (chunk %d tokens), combine warps %d+%d, buffer %zu bytes",
          dev_, channels_, send_warps_, recv_warps_, chunk_tokens_, push_warps_, reduce_warps_, buffer_bytes_);
  return epSuccess;
}

// ---- 7. map the buffers --------------------------------------------------------------
// This rank's buffer registered with cuda_ipc, the handles exchanged
// (collective), every peer's buffer mapped here. The transport learns that
// every rank connected at the last step (finishSetup).
epResult_t CudaBackend::mapBuffer(InitContext& ctx) {
  const int R = comm_.nranks(), me = comm_.rank();
  const std::vector<epPeerInfo_v1_t>& peers = ctx.peers;
  auto buffer = std::make_unique<PeerBuffers>(ipc_, me, R);
  LocalMemory own;
  own.bytes = buffer_bytes_;
  own.kind = EP_TRANSPORT_MEM_DEVICE;
  epResult_t res = buffer->registerLocal(own);
  if (res != epSuccess)
    return setError(comm_, res, "cuda backend: cannot allocate the %zu-byte communication buffer on device %d",
                    buffer_bytes_, dev_);
  EPCHECK(buffer->exchange(comm_.bootstrap()));
  for (int r = 0; r < R; r++) {
    if (r == me) continue;
    res = buffer->connect(r, peers[r]);
    if (res != epSuccess)
      return setError(comm_, res, "cuda backend: cannot map rank %d's buffer (GPU %s) on GPU %s", r,
                      peers[r].bus_id, peers[me].bus_id);
  }
  bufs_.assign(R, nullptr);
  for (int r = 0; r < R; r++) bufs_[r] = static_cast<char*>(buffer->peerPtr(r));
  buffer_ = std::move(buffer);
  return epSuccess;
}

// ---- 8. allocate the rank's state -------------------------------------------------
// Rank-private device state, the host-mapped error slots, the pinned counts.
epResult_t CudaBackend::allocateRankState(InitContext&) {
  const Config& cfg = comm_.config();
  const int R = comm_.nranks();
  auto st = std::make_unique<RankState>();
  const size_t scratch_ints = size_t(cfg.num_experts) + size_t(R) + size_t(comm_.nodes().num_nodes);
  static_assert(sizeof(DevLocal) <= 256, "DevLocal outgrew its slot");
  const size_t route_off = roundUp(256 + scratch_ints * sizeof(int), 256);
  const size_t local_bytes = route_off + routeScratchBytes(cfg.max_tokens_per_rank);
  void* mem = nullptr;
  CUDACHECK(cudaMalloc(&mem, local_bytes));
  st->local = static_cast<DevLocal*>(mem);  // owned from here: freed with st if a step below fails
  st->local_bytes = local_bytes;
  CUDACHECK(cudaMemset(mem, 0, local_bytes));
  st->layout_scratch = reinterpret_cast<int*>(static_cast<char*>(mem) + 256);
  st->route_scratch = reinterpret_cast<uint64_t*>(static_cast<char*>(mem) + route_off);
  void* hp = nullptr;
  CUDACHECK(cudaHostAlloc(&hp, kErrorSlots * sizeof(ErrorInfo), cudaHostAllocMapped));
  memset(hp, 0, kErrorSlots * sizeof(ErrorInfo));
  st->err_host = static_cast<ErrorInfo*>(hp);
  void* dp = nullptr;
  CUDACHECK(cudaHostGetDevicePointer(&dp, hp, 0));
  st->err_dev = static_cast<ErrorInfo*>(dp);
  CUDACHECK(cudaHostAlloc(&hp, sizeof(HState), cudaHostAllocDefault));
  st->hs_host = static_cast<HState*>(hp);
  state_ = std::move(st);
  return epSuccess;
}

// ---- 9. allocate handle slots ---------------------------------------------------------
// A few up front, so that most calls allocate nothing (more come when more
// handles are alive, under stream capture too: HandleSlots::acquire).
epResult_t CudaBackend::allocateHandleSlots(InitContext&) {
  auto slots = std::make_unique<HandleSlots>(comm_, dev_, channels_);
  EPCHECK(slots->reserve(4));
  slots_ = std::move(slots);
  return epSuccess;
}

// ---- 10. load the kernels ---------------------------------------------------------------
// Every kernel loaded now, not at its first launch (preload.cuh says why).
epResult_t CudaBackend::loadKernels(InitContext&) {
  CUDACHECK(cudaError_t(preloadLayoutKernels()));
  CUDACHECK(cudaError_t(preloadDispatchKernels()));
  CUDACHECK(cudaError_t(preloadCombineKernels()));
  if (comm_.config().low_latency && comm_.config().enable_shrink) {  // the build that reads the mask (ll_variant.h)
    CUDACHECK(cudaError_t(ll_shrink::preloadLLDispatchKernels()));
    CUDACHECK(cudaError_t(ll_shrink::preloadLLDispatchSlicesKernels()));
    CUDACHECK(cudaError_t(ll_shrink::preloadLLCombineKernels()));
  } else if (comm_.config().low_latency) {
    CUDACHECK(cudaError_t(ll_plain::preloadLLDispatchKernels()));
    CUDACHECK(cudaError_t(ll_plain::preloadLLDispatchSlicesKernels()));
    CUDACHECK(cudaError_t(ll_plain::preloadLLCombineKernels()));
  }
  CUDACHECK(cudaDeviceSynchronize());
  return epSuccess;
}

// ---- 11. start the low-latency engine ----------------------------------------------------
// config.low_latency = 1: its buffers, mapped by every rank (collective, like
// everything above).
epResult_t CudaBackend::startLowLatency(InitContext& ctx) {
  const Config& cfg = comm_.config();
  if (!cfg.low_latency) return epSuccess;
  // The cap bounds what epCommBufferBytes reports: both buffers together.
  const size_t ll_bytes = llBufferBytes(comm_.nranks(), cfg.max_tokens_per_rank, cfg.hidden, cfg.max_topk,
                                        cfg.num_experts);
  if (cfg.buffer_bytes_cap > 0 && buffer_bytes_ + ll_bytes > cfg.buffer_bytes_cap)
    return setError(comm_, epInvalidArgument,
                    "buffer_bytes_cap = %zu (config, else EP_BUFFER_BYTES_CAP) is too small: the CUDA backend needs %zu bytes for the "
                    "high-throughput buffer and %zu for the low-latency buffers",
                    cfg.buffer_bytes_cap, buffer_bytes_, ll_bytes);
  // Ranks sharing a GPU split its SMs, as for the high-throughput kernels:
  // every block of every rank's fused kernel must be resident at once.
  const long long want = param::CUDA_LL_SMS();
  bool ignored = false;
  const int ll_sms = llBlocks(ctx.prop.multiProcessorCount, ctx.sharing, want, &ignored);
  if (ignored)
    EP_WARN(kSubsysCuda, "EP_CUDA_LL_SMS=%lld is not in 1..%d (this rank's SMs): ignored", want, ll_sms);
  auto ll = std::make_unique<LLEngine>(comm_, dev_, ll_sms);
  EPCHECK(ll->init(ipc_, ctx.peers));
  ll_ = std::move(ll);
  return epSuccess;
}

// ---- 12. start the watcher -------------------------------------------------------------
// What the waits compare to find a peer in another call, then the host's
// notices (exited peers, calls out of step, abort) and their watcher thread.
epResult_t CudaBackend::startWatcher(InitContext&) {
  EPCHECK(watchOtherFamily());
  auto notices = std::make_unique<HostNotices>(comm_, dev_);
  EPCHECK(notices->init());
  notices->addTarget(&state_->local->timed_out, state_->local->gone, state_->err_host);
  if (ll_) notices->addTarget(&ll_->deviceLocal()->timed_out, ll_->deviceLocal()->gone, ll_->errorSlots());
  notices_ = std::move(notices);
  if (ll_) ll_->setNotices(notices_.get());
  notices_->watch();
  return epSuccess;
}

// What the high-throughput waits compare to find a peer in another call:
// the words the peers wrote into this rank's Ctrl and, with low-latency
// buffers, this rank's low-latency signal counters; and
// where they tell a peer found in a low-latency call (its LLLocal::gone
// bytes, as mapped here). FamilyWatch.
epResult_t CudaBackend::watchOtherFamily() {
  FamilyWatch w{};
  w.ht_ctrl = reinterpret_cast<const Ctrl*>(bufs_[comm_.rank()]);
  w.channels = channels_;
  if (ll_) {
    w.ll_counters = ll_->signalCounters();
    for (int r = 0; r < comm_.nranks(); r++) w.peer_ll_gone[r] = ll_->peerLocal(r)->gone;
  }
  w.rank = comm_.rank();
  w.nranks = comm_.nranks();
  CUDACHECK(cudaMemcpy(&state_->local->watch, &w, sizeof(w), cudaMemcpyHostToDevice));
  return epSuccess;
}

// ---- 13. finish the setup ---------------------------------------------------------------
// Every rank mapped every buffer (a barrier): cuda_ipc may drop what it
// published for the mappings.
epResult_t CudaBackend::finishSetup(InitContext&) { return buffer_->finish(comm_.bootstrap()); }

}  // namespace cuda

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

epResult_t createCudaBackend(const BackendComm& comm, std::unique_ptr<Backend>* out) {
  if (!cudaBackendAvailable())
    return setError(comm, epNotSupported, "the CUDA backend needs a visible GPU and a CUDA driver");
  auto backend = std::make_unique<cuda::CudaBackend>(comm);
  EPCHECK(backend->init());
  *out = std::move(backend);
  return epSuccess;
}

}  // namespace ep
