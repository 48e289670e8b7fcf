// What the core learns from CUDA outside the backend: the PCI bus id of a
// rank's GPU (exchanged at init, so the plan and moeep_info can place it in the
// topology) and how two GPUs of this machine reach each other (the topology's
// peer-access hook: none / P2P / NVLink).
//
// NVLink is told from other P2P by NVML, opened with dlopen: a machine without
// libnvidia-ml.so.1 reports plain P2P, never fails.
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <mutex>

#include "../backend.h"
#include "../topo/topo.h"

namespace ep {

namespace {

// The few NVML entry points used, by their documented C signatures.
using NvmlDevice = struct NvmlDeviceOpaque*;
using NvmlInitFn = int (*)();
using NvmlHandleByBusIdFn = int (*)(const char*, NvmlDevice*);
using NvmlP2PStatusFn = int (*)(NvmlDevice, NvmlDevice, int, int*);
constexpr int kNvmlSuccess = 0;
constexpr int kNvmlP2PCapsIndexNvlink = 2;  // NVML_P2P_CAPS_INDEX_NVLINK
constexpr int kNvmlP2PStatusOk = 0;         // NVML_P2P_STATUS_OK

struct Nvml {
  NvmlHandleByBusIdFn handle_by_bus_id = nullptr;
  NvmlP2PStatusFn p2p_status = nullptr;
  bool ok = false;
};

const Nvml& nvml() {
  static Nvml n;
  static std::once_flag once;
  std::call_once(once, [] {
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return;
    auto init = reinterpret_cast<NvmlInitFn>(dlsym(lib, "nvmlInit_v2"));
    n.handle_by_bus_id = reinterpret_cast<NvmlHandleByBusIdFn>(dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2"));
    n.p2p_status = reinterpret_cast<NvmlP2PStatusFn>(dlsym(lib, "nvmlDeviceGetP2PStatus"));
    n.ok = init != nullptr && n.handle_by_bus_id != nullptr && n.p2p_status != nullptr && init() == kNvmlSuccess;
  });
  return n;
}

PeerAccess cudaPeerAccess(const char* bus_a, const char* bus_b) {
  int da = -1, db = -1, can = 0;
  if (cudaDeviceGetByPCIBusId(&da, bus_a) != cudaSuccess || cudaDeviceGetByPCIBusId(&db, bus_b) != cudaSuccess) {
    cudaGetLastError();
    return PeerAccess::kUnknown;
  }
  if (da == db) return PeerAccess::kNvlink;  // the same GPU
  if (cudaDeviceCanAccessPeer(&can, da, db) != cudaSuccess) {
    cudaGetLastError();
    return PeerAccess::kUnknown;
  }
  if (!can) return PeerAccess::kNone;
  const Nvml& n = nvml();
  NvmlDevice a = nullptr, b = nullptr;
  int status = -1;
  if (n.ok && n.handle_by_bus_id(bus_a, &a) == kNvmlSuccess && n.handle_by_bus_id(bus_b, &b) == kNvmlSuccess &&
      n.p2p_status(a, b, kNvmlP2PCapsIndexNvlink, &status) == kNvmlSuccess && status == kNvmlP2PStatusOk)
    return PeerAccess::kNvlink;
  return PeerAccess::kP2P;
}

// Installed when the library loads; it calls CUDA only when asked.
struct HookInstaller {
  HookInstaller() { topoSetPeerAccessFn(cudaPeerAccess); }
} hook_installer;

}  // namespace

bool cudaDeviceIdentity(int requested, int* device, char* bus_id, size_t len) {
  int dev = requested;
  if (dev < 0 && cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  if (cudaDeviceGetPCIBusId(bus_id, int(len), dev) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  *device = dev;
  return true;
}

}  // namespace ep
