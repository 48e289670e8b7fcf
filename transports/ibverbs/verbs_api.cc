#include "verbs_api.h"

#include <dlfcn.h>

namespace ibv {

namespace {

// The inline verbs of verbs.h, as functions the table can point at.
int inlinePostSend(struct ibv_qp* qp, struct ibv_send_wr* wr, struct ibv_send_wr** bad) {
  return qp->context->ops.post_send(qp, wr, bad);
}
int inlinePollCq(struct ibv_cq* cq, int n, struct ibv_wc* wc) { return cq->context->ops.poll_cq(cq, n, wc); }

// Binds *slot to symbol name of lib; false (with *why) when it is missing and
// required.
template <typename F>
bool bind(void* lib, const char* lib_name, const char* name, F* slot, bool required, std::string* why) {
  *slot = reinterpret_cast<F>(dlsym(lib, name));
  if (*slot == nullptr && required) {
    *why = std::string(lib_name) + " has no " + name + " (rdma-core too old?)";
    return false;
  }
  return true;
}

}  // namespace

bool loadVerbs(Verbs* v, std::string* why) {
  const char* name = "libibverbs.so.1";
  void* lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* err = dlerror();
    *why = std::string("cannot open ") + name + " (" + (err ? err : "not found") +
           "): install libibverbs1 and a provider (ibverbs-providers)";
    return false;
  }
  bool ok = bind(lib, name, "ibv_get_device_list", &v->get_device_list, true, why) &&
            bind(lib, name, "ibv_free_device_list", &v->free_device_list, true, why) &&
            bind(lib, name, "ibv_get_device_name", &v->get_device_name, true, why) &&
            bind(lib, name, "ibv_open_device", &v->open_device, true, why) &&
            bind(lib, name, "ibv_close_device", &v->close_device, true, why) &&
            bind(lib, name, "ibv_query_device", &v->query_device, true, why) &&
            bind(lib, name, "ibv_query_port", &v->query_port, true, why) &&
            bind(lib, name, "ibv_query_gid", &v->query_gid, true, why) &&
            bind(lib, name, "_ibv_query_gid_ex", &v->query_gid_ex, false, why) &&
            bind(lib, name, "ibv_alloc_pd", &v->alloc_pd, true, why) &&
            bind(lib, name, "ibv_dealloc_pd", &v->dealloc_pd, true, why) &&
            bind(lib, name, "ibv_reg_mr", &v->reg_mr, true, why) &&
            bind(lib, name, "ibv_reg_dmabuf_mr", &v->reg_dmabuf_mr, false, why) &&
            bind(lib, name, "ibv_dereg_mr", &v->dereg_mr, true, why) &&
            bind(lib, name, "ibv_create_cq", &v->create_cq, true, why) &&
            bind(lib, name, "ibv_destroy_cq", &v->destroy_cq, true, why) &&
            bind(lib, name, "ibv_create_qp", &v->create_qp, true, why) &&
            bind(lib, name, "ibv_modify_qp", &v->modify_qp, true, why) &&
            bind(lib, name, "ibv_destroy_qp", &v->destroy_qp, true, why) &&
            bind(lib, name, "ibv_create_comp_channel", &v->create_comp_channel, true, why) &&
            bind(lib, name, "ibv_destroy_comp_channel", &v->destroy_comp_channel, true, why) &&
            bind(lib, name, "ibv_get_cq_event", &v->get_cq_event, true, why) &&
            bind(lib, name, "ibv_ack_cq_events", &v->ack_cq_events, true, why) &&
            bind(lib, name, "ibv_create_srq", &v->create_srq, true, why) &&
            bind(lib, name, "ibv_destroy_srq", &v->destroy_srq, true, why) &&
            bind(lib, name, "ibv_modify_srq", &v->modify_srq, true, why) &&
            bind(lib, name, "ibv_get_async_event", &v->get_async_event, true, why) &&
            bind(lib, name, "ibv_ack_async_event", &v->ack_async_event, true, why) &&
            bind(lib, name, "ibv_wc_status_str", &v->wc_status_str, true, why) &&
            bind(lib, name, "ibv_event_type_str", &v->event_type_str, true, why);
  if (!ok) {
    dlclose(lib);
    return false;
  }
  v->post_send = inlinePostSend;
  v->poll_cq = inlinePollCq;
  return true;
}

bool loadRdmacm(Rdmacm* cm, std::string* why) {
  const char* name = "librdmacm.so.1";
  void* lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* err = dlerror();
    *why = std::string("cannot open ") + name + " (" + (err ? err : "not found") + "): install librdmacm1";
    return false;
  }
  bool ok = bind(lib, name, "rdma_create_event_channel", &cm->create_event_channel, true, why) &&
            bind(lib, name, "rdma_destroy_event_channel", &cm->destroy_event_channel, true, why) &&
            bind(lib, name, "rdma_create_id", &cm->create_id, true, why) &&
            bind(lib, name, "rdma_destroy_id", &cm->destroy_id, true, why) &&
            bind(lib, name, "rdma_bind_addr", &cm->bind_addr, true, why) &&
            bind(lib, name, "rdma_listen", &cm->listen, true, why) &&
            bind(lib, name, "rdma_resolve_addr", &cm->resolve_addr, true, why) &&
            bind(lib, name, "rdma_resolve_route", &cm->resolve_route, true, why) &&
            bind(lib, name, "rdma_create_qp", &cm->create_qp, true, why) &&
            bind(lib, name, "rdma_destroy_qp", &cm->destroy_qp, true, why) &&
            bind(lib, name, "rdma_connect", &cm->connect, true, why) &&
            bind(lib, name, "rdma_accept", &cm->accept, true, why) &&
            bind(lib, name, "rdma_reject", &cm->reject, true, why) &&
            bind(lib, name, "rdma_disconnect", &cm->disconnect, true, why) &&
            bind(lib, name, "rdma_get_cm_event", &cm->get_cm_event, true, why) &&
            bind(lib, name, "rdma_ack_cm_event", &cm->ack_cm_event, true, why) &&
            bind(lib, name, "rdma_set_option", &cm->set_option, true, why) &&
            bind(lib, name, "rdma_get_devices", &cm->get_devices, true, why) &&
            bind(lib, name, "rdma_free_devices", &cm->free_devices, true, why) &&
            bind(lib, name, "rdma_event_str", &cm->event_str, true, why) &&
            bind(lib, name, "rdma_get_src_port", &cm->get_src_port, true, why);
  if (!ok) dlclose(lib);
  return ok;
}

}  // namespace ibv
