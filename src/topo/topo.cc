// What does not need hwloc: names, bus id lookup, the NIC choice, the CUDA
// peer-access hook and the printed report.
#include "topo/topo.h"

#include <algorithm>
#include <atomic>
#include <cstring>

namespace ep {

const char* pciDistName(PciDist d) {
  switch (d) {
    case PciDist::kPix:
      return "PIX";
    case PciDist::kPxb:
      return "PXB";
    case PciDist::kPhb:
      return "PHB";
    case PciDist::kNode:
      return "NODE";
    case PciDist::kSys:
      return "SYS";
  }
  return "?";
}

const char* pciDistWhy(PciDist d) {
  switch (d) {
    case PciDist::kPix:
      return "same PCIe switch";
    case PciDist::kPxb:
      return "several PCIe switches";
    case PciDist::kPhb:
      return "through the PCIe host bridge";
    case PciDist::kNode:
      return "between host bridges of one NUMA node";
    case PciDist::kSys:
      return "across NUMA nodes";
  }
  return "?";
}

const char* peerAccessName(PeerAccess a) {
  switch (a) {
    case PeerAccess::kUnknown:
      return "unknown";
    case PeerAccess::kNone:
      return "none";
    case PeerAccess::kP2P:
      return "p2p";
    case PeerAccess::kNvlink:
      return "nvlink";
  }
  return "?";
}

namespace {

std::atomic<PeerAccessFn> g_peer_access{nullptr};

// Parses "[domain:]bus:dev.fn" (hex; any domain width, any case).
bool parseBusId(const char* text, unsigned* dom, unsigned* bus, unsigned* dev, unsigned* fn) {
  if (text == nullptr) return false;
  *dom = 0;
  if (sscanf(text, "%x:%x:%x.%x", dom, bus, dev, fn) == 4) return true;
  *dom = 0;
  return sscanf(text, "%x:%x.%x", bus, dev, fn) == 3;
}

}  // namespace

void topoSetPeerAccessFn(PeerAccessFn fn) { g_peer_access.store(fn); }

PeerAccess topoPeerAccess(const char* bus_a, const char* bus_b) {
  PeerAccessFn fn = g_peer_access.load();
  if (fn == nullptr || bus_a == nullptr || bus_b == nullptr || !*bus_a || !*bus_b)
    return PeerAccess::kUnknown;
  return fn(bus_a, bus_b);
}

int topoFindGpu(const Topology& t, const char* bus_id) {
  unsigned d, b, v, f;
  if (!parseBusId(bus_id, &d, &b, &v, &f)) return -1;
  for (size_t g = 0; g < t.gpus.size(); g++) {
    unsigned d2, b2, v2, f2;
    if (parseBusId(t.gpus[g].bus_id.c_str(), &d2, &b2, &v2, &f2) && d == d2 && b == b2 && v == v2 && f == f2)
      return int(g);
  }
  return -1;
}

namespace {

// Kuhn's augmenting path over the "nearest NIC" edges. Free NICs are tried
// first, so that an uncontested GPU keeps the lowest-numbered NIC it can have.
bool augment(int g, const std::vector<std::vector<int>>& cand, std::vector<int>* owner,
             std::vector<char>* seen, std::vector<int>* nic_of_gpu) {
  for (int pass = 0; pass < 2; pass++)
    for (int n : cand[g]) {
      if ((*seen)[n] || (pass == 0 && (*owner)[n] >= 0)) continue;
      (*seen)[n] = 1;
      if ((*owner)[n] < 0 || augment((*owner)[n], cand, owner, seen, nic_of_gpu)) {
        (*owner)[n] = g;
        (*nic_of_gpu)[g] = n;
        return true;
      }
    }
  return false;
}

// Leaves out of *usable the NICs for which worse() holds, unless none would
// be left; says which (or that all are worse) in *note.
void preferOthers(const std::vector<TopoNic>& nics, bool (*worse)(const TopoNic&), const char* why_left_out,
                  const char* why_all, std::vector<char>* usable, std::string* note) {
  std::string names;
  bool others = false;
  for (size_t n = 0; n < nics.size(); n++) {
    if (!(*usable)[n]) continue;
    if (worse(nics[n])) names += (names.empty() ? "" : ", ") + nics[n].name;
    else others = true;
  }
  if (names.empty()) return;
  if (!others) {
    *note += std::string("; ") + why_all;
    return;
  }
  for (size_t n = 0; n < nics.size(); n++)
    if (worse(nics[n])) (*usable)[n] = 0;
  *note += "; " + names + " left out (" + why_left_out + ")";
}

// The NICs to choose from (usable[n] = 1), and a note for the reasons when
// some are left out: a NIC with an ACTIVE port (or no port state known)
// before one whose ports are all down or still initialising, which cannot
// carry traffic; then NICs on PCI before those without a PCI device (soft
// RoCE, siw), which go through the host's network stack and so are no match
// for a real HCA however near they look.
}  // namespace

std::vector<char> topoUsableNics(const std::vector<TopoNic>& nics, std::string* note) {
  std::vector<char> usable(nics.size(), 1);
  note->clear();
  preferOthers(nics, [](const TopoNic& n) { return n.active_ports == 0; }, "no port ACTIVE",
               "no NIC has an ACTIVE port", &usable, note);
  preferOthers(nics, [](const TopoNic& n) { return n.bus_id.empty(); }, "no PCI device: software RDMA",
               "no usable RDMA NIC on PCI: one without a PCI device (software RDMA)", &usable, note);
  return usable;
}

void topoChooseNics(const std::vector<std::vector<PciDist>>& dist, const std::vector<TopoNic>& nics,
                    std::vector<int>* nic_of_gpu, std::vector<std::string>* why) {
  const int G = int(dist.size()), N = int(nics.size());
  nic_of_gpu->assign(G, -1);
  why->assign(G, N == 0 ? "no RDMA NIC on this machine" : "");
  if (N == 0) return;
  std::string note;
  const std::vector<char> usable = topoUsableNics(nics, &note);
  std::vector<std::vector<int>> cand(G);
  for (int g = 0; g < G; g++) {
    PciDist best = PciDist::kSys;
    for (int n = 0; n < N; n++)
      if (usable[n]) best = std::min(best, dist[g][n]);
    for (int n = 0; n < N; n++)
      if (usable[n] && dist[g][n] == best) cand[g].push_back(n);
  }
  std::vector<int> owner(N, -1);
  for (int g = 0; g < G; g++) {
    std::vector<char> seen(N, 0);
    augment(g, cand, &owner, &seen, nic_of_gpu);
  }
  // More GPUs than nearest NICs: the rest share, each with the least-loaded one.
  std::vector<int> load(N, 0);
  for (int g = 0; g < G; g++)
    if ((*nic_of_gpu)[g] >= 0) load[(*nic_of_gpu)[g]]++;
  for (int g = 0; g < G; g++) {
    if ((*nic_of_gpu)[g] >= 0) continue;
    int pick = cand[g][0];
    for (int n : cand[g])
      if (load[n] < load[pick]) pick = n;
    (*nic_of_gpu)[g] = pick;
    load[pick]++;
  }
  for (int g = 0; g < G; g++) {
    int n = (*nic_of_gpu)[g];
    std::string w = std::string(pciDistName(dist[g][n])) + " (" + pciDistWhy(dist[g][n]) + ")";
    if (cand[g].size() > 1) w += ", 1 of " + std::to_string(cand[g].size()) + " equally near NICs";
    std::string sharers;
    for (int o = 0; o < G; o++)
      if (o != g && (*nic_of_gpu)[o] == n) sharers += (sharers.empty() ? "" : ",") + std::to_string(o);
    if (!sharers.empty()) w += ", shared with GPU " + sharers;
    (*why)[g] = w + note;
  }
}

void topoPrint(FILE* out, const Topology& t) {
  fprintf(out, "topology: %s\n", t.source.c_str());
  if (!t.available) {
    fprintf(out, "  not available: %s\n", t.why_unavailable.c_str());
    return;
  }
  fprintf(out, "  %d packages, %zu NUMA nodes\n", t.packages, t.numa.size());
  for (const TopoNuma& n : t.numa)
    fprintf(out, "  NUMA %d: CPUs %s, %.1f GiB\n", n.os_index, n.cpus.c_str(), double(n.bytes) / (1u << 30));
  fprintf(out, "GPUs (%zu):\n", t.gpus.size());
  for (size_t g = 0; g < t.gpus.size(); g++) {
    fprintf(out, "  GPU %zu  %s  %04x:%04x  NUMA %d  CPUs %s", g, t.gpus[g].bus_id.c_str(), t.gpus[g].vendor,
            t.gpus[g].device, t.gpus[g].numa, t.gpus[g].cpus.c_str());
    // Ranks find their GPU by bus id, so a second GPU with the same id is never used.
    const int first = topoFindGpu(t, t.gpus[g].bus_id.c_str());
    if (first != int(g)) fprintf(out, "  (bus id of GPU %d again: unused)", first);
    fprintf(out, "\n");
  }
  fprintf(out, "RDMA NICs (%zu):\n", t.nics.size());
  for (const TopoNic& n : t.nics)
    fprintf(out, "  %-8s  %s  NUMA %d  CPUs %s%s\n", n.name.c_str(),
            n.bus_id.empty() ? "(no PCI)" : n.bus_id.c_str(), n.numa, n.cpus.c_str(),
            n.active_ports == 0 ? "  (no port ACTIVE)" : "");
  if (t.gpus.empty()) return;
  if (!t.nics.empty()) {
    fprintf(out, "GPU-NIC distance (PIX < PXB < PHB < NODE < SYS):\n        ");
    for (const TopoNic& n : t.nics) fprintf(out, " %-8s", n.name.c_str());
    fprintf(out, "\n");
    for (size_t g = 0; g < t.gpus.size(); g++) {
      fprintf(out, "  GPU %-2zu", g);
      for (size_t n = 0; n < t.nics.size(); n++) fprintf(out, " %-8s", pciDistName(t.dist[g][n]));
      fprintf(out, "\n");
    }
  }
  fprintf(out, "NIC per GPU:\n");
  for (size_t g = 0; g < t.gpus.size(); g++) {
    int n = t.nic_of_gpu[g];
    fprintf(out, "  GPU %zu -> %s: %s\n", g, n >= 0 ? t.nics[n].name.c_str() : "none", t.nic_why[g].c_str());
  }
  if (g_peer_access.load() == nullptr) {
    fprintf(out, "GPU peer access: unknown (no CUDA support in this build or process)\n");
    return;
  }
  fprintf(out, "GPU peer access (from CUDA):\n        ");
  for (size_t g = 0; g < t.gpus.size(); g++) fprintf(out, " GPU %-3zu", g);
  fprintf(out, "\n");
  for (size_t a = 0; a < t.gpus.size(); a++) {
    fprintf(out, "  GPU %-2zu", a);
    for (size_t b = 0; b < t.gpus.size(); b++)
      fprintf(
          out, " %-7s",
          a == b ? "-" : peerAccessName(topoPeerAccess(t.gpus[a].bus_id.c_str(), t.gpus[b].bus_id.c_str())));
    fprintf(out, "\n");
  }
}

}  // namespace ep
