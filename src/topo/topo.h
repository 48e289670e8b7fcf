// The machine as the library sees it: GPUs (PCI devices found by bus id), RDMA
// NICs (OpenFabrics OS devices), NUMA nodes, the PCI distance class of every
// GPU-NIC pair and the NIC each GPU should use.
//
// hwloc is read once and everything is copied into plain data, so that the
// rest (NIC choice, the plan, printing) is testable and builds without hwloc.
// NVLink / P2P reachability is not in Debian's hwloc: it comes from the CUDA
// side through topoSetPeerAccessFn (default: unknown).
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "moeep.h"

namespace ep {

// How far apart two PCI devices are, nearest first (the vocabulary of
// `nvidia-smi topo -m`; order matters: a smaller value is a better path).
enum class PciDist : uint8_t {
  kPix = 0,   // one PCIe switch (or bridge) joins them
  kPxb = 1,   // several PCIe switches, not through the host bridge
  kPhb = 2,   // through one PCIe host bridge (the CPU's root complex)
  kNode = 3,  // between host bridges of one NUMA node
  kSys = 4,   // across the SMP interconnect between NUMA nodes or sockets
};
const char* pciDistName(PciDist d);  // "PIX", "PXB", ...
const char* pciDistWhy(PciDist d);   // "same PCIe switch", ...

struct TopoGpu {
  std::string bus_id;  // "0000:1b:00.0"
  uint16_t vendor = 0, device = 0;
  int numa = -1;     // NUMA node os index, -1 when not local to exactly one
  std::string cpus;  // CPU list near the GPU, "0-55,112-167"
};

struct TopoNic {
  std::string name;    // "mlx5_0"
  std::string bus_id;  // "" when the device has no PCI parent (soft RoCE)
  int numa = -1;
  std::string cpus;
  int active_ports = -1;  // ports in state ACTIVE (hwloc's PortNState infos); -1: no state known
};

struct TopoNuma {
  int os_index = 0;
  std::string cpus;
  uint64_t bytes = 0;
};

struct Topology {
  bool available = false;  // false: why_unavailable says why; the lists are empty
  std::string why_unavailable;
  std::string source;  // "this machine" or "xml FILE"
  int packages = 0;
  std::vector<TopoNuma> numa;
  std::vector<TopoGpu> gpus;               // in PCI bus order
  std::vector<TopoNic> nics;               // in PCI bus order
  std::vector<std::vector<PciDist>> dist;  // [gpu][nic]
  std::vector<int> nic_of_gpu;             // [gpu] index into nics, -1: none
  std::vector<std::string> nic_why;        // [gpu] why that NIC
};

// Reads the topology: the XML file xml_path when not NULL/empty, else this
// machine (hwloc also honours HWLOC_XMLFILE). A missing hwloc gives
// available = false and epSuccess; an unreadable XML file is epInvalidArgument.
// Also computes dist, nic_of_gpu and nic_why.
epResult_t topoLoad(const char* xml_path, Topology* out);

// The topology of this process, loaded once (EP_TOPO_XML or the machine).
// Thread-safe; the result (and its error) are cached for the process.
epResult_t topoLocal(std::shared_ptr<const Topology>* out);

// The index of the GPU with this PCI bus id ("0000:1B:00.0", "00000000:1b:00.0",
// "1b:00.0" all match), or -1.
int topoFindGpu(const Topology& t, const char* bus_id);

// The NIC of every GPU from the distance matrix dist[gpu][nic]: each GPU gets
// one of its nearest NICs; among equally near NICs the GPUs are spread so that
// none shares a NIC unless there are fewer such NICs than GPUs (a maximum
// matching, then the least-loaded NIC for the rest). NICs whose ports are all
// known not ACTIVE are chosen only when no NIC has one; then, among the rest,
// NICs without a PCI device (bus_id "", soft RoCE) only when none of them is
// on PCI (topoUsableNics). why[g] says why.
void topoChooseNics(const std::vector<std::vector<PciDist>>& dist, const std::vector<TopoNic>& nics,
                    std::vector<int>* nic_of_gpu, std::vector<std::string>* why);

// The NICs worth choosing (usable[n] = 1): those with an ACTIVE port (or no
// port state known), then those on PCI, each rule applied only when it leaves
// some; *note says what was left out and why ("; mlx5_1 left out (...)").
std::vector<char> topoUsableNics(const std::vector<TopoNic>& nics, std::string* note);

// Direct reachability between two GPUs of this machine, given by the CUDA side.
enum class PeerAccess : uint8_t {
  kUnknown = 0,  // no CUDA hook, or it cannot tell
  kNone = 1,     // no peer access: copies go through host memory
  kP2P = 2,      // peer access (cudaDeviceCanAccessPeer) over PCIe or a link not known to be NVLink
  kNvlink = 3,   // peer access over NVLink
};
const char* peerAccessName(PeerAccess a);
// Returns the access from the GPU with bus id a to the GPU with bus id b.
using PeerAccessFn = PeerAccess (*)(const char* bus_a, const char* bus_b);
// Installs the hook (the CUDA backend calls this when it loads); NULL restores
// the default, which answers kUnknown.
void topoSetPeerAccessFn(PeerAccessFn fn);
PeerAccess topoPeerAccess(const char* bus_a, const char* bus_b);

// Human-readable report: NUMA nodes, GPUs, NICs, the distance matrix, the NIC
// of each GPU and why, and the GPU-GPU access matrix from the hook.
void topoPrint(FILE* out, const Topology& t);

}  // namespace ep
