# Writes the hwloc XML fixtures of this directory (dgx_h100.xml, pcie_box.xml,
# pcie_box_rxe.xml, vm_flat.xml, vm_flat_port_down.xml) from the hand-designed
# descriptions below: python3 make_fixtures.py
# hwloc's XML reader drops the I/O objects that follow a comment inside
# <topology>, so each file explains itself in a header comment instead.
import itertools

gp = itertools.count(1)

def mask(bits):
    v = 0
    for b in bits: v |= 1 << b
    return "0x%08x" % v

L = []
def add(d, text): L.append("  " * d + text)

def sets(cpus, nodes):
    c, n = mask(cpus), mask(nodes)
    return f'cpuset="{c}" complete_cpuset="{c}" nodeset="{n}" complete_nodeset="{n}"'

def package(d, idx, cpus, numa, io, mem=68719476736):
    add(d, f'<object type="Package" os_index="{idx}" {sets(cpus, [numa])} gp_index="{next(gp)}">')
    add(d+1, f'<object type="NUMANode" os_index="{numa}" {sets(cpus, [numa])} gp_index="{next(gp)}" local_memory="{mem}"/>')
    for c in cpus:
        add(d+1, f'<object type="Core" os_index="{c}" {sets([c], [numa])} gp_index="{next(gp)}">')
        add(d+2, f'<object type="PU" os_index="{c}" {sets([c], [numa])} gp_index="{next(gp)}"/>')
        add(d+1, '</object>')
    io(d+1)
    add(d, '</object>')

def hostbridge(d, lo, hi, children):
    add(d, f'<object type="Bridge" gp_index="{next(gp)}" bridge_type="0-1" depth="0" bridge_pci="0000:[{lo:02x}-{hi:02x}]">')
    children(d+1)
    add(d, '</object>')

def bridge(d, bus, sec, sub, depth, children, vendor="1000:c030"):
    add(d, f'<object type="Bridge" gp_index="{next(gp)}" pci_busid="0000:{bus}" pci_type="0604 [{vendor}] [0000:0000] 00" bridge_type="1-1" depth="{depth}" bridge_pci="0000:[{sec:02x}-{sub:02x}]">')
    children(d+1)
    add(d, '</object>')

def gpu(d, bus, model="2330"):
    add(d, f'<object type="PCIDev" gp_index="{next(gp)}" pci_busid="0000:{bus:02x}:00.0" pci_type="0302 [10de:{model}] [10de:16c1] a1" pci_link_speed="63.015385"/>')

# state: the OpenFabrics port state hwloc reports (4 ACTIVE, 1 DOWN).
def nic(d, bus, name, fn=0, ids="15b3:1021", state=4):
    idx = int(name.split("_")[1])
    add(d, f'<object type="PCIDev" gp_index="{next(gp)}" pci_busid="0000:{bus:02x}:00.{fn}" pci_type="0207 [{ids}] [15b3:0041] 00" pci_link_speed="63.015385">')
    add(d+1, f'<object type="OSDev" gp_index="{next(gp)}" name="{name}" osdev_type="3">')
    add(d+2, '<info name="NodeGUID" value="a088:c203:00%02x:%04x"/>' % (idx, 0x1000 + bus))
    add(d+2, f'<info name="Port1State" value="{state}"/>')
    add(d+2, '<info name="Port1LID" value="0x%x"/>' % (bus + 1))
    add(d+1, '</object>')
    add(d, '</object>')

# An OpenFabrics device without a PCI parent (soft RoCE rxe0, siw0): hwloc
# attaches it to the Machine.
def soft_nic(d, name):
    add(d, f'<object type="OSDev" gp_index="{next(gp)}" name="{name}" osdev_type="3">')
    add(d+1, '<info name="NodeGUID" value="5054:00ff:fe12:3456"/>')
    add(d+1, '<info name="Port1State" value="4"/>')
    add(d, '</object>')

def eth(d, bus, name, ids="8086:1533"):
    add(d, f'<object type="PCIDev" gp_index="{next(gp)}" pci_busid="0000:{bus:02x}:00.0" pci_type="0200 [{ids}] [0000:0000] 03" pci_link_speed="0.500000">')
    add(d+1, f'<object type="OSDev" gp_index="{next(gp)}" name="{name}" osdev_type="2"/>')
    add(d, '</object>')

def disk(d, bus, name="nvme0n1", pci_type="0108 [144d:a80a] [144d:a801] 00"):
    add(d, f'<object type="PCIDev" gp_index="{next(gp)}" pci_busid="0000:{bus:02x}:00.0" pci_type="{pci_type}" pci_link_speed="7.876923">')
    add(d+1, f'<object type="OSDev" gp_index="{next(gp)}" name="{name}" osdev_type="0"/>')
    add(d, '</object>')

def machine(path, title, cpus, nodes, host, body):
    global gp, L
    gp = itertools.count(1); L = []
    add(0, '<?xml version="1.0" encoding="UTF-8"?>')
    add(0, '<!DOCTYPE topology SYSTEM "hwloc2.dtd">')
    add(0, '<!--')
    for line in title: add(0, "  " + line if line else "")
    add(0, '-->')
    add(0, '<topology version="2.0">')
    c, n = mask(cpus), mask(nodes)
    add(1, f'<object type="Machine" os_index="0" cpuset="{c}" complete_cpuset="{c}" allowed_cpuset="{c}" nodeset="{n}" complete_nodeset="{n}" allowed_nodeset="{n}" gp_index="{next(gp)}">')
    add(2, '<info name="Backend" value="Linux"/>')
    add(2, f'<info name="HostName" value="{host}"/>')
    body(2)
    add(1, '</object>')
    add(0, '</topology>')
    open(path, "w").write("\n".join(L) + "\n")

import os
D = os.path.dirname(os.path.abspath(__file__)) + "/"

# ---- DGX-H100-like ----------------------------------------------------------
# (nic bus, gpu bus) per leaf switch; GPU order = bus order
PAIRS = [(0x18, 0x1b), (0x40, 0x43), (0x4f, 0x52), (0x5e, 0x61),
         (0x9a, 0x9d), (0xc0, 0xc3), (0xce, 0xd1), (0xdc, 0xdf)]

def leaf(d, idx, dsp_bus, depth):
    n, g = PAIRS[idx]
    usp = n - 1
    def ports(d2):
        bridge(d2, "%02x:01.0" % usp, n, n, depth + 2, lambda d3: nic(d3, n, f"mlx5_{idx}"))
        bridge(d2, "%02x:02.0" % usp, g, g, depth + 2, lambda d3: gpu(d3, g))
    # downstream port of the top switch -> leaf switch upstream port -> its ports
    bridge(d, dsp_bus, usp, g, depth,
           lambda d1: bridge(d1, "%02x:00.0" % usp, n, g, depth + 1, ports))

def dgx_hostbridge(d, hb):
    lo = PAIRS[2*hb][0] - 8
    hi = PAIRS[2*hb+1][1]
    def top(d1):
        if hb == 0: eth(d1, lo + 1, "eno1")
        if hb == 2: disk(d1, lo + 1)
        def ports(d2):
            leaf(d2, 2*hb, "%02x:00.0" % (lo + 3), 2)
            leaf(d2, 2*hb + 1, "%02x:01.0" % (lo + 3), 2)
        bridge(d1, "%02x:00.0" % (lo + 2), lo + 3, hi, 1, ports)
    hostbridge(d, lo, hi, top)

machine(D + "dgx_h100.xml", [
    "DGX-H100-like box (hand-written for tests/unit/test_topo.cc, not captured).",
    "2 packages, one NUMA node each (PUs 0-3 and 4-7), 2 host bridges per package.",
    "Under each host bridge a top PCIe switch (Broadcom 1000:c030) over two leaf",
    "switches; each leaf switch holds one H100 (class 0302, 10de:2330) and one",
    "ConnectX-7 (class 0207, 15b3:1021) whose OpenFabrics device is mlx5_N.",
    "",
    "  package 0: host bridge 0: leaf [GPU 0 1b:00.0, mlx5_0 18:00.0] leaf [GPU 1 43:00.0, mlx5_1 40:00.0]",
    "             host bridge 1: leaf [GPU 2 52:00.0, mlx5_2 4f:00.0] leaf [GPU 3 61:00.0, mlx5_3 5e:00.0]",
    "  package 1: host bridge 2: leaf [GPU 4 9d:00.0, mlx5_4 9a:00.0] leaf [GPU 5 c3:00.0, mlx5_5 c0:00.0]",
    "             host bridge 3: leaf [GPU 6 d1:00.0, mlx5_6 ce:00.0] leaf [GPU 7 df:00.0, mlx5_7 dc:00.0]",
    "",
    "Expected: GPU i uses mlx5_i (PIX); GPU 0 sees mlx5_1 PXB, mlx5_2/3 NODE, mlx5_4..7 SYS.",
    "Not RDMA NICs: the Ethernet port eno1 (host bridge 0) and an NVMe disk (host bridge 2).",
], range(8), [0, 1], "dgx-fixture",
    lambda d: [package(d, p, range(4*p, 4*p + 4), p,
                       lambda d1, p=p: [dgx_hostbridge(d1, 2*p), dgx_hostbridge(d1, 2*p + 1)])
               for p in range(2)])

# ---- PCIe-only box ----------------------------------------------------------
def root_port(d, port_bus, dev_bus, child):
    bridge(d, port_bus, dev_bus, dev_bus, 1, child, vendor="8086:347a")

PCIE_BOX = [
    "PCIe-only server (hand-written for tests/unit/test_topo.cc): no PCIe switches,",
    "no NVLink, one RDMA NIC. 2 packages, one NUMA node each (PUs 0-3 and 4-7).",
    "Every device sits behind its own root port (a PCI bridge) of a host bridge:",
    "",
    "  package 0: host bridge 0: [GPU 0 17:00.0] [mlx5_0 31:00.0] [eno1 01:00.0, Ethernet]",
    "             host bridge 1: [GPU 1 4b:00.0]",
    "  package 1: host bridge 2: [GPU 2 98:00.0]",
    "             host bridge 3: [GPU 3 b1:00.0]",
    "",
]

def pcie_box(d):
    package(d, 0, range(0, 4), 0, lambda d1: [
        hostbridge(d1, 0x00, 0x3f, lambda d2: [
            root_port(d2, "00:1c.0", 0x01, lambda d3: eth(d3, 0x01, "eno1")),
            root_port(d2, "16:00.0", 0x17, lambda d3: gpu(d3, 0x17, "20b5")),
            root_port(d2, "30:00.0", 0x31, lambda d3: nic(d3, 0x31, "mlx5_0"))]),
        hostbridge(d1, 0x40, 0x7f, lambda d2:
            root_port(d2, "4a:00.0", 0x4b, lambda d3: gpu(d3, 0x4b, "20b5")))])
    package(d, 1, range(4, 8), 1, lambda d1: [
        hostbridge(d1, 0x80, 0x9f, lambda d2:
            root_port(d2, "97:00.0", 0x98, lambda d3: gpu(d3, 0x98, "20b5"))),
        hostbridge(d1, 0xa0, 0xff, lambda d2:
            root_port(d2, "b0:00.0", 0xb1, lambda d3: gpu(d3, 0xb1, "20b5")))])

machine(D + "pcie_box.xml", PCIE_BOX + [
    "Expected: every GPU uses mlx5_0 (the only one): GPU 0 PHB, GPU 1 NODE, GPU 2 and 3 SYS.",
], range(8), [0, 1], "pcie-fixture", pcie_box)

machine(D + "pcie_box_rxe.xml", PCIE_BOX + [
    "Plus rxe0, soft RoCE over eno1: an OpenFabrics device with no PCI parent, under",
    "the Machine, so SYS from every GPU, as near as mlx5_0 is to GPU 2 and 3.",
    "",
    "Expected: every GPU still uses mlx5_0; rxe0 only where no NIC on PCI is usable.",
], range(8), [0, 1], "pcie-rxe-fixture", lambda d: [pcie_box(d), soft_nic(d, "rxe0")])

# ---- VM with a flat PCI tree --------------------------------------------------
def vm_io(d, nic1_state=4):
    def devs(d1):
        disk(d1, 0x02, "vda", "0100 [1af4:1042] [1af4:1100] 01")
        eth(d1, 0x03, "eth0", "1af4:1041")
        for i, bus in enumerate([0x05, 0x06, 0x07, 0x08]): gpu(d1, bus)
        nic(d1, 0x09, "mlx5_0", ids="15b3:101e")
        nic(d1, 0x0a, "mlx5_1", ids="15b3:101e", state=nic1_state)
    hostbridge(d, 0x00, 0x00, devs)

VM_FLAT = [
    "Virtual machine whose PCI tree is flat (hand-written for tests/unit/test_topo.cc):",
    "one package, one NUMA node (PUs 0-7), every device directly on the root bus of",
    "one host bridge, as KVM/Firecracker guests with passthrough show them:",
    "",
    "  host bridge: [vda 02:00.0] [eth0 03:00.0] [GPU 0..3 05..08:00.0]",
    "               [mlx5_0 09:00.0] [mlx5_1 0a:00.0] (ConnectX virtual functions 15b3:101e)",
    "",
]

machine(D + "vm_flat.xml", VM_FLAT + [
    "Expected: all GPU-NIC pairs PHB; the GPUs spread over the two equally near NICs:",
    "GPU 0 -> mlx5_0, GPU 1 -> mlx5_1, GPU 2 -> mlx5_0, GPU 3 -> mlx5_1.",
], range(8), [0], "vm-fixture",
    lambda d: package(d, 0, range(8), 0, vm_io, mem=17179869184))

machine(D + "vm_flat_port_down.xml", VM_FLAT + [
    "Here the port of mlx5_1 is DOWN (Port1State 1; 4 is ACTIVE).",
    "",
    "Expected: every GPU uses mlx5_0, the NIC with an active port.",
], range(8), [0], "vm-down-fixture",
    lambda d: package(d, 0, range(8), 0, lambda d1: vm_io(d1, nic1_state=1), mem=17179869184))
