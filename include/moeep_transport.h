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

#define EP_TRANSPORT_ABI_VERSION 1
#define EP_TRANSPORT_HANDLE_BYTES 256 /* bytes of an exported memory handle */

typedef enum {
  epTransportLogWarn = 1,
  epTransportLogInfo = 2,
  epTransportLogTrace = 3
} epTransportLogLevel_t;

/* What the core gives a transport at init. */
typedef struct {
  unsigned version; /* EP_TRANSPORT_ABI_VERSION of the core */
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
  unsigned version;  /* EP_TRANSPORT_ABI_VERSION the module was built with */
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

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MOEEP_TRANSPORT_H_ */
