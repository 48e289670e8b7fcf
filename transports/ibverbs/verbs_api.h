// The verbs and rdma_cm functions the module uses, bound at run time.
//
// The core links neither libibverbs nor librdmacm, and neither does this
// module: it opens libibverbs.so.1 (and librdmacm.so.1 for the rdma_cm
// connection setup) with dlopen and resolves each function it calls into
// these tables, so that libmoeep loads on machines without RDMA packages and
// the module says why it cannot run instead.
//
// ibv_post_send, ibv_poll_cq, ibv_post_srq_recv and ibv_req_notify_cq are
// inline functions of verbs.h that call through the device context: they
// need no symbol. The
// table still carries post_send and poll_cq as pointers, because that is the
// seam where faults are injected (fault.h): the data path calls only these.
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <string>

namespace ibv {

struct Verbs {
  struct ibv_device** (*get_device_list)(int* num);
  void (*free_device_list)(struct ibv_device** list);
  const char* (*get_device_name)(struct ibv_device* dev);
  struct ibv_context* (*open_device)(struct ibv_device* dev);
  int (*close_device)(struct ibv_context* ctx);
  int (*query_device)(struct ibv_context* ctx, struct ibv_device_attr* attr);
  int (*query_port)(struct ibv_context* ctx, uint8_t port, struct ibv_port_attr* attr);
  int (*query_gid)(struct ibv_context* ctx, uint8_t port, int index, union ibv_gid* gid);
  // Newer libibverbs only (IBVERBS_1.11): the GID's type; NULL where absent
  // (the type is then read from sysfs).
  int (*query_gid_ex)(struct ibv_context* ctx, uint32_t port, uint32_t index, struct ibv_gid_entry* entry,
                      uint32_t flags, size_t entry_size);
  struct ibv_pd* (*alloc_pd)(struct ibv_context* ctx);
  int (*dealloc_pd)(struct ibv_pd* pd);
  struct ibv_mr* (*reg_mr)(struct ibv_pd* pd, void* addr, size_t length, int access);
  // IBVERBS_1.12; NULL where absent (DMA-BUF registration is then refused).
  struct ibv_mr* (*reg_dmabuf_mr)(struct ibv_pd* pd, uint64_t offset, size_t length, uint64_t iova, int fd,
                                  int access);
  int (*dereg_mr)(struct ibv_mr* mr);
  struct ibv_cq* (*create_cq)(struct ibv_context* ctx, int cqe, void* cq_context, struct ibv_comp_channel* ch,
                              int comp_vector);
  int (*destroy_cq)(struct ibv_cq* cq);
  struct ibv_qp* (*create_qp)(struct ibv_pd* pd, struct ibv_qp_init_attr* attr);
  int (*modify_qp)(struct ibv_qp* qp, struct ibv_qp_attr* attr, int mask);
  int (*destroy_qp)(struct ibv_qp* qp);
  // The completion channel (wake.cc): waits that sleep.
  struct ibv_comp_channel* (*create_comp_channel)(struct ibv_context* ctx);
  int (*destroy_comp_channel)(struct ibv_comp_channel* channel);
  int (*get_cq_event)(struct ibv_comp_channel* channel, struct ibv_cq** cq, void** cq_context);
  void (*ack_cq_events)(struct ibv_cq* cq, unsigned int nevents);
  struct ibv_srq* (*create_srq)(struct ibv_pd* pd, struct ibv_srq_init_attr* attr);
  int (*destroy_srq)(struct ibv_srq* srq);
  int (*modify_srq)(struct ibv_srq* srq, struct ibv_srq_attr* attr, int mask);
  int (*get_async_event)(struct ibv_context* ctx, struct ibv_async_event* event);
  void (*ack_async_event)(struct ibv_async_event* event);
  const char* (*wc_status_str)(enum ibv_wc_status status);
  const char* (*event_type_str)(enum ibv_event_type type);
  // The data path (fault seam): inline verbs by default.
  int (*post_send)(struct ibv_qp* qp, struct ibv_send_wr* wr, struct ibv_send_wr** bad);
  int (*poll_cq)(struct ibv_cq* cq, int n, struct ibv_wc* wc);
};

struct Rdmacm {
  struct rdma_event_channel* (*create_event_channel)();
  void (*destroy_event_channel)(struct rdma_event_channel* ch);
  int (*create_id)(struct rdma_event_channel* ch, struct rdma_cm_id** id, void* context, enum rdma_port_space ps);
  int (*destroy_id)(struct rdma_cm_id* id);
  int (*bind_addr)(struct rdma_cm_id* id, struct sockaddr* addr);
  int (*listen)(struct rdma_cm_id* id, int backlog);
  int (*resolve_addr)(struct rdma_cm_id* id, struct sockaddr* src, struct sockaddr* dst, int timeout_ms);
  int (*resolve_route)(struct rdma_cm_id* id, int timeout_ms);
  int (*create_qp)(struct rdma_cm_id* id, struct ibv_pd* pd, struct ibv_qp_init_attr* attr);
  void (*destroy_qp)(struct rdma_cm_id* id);
  int (*connect)(struct rdma_cm_id* id, struct rdma_conn_param* param);
  int (*accept)(struct rdma_cm_id* id, struct rdma_conn_param* param);
  int (*reject)(struct rdma_cm_id* id, const void* data, uint8_t len);
  int (*disconnect)(struct rdma_cm_id* id);
  int (*get_cm_event)(struct rdma_event_channel* ch, struct rdma_cm_event** event);
  int (*ack_cm_event)(struct rdma_cm_event* event);
  int (*set_option)(struct rdma_cm_id* id, int level, int optname, void* optval, size_t optlen);
  struct ibv_context** (*get_devices)(int* num);
  void (*free_devices)(struct ibv_context** list);
  const char* (*event_str)(enum rdma_cm_event_type event);
  uint16_t (*get_src_port)(struct rdma_cm_id* id);
};

// Opens libibverbs.so.1 and binds Verbs; false with *why naming the library
// or the symbol that is missing. Once per process; the library stays open.
bool loadVerbs(Verbs* v, std::string* why);
// The same for librdmacm.so.1 (only the rdma_cm connection setup needs it).
bool loadRdmacm(Rdmacm* cm, std::string* why);

}  // namespace ibv
