// Which NIC, port and GID a communicator uses.
//
// The NIC: EP_IB_HCA ("mlx5_0" or "mlx5_0:1"), else the core's choice
// (info->device: the topology's NIC for the rank), else the first device
// with an active port. A named NIC without an active port is an error, not
// a quiet move to another NIC (which would leave the rank's rail). On RoCE the GID must be a RoCE v2 one (routable over UDP/IP, and the
// one whose frames carry the DSCP of the traffic class); an IPv4-mapped GID
// is preferred, because that is the address rdma_cm and most fabrics use.
// ib_gid_index overrides the choice; an index past the table's end or an
// empty entry is an error naming the device.
#include <arpa/inet.h>

#include <cstdio>
#include <cstring>

#include "ib.h"

namespace ibv {

namespace {

bool gidIsZero(const union ibv_gid& g) {
  for (unsigned char b : g.raw)
    if (b != 0) return false;
  return true;
}

bool gidIsIpv4Mapped(const union ibv_gid& g) {
  for (int i = 0; i < 10; i++)
    if (g.raw[i] != 0) return false;
  return g.raw[10] == 0xff && g.raw[11] == 0xff;
}

// The GID's type: from ibv_query_gid_ex where the library has it, else from
// sysfs (older rdma-core). "" when unknown.
std::string gidType(Context* c, struct ibv_context* ctx, const std::string& dev, int port, int index) {
  if (c->v.query_gid_ex) {
    struct ibv_gid_entry e;
    memset(&e, 0, sizeof(e));
    if (c->v.query_gid_ex(ctx, uint32_t(port), uint32_t(index), &e, 0, sizeof(e)) == 0)
      return e.gid_type == IBV_GID_TYPE_ROCE_V2 ? "RoCE v2" : e.gid_type == IBV_GID_TYPE_ROCE_V1 ? "RoCE v1" : "IB";
  }
  char path[256];
  snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/%d/gid_attrs/types/%d", dev.c_str(), port, index);
  FILE* f = fopen(path, "r");
  if (f == nullptr) return "";
  char line[64] = "";
  const bool got = fgets(line, sizeof(line), f) != nullptr;
  fclose(f);
  if (!got) return "";
  if (strncmp(line, "RoCE v2", 7) == 0) return "RoCE v2";
  return "RoCE v1";
}

// EP_IB_HCA / info->device: "name" or "name:port".
void parseHca(const char* spec, std::string* name, int* port) {
  *name = spec ? spec : "";
  *port = 0;
  const size_t colon = name->find(':');
  if (colon != std::string::npos) {
    *port = atoi(name->c_str() + colon + 1);
    name->resize(colon);
  }
}

bool usablePort(const struct ibv_port_attr& a) {
  return a.state == IBV_PORT_ACTIVE &&
         (a.link_layer == IBV_LINK_LAYER_INFINIBAND || a.link_layer == IBV_LINK_LAYER_ETHERNET ||
          a.link_layer == IBV_LINK_LAYER_UNSPECIFIED);
}

const char* portState(enum ibv_port_state s) {
  switch (s) {
    case IBV_PORT_DOWN: return "DOWN";
    case IBV_PORT_INIT: return "INIT";
    case IBV_PORT_ARMED: return "ARMED";
    case IBV_PORT_ACTIVE: return "ACTIVE";
    default: return "not active";
  }
}

epResult_t chooseGid(Comm* comm) {
  Context* c = comm->ctx;
  Port& p = comm->port;
  if (!p.roce) {  // InfiniBand: LID routing, GID 0 for a GRH if one is ever needed
    p.gid_index = 0;
    c->v.query_gid(p.ctx, uint8_t(p.port), 0, &p.gid);
    p.gid_kind = "IB";
    return epSuccess;
  }
  const int table = p.attr.gid_tbl_len;
  if (comm->info.gid_index >= 0) {
    const int i = comm->info.gid_index;
    if (i >= table)
      return fail(comm, epInvalidArgument, -1,
                  "GID index %d (ib_gid_index / EP_IB_GID_INDEX) is out of range on device %s port %d: its GID "
                  "table has %d entries (show_gids lists them)",
                  i, p.device.c_str(), p.port, table);
    if (c->v.query_gid(p.ctx, uint8_t(p.port), i, &p.gid) != 0 || gidIsZero(p.gid))
      return fail(comm, epInvalidArgument, -1,
                  "GID index %d (ib_gid_index / EP_IB_GID_INDEX) of device %s port %d is empty (show_gids "
                  "lists the set entries)",
                  i, p.device.c_str(), p.port);
    p.gid_index = i;
    p.gid_kind = gidType(c, p.ctx, p.device, p.port, i);
  } else {
    int first_v2 = -1, mapped_v2 = -1, first_any = -1;
    for (int i = 0; i < table && mapped_v2 < 0; i++) {
      union ibv_gid g;
      if (c->v.query_gid(p.ctx, uint8_t(p.port), i, &g) != 0 || gidIsZero(g)) continue;
      if (first_any < 0) first_any = i;
      if (gidType(c, p.ctx, p.device, p.port, i) != "RoCE v2") continue;
      if (first_v2 < 0) first_v2 = i;
      if (gidIsIpv4Mapped(g)) mapped_v2 = i;
    }
    const int pick = mapped_v2 >= 0 ? mapped_v2 : first_v2 >= 0 ? first_v2 : first_any;
    if (pick < 0)
      return fail(comm, epNotSupported, -1,
                  "device %s port %d (RoCE) has no GID: its network interface has no address", p.device.c_str(),
                  p.port);
    if (first_v2 < 0)
      logf(c, epTransportLogWarn, "device %s port %d has no RoCE v2 GID: GID %d (RoCE v1) is used, whose frames "
           "carry no DSCP", p.device.c_str(), p.port, pick);
    p.gid_index = pick;
    c->v.query_gid(p.ctx, uint8_t(p.port), pick, &p.gid);
    p.gid_kind = gidType(c, p.ctx, p.device, p.port, pick);
  }
  if (gidIsIpv4Mapped(p.gid)) memcpy(&p.ipv4, &p.gid.raw[12], 4);
  return epSuccess;
}

}  // namespace

bool anyActivePort(Context* c, std::string* why) {
  int n = 0;
  struct ibv_device** list = c->v.get_device_list(&n);
  if (list == nullptr || n == 0) {
    if (list) c->v.free_device_list(list);
    *why = "no RDMA device (ibv_get_device_list found none: no NIC, or no provider for it)";
    return false;
  }
  std::string seen;
  bool found = false;
  for (int d = 0; d < n && !found; d++) {
    const char* name = c->v.get_device_name(list[d]);
    struct ibv_context* ctx = c->v.open_device(list[d]);
    if (ctx == nullptr) {
      seen += std::string(seen.empty() ? "" : ", ") + name + " (cannot open)";
      continue;
    }
    struct ibv_device_attr da;
    if (c->v.query_device(ctx, &da) == 0) {
      for (int port = 1; port <= da.phys_port_cnt && !found; port++) {
        struct ibv_port_attr pa;
        memset(&pa, 0, sizeof(pa));
        if (c->v.query_port(ctx, uint8_t(port), &pa) != 0) continue;
        if (usablePort(pa)) found = true;
        else seen += std::string(seen.empty() ? "" : ", ") + name + ":" + std::to_string(port) + " " +
                     portState(pa.state);
      }
    }
    c->v.close_device(ctx);
  }
  c->v.free_device_list(list);
  if (!found) *why = "no active RDMA port (" + seen + ")";
  return found;
}

epResult_t openPort(Comm* comm) {
  Context* c = comm->ctx;
  Port& p = comm->port;
  std::string want;
  int want_port = comm->info.port;
  // EP_IB_HCA wins over the core's choice (the topology's nearest NIC).
  const char* hca = c->env->get_param("IB_HCA");
  const bool from_env = hca != nullptr && *hca != '\0';
  const char* spec = from_env ? hca : comm->info.device;
  int spec_port = 0;
  parseHca(spec, &want, &spec_port);
  if (want_port <= 0) want_port = spec_port;

  // rdma_cm's ids carry its own device contexts: a QP made on one needs a PD
  // of that very context, so the rdma_cm setup uses its context.
  struct ibv_context** cm_list = nullptr;
  int n = 0;
  struct ibv_device** list = nullptr;
  if (comm->use_cm) {
    cm_list = c->cm.get_devices(&n);
  } else {
    list = c->v.get_device_list(&n);
  }
  std::string seen;
  for (int d = 0; d < n && p.ctx == nullptr; d++) {
    struct ibv_device* dev = comm->use_cm ? cm_list[d]->device : list[d];
    const char* name = c->v.get_device_name(dev);
    if (!want.empty() && want != name) continue;
    struct ibv_context* ctx = comm->use_cm ? cm_list[d] : c->v.open_device(dev);
    if (ctx == nullptr) {
      seen += std::string(seen.empty() ? "" : ", ") + name + " (cannot open)";
      continue;
    }
    struct ibv_device_attr da;
    memset(&da, 0, sizeof(da));
    c->v.query_device(ctx, &da);
    for (int port = 1; port <= da.phys_port_cnt; port++) {
      if (want_port > 0 && port != want_port) continue;
      struct ibv_port_attr pa;
      memset(&pa, 0, sizeof(pa));
      if (c->v.query_port(ctx, uint8_t(port), &pa) != 0) continue;
      if (!usablePort(pa)) {
        seen += std::string(seen.empty() ? "" : ", ") + name + ":" + std::to_string(port) + " " + portState(pa.state);
        continue;
      }
      p.device = name;
      p.port = port;
      p.ctx = ctx;
      p.ctx_owned = !comm->use_cm;
      p.attr = pa;
      p.dev_attr = da;
      p.roce = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
      break;
    }
    if (p.ctx == nullptr && !comm->use_cm) c->v.close_device(ctx);
  }
  if (list) c->v.free_device_list(list);
  // rdma_cm keeps its contexts open for the life of the process; the list
  // itself may go.
  if (cm_list) c->cm.free_devices(cm_list);
  if (p.ctx == nullptr) {
    if (!want.empty())
      return fail(comm, epNotSupported, -1, "device %s%s%s (%s) has no active port%s%s", want.c_str(),
                  want_port > 0 ? ":" : "", want_port > 0 ? std::to_string(want_port).c_str() : "",
                  from_env ? "EP_IB_HCA" : "the topology's choice; EP_IB_HCA=NAME picks another", seen.empty() ? " or does not exist" : ": ",
                  seen.c_str());
    return fail(comm, epNotSupported, -1, "no active RDMA port%s%s%s", seen.empty() ? "" : " (", seen.c_str(),
                seen.empty() ? "" : ")");
  }
  if (p.ctx_owned) g_live_objects++;
  p.pd = c->v.alloc_pd(p.ctx);
  if (p.pd == nullptr) return fail(comm, epSystemError, -1, "ibv_alloc_pd failed on device %s", p.device.c_str());
  g_live_objects++;
  return chooseGid(comm);
}

void closePort(Comm* comm) {
  Context* c = comm->ctx;
  Port& p = comm->port;
  if (p.pd) {
    c->v.dealloc_pd(p.pd);
    g_live_objects--;
    p.pd = nullptr;
  }
  if (p.ctx && p.ctx_owned) {
    c->v.close_device(p.ctx);
    g_live_objects--;
  }
  p.ctx = nullptr;
}

}  // namespace ibv
