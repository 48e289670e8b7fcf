/*
 * libmoeep transport module ABI.
 *
 * A transport moves bytes between the ranks of a communicator: it maps or
 * registers memory and connects peers (the setup plane). Kernels and the host
 * progress engine then load and store through mapped pointers, or post
 * commands the transport turns into network operations (the data plane).
 *
 * Built-in transports and modules use the same table. A module is a shared
 * object named libmoeep-transport-NAME.so that exports one symbol,
 * `epTransport_v1` (an epTransport_v1_t). The core checks `version` and adapts
 * older tables or refuses them with a clear message. Transports never read the
 * environment or print: the core hands them a logger and a parameter getter.
 *
 * Three table versions exist, each under a symbol of its own, as NCCL's net
 * plugins do: `epTransport_v1` (memory the transport allocates and peers map:
 * shm, cuda_ipc), `epTransport_v2` (networks: memory the caller owns,
 * registered; connections per peer and traffic class; one-sided puts with a
 * signal) and `epTransport_v3` (version 2 and a blocking wait). A module may
 * export several; the core takes the newest it knows. docs/ABI.md,
 * "Transport ABI v2" and "v3", gives the rules in full.
 *
 * This header compiles alone as C11 and C++17.
 * SPDX-License-Identifier: MIT
 */
#ifndef MOEEP_TRANSPORT_H_
#define MOEEP_TRANSPORT_H_

#include <stddef.h>
#include <stdint.h>

#include "moeep.h"

#ifdef __cplusplus
extern "C" {
#endif

#define EP_TRANSPORT_ABI_VERSION 3   /* the newest table version this header defines */
#define EP_TRANSPORT_HANDLE_BYTES 256 /* bytes of an exported memory handle (v1) */

typedef enum {
  epTransportLogWarn = 1,
  epTransportLogInfo = 2,
  epTransportLogTrace = 3
} epTransportLogLevel_t;

/* What the core gives a transport at init. */
typedef struct {
  unsigned version; /* EP_TRANSPORT_ABI_VERSION of the core: a module takes any version at least the one
                       it needs (a core of a later version still calls every older table it loads) */
  void (*log)(epTransportLogLevel_t level, const char *transport, const char *fmt, ...);
  /* Value of parameter EP_<name>, or NULL when unset. */
  const char *(*get_param)(const char *name);
} epTransportEnv_v1_t;

/* Capabilities (epTransportProps_v1_t.caps). */
#define EP_TRANSPORT_CAP_LOAD_STORE 0x1u  /* peers' memory is mapped: plain loads and stores */
#define EP_TRANSPORT_CAP_HOST_MEM 0x2u    /* registers host memory */
#define EP_TRANSPORT_CAP_DEVICE_MEM 0x4u  /* registers device memory */
#define EP_TRANSPORT_CAP_RDMA 0x8u        /* one-sided writes through post/test */
#define EP_TRANSPORT_CAP_ACROSS_NODES 0x10u

typedef struct {
  const char *name;
  unsigned caps;
  int latency_us;      /* rough one-way latency, for path choice */
  int bandwidth_gbps;  /* rough bandwidth, for path choice */
} epTransportProps_v1_t;

/* What a rank tells its peers about itself (exchanged at init). */
typedef struct {
  int rank;
  int pid;
  uint64_t host_hash; /* same value <=> same machine (or same EP_HOST_ID) */
  int cuda_device;    /* -1 on the host backend */
  char bus_id[16];    /* PCI bus id of the GPU, "" on the host backend */
} epPeerInfo_v1_t;

/* Kinds of memory for reg_mem. */
#define EP_TRANSPORT_MEM_HOST 0
#define EP_TRANSPORT_MEM_DEVICE 1

/* name, init, can_connect, reg_mem, dereg_mem, connect, connected and close
 * are mandatory: the core refuses a table that lacks one (listed unavailable,
 * with the reason). post, test, properties and finalize may be NULL. */
typedef struct {
  const char *name;  /* short, lower case: "shm", "cuda_ipc", "ibverbs" */
  unsigned version;  /* 1 (later table versions come under symbols of their own) */
  epResult_t (*init)(const epTransportEnv_v1_t *env, void **ctx);
  epResult_t (*properties)(void *ctx, epTransportProps_v1_t *props);
  /* *ok = 1 when this transport can join self and peer. */
  epResult_t (*can_connect)(void *ctx, const epPeerInfo_v1_t *self, const epPeerInfo_v1_t *peer,
                            int *ok);
  /* Allocates size bytes of memory of kind, zero-filled, that peers can reach;
   * writes an exportable handle (at most EP_TRANSPORT_HANDLE_BYTES) to handle. */
  epResult_t (*reg_mem)(void *ctx, size_t size, int kind, void **ptr, void *handle, void **mem);
  epResult_t (*dereg_mem)(void *ctx, void *mem);
  /* Maps a peer's exported memory into this process; *ptr is where it lies. */
  epResult_t (*connect)(void *ctx, const epPeerInfo_v1_t *peer, const void *peer_handle,
                        void **ptr, void **conn);
  /* Called once every peer connected: a transport may drop names it published. */
  epResult_t (*connected)(void *ctx, void *mem);
  /* One-sided write of bytes from local mem to peer conn at offset (RDMA-like
   * transports; NULL for load/store transports). */
  epResult_t (*post)(void *conn, const void *local, size_t offset, size_t bytes, uint64_t *request);
  /* *done = 1 when request finished. */
  epResult_t (*test)(void *conn, uint64_t request, int *done);
  epResult_t (*close)(void *ctx, void *conn);
  /* Not called by this version: init runs once per process and its context,
   * like the module, is kept until the process exits. */
  epResult_t (*finalize)(void *ctx);
} epTransport_v1_t;


/* ---- Version 2: network transports ---------------------------------------
 * Symbol `epTransport_v2` (an epTransport_v2_t). Life of one communicator:
 *   comm_open -> endpoint (per peer and class) -> [the core exchanges the
 *   endpoints over its bootstrap] -> connect -> reg_mem + mem_handle ->
 *   [handles exchanged] -> put / progress / test ... -> close -> dereg_mem ->
 *   comm_close.   finalize: once, when the process unloads the library.
 * Threads: a communicator's calls come from one thread at a time, except
 * last_error, which any thread may call. */

/* Traffic classes: each has its own connections (queue pairs, streams), so
 * that one class never waits behind another on the fabric. */
typedef enum {
  epTrafficThroughput = 0, /* high-throughput dispatch / combine data */
  epTrafficLowLatency = 1, /* low-latency (decode) data */
  epTrafficControl = 2     /* counts, credits, barriers */
} epTrafficClass_t;
#define EP_TRAFFIC_CLASSES 3

/* What is asked of the fabric for one class. InfiniBand reads the service
 * level (a virtual lane; adaptive routing is a property the subnet manager
 * gives chosen service levels); RoCE reads the traffic class (DSCP << 2). */
typedef struct {
  int service_level;    /* 0..15 */
  int traffic_class;    /* 0..255 */
  int adaptive_routing; /* 1: the class should use an adaptive-routing service level, 0: not;
                           in comm_open also -1: auto, which the transport resolves (on for
                           InfiniBand, off for RoCE and TCP) and conn_info reports resolved;
                           -1 is part of version 2 as first released (0.1.0) */
} epTransportClass_v2_t;

/* What the core tells a transport about one communicator (comm_open). */
typedef struct {
  size_t size;            /* sizeof(epTransportCommInfo_v2_t) as the core built it */
  int rank;
  int nranks;
  int node;               /* this rank's node (host) index */
  int num_nodes;
  const char *device;     /* the NIC the topology chose ("mlx5_0", "eth0"; EP_IB_HCA /
                             EP_SOCKET_IFNAME win); NULL: the transport's own choice */
  int port;               /* NIC port, 0: the transport's choice */
  int gid_index;          /* RoCE GID index, -1: chosen by the transport (a RoCEv2 GID) */
  int qps_per_peer;       /* connections per peer and class (QPs, TCP streams), >= 1 */
  int ib_timeout;         /* local ACK timeout exponent: 4.096 us * 2^ib_timeout */
  int ib_retry_cnt;       /* retries before a QP errors out, 0..7 */
  int timeout_ms;         /* the communicator's timeout: bound for any wait of setup */
  epTransportClass_v2_t classes[EP_TRAFFIC_CLASSES]; /* by epTrafficClass_t */
  /* Added after the first v2 table; a transport reads it only when size
   * covers it. */
  int qp_budget;          /* most QPs (streams) this communicator may create, 0: no cap; an
                             endpoint beyond it fails with epInvalidUsage naming the budget */
  /* Added after qp_budget (read only when size covers aborted_arg). NULL: never. Returns
   * non-zero once the communicator was aborted (epCommAbort): a connect waiting for its peer
   * then returns epAborted instead of waiting out timeout_ms. Any thread may call it. */
  int (*aborted)(void *arg);
  void *aborted_arg;
} epTransportCommInfo_v2_t;

/* What one connection is, as epCommPeerInfo reports it. */
typedef struct {
  size_t size;             /* sizeof as the caller built it: fill at most that */
  char device[64];         /* "mlx5_0", "rxe0", "lo" */
  int port;
  int qps;                 /* queue pairs / streams of this connection */
  char link[32];           /* "InfiniBand", "RoCEv2", "TCP" */
  epTransportClass_v2_t requested; /* what this connection's class asked for */
  char detail[128];        /* free text: the GID, the address, the MTU */
} epTransportConnInfo_v2_t;

/* Flags of put. */
#define EP_PUT_SIGNAL 0x1u    /* after the data, store signal_value at signal_offset */
#define EP_PUT_INLINE_OK 0x2u /* the caller's bytes may be copied at the call (small puts) */

/* Endpoint data: at most this many bytes per (peer, class). */
#define EP_TRANSPORT_ENDPOINT_MAX_BYTES 4096
/* A registered memory's handle: at most this many bytes. */
#define EP_TRANSPORT_MEM_HANDLE_MAX_BYTES 256

/* Mandatory: name, version, init, comm_open, endpoint, connect, reg_mem,
 * mem_handle, dereg_mem, put, test, progress, last_error, close, comm_close.
 * Optional (NULL): properties, can_connect (NULL: every peer), conn_info,
 * finalize. */
typedef struct {
  const char *name; /* short, lower case: "ibverbs", "socket" */
  unsigned version; /* 2 */
  /* Once per process. Fails (with a logged reason) where the transport cannot
   * run here: no library, no device. */
  epResult_t (*init)(const epTransportEnv_v1_t *env, void **ctx);
  epResult_t (*properties)(void *ctx, epTransportProps_v1_t *props);
  epResult_t (*can_connect)(void *ctx, const epPeerInfo_v1_t *self, const epPeerInfo_v1_t *peer, int *ok);

  /* One per communicator. */
  epResult_t (*comm_open)(void *ctx, const epTransportCommInfo_v2_t *info, void **comm);
  /* This rank's endpoint for (peer, cls): what the peer needs to connect to
   * it (QP numbers, LID / GID, an address). *bytes: in, the room; out, the
   * size (at most EP_TRANSPORT_ENDPOINT_MAX_BYTES). Creates what the
   * connection needs on this side (a QP); called once per (peer, cls). */
  epResult_t (*endpoint)(void *comm, int peer, epTrafficClass_t cls, void *buf, size_t *bytes);
  /* Completes the connection to (peer, cls) from the peer's endpoint for
   * this rank. Both ranks call it; neither returns before the connection
   * can carry puts both ways, or timeout_ms passed (epRemoteError naming the
   * peer). */
  epResult_t (*connect)(void *comm, int peer, epTrafficClass_t cls, const void *peer_endpoint, size_t bytes,
                        void **conn);

  /* Registers bytes at ptr, which the caller owns and keeps until
   * dereg_mem (kind EP_TRANSPORT_MEM_HOST / _DEVICE; dmabuf_fd >= 0: device
   * memory exported as a DMA-BUF, at dmabuf_offset within it). Once per
   * buffer, not per call. */
  epResult_t (*reg_mem)(void *comm, void *ptr, size_t bytes, int kind, int dmabuf_fd, uint64_t dmabuf_offset,
                        void **mem);
  /* What a peer needs to put into mem (address, remote key), at most
   * EP_TRANSPORT_MEM_HANDLE_MAX_BYTES. */
  epResult_t (*mem_handle)(void *mem, void *buf, size_t *bytes);
  epResult_t (*dereg_mem)(void *comm, void *mem);

  /* One-sided write of bytes from local registered memory (mem, offset) to
   * the peer's memory named by remote_handle (from its mem_handle) at
   * remote_offset. With EP_PUT_SIGNAL, once the data is in place, the
   * 8-byte word at signal_offset of the same remote memory becomes
   * signal_value: data and signal travel on the same connection, so a peer
   * that reads the new value (acquire) reads the data too. bytes may be 0
   * (a signal alone: credits). *request (NULL: not wanted) is for test.
   * Puts on one connection land in the order they were posted. Returns
   * epInProgress when the connection's queue is full: call progress, post
   * again. A put to a peer that closed its end on purpose (destroyed its
   * communicator) is dropped without error, as that peer takes nothing
   * more (its last calls' credits, say); a peer that died is an error. */
  epResult_t (*put)(void *conn, void *mem, size_t offset, const void *remote_handle, size_t remote_offset,
                    size_t bytes, size_t signal_offset, uint64_t signal_value, unsigned flags,
                    uint64_t *request);
  /* *done = 1 once the put's local bytes may be reused. */
  epResult_t (*test)(void *conn, uint64_t request, int *done);
  /* Moves data and completions; a rank that waits for a signal calls it
   * between looks (a transport with its own thread may do nothing). An
   * error here is the communicator's: last_error says which peer. */
  epResult_t (*progress)(void *comm);
  epResult_t (*conn_info)(void *conn, epTransportConnInfo_v2_t *info);
  /* The first error this communicator's transport met: the peer it concerns
   * (-1: none in particular) and why. epSuccess and *peer = -1, msg "" when
   * there was none. */
  epResult_t (*last_error)(void *comm, int *peer, char *msg, size_t len);
  epResult_t (*close)(void *conn);
  epResult_t (*comm_close)(void *comm);
  /* Once, when the library is unloaded (the process exits, or the last
   * dlclose), and only when no communicator context is open: a process that
   * exits with one open skips it. */
  epResult_t (*finalize)(void *ctx);
} epTransport_v2_t;

/* Version 3: version 2's table, field for field (each as documented
 * there), then wait and drop_peer. Mandatory and optional callbacks as in
 * version 2; wait and drop_peer are optional. */
typedef struct {
  const char *name;
  unsigned version; /* 3 */
  epResult_t (*init)(const epTransportEnv_v1_t *env, void **ctx);
  epResult_t (*properties)(void *ctx, epTransportProps_v1_t *props);
  epResult_t (*can_connect)(void *ctx, const epPeerInfo_v1_t *self, const epPeerInfo_v1_t *peer, int *ok);
  epResult_t (*comm_open)(void *ctx, const epTransportCommInfo_v2_t *info, void **comm);
  epResult_t (*endpoint)(void *comm, int peer, epTrafficClass_t cls, void *buf, size_t *bytes);
  epResult_t (*connect)(void *comm, int peer, epTrafficClass_t cls, const void *peer_endpoint, size_t bytes,
                        void **conn);
  epResult_t (*reg_mem)(void *comm, void *ptr, size_t bytes, int kind, int dmabuf_fd, uint64_t dmabuf_offset,
                        void **mem);
  epResult_t (*mem_handle)(void *mem, void *buf, size_t *bytes);
  epResult_t (*dereg_mem)(void *comm, void *mem);
  epResult_t (*put)(void *conn, void *mem, size_t offset, const void *remote_handle, size_t remote_offset,
                    size_t bytes, size_t signal_offset, uint64_t signal_value, unsigned flags,
                    uint64_t *request);
  epResult_t (*test)(void *conn, uint64_t request, int *done);
  epResult_t (*progress)(void *comm);
  epResult_t (*conn_info)(void *conn, epTransportConnInfo_v2_t *info);
  epResult_t (*last_error)(void *comm, int *peer, char *msg, size_t len);
  epResult_t (*close)(void *conn);
  epResult_t (*comm_close)(void *comm);
  epResult_t (*finalize)(void *ctx);
  /* Blocks the calling thread until something may have come for this
   * communicator (a peer's put with EP_PUT_SIGNAL landed, a put of this side
   * completed, an error), or timeout_us passed, doing progress's work on the
   * way. It may return early without cause: the caller looks at its signal
   * words again either way. A rank calls it once it found nothing to do for
   * a while, so that waiting burns no core. epSuccess, or the communicator's
   * error as progress returns it. NULL: the core naps between calls to
   * progress. */
  epResult_t (*wait)(void *comm, int timeout_us);
  /* After a shrink (epCommShrink): peer is gone for good. Called before the
   * core closes its connections: the transport treats them as failed (their
   * close waits for nothing) and forgets the errors that concerned that
   * peer, so that progress, put and wait report only others' from then on.
   * Optional (NULL: the communicator's error stays, and the core refuses
   * enable_shrink across nodes over this transport). */
  epResult_t (*drop_peer)(void *comm, int peer);
} epTransport_v3_t;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MOEEP_TRANSPORT_H_ */
