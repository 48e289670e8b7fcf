// Reading the topology with hwloc 2.x (Debian's 2.9 has no CUDA or NVML
// plugin, so GPUs are plain PCI devices). The only file that includes hwloc.h;
// without it (no -DEP_WITH_HWLOC) the topology is "hwloc not available".
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <numeric>
#include <set>
#include <tuple>

#include "debug.h"
#include "params.h"
#include "topo/topo.h"

#ifdef EP_WITH_HWLOC
#include <hwloc.h>
#endif

namespace ep {

#ifdef EP_WITH_HWLOC
namespace {

std::string busIdOf(hwloc_obj_t pci) {
  char buf[32];
  snprintf(buf, sizeof(buf), "%04x:%02x:%02x.%x", pci->attr->pcidev.domain, pci->attr->pcidev.bus,
           pci->attr->pcidev.dev, pci->attr->pcidev.func);
  return buf;
}

std::string cpuList(hwloc_const_bitmap_t set) {
  if (set == nullptr) return "";
  char* s = nullptr;
  if (hwloc_bitmap_list_asprintf(&s, set) < 0 || s == nullptr) return "";
  std::string r(s);
  free(s);
  return r;
}

// The NUMA node near obj: its nearest non-I/O ancestor's, when that covers
// exactly one node (a device under the Machine of a two-socket box has none).
int numaOf(hwloc_topology_t t, hwloc_obj_t obj, std::string* cpus) {
  hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(t, obj);
  if (anc == nullptr) return -1;
  *cpus = cpuList(anc->cpuset);
  if (anc->nodeset == nullptr || hwloc_bitmap_weight(anc->nodeset) != 1) return -1;
  return hwloc_bitmap_first(anc->nodeset);
}

bool isNvidiaGpu(hwloc_obj_t pci) {
  // 3D (0x0302) or VGA (0x0300) controllers; NVSwitches (0x0680) are not GPUs.
  return pci->attr->pcidev.vendor_id == 0x10de && (pci->attr->pcidev.class_id >> 8) == 0x03;
}

bool isHostBridge(hwloc_obj_t o) {
  return o->type == HWLOC_OBJ_BRIDGE && o->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_HOST;
}

// hwloc_get_common_ancestor_obj compares depths, which I/O objects do not
// order (they all have negative special depths): walk parent chains instead.
hwloc_obj_t commonAncestor(hwloc_obj_t a, hwloc_obj_t b) {
  std::set<hwloc_obj_t> above_a;
  for (hwloc_obj_t o = a; o != nullptr; o = o->parent) above_a.insert(o);
  for (hwloc_obj_t o = b; o != nullptr; o = o->parent)
    if (above_a.count(o)) return o;
  return nullptr;
}

int bridgesBetween(hwloc_obj_t dev, hwloc_obj_t anc) {
  int n = 0;
  for (hwloc_obj_t o = dev->parent; o != nullptr && o != anc; o = o->parent)
    if (o->type == HWLOC_OBJ_BRIDGE) n++;
  return n;
}

PciDist classify(hwloc_topology_t t, hwloc_obj_t a, hwloc_obj_t b) {
  // Functions of one card (same domain, bus and device): hwloc makes them
  // siblings, not parent and child, so the ancestor rule below misses them.
  if (a->type == HWLOC_OBJ_PCI_DEVICE && b->type == HWLOC_OBJ_PCI_DEVICE &&
      a->attr->pcidev.domain == b->attr->pcidev.domain && a->attr->pcidev.bus == b->attr->pcidev.bus &&
      a->attr->pcidev.dev == b->attr->pcidev.dev)
    return PciDist::kPix;
  hwloc_obj_t anc = commonAncestor(a, b);
  if (anc == nullptr) return PciDist::kSys;
  if (anc->type == HWLOC_OBJ_PCI_DEVICE) return PciDist::kPix;  // functions of one card
  if (anc->type == HWLOC_OBJ_BRIDGE) {
    if (isHostBridge(anc)) return PciDist::kPhb;
    // hwloc shows a PCIe switch as its upstream-port bridge over one bridge per
    // downstream port: two devices of one switch have at most that port bridge
    // each between them and the common ancestor; more means nested switches.
    return bridgesBetween(a, anc) <= 1 && bridgesBetween(b, anc) <= 1 ? PciDist::kPix : PciDist::kPxb;
  }
  hwloc_obj_t la = hwloc_get_non_io_ancestor_obj(t, a);
  hwloc_obj_t lb = hwloc_get_non_io_ancestor_obj(t, b);
  bool same_node = la && lb && la->nodeset && lb->nodeset && hwloc_bitmap_isequal(la->nodeset, lb->nodeset);
  return same_node ? PciDist::kNode : PciDist::kSys;
}

// hwloc fails some loads without setting errno (a file whose Machine has no
// PU, for one): strerror(0) would say "Success".
std::string failureText(int err, const char* if_no_errno) {
  return err == 0 ? std::string(if_no_errno) : std::string(strerror(err));
}

// hwloc reports a file it cannot parse (truncated, not hwloc's format) as
// EINVAL, which strerror turns into a misleading "Invalid argument".
epResult_t xmlRefused(const char* xml_path, int err) {
  if (err == EINVAL)
    return setError(nullptr, epInvalidArgument,
                    "topology file %s is not a valid hwloc XML file (truncated, or not written by "
                    "hwloc's XML export; HWLOC_XML_VERBOSE=1 prints the parser's reason)",
                    xml_path);
  return setError(nullptr, epInvalidArgument, "topology file %s cannot be read: %s", xml_path,
                  failureText(err, "hwloc rejected it (no usable machine in it: a PU, for one; "
                                   "HWLOC_XML_VERBOSE=1 may say more)").c_str());
}

// Ports in state ACTIVE (4) among an OpenFabrics device's PortNState infos,
// -1 when it has none (an XML written without them).
int activePorts(hwloc_obj_t osdev) {
  int known = 0, active = 0;
  for (unsigned i = 0; i < osdev->infos_count; i++) {
    const char* name = osdev->infos[i].name;
    const char* value = osdev->infos[i].value;
    unsigned port = 0;
    int digits_end = 0;
    if (name == nullptr || value == nullptr || sscanf(name, "Port%u%n", &port, &digits_end) != 1 ||
        strcmp(name + digits_end, "State") != 0)
      continue;
    known++;
    if (strcmp(value, "4") == 0) active++;
  }
  return known > 0 ? active : -1;
}

// hwloc lists I/O objects in tree order, by their locality first, which need
// not follow bus numbers (a machine whose first NUMA node holds the higher
// buses). Reorders items and objs alike into PCI bus order, the order CUDA
// numbers identical GPUs in; objects that are not PCI functions (soft RoCE
// devices) go last, in hwloc's order.
template <typename Item>
void sortByBus(std::vector<Item>* items, std::vector<hwloc_obj_t>* objs) {
  auto key = [](hwloc_obj_t o) {
    const bool pci = o->type == HWLOC_OBJ_PCI_DEVICE;
    return std::make_tuple(!pci, pci ? unsigned(o->attr->pcidev.domain) : 0u, pci ? unsigned(o->attr->pcidev.bus) : 0u,
                           pci ? unsigned(o->attr->pcidev.dev) : 0u, pci ? unsigned(o->attr->pcidev.func) : 0u);
  };
  std::vector<size_t> order(objs->size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return key((*objs)[a]) < key((*objs)[b]); });
  std::vector<Item> sorted_items;
  std::vector<hwloc_obj_t> sorted_objs;
  for (size_t i : order) {
    sorted_items.push_back(std::move((*items)[i]));
    sorted_objs.push_back((*objs)[i]);
  }
  *items = std::move(sorted_items);
  *objs = std::move(sorted_objs);
}

void readTopology(hwloc_topology_t t, Topology* out) {
  out->packages = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PACKAGE);
  for (hwloc_obj_t n = nullptr; (n = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_NUMANODE, n)) != nullptr;) {
    TopoNuma numa;
    numa.os_index = int(n->os_index);
    numa.cpus = cpuList(n->cpuset);
    numa.bytes = n->attr->numanode.local_memory;
    out->numa.push_back(numa);
  }
  std::vector<hwloc_obj_t> gpu_objs, nic_objs;
  for (hwloc_obj_t p = nullptr; (p = hwloc_get_next_pcidev(t, p)) != nullptr;) {
    if (!isNvidiaGpu(p)) continue;
    TopoGpu g;
    g.bus_id = busIdOf(p);
    g.vendor = p->attr->pcidev.vendor_id;
    g.device = p->attr->pcidev.device_id;
    g.numa = numaOf(t, p, &g.cpus);
    out->gpus.push_back(g);
    gpu_objs.push_back(p);
  }
  for (hwloc_obj_t o = nullptr; (o = hwloc_get_next_osdev(t, o)) != nullptr;) {
    if (o->attr->osdev.type != HWLOC_OBJ_OSDEV_OPENFABRICS) continue;
    hwloc_obj_t pci = o->parent;  // the NIC's PCI function, unless it is a soft device
    while (pci != nullptr && hwloc_obj_type_is_io(pci->type) && pci->type != HWLOC_OBJ_PCI_DEVICE)
      pci = pci->parent;
    TopoNic nic;
    nic.name = o->name ? o->name : "?";
    bool on_pci = pci != nullptr && pci->type == HWLOC_OBJ_PCI_DEVICE;
    if (on_pci) nic.bus_id = busIdOf(pci);
    nic.numa = numaOf(t, on_pci ? pci : o, &nic.cpus);
    nic.active_ports = activePorts(o);
    out->nics.push_back(nic);
    nic_objs.push_back(on_pci ? pci : o);
  }
  sortByBus(&out->gpus, &gpu_objs);
  sortByBus(&out->nics, &nic_objs);
  out->dist.assign(gpu_objs.size(), std::vector<PciDist>(nic_objs.size(), PciDist::kSys));
  for (size_t g = 0; g < gpu_objs.size(); g++)
    for (size_t n = 0; n < nic_objs.size(); n++) out->dist[g][n] = classify(t, gpu_objs[g], nic_objs[n]);
}

}  // namespace

epResult_t topoLoad(const char* xml_path, Topology* out) {
  Topology topo;
  bool from_xml = xml_path != nullptr && *xml_path != '\0';
  topo.source = from_xml ? std::string("xml ") + xml_path : "this machine";
  hwloc_topology_t t;
  if (hwloc_topology_init(&t) != 0)
    return setError(nullptr, epSystemError, "hwloc_topology_init failed: %s", strerror(errno));
  // Bridges, PCI and OS devices are filtered out by default; the distance
  // classes need every bridge, so keep all I/O objects.
  hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_ALL);
#if HWLOC_API_VERSION >= 0x00020100
  // What the plan reads comes from the PCI tree and the OpenFabrics devices.
  // The components that add GPU and display objects of their own are not
  // loaded: they start the OpenCL, CUDA, NVML, ROCm or Level Zero runtimes,
  // or dial ten X displays over Unix and TCP sockets with name lookups, all
  // in the first init of a process, where any of them can stall it.
  for (const char* unused : {"gl", "opencl", "cuda", "nvml", "rsmi", "levelzero"})
    hwloc_topology_set_components(t, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, unused);
#endif
  if (from_xml && hwloc_topology_set_xml(t, xml_path) != 0) {
    int err = errno;
    hwloc_topology_destroy(t);
    return xmlRefused(xml_path, err);
  }
  if (hwloc_topology_load(t) != 0) {
    int err = errno;
    hwloc_topology_destroy(t);
    if (from_xml) return xmlRefused(xml_path, err);
    topo.why_unavailable =
        "hwloc cannot read this machine: " + failureText(err, "hwloc_topology_load failed without a reason");
    *out = std::move(topo);
    return epSuccess;
  }
  readTopology(t, &topo);
  hwloc_topology_destroy(t);
  topo.available = true;
  topoChooseNics(topo.dist, topo.nics, &topo.nic_of_gpu, &topo.nic_why);
  *out = std::move(topo);
  return epSuccess;
}

#else  // !EP_WITH_HWLOC

epResult_t topoLoad(const char* xml_path, Topology* out) {
  Topology topo;
  bool from_xml = xml_path != nullptr && *xml_path != '\0';
  topo.source = from_xml ? std::string("xml ") + xml_path : "this machine";
  topo.why_unavailable = "hwloc not available (libmoeep was built without hwloc)";
  *out = std::move(topo);
  return epSuccess;
}

#endif  // EP_WITH_HWLOC

epResult_t topoLocal(std::shared_ptr<const Topology>* out) {
  static std::once_flag once;
  static std::shared_ptr<const Topology> cached;
  static epResult_t cached_res = epSuccess;
  static std::string cached_error;
  std::call_once(once, [] {
    auto topo = std::make_shared<Topology>();
    cached_res = topoLoad(param::TOPO_XML(), topo.get());
    if (cached_res != epSuccess) {
      cached_error = std::string("EP_TOPO_XML: ") + threadLastError();
      return;
    }
    if (topo->available)
      EP_INFO(kSubsysTopo, "topology of %s: %zu NUMA nodes, %zu GPUs, %zu RDMA NICs", topo->source.c_str(),
              topo->numa.size(), topo->gpus.size(), topo->nics.size());
    else if (*param::TOPO_XML() != '\0')
      EP_WARN(kSubsysTopo, "EP_TOPO_XML=%s ignored: %s", param::TOPO_XML(), topo->why_unavailable.c_str());
    else
      EP_INFO(kSubsysTopo, "no topology: %s", topo->why_unavailable.c_str());
    for (size_t g = 0; g < topo->gpus.size(); g++)
      if (topoFindGpu(*topo, topo->gpus[g].bus_id.c_str()) != int(g))
        EP_WARN(kSubsysTopo, "topology (%s) lists GPU %s more than once; a rank on it uses the first",
                topo->source.c_str(), topo->gpus[g].bus_id.c_str());
    for (size_t g = 0; g < topo->gpus.size(); g++)
      EP_INFO(kSubsysTopo, "GPU %zu (%s) uses NIC %s: %s", g, topo->gpus[g].bus_id.c_str(),
              topo->nic_of_gpu[g] >= 0 ? topo->nics[topo->nic_of_gpu[g]].name.c_str() : "none",
              topo->nic_why[g].c_str());
    cached = std::move(topo);
  });
  // The error of the first load is repeated for every caller, each with its own message.
  if (cached_res != epSuccess) return setError(nullptr, cached_res, "%s", cached_error.c_str());
  *out = cached;
  return epSuccess;
}

}  // namespace ep
