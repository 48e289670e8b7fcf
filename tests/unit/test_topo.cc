// Topology on hand-written hwloc XML fixtures (tests/data/): GPUs by PCI bus
// id, RDMA NICs as OpenFabrics devices, NUMA locality, the PCI distance class
// of every GPU-NIC pair and the NIC each GPU uses; the NIC choice on synthetic
// distance matrices; EP_TOPO_XML; the printed report and the CUDA hook.
//
// Without hwloc in the build the fixture cases print SKIPPED.
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <functional>
#include <string>
#include <vector>

#include "common.h"
#include "fixtures.h"
#include "topo/topo.h"

namespace {

using eptest::fixturePath;
using eptest::loadFixture;
using eptest::printed;
using eptest::requireHwloc;

using ep::PciDist;
using ep::Topology;

// ---- DGX-H100-like: 8 GPUs, 8 NICs, 2 NUMA nodes, nested PCIe switches ----------------

void dgx_gpus_nics_and_numa(void**) {
  Topology t;
  loadFixture("dgx_h100.xml", &t);
  assert_int_equal(t.packages, 2);
  assert_int_equal(t.numa.size(), 2);
  assert_string_equal(t.numa[1].cpus.c_str(), "4-7");
  const char* gpu_bus[8] = {"0000:1b:00.0", "0000:43:00.0", "0000:52:00.0", "0000:61:00.0",
                            "0000:9d:00.0", "0000:c3:00.0", "0000:d1:00.0", "0000:df:00.0"};
  assert_int_equal(t.gpus.size(), 8);
  for (int g = 0; g < 8; g++) {
    assert_string_equal(t.gpus[g].bus_id.c_str(), gpu_bus[g]);
    assert_int_equal(t.gpus[g].vendor, 0x10de);
    assert_int_equal(t.gpus[g].numa, g / 4);
    assert_string_equal(t.gpus[g].cpus.c_str(), g < 4 ? "0-3" : "4-7");
  }
  // The Ethernet port and the NVMe disk are not RDMA NICs.
  assert_int_equal(t.nics.size(), 8);
  for (int n = 0; n < 8; n++) {
    assert_string_equal(t.nics[n].name.c_str(), ("mlx5_" + std::to_string(n)).c_str());
    assert_int_equal(t.nics[n].numa, n / 4);
  }
  assert_string_equal(t.nics[0].bus_id.c_str(), "0000:18:00.0");
}

void dgx_distance_classes(void**) {
  Topology t;
  loadFixture("dgx_h100.xml", &t);
  // GPU g and mlx5_g share a leaf switch; leaf pairs share a top switch under
  // one host bridge; two host bridges per package.
  for (int g = 0; g < 8; g++)
    for (int n = 0; n < 8; n++) {
      PciDist want = g == n           ? PciDist::kPix
                     : g / 2 == n / 2 ? PciDist::kPxb
                     : g / 4 == n / 4 ? PciDist::kNode
                                      : PciDist::kSys;
      if (t.dist[g][n] != want) {
        print_error("GPU %d - mlx5_%d: %s, expected %s\n", g, n, ep::pciDistName(t.dist[g][n]),
                    ep::pciDistName(want));
        fail();
      }
    }
}

void dgx_each_gpu_gets_its_own_switch_nic(void**) {
  Topology t;
  loadFixture("dgx_h100.xml", &t);
  for (int g = 0; g < 8; g++) {
    assert_int_equal(t.nic_of_gpu[g], g);
    assert_contains(t.nic_why[g].c_str(), "PIX (same PCIe switch)");
    assert_null(strstr(t.nic_why[g].c_str(), "shared"));
  }
}

// ---- PCIe-only box: no switches, one NIC ------------------------------------------------

void pcie_box_one_nic_shared_by_all(void**) {
  Topology t;
  loadFixture("pcie_box.xml", &t);
  assert_int_equal(t.gpus.size(), 4);
  assert_int_equal(t.nics.size(), 1);
  assert_string_equal(t.nics[0].name.c_str(), "mlx5_0");
  const PciDist want[4] = {PciDist::kPhb, PciDist::kNode, PciDist::kSys, PciDist::kSys};
  for (int g = 0; g < 4; g++) {
    assert_int_equal(int(t.dist[g][0]), int(want[g]));
    assert_int_equal(t.nic_of_gpu[g], 0);
    assert_contains(t.nic_why[g].c_str(), ep::pciDistName(want[g]));
    assert_contains(t.nic_why[g].c_str(), "shared with GPU");
  }
  assert_contains(t.nic_why[0].c_str(), "shared with GPU 1,2,3");
  assert_int_equal(t.gpus[1].numa, 0);
  assert_int_equal(t.gpus[2].numa, 1);
}

// The same box with a soft RoCE device (no PCI parent, under the Machine): as
// near as mlx5_0 (SYS) to GPU 2 and 3, which took it before.
void pcie_box_soft_roce_is_left_out(void**) {
  Topology t;
  loadFixture("pcie_box_rxe.xml", &t);
  assert_int_equal(t.nics.size(), 2);
  assert_string_equal(t.nics[1].name.c_str(), "rxe0");
  assert_string_equal(t.nics[1].bus_id.c_str(), "");
  assert_int_equal(int(t.dist[2][1]), int(PciDist::kSys));
  for (int g = 0; g < 4; g++) {
    assert_int_equal(t.nic_of_gpu[g], 0);
    assert_contains(t.nic_why[g].c_str(), "rxe0 left out (no PCI device");
  }
}

// ---- A GPU and a NIC as two functions of one card --------------------------------------

void functions_of_one_card_are_pix(void**) {
  Topology t;
  loadFixture("multifunction.xml", &t);
  assert_int_equal(t.gpus.size(), 1);
  assert_int_equal(t.nics.size(), 2);
  assert_string_equal(t.nics[1].name.c_str(), "mlx5_1");
  assert_int_equal(int(t.dist[0][0]), int(PciDist::kPhb));  // the other card, same host bridge
  assert_int_equal(int(t.dist[0][1]), int(PciDist::kPix));  // its own card
  assert_int_equal(t.nic_of_gpu[0], 1);
}

// ---- Bus numbers against the NUMA order ----------------------------------------------

// GPUs and NICs are listed in PCI bus order (TOPOLOGY.md), not in hwloc's tree
// order, which puts package 0's devices at 81:00 / 82:00 first.
void gpus_and_nics_in_bus_order_across_numa_nodes(void**) {
  Topology t;
  loadFixture("numa_bus_order.xml", &t);
  assert_int_equal(t.gpus.size(), 2);
  assert_int_equal(t.nics.size(), 2);
  assert_string_equal(t.gpus[0].bus_id.c_str(), "0000:01:00.0");
  assert_int_equal(t.gpus[0].numa, 1);
  assert_string_equal(t.gpus[1].bus_id.c_str(), "0000:81:00.0");
  assert_int_equal(t.gpus[1].numa, 0);
  assert_string_equal(t.nics[0].name.c_str(), "mlx5_0");
  assert_string_equal(t.nics[0].bus_id.c_str(), "0000:02:00.0");
  assert_string_equal(t.nics[1].name.c_str(), "mlx5_1");
  // The matrix and the choice follow the sorted lists.
  assert_int_equal(int(t.dist[0][0]), int(PciDist::kPhb));
  assert_int_equal(int(t.dist[0][1]), int(PciDist::kSys));
  assert_int_equal(t.nic_of_gpu[0], 0);
  assert_int_equal(t.nic_of_gpu[1], 1);
}

// ---- VM with a flat PCI tree: everything on one host bridge ---------------------------

void vm_flat_spreads_gpus_over_equal_nics(void**) {
  Topology t;
  loadFixture("vm_flat.xml", &t);
  assert_int_equal(t.numa.size(), 1);
  assert_int_equal(t.gpus.size(), 4);
  assert_int_equal(t.nics.size(), 2);
  for (int g = 0; g < 4; g++)
    for (int n = 0; n < 2; n++) assert_int_equal(int(t.dist[g][n]), int(PciDist::kPhb));
  assert_true((t.nic_of_gpu == std::vector<int>{0, 1, 0, 1}));
  assert_contains(t.nic_why[0].c_str(), "PHB (through the PCIe host bridge), 1 of 2 equally near NICs");
  assert_contains(t.nic_why[0].c_str(), "shared with GPU 2");
  assert_int_equal(t.gpus[0].numa, 0);
}

// The same VM with the port of mlx5_1 DOWN: every GPU takes mlx5_0.
void vm_flat_nic_without_active_port_is_left_out(void**) {
  Topology t;
  loadFixture("vm_flat_port_down.xml", &t);
  assert_int_equal(t.nics.size(), 2);
  assert_int_equal(t.nics[0].active_ports, 1);
  assert_int_equal(t.nics[1].active_ports, 0);
  assert_true((t.nic_of_gpu == std::vector<int>{0, 0, 0, 0}));
  assert_contains(t.nic_why[3].c_str(), "PHB (through the PCIe host bridge), shared with GPU 0,1,2");
  assert_contains(t.nic_why[3].c_str(), "; mlx5_1 left out (no port ACTIVE)");
  std::string text = printed([&](FILE* f) { ep::topoPrint(f, t); });
  assert_contains(text.c_str(), "(no port ACTIVE)");
  Topology up;  // the fixture with both ports ACTIVE
  loadFixture("vm_flat.xml", &up);
  assert_int_equal(up.nics[1].active_ports, 1);
}

// ---- NIC choice on synthetic distances (no hwloc needed) ------------------------------

std::vector<ep::TopoNic> nics(int n) {
  std::vector<ep::TopoNic> v(n);
  for (int i = 0; i < n; i++) {
    v[i].name = "nic" + std::to_string(i);
    v[i].bus_id = "0000:" + std::to_string(10 + i) + ":00.0";
  }
  return v;
}

void choice_avoids_needless_sharing(void**) {
  // GPU 0 is equally near NICs 0 and 1, GPU 1 only near NIC 0: a greedy pass in
  // GPU order would give both NIC 0; the matching moves GPU 0 to NIC 1.
  const PciDist X = PciDist::kPix, F = PciDist::kSys;
  std::vector<int> nic;
  std::vector<std::string> why;
  ep::topoChooseNics({{X, X}, {X, F}}, nics(2), &nic, &why);
  assert_true((nic == std::vector<int>{1, 0}));
  assert_null(strstr(why[0].c_str(), "shared"));
  assert_null(strstr(why[1].c_str(), "shared"));
  // The nearest NIC wins over an unshared farther one.
  ep::topoChooseNics({{X, F}, {X, F}}, nics(2), &nic, &why);
  assert_true((nic == std::vector<int>{0, 0}));
  assert_contains(why[1].c_str(), "shared with GPU 0");
}

void choice_shares_least_loaded_when_it_must(void**) {
  const PciDist P = PciDist::kPhb;
  std::vector<std::vector<PciDist>> dist(5, std::vector<PciDist>(2, P));
  std::vector<int> nic;
  std::vector<std::string> why;
  ep::topoChooseNics(dist, nics(2), &nic, &why);
  assert_true((nic == std::vector<int>{0, 1, 0, 1, 0}));
  ep::topoChooseNics(dist, nics(0), &nic, &why);
  assert_true((nic == std::vector<int>(5, -1)));
  assert_contains(why[0].c_str(), "no RDMA NIC");
}

void choice_puts_nics_without_pci_last(void**) {
  // NIC 1 has no PCI device and is nearer to both GPUs: left out while NIC 0 is there.
  const PciDist P = PciDist::kPhb, S = PciDist::kSys;
  std::vector<ep::TopoNic> soft = nics(2);
  soft[1].name = "siw0";
  soft[1].bus_id = "";
  std::vector<int> nic;
  std::vector<std::string> why;
  ep::topoChooseNics({{S, P}, {S, P}}, soft, &nic, &why);
  assert_true((nic == std::vector<int>{0, 0}));
  assert_contains(why[1].c_str(), "SYS (across NUMA nodes), shared with GPU 0; siw0 left out (no PCI device");
  // Only NICs without a PCI device: they are used, and the reason says so.
  soft[0].bus_id = "";
  ep::topoChooseNics({{S, P}, {S, P}}, soft, &nic, &why);
  assert_true((nic == std::vector<int>{1, 1}));
  assert_contains(why[0].c_str(), "no usable RDMA NIC on PCI");
}

void choice_avoids_nics_without_active_port(void**) {
  const PciDist X = PciDist::kPix, P = PciDist::kPhb;
  std::vector<ep::TopoNic> v = nics(3);
  v[0].active_ports = 0;   // nearest, but down
  v[1].active_ports = -1;  // state unknown: usable
  v[2].active_ports = 2;
  std::vector<int> nic;
  std::vector<std::string> why;
  ep::topoChooseNics({{X, P, P}, {X, P, P}}, v, &nic, &why);
  assert_true((nic == std::vector<int>{1, 2}));
  assert_contains(why[0].c_str(), "nic0 left out (no port ACTIVE)");
  // No NIC with an active port: the nearest all the same, and the reason says so.
  v[1].active_ports = v[2].active_ports = 0;
  ep::topoChooseNics({{X, P, P}, {X, P, P}}, v, &nic, &why);
  assert_true((nic == std::vector<int>{0, 0}));
  assert_contains(why[1].c_str(), "no NIC has an ACTIVE port");
  // A soft NIC with an active port beats PCI NICs whose ports are all down.
  v.push_back(ep::TopoNic());
  v[3].name = "rxe0";
  v[3].active_ports = 1;
  ep::topoChooseNics({{X, P, P, PciDist::kSys}}, v, &nic, &why);
  assert_true((nic == std::vector<int>{3}));
  assert_contains(why[0].c_str(), "nic0, nic1, nic2 left out (no port ACTIVE); no usable RDMA NIC on PCI");
}

// ---- Lookup, errors, EP_TOPO_XML, printing ----------------------------------------------

void find_gpu_by_any_bus_id_spelling(void**) {
  Topology t;  // as the DGX fixture lists them (no hwloc needed)
  for (const char* bus : {"0000:1b:00.0", "0000:43:00.0", "0000:52:00.0", "0000:61:00.0", "0000:9d:00.0",
                          "0000:c3:00.0", "0000:d1:00.0", "0000:df:00.0"}) {
    t.gpus.emplace_back();
    t.gpus.back().bus_id = bus;
  }
  assert_int_equal(ep::topoFindGpu(t, "0000:1b:00.0"), 0);
  assert_int_equal(ep::topoFindGpu(t, "0000:C3:00.0"), 5);      // CUDA writes upper case
  assert_int_equal(ep::topoFindGpu(t, "00000000:df:00.0"), 7);  // nvidia-smi: 8-digit domain
  assert_int_equal(ep::topoFindGpu(t, "43:00.0"), 1);
  assert_int_equal(ep::topoFindGpu(t, "0000:18:00.0"), -1);  // a NIC, not a GPU
  assert_int_equal(ep::topoFindGpu(t, "not a bus id"), -1);
  assert_int_equal(ep::topoFindGpu(t, ""), -1);
}

void unreadable_xml_is_invalid_argument(void**) {
  requireHwloc();
  Topology t;
  t.packages = -99;  // sentinel: nothing written on error
  assert_result(ep::topoLoad("/nonexistent/topo.xml", &t), epInvalidArgument);
  assert_contains(ep::threadLastError(), "/nonexistent/topo.xml");
  char path[] = "/tmp/test_topo_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  const char junk[] = "<topology version=\"2.0\"><object type=";
  assert_int_equal(write(fd, junk, sizeof(junk) - 1), sizeof(junk) - 1);
  close(fd);
  assert_result(ep::topoLoad(path, &t), epInvalidArgument);
  assert_contains(ep::threadLastError(), path);
  assert_contains(ep::threadLastError(), "not a valid hwloc XML file");  // not "Invalid argument"
  unlink(path);
  assert_int_equal(t.packages, -99);
}

// hwloc refuses a Machine without a PU and leaves errno 0: the message must
// not end in strerror(0), "Success".
void xml_without_pu_is_refused_without_success(void**) {
  requireHwloc();
  char path[] = "/tmp/test_topo_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  const char xml[] =
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<topology version=\"2.0\">\n"
      "<object type=\"Machine\" os_index=\"0\" cpuset=\"0x1\" complete_cpuset=\"0x1\" allowed_cpuset=\"0x1\" "
      "nodeset=\"0x1\" complete_nodeset=\"0x1\" allowed_nodeset=\"0x1\" gp_index=\"1\">\n</object>\n"
      "</topology>\n";
  assert_int_equal(write(fd, xml, sizeof(xml) - 1), sizeof(xml) - 1);
  close(fd);
  Topology t;
  errno = 0;
  assert_result(ep::topoLoad(path, &t), epInvalidArgument);
  unlink(path);
  assert_contains(ep::threadLastError(), path);
  assert_contains(ep::threadLastError(), "hwloc rejected it");
  assert_null(strstr(ep::threadLastError(), "Success"));
}

void this_machine_loads(void**) {
  Topology t;
  assert_ok(ep::topoLoad(nullptr, &t));
  assert_string_equal(t.source.c_str(), "this machine");
#ifdef EP_WITH_HWLOC
  assert_true(t.available);
  assert_true(t.numa.size() >= 1);
  assert_int_equal(t.nic_of_gpu.size(), t.gpus.size());
#else
  assert_false(t.available);
  assert_contains(t.why_unavailable.c_str(), "hwloc not available");
#endif
}

void ep_topo_xml_replaces_the_machine(void**) {
  requireHwloc();
  // The only case that reads EP_TOPO_XML (parameters are read once per process).
  std::string path = fixturePath("vm_flat.xml");
  setenv("EP_TOPO_XML", path.c_str(), 1);
  std::shared_ptr<const Topology> t;
  assert_ok(ep::topoLocal(&t));
  assert_string_equal(t->source.c_str(), ("xml " + path).c_str());
  assert_int_equal(t->gpus.size(), 4);
  std::shared_ptr<const Topology> again;
  assert_ok(ep::topoLocal(&again));
  assert_ptr_equal(t.get(), again.get());  // loaded once
  unsetenv("EP_TOPO_XML");
}

ep::PeerAccess fakeAccess(const char* a, const char* b) {
  // GPUs on one package see each other over NVLink, across packages only over PCIe.
  return (a[5] < '8') == (b[5] < '8') ? ep::PeerAccess::kNvlink : ep::PeerAccess::kP2P;
}

// Ranks find their GPU by bus id; a second GPU listed with the same id (a
// hand-edited XML) can never be found, and the report says so.
void report_marks_a_repeated_bus_id(void**) {
  Topology t;
  loadFixture("dgx_h100.xml", &t);
  assert_null(strstr(printed([&](FILE* f) { ep::topoPrint(f, t); }).c_str(), "again"));
  t.gpus[3].bus_id = "0000:43:00.0";  // GPU 1's
  std::string text = printed([&](FILE* f) { ep::topoPrint(f, t); });
  assert_contains(text.c_str(), "GPU 3  0000:43:00.0  10de:2330  NUMA 0  CPUs 0-3  (bus id of GPU 1 again: unused)");
  assert_null(strstr(text.c_str(), "GPU 1  0000:43:00.0  10de:2330  NUMA 0  CPUs 0-3  ("));
}

void report_names_nics_classes_and_peer_access(void**) {
  ep::topoSetPeerAccessFn(nullptr);  // the default, whatever a CUDA build installed at load
  Topology t;
  loadFixture("dgx_h100.xml", &t);
  std::string text = printed([&](FILE* f) { ep::topoPrint(f, t); });
  assert_contains(text.c_str(), "dgx_h100.xml");
  assert_contains(text.c_str(), "GPU 0  0000:1b:00.0  10de:2330  NUMA 0  CPUs 0-3");
  assert_contains(text.c_str(), "GPU 7 -> mlx5_7: PIX (same PCIe switch)");
  assert_contains(text.c_str(), "  GPU 0  PIX      PXB      NODE     NODE     SYS");
  assert_contains(text.c_str(), "GPU peer access: unknown");
  assert_int_equal(int(ep::topoPeerAccess("0000:1b:00.0", "0000:43:00.0")), int(ep::PeerAccess::kUnknown));
  ep::topoSetPeerAccessFn(fakeAccess);
  assert_int_equal(int(ep::topoPeerAccess("0000:1b:00.0", "0000:43:00.0")), int(ep::PeerAccess::kNvlink));
  text = printed([&](FILE* f) { ep::topoPrint(f, t); });
  assert_contains(text.c_str(), "GPU peer access (from CUDA):");
  assert_contains(text.c_str(), "  GPU 0  -       nvlink  nvlink  nvlink  p2p");
  ep::topoSetPeerAccessFn(nullptr);
  assert_int_equal(int(ep::topoPeerAccess("0000:1b:00.0", "0000:43:00.0")), int(ep::PeerAccess::kUnknown));
  Topology none;
  none.source = "this machine";
  none.why_unavailable = "hwloc not available";
  text = printed([&](FILE* f) { ep::topoPrint(f, none); });
  assert_contains(text.c_str(), "not available: hwloc not available");
}

int groupSetup(void**) {
  eptest::unsetAllParams();
  return 0;
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(dgx_gpus_nics_and_numa),
      cmocka_unit_test(dgx_distance_classes),
      cmocka_unit_test(dgx_each_gpu_gets_its_own_switch_nic),
      cmocka_unit_test(pcie_box_one_nic_shared_by_all),
      cmocka_unit_test(pcie_box_soft_roce_is_left_out),
      cmocka_unit_test(functions_of_one_card_are_pix),
      cmocka_unit_test(gpus_and_nics_in_bus_order_across_numa_nodes),
      cmocka_unit_test(vm_flat_spreads_gpus_over_equal_nics),
      cmocka_unit_test(vm_flat_nic_without_active_port_is_left_out),
      cmocka_unit_test(choice_avoids_needless_sharing),
      cmocka_unit_test(choice_shares_least_loaded_when_it_must),
      cmocka_unit_test(choice_puts_nics_without_pci_last),
      cmocka_unit_test(choice_avoids_nics_without_active_port),
      cmocka_unit_test(find_gpu_by_any_bus_id_spelling),
      cmocka_unit_test(unreadable_xml_is_invalid_argument),
      cmocka_unit_test(xml_without_pu_is_refused_without_success),
      cmocka_unit_test(this_machine_loads),
      cmocka_unit_test(ep_topo_xml_replaces_the_machine),
      cmocka_unit_test(report_names_nics_classes_and_peer_access),
      cmocka_unit_test(report_marks_a_repeated_bus_id),
  };
  return cmocka_run_group_tests_name("topo", tests, groupSetup, nullptr);
}
