// cuda_ipc: device memory shared between the GPUs of one node.
//
// reg_mem(DEVICE) allocates with cudaMalloc on the current device, zero-fills
// it and exports a cudaIpcMemHandle together with the owner's pid, a random
// per-process token, the device ordinal and the raw pointer. connect maps a
// peer's memory: with cudaIpcOpenMemHandle when the peer is another process,
// or, when it is this very process (ranks as threads, epCommInitAll), with the
// raw pointer after enabling peer access (cudaIpcOpenMemHandle refuses handles
// of its own process; peer access is enabled once per context and peer, see
// enablePeerAccessOnce). can_connect asks cudaDeviceCanAccessPeer, so two GPUs
// without a P2P path are refused before anything is mapped.
#include <cuda.h>  // CUcontext, for the context id (resolved at run time, no libcuda link)
#include <cuda_runtime.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <mutex>
#include <new>
#include <random>
#include <set>
#include <utility>

#include "transport.h"

namespace {

constexpr uint32_t kHandleMagic = 0x65704369u;  // 'epCi'

struct IpcHandle {
  uint32_t magic;
  int32_t pid;
  uint64_t token;  // tells processes apart even when pids repeat (containers)
  int32_t device;
  int32_t pad;
  uint64_t size;
  uint64_t ptr;  // valid in the owner's process only
  cudaIpcMemHandle_t ipc;
};
static_assert(sizeof(IpcHandle) <= EP_TRANSPORT_HANDLE_BYTES, "handle too large");

struct IpcContext {
  const epTransportEnv_v1_t* env;
  uint64_t token;
};

struct IpcMem {
  void* ptr;
  size_t size;
};

struct IpcConn {
  void* ptr;
  bool opened;  // through cudaIpcOpenMemHandle (close it)
};

#define IPC_LOG(ctx, level, ...) (ctx)->env->log((level), "cuda_ipc", __VA_ARGS__)

// The id of the current CUDA context: unique over the life of the process, so
// a context made again after cudaDeviceReset gets a new one. False where the
// driver lacks cuCtxGetId (before CUDA 12.0).
bool currentContextId(unsigned long long* id) {
  using GetCurrentFn = CUresult(CUDAAPI*)(CUcontext*);
  using GetIdFn = CUresult(CUDAAPI*)(CUcontext, unsigned long long*);
  static const std::pair<GetCurrentFn, GetIdFn> fns = [] {
    void* cur = nullptr;
    void* get_id = nullptr;
    cudaDriverEntryPointQueryResult q1, q2;
    if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &cur, 12000, cudaEnableDefault, &q1) != cudaSuccess ||
        cudaGetDriverEntryPointByVersion("cuCtxGetId", &get_id, 12000, cudaEnableDefault, &q2) != cudaSuccess ||
        q1 != cudaDriverEntryPointSuccess || q2 != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return std::pair<GetCurrentFn, GetIdFn>{nullptr, nullptr};
    }
    return std::pair<GetCurrentFn, GetIdFn>{reinterpret_cast<GetCurrentFn>(cur), reinterpret_cast<GetIdFn>(get_id)};
  }();
  CUcontext c = nullptr;
  return fns.first != nullptr && fns.first(&c) == CUDA_SUCCESS && c != nullptr && fns.second(c, id) == CUDA_SUCCESS;
}

// Lets the current device load and store to `peer`'s memory. Enabling twice
// fails with cudaErrorPeerAccessAlreadyEnabled; that is harmless, but tools
// such as compute-sanitizer report every failed call, and every communicator
// (and its low-latency buffer) connects again. So the (context, peer) pairs
// enabled here are remembered for the process; access enabled by someone else
// (NCCL, a framework) still answers "already enabled", which is accepted.
cudaError_t enablePeerAccessOnce(int peer) {
  static std::mutex mu;
  static std::set<std::pair<unsigned long long, int>> enabled;
  unsigned long long ctx_id = 0;
  bool known = currentContextId(&ctx_id);
  std::lock_guard<std::mutex> lock(mu);
  if (known && enabled.count({ctx_id, peer}) != 0) return cudaSuccess;
  cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
  if (e == cudaErrorPeerAccessAlreadyEnabled) {
    cudaGetLastError();
    e = cudaSuccess;
  }
  if (e == cudaSuccess && known) enabled.insert({ctx_id, peer});
  return e;
}

epResult_t ipcInit(const epTransportEnv_v1_t* env, void** out) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    cudaGetLastError();
    // No driver or no GPU: the host backend still works; say why once.
    env->log(epTransportLogInfo, "cuda_ipc", "no usable GPU (%s)",
             e != cudaSuccess ? cudaGetErrorString(e) : "0 CUDA devices");
    return epNotSupported;
  }
  auto* ctx = new (std::nothrow) IpcContext();
  if (ctx == nullptr) return epOutOfMemory;
  ctx->env = env;
  std::random_device rd;
  ctx->token = (uint64_t(rd()) << 32) ^ rd() ^ uint64_t(getpid());
  *out = ctx;
  return epSuccess;
}

epResult_t ipcProperties(void*, epTransportProps_v1_t* props) {
  props->name = "cuda_ipc";
  props->caps = EP_TRANSPORT_CAP_LOAD_STORE | EP_TRANSPORT_CAP_DEVICE_MEM;
  props->latency_us = 1;
  props->bandwidth_gbps = 3000;
  return epSuccess;
}

// self and peer carry cuda_device (an ordinal of this process when the peer is
// in this process) and bus_id (a PCI bus id) as filled by the CUDA backend.
epResult_t ipcCanConnect(void* vctx, const epPeerInfo_v1_t* self, const epPeerInfo_v1_t* peer, int* ok) {
  auto* ctx = static_cast<IpcContext*>(vctx);
  *ok = 0;
  if (self->host_hash != peer->host_hash) return epSuccess;
  int mine = self->cuda_device, theirs = -1;
  if (peer->bus_id[0] != '\0' && cudaDeviceGetByPCIBusId(&theirs, peer->bus_id) != cudaSuccess) {
    cudaGetLastError();
    // The peer's GPU is not visible to this process (CUDA_VISIBLE_DEVICES):
    // cudaIpcOpenMemHandle decides.
    *ok = 1;
    return epSuccess;
  }
  if (theirs < 0) theirs = peer->cuda_device;
  if (theirs == mine) {
    *ok = 1;
    return epSuccess;
  }
  int can = 0;
  if (cudaDeviceCanAccessPeer(&can, mine, theirs) != cudaSuccess) {
    cudaGetLastError();
    IPC_LOG(ctx, epTransportLogWarn, "cudaDeviceCanAccessPeer(%d, %d) failed", mine, theirs);
    return epUnhandledCudaError;
  }
  *ok = can;
  return epSuccess;
}

epResult_t ipcRegMem(void* vctx, size_t size, int kind, void** ptr, void* handle, void** mem) {
  auto* ctx = static_cast<IpcContext*>(vctx);
  if (kind != EP_TRANSPORT_MEM_DEVICE) return epNotSupported;
  int dev = 0;
  cudaGetDevice(&dev);
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, size);
  if (e != cudaSuccess) {
    cudaGetLastError();
    IPC_LOG(ctx, epTransportLogWarn, "cudaMalloc of %zu bytes on device %d failed: %s", size, dev,
            cudaGetErrorString(e));
    return e == cudaErrorMemoryAllocation ? epOutOfMemory : epUnhandledCudaError;
  }
  IpcHandle h{};
  h.magic = kHandleMagic;
  h.pid = int32_t(getpid());
  h.token = ctx->token;
  h.device = dev;
  h.size = size;
  h.ptr = reinterpret_cast<uint64_t>(p);
  if ((e = cudaMemset(p, 0, size)) != cudaSuccess || (e = cudaDeviceSynchronize()) != cudaSuccess ||
      (e = cudaIpcGetMemHandle(&h.ipc, p)) != cudaSuccess) {
    cudaGetLastError();
    IPC_LOG(ctx, epTransportLogWarn, "cannot export %zu bytes on device %d: %s", size, dev, cudaGetErrorString(e));
    cudaFree(p);
    return epUnhandledCudaError;
  }
  auto* m = new (std::nothrow) IpcMem{p, size};
  if (m == nullptr) {
    cudaFree(p);
    return epOutOfMemory;
  }
  memcpy(handle, &h, sizeof(h));
  *ptr = p;
  *mem = m;
  return epSuccess;
}

epResult_t ipcDeregMem(void*, void* vmem) {
  auto* m = static_cast<IpcMem*>(vmem);
  if (m == nullptr) return epSuccess;
  cudaFree(m->ptr);
  delete m;
  return epSuccess;
}

epResult_t ipcConnect(void* vctx, const epPeerInfo_v1_t* peer, const void* peer_handle, void** ptr, void** conn) {
  auto* ctx = static_cast<IpcContext*>(vctx);
  IpcHandle h;
  memcpy(&h, peer_handle, sizeof(h));
  if (h.magic != kHandleMagic) {
    IPC_LOG(ctx, epTransportLogWarn, "rank %d sent a handle that is not a cuda_ipc handle", peer->rank);
    return epInternalError;
  }
  auto* c = new (std::nothrow) IpcConn{nullptr, false};
  if (c == nullptr) return epOutOfMemory;
  int dev = 0;
  cudaGetDevice(&dev);
  if (h.pid == int32_t(getpid()) && h.token == ctx->token) {
    if (h.device != dev) {
      cudaError_t e = enablePeerAccessOnce(h.device);
      if (e != cudaSuccess) {
        cudaGetLastError();
        IPC_LOG(ctx, epTransportLogWarn, "cudaDeviceEnablePeerAccess(%d) from device %d failed: %s", h.device,
                dev, cudaGetErrorString(e));
        delete c;
        return epNotSupported;
      }
    }
    c->ptr = reinterpret_cast<void*>(h.ptr);
  } else {
    cudaError_t e = cudaIpcOpenMemHandle(&c->ptr, h.ipc, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
      cudaGetLastError();
      IPC_LOG(ctx, epTransportLogWarn, "cudaIpcOpenMemHandle of rank %d's buffer on device %d failed: %s",
              peer->rank, dev, cudaGetErrorString(e));
      delete c;
      return epUnhandledCudaError;
    }
    c->opened = true;
  }
  *ptr = c->ptr;
  *conn = c;
  return epSuccess;
}

epResult_t ipcConnected(void*, void*) { return epSuccess; }

epResult_t ipcClose(void*, void* vconn) {
  auto* c = static_cast<IpcConn*>(vconn);
  if (c == nullptr) return epSuccess;
  if (c->opened) cudaIpcCloseMemHandle(c->ptr);
  delete c;
  return epSuccess;
}

epResult_t ipcFinalize(void* vctx) {
  delete static_cast<IpcContext*>(vctx);
  return epSuccess;
}

const epTransport_v1_t cudaIpcTransport = {
    "cuda_ipc",  1,                         ipcInit,    ipcProperties, ipcCanConnect,
    ipcRegMem,   ipcDeregMem,              ipcConnect, ipcConnected,  nullptr,
    nullptr,     ipcClose,                 ipcFinalize};

}  // namespace

EP_TRANSPORT_DEFINE(cudaIpcTransport)
