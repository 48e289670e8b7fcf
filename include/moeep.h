/*
 * libmoeep — expert-parallel dispatch and combine for mixture-of-experts models.
 *
 * The public C API. It compiles alone as C11 and as C++17 and needs no CUDA
 * header: a stream is a `struct CUstream_st *`, which is what cudaStream_t is.
 *
 * ABI policy (docs/ABI.md): functions are never removed or changed within a
 * major version; enum values are never renumbered; every config and argument
 * struct begins with {size, magic, version} and only grows at its end. The
 * library reads `size` first and fills fields the caller did not know about
 * with their defaults.
 *
 * SPDX-License-Identifier: MIT
 */
#ifndef MOEEP_H_
#define MOEEP_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define EP_API
#else
#define EP_API __attribute__((visibility("default")))
#endif

/* ---- Version ----------------------------------------------------------- */
#define EP_VERSION_MAJOR 0
#define EP_VERSION_MINOR 1
#define EP_VERSION_PATCH 0
#define EP_VERSION_CODE_OF(major, minor, patch) ((major) * 10000 + (minor) * 100 + (patch))
#define EP_VERSION_CODE EP_VERSION_CODE_OF(EP_VERSION_MAJOR, EP_VERSION_MINOR, EP_VERSION_PATCH)

/* ---- Results (values are fixed forever) --------------------------------- */
typedef enum {
  epSuccess = 0,
  epUnhandledCudaError = 1,   /* a CUDA call failed */
  epSystemError = 2,          /* a system call failed (socket, shm, mmap, ...) */
  epInternalError = 3,        /* a bug in the library */
  epInvalidArgument = 4,      /* bad argument: the message names it */
  epInvalidUsage = 5,         /* call not allowed in this state */
  epRemoteError = 6,          /* a peer failed or left */
  epInProgress = 7,           /* not an error: the operation is still running */
  epTimeout = 8,              /* a peer did not answer in time: the message names it */
  epNotSupported = 9,         /* valid request this build or machine cannot serve */
  epAborted = 10,             /* epCommAbort was called on this communicator */
  epOutOfMemory = 11          /* an allocation failed */
} epResult_t;

/* ---- Opaque objects ----------------------------------------------------- */
typedef struct epComm *epComm_t;
typedef struct epHandle *epHandle_t;
typedef struct CUstream_st *epStream_t; /* == cudaStream_t; NULL on the host backend */

#define EP_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[EP_UNIQUE_ID_BYTES];
} epUniqueId;

/* ---- Data types ---------------------------------------------------------- */
typedef enum {
  epBfloat16 = 0,
  epFloat16 = 1,
  epFloat32 = 2,
  epFloat8E4M3 = 3, /* one byte per element, float32 scales per 128 elements */
  epInt32 = 4,
  epInt64 = 5
} epDataType_t;

typedef enum {
  epBackendAuto = 0, /* the GPU when the build and the machine have one, else the host */
  epBackendHost = 1, /* host memory; ranks on one machine or several (network transports) */
  epBackendCuda = 2  /* device memory, kernels on the caller's stream; ranks on several machines:
                        staged through host memory, not capturable (docs/PROXY.md) */
} epBackend_t;

/* Magic numbers that open every versioned struct. */
#define EP_CONFIG_MAGIC 0x65704366u        /* 'epCf' */
#define EP_LAYOUT_ARGS_MAGIC 0x65704c61u   /* 'epLa' */
#define EP_DISPATCH_ARGS_MAGIC 0x65704469u /* 'epDi' */
#define EP_COMBINE_ARGS_MAGIC 0x6570436fu  /* 'epCo' */

/* ---- Communicator configuration -----------------------------------------
 * Fields set to 0 (or -1 where noted) take the value of the matching EP_*
 * variable, else the library default. Precedence: struct > EP_* > default. */
#define EP_CONFIG_VERSION 3 /* raised with every field added: read up to its version's last field */
typedef struct {
  size_t size;                 /* sizeof(epConfig_t) as the caller compiled it */
  unsigned magic;              /* EP_CONFIG_MAGIC */
  unsigned version;            /* EP_CONFIG_VERSION */
  int num_experts;             /* E, global; must be a multiple of the rank count */
  int hidden;                  /* H, elements per row; H * sizeof(type) % 16 == 0 */
  int max_tokens_per_rank;     /* largest T any rank passes */
  int max_topk;                /* largest K (1..32) */
  epDataType_t dispatch_type;  /* wire type of dispatch: epBfloat16 / epFloat16 / epFloat32 / epFloat8E4M3 */
  epDataType_t combine_type;   /* type of combine rows: epBfloat16 / epFloat16 / epFloat32 */
  epBackend_t backend;         /* epBackendAuto: GPU if present */
  int device;                  /* CUDA device, -1: the current one */
  size_t buffer_bytes_cap;     /* upper bound on the communication buffers together
                                  (what epCommBufferBytes reports), 0: no cap */
  int timeout_ms;              /* how long to wait for a peer before epTimeout, 0: EP_TIMEOUT_MS */
  int num_sms;                 /* SM budget of the high-throughput kernels, 0: library default */
  int max_nodes_per_token;     /* node-limited routing bound M, 0: not declared */
  int low_latency;             /* 1: register the low-latency buffers at init (decode) */
  /* InfiniBand / RoCE settings of the network transport. Each is -1 when not
   * set: then the EP_IB_* variable of the same name applies, else the default
   * (docs/TOPOLOGY.md). Classes: throughput (dispatch/combine data), low
   * latency (decode data), control (counts, credits, barriers). */
  int ib_sl_throughput;        /* service level 0..15; default 0 */
  int ib_sl_low_latency;       /* service level 0..15; default 0 */
  int ib_sl_control;           /* service level 0..15; default 0 */
  int ib_traffic_class;        /* RoCE traffic class 0..255 (DSCP << 2); default 0 */
  int ib_gid_index;            /* GID index 0..255; default: chosen by the transport */
  int ib_qps_per_peer;         /* queue pairs per peer connection 1..16; default 1 */
  int ib_ar_throughput;        /* adaptive routing 1 on, 0 off; default: on for IB, off for RoCE */
  int ib_ar_low_latency;       /* adaptive routing of low-latency traffic, as above */
  int ib_ar_control;           /* adaptive routing of control traffic, as above */
  /* Version 2 (network transports). -1: the EP_IB_* variable, else the default. */
  int ib_tc_throughput;        /* RoCE traffic class of throughput traffic; default: ib_traffic_class */
  int ib_tc_low_latency;       /* RoCE traffic class of low-latency traffic; default: ib_traffic_class */
  int ib_tc_control;           /* RoCE traffic class of control traffic; default: ib_traffic_class */
  int ib_timeout;              /* QP local ACK timeout 1..31 (4.096 us * 2^t); default 20 */
  int ib_retry_cnt;            /* QP retries 0..7 before a link fault is an error; default 7 */
  int ib_qp_budget;            /* most QPs per rank 0..2^20, 0: no cap; default 0 */
  /* Version 3. */
  int enable_shrink;           /* 1: epCommShrink may be called (each rank opens a listener of its own
                                  at init; host backend); 0: EP_ENABLE_SHRINK, else off */
} epConfig_t;

#define EP_CONFIG_INITIALIZER                                                      \
  {                                                                                \
    sizeof(epConfig_t), EP_CONFIG_MAGIC, EP_CONFIG_VERSION, 0, 0, 0, 0, epBfloat16, \
        epBfloat16, epBackendAuto, -1, 0, 0, 0, 0, 0, -1, -1, -1, -1, -1, -1, -1,  \
        -1, -1, -1, -1, -1, -1, -1, -1, 0                                          \
  }

/* ---- Library ------------------------------------------------------------- */
EP_API epResult_t epGetVersion(int *version); /* EP_VERSION_CODE of the loaded library */
EP_API const char *epGetErrorString(epResult_t result);
/* The message of the last failed call on comm (thread-local when comm is NULL). Never NULL. */
EP_API const char *epGetLastError(epComm_t comm);

/* Parameter `index` of the EP_* table (0, 1, ... until epInvalidArgument):
 * its name, default, current value from the environment (NULL: unset) and doc.
 * A secret (EP_COMM_SECRET) is not shown: its value reads "(set; not shown)",
 * or the file:PATH that names it. The strings live as long as the library.
 * Any output may be NULL. */
EP_API epResult_t epGetParam(int index, const char **name, const char **default_value,
                             const char **value, const char **doc);
/* Transport `index` of this process (built-in or module): its name, whether it
 * can be used, and where it came from or why it cannot. */
EP_API epResult_t epGetTransport(int index, const char **name, int *available, const char **detail);

/* ---- Communicator ---------------------------------------------------------- */
/* Creates a unique id on the root; starts the bootstrap root in this process,
 * which serves one communicator and waits for its ranks for EP_TIMEOUT_MS
 * (default 60 s; config.timeout_ms is not known yet). The id carries a secret
 * drawn from the OS's random source, which every peer must prove it holds:
 * share the id as you would a password. With EP_COMM_ID the id is derived
 * from that string alone (two jobs must not share one EP_COMM_ID at the same
 * time), and the secret from EP_COMM_SECRET; without that variable the
 * EP_COMM_ID mode is unauthenticated (docs/SEMANTICS.md). */
EP_API epResult_t epGetUniqueId(epUniqueId *unique_id);
/* Collective over nranks processes or threads. Blocks until every rank arrived,
 * or returns epTimeout naming the ranks that did not within the timeout. */
EP_API epResult_t epCommInitRank(epComm_t *comm, int nranks, epUniqueId unique_id, int rank,
                                 const epConfig_t *config);
/* All ranks in one process: comms[i] is rank i. devices may be NULL (0..n-1 on
 * the GPU backend; ignored on the host backend). */
EP_API epResult_t epCommInitAll(epComm_t *comms, int nranks, const int *devices,
                                const epConfig_t *config);
/* Frees comm. Refused (epInvalidUsage) while a call on comm is in progress in
 * another thread: unblock such a call with epCommAbort instead. */
EP_API epResult_t epCommDestroy(epComm_t comm);
/* Makes every call blocked on comm in other threads return epAborted, waits for
 * them to leave, then frees comm: comm must not be used afterwards. Safe from
 * another thread; one destroy or abort per communicator. */
EP_API epResult_t epCommAbort(epComm_t comm);
/* After a call failed because ranks died (epRemoteError or epTimeout naming
 * one), the survivors agree on the dead set and go on without it: a
 * collective of every surviving rank (config.enable_shrink at init; host
 * backend). suspects (may be NULL) adds ranks the caller knows to be gone.
 * On success dead[0..*ndead) (room for nranks entries) is the set every
 * survivor agreed on, ascending, the same on all of them, and the
 * communicator works again: from the next call on the dead ranks' experts
 * are masked (their terms are zero, docs/SEMANTICS.md, "Shrink") and handles
 * made before are refused. epRemoteError when the others declared this rank
 * dead, when the survivors it can reach are no majority of the ranks before,
 * or when another rank died during the shrink (call it again); the
 * communicator then stays failed. docs/SHRINK.md. */
EP_API epResult_t epCommShrink(epComm_t comm, const int *suspects, int nsuspects, int *dead, int *ndead);
/* The ranks the shrinks so far removed, ascending: *ndead is their number,
 * the first min(*ndead, capacity) are written to dead (may be NULL when
 * capacity is 0); *epoch (may be NULL) the epoch of the last completed
 * shrink (0: none; failed attempts use epochs too, so it may skip). Not
 * collective; safe beside a call on another thread.
 * A communicator made without enable_shrink answers 0 and 0. */
EP_API epResult_t epCommDeadRanks(epComm_t comm, int *dead, int capacity, int *ndead, unsigned int *epoch);
EP_API epResult_t epCommRank(epComm_t comm, int *rank);
EP_API epResult_t epCommSize(epComm_t comm, int *size);
/* Experts owned by this rank: [*first, *first + *count). */
EP_API epResult_t epCommLocalExperts(epComm_t comm, int *first, int *count);
/* Bytes of the communication buffer this rank registered. */
EP_API epResult_t epCommBufferBytes(epComm_t comm, size_t *bytes);
/* Number of nodes and the node of each rank (nodes[] may be NULL). */
EP_API epResult_t epCommNodes(epComm_t comm, int *num_nodes, int *node_of_rank);

/* ---- Topology and paths -------------------------------------------------- */
typedef enum {
  epPathSelf = 0,
  epPathNvlink = 1,       /* same node, GPU peer access */
  epPathHostStaged = 2,   /* same node, through host memory */
  epPathRail = 3,         /* other node: RDMA straight to the peer (this rank's rail peer there) */
  epPathRailForward = 4   /* other node: RDMA to the rail peer there, which forwards inside its node */
} epPathKind_t;

/* Text reports fill buf (NUL-terminated) when *bytes is large enough; with
 * buf NULL or *bytes too small they set *bytes to the size needed (epSuccess
 * with buf NULL, epInvalidArgument otherwise). */
/* The topology of xml_path (NULL: EP_TOPO_XML, else this machine): GPUs, NICs,
 * NUMA nodes, PCI distances, the NIC of each GPU and why; with ranks_per_node
 * and num_nodes > 0 also the plan of such a job (a dry run: local rank i
 * drives GPU i; at most 2048 ranks in all). */
EP_API epResult_t epTopologyReport(const char *xml_path, int ranks_per_node, int num_nodes, char *buf,
                                   size_t *bytes);
/* The plan of a communicator: the path to each peer, rail peers, NIC, IB settings. */
EP_API epResult_t epCommPlanReport(epComm_t comm, char *buf, size_t *bytes);
/* How this rank reaches peer, and through which rank (via_rank: -1 when direct). */
EP_API epResult_t epCommPeerPath(epComm_t comm, int peer, epPathKind_t *kind, int *via_rank);

/* What is asked of the fabric for one traffic class of a network peer. */
typedef struct {
  int service_level;    /* InfiniBand service level 0..15 (the subnet manager maps it to a virtual lane) */
  int traffic_class;    /* RoCE traffic class 0..255 (DSCP << 2) */
  int adaptive_routing; /* 1: requested, 0: not (verbs cannot say what the fabric did) */
} epPeerClassInfo_t;

/* How this rank reaches one peer (epCommPeerInfo). Initialise with
 * EP_COMM_PEER_INFO_INITIALIZER; the library writes at most `size` bytes. */
#define EP_COMM_PEER_INFO_MAGIC 0x65705069u /* 'epPi' */
#define EP_COMM_PEER_INFO_VERSION 1
#define EP_PEER_TRAFFIC_CLASSES 3 /* throughput, low latency, control: the order of classes[] */
typedef struct {
  size_t size;
  unsigned magic;
  unsigned version;
  int peer;                /* the peer asked about */
  int node;                /* its node */
  epPathKind_t path;       /* as epCommPeerPath */
  int via_rank;            /* epPathRailForward: the rank that forwards, else -1 */
  char transport[32];      /* "self", "shm", "cuda_ipc", "socket", "ibverbs" */
  /* Network peers (qps > 0) only; zero / "" for the others. */
  char device[64];         /* this rank's NIC or interface: "mlx5_0", "rxe0", "lo" */
  int port;                /* NIC port */
  int qps;                 /* queue pairs (TCP streams) per connection to this peer */
  char link[32];           /* "InfiniBand", "RoCEv2", "RoCEv1", "TCP" */
  epPeerClassInfo_t classes[EP_PEER_TRAFFIC_CLASSES]; /* requested per class */
  char detail[128];        /* free text: QP number, GIDs, addresses, MTU, setup */
} epCommPeerInfo_t;
#define EP_COMM_PEER_INFO_INITIALIZER \
  { sizeof(epCommPeerInfo_t), EP_COMM_PEER_INFO_MAGIC, EP_COMM_PEER_INFO_VERSION, 0, 0, epPathSelf, -1, \
    {0}, {0}, 0, 0, {0}, {{0, 0, 0}, {0, 0, 0}, {0, 0, 0}}, {0} }
/* Fills *info for peer (the communicator's own rank included: transport
 * "self"). Not collective; any thread. */
EP_API epResult_t epCommPeerInfo(epComm_t comm, int peer, epCommPeerInfo_t *info);

/* ---- Layout ---------------------------------------------------------------
 * Local: where the tokens of this rank go. Outputs are optional (NULL: not
 * written); on the GPU backend they are device pointers, written on stream. */
#define EP_LAYOUT_ARGS_VERSION 1
typedef struct {
  size_t size;
  unsigned magic;
  unsigned version;
  const void *topk_idx;        /* [num_tokens, num_topk] global expert ids, -1: none */
  epDataType_t topk_idx_type;  /* epInt64 or epInt32 */
  int num_tokens;              /* T (may be 0) */
  int num_topk;                /* K */
  int *tokens_per_rank;        /* out [R]: tokens with at least one expert on rank r */
  int *tokens_per_node;        /* out [num nodes] */
  int *tokens_per_expert;      /* out [E]: (token, expert) pairs */
  uint8_t *is_token_in_rank;   /* out [T, R], 0 or 1 */
} epLayoutArgs_t;

#define EP_LAYOUT_ARGS_INITIALIZER \
  { sizeof(epLayoutArgs_t), EP_LAYOUT_ARGS_MAGIC, EP_LAYOUT_ARGS_VERSION, NULL, epInt64, 0, 0, NULL, NULL, NULL, NULL }

EP_API epResult_t epLayout(epComm_t comm, const epLayoutArgs_t *args, epStream_t stream);

/* ---- Dispatch -------------------------------------------------------------- */
/* Flags of epDispatchArgs_t.flags */
#define EP_DISPATCH_NO_HOST_SYNC 0x1u /* capacity sizing: no host wait; capturable */

#define EP_DISPATCH_ARGS_VERSION 1
typedef struct {
  size_t size;
  unsigned magic;
  unsigned version;
  unsigned flags;
  /* input: this rank's tokens */
  const void *x;               /* [num_tokens, H] of x_type, rows x_stride bytes apart */
  epDataType_t x_type;         /* must equal the config's dispatch_type */
  size_t x_stride;             /* bytes between rows, 0: H * sizeof(type) */
  const float *x_scales;       /* FP8 only: [num_tokens, ceil(H/128)] */
  size_t scales_token_stride;  /* elements between tokens' scales, 0: ceil(H/128) */
  size_t scales_block_stride;  /* elements between one token's scales, 0: 1 */
  const void *topk_idx;        /* [num_tokens, num_topk]; a cached re-dispatch only forwards it
                                  to recv_topk_idx (NULL there: -1 rows; the routing is the handle's) */
  epDataType_t topk_idx_type;  /* epInt64 or epInt32 */
  const float *topk_weights;   /* [num_tokens, num_topk], optional (NULL: received weights 0) */
  int num_tokens;              /* T */
  int num_topk;                /* K */
  int expert_alignment;        /* round recv_tokens_per_expert up to this, 0 or 1: none */
  /* output: rows received from all ranks, by source rank then source token */
  void *recv_x;                /* [recv_capacity, H] of x_type */
  float *recv_scales;          /* FP8 only: [recv_capacity, ceil(H/128)] */
  int64_t *recv_topk_idx;      /* [recv_capacity, K] local expert ids, -1 elsewhere; optional */
  float *recv_topk_weights;    /* [recv_capacity, K]; optional */
  int64_t recv_capacity;       /* rows the recv_* buffers hold */
  int *recv_tokens_per_expert; /* out [local experts]; optional */
  int64_t *num_recv;           /* out: rows received (host pointer unless NO_HOST_SYNC:
                                  then device memory on the GPU backend); optional */
} epDispatchArgs_t;

#define EP_DISPATCH_ARGS_INITIALIZER                                                          \
  {                                                                                           \
    sizeof(epDispatchArgs_t), EP_DISPATCH_ARGS_MAGIC, EP_DISPATCH_ARGS_VERSION, 0u, NULL,   \
        epBfloat16, 0, NULL, 0, 0, NULL, epInt64, NULL, 0, 0, 0, NULL, NULL, NULL, NULL, 0, \
        NULL, NULL                                                                            \
  }

/* Computes the routing of args->topk_idx, exchanges counts with every rank and
 * waits for them (on the GPU backend this is a device-to-host wait), and returns
 * a handle that knows the exact number of rows this rank will receive. Then
 * epHandleRecvCount() sizes the outputs and epDispatch(..., handle) moves data. */
EP_API epResult_t epDispatchPrepare(epComm_t comm, const epDispatchArgs_t *args, epHandle_t *handle,
                                    epStream_t stream);
/* Dispatches this rank's tokens. *handle == NULL: new routing from topk_idx,
 * and a new handle is returned in *handle. *handle from epDispatchPrepare: the
 * prepared routing. *handle from an earlier epDispatch: a cached re-dispatch of
 * new x with the same routing (no layout exchange; topk_idx is optional there:
 * given, it is checked, sent with the rows to recv_topk_idx and counted into
 * recv_tokens_per_expert, but the routing stays the handle's). */
EP_API epResult_t epDispatch(epComm_t comm, const epDispatchArgs_t *args, epHandle_t *handle,
                             epStream_t stream);
/* Rows this rank receives with the handle's routing (known after a prepare or a
 * dispatch without EP_DISPATCH_NO_HOST_SYNC). */
EP_API epResult_t epHandleRecvCount(epHandle_t handle, int64_t *num_recv);
EP_API epResult_t epHandleDestroy(epHandle_t handle);

/* ---- Combine --------------------------------------------------------------- */
#define EP_COMBINE_DETERMINISTIC 0x1u /* sum in ascending source-rank order (bit-identical) */

#define EP_COMBINE_ARGS_VERSION 1
typedef struct {
  size_t size;
  unsigned magic;
  unsigned version;
  unsigned flags;
  const void *y;                  /* [num_recv, H] of y_type: one row per received token */
  epDataType_t y_type;            /* must equal the config's combine_type */
  size_t y_stride;                /* bytes between rows, 0: packed */
  const float *recv_topk_weights; /* [num_recv, K] to sum back, optional */
  int num_topk;                   /* K of recv_topk_weights */
  const void *bias;               /* [num_tokens, H] of y_type, optional */
  void *out;                      /* [num_tokens, H] of y_type on the token's home rank */
  float *out_topk_weights;        /* [num_tokens, K], optional (needs recv_topk_weights) */
} epCombineArgs_t;

#define EP_COMBINE_ARGS_INITIALIZER                                                          \
  {                                                                                          \
    sizeof(epCombineArgs_t), EP_COMBINE_ARGS_MAGIC, EP_COMBINE_ARGS_VERSION, 0u, NULL,     \
        epBfloat16, 0, NULL, 0, NULL, NULL, NULL                                             \
  }

/* Sums each received row back onto its token's home rank, using the routing of
 * a handle from epDispatch. out[t] = sum over ranks r that received t of y_r[row]
 * (+ bias[t]), accumulated in float32. */
EP_API epResult_t epCombine(epComm_t comm, const epCombineArgs_t *args, epHandle_t handle,
                            epStream_t stream);

/* ---- Low latency (decode) --------------------------------------------------
 * Needs config.low_latency = 1: fixed worst-case buffers are registered at init
 * from max_tokens_per_rank, hidden, num_experts and max_topk, so no call
 * waits on the host, and every call can be captured in a CUDA graph. A call
 * allocates only when more than 8 handles are alive at once (the pool of their
 * device state grows, during stream capture too). A token crosses to each
 * destination rank once and is expanded there into the expert-major layout.
 * Two buffer sets alternate between calls.
 * Output layout, with M = max_tokens_per_rank and R ranks:
 *   recv_x      [local_experts, R * M, H]        BF16, or FP8-E4M3 bytes
 *   recv_scales [local_experts, ceil(H/128), R * M] float32 (FP8; token index
 *               fastest, the layout grouped GEMMs read)
 *   recv_count  [local_experts]                   valid rows per expert
 *   recv_src    [local_experts, R * M]            source rank * M + source token
 * Rows of an expert are grouped by source rank ascending, then source token. */
#define EP_LL_DISPATCH_ARGS_MAGIC 0x65704c64u /* 'epLd' */
#define EP_LL_COMBINE_ARGS_MAGIC 0x65704c63u  /* 'epLc' */

/* Flags of the low-latency args. */
#define EP_LL_SEND_ONLY 0x1u          /* post the sends and return; finish with epLowLatencyComplete */
#define EP_LL_ROUND_SCALE_POW2 0x2u   /* FP8: scales rounded up to powers of two */

#define EP_LL_DISPATCH_ARGS_VERSION 1
typedef struct {
  size_t size;
  unsigned magic;
  unsigned version;
  unsigned flags;
  const void *x;               /* [num_tokens, H] BF16 */
  const void *topk_idx;        /* [num_tokens, num_topk] global expert ids, -1: none */
  epDataType_t topk_idx_type;  /* epInt64 or epInt32 */
  const float *topk_weights;   /* [num_tokens, num_topk]: the weights combine applies; NULL: 1 */
  int num_tokens;
  int num_topk;
  epDataType_t wire_type;      /* epFloat8E4M3 (quantised in the library) or epBfloat16 */
  void *recv_x;
  float *recv_scales;
  int *recv_count;
  int *recv_src;               /* optional */
} epLowLatencyDispatchArgs_t;

#define EP_LL_DISPATCH_ARGS_INITIALIZER                                                      \
  {                                                                                          \
    sizeof(epLowLatencyDispatchArgs_t), EP_LL_DISPATCH_ARGS_MAGIC, EP_LL_DISPATCH_ARGS_VERSION, \
        0u, NULL, NULL, epInt64, NULL, 0, 0, epFloat8E4M3, NULL, NULL, NULL, NULL              \
  }

#define EP_LL_COMBINE_ARGS_VERSION 1
typedef struct {
  size_t size;
  unsigned magic;
  unsigned version;
  unsigned flags;
  const void *y;  /* [local_experts, R * M, H] BF16: expert outputs in the dispatch layout, read in place */
  void *out;      /* [num_tokens, H] BF16 on the token's home rank */
} epLowLatencyCombineArgs_t;

#define EP_LL_COMBINE_ARGS_INITIALIZER                                                         \
  {                                                                                            \
    sizeof(epLowLatencyCombineArgs_t), EP_LL_COMBINE_ARGS_MAGIC, EP_LL_COMBINE_ARGS_VERSION, 0u, \
        NULL, NULL                                                                             \
  }

/* Bytes of the low-latency buffers a GPU communicator of nranks with config registers
   (the host backend sizes its rings in its own way: epCommBufferBytes tells what a
   communicator holds). */
EP_API epResult_t epLowLatencyBufferBytes(const epConfig_t *config, int nranks, size_t *bytes);
/* Dispatch for decode; *handle receives a new handle (destroy with epHandleDestroy). */
EP_API epResult_t epLowLatencyDispatch(epComm_t comm, const epLowLatencyDispatchArgs_t *args,
                                       epHandle_t *handle, epStream_t stream);
/* out[t] = sum_k topk_weights[t,k] * y[expert(t,k)][slot(t,k)], float32
 * accumulation: each rank sums its own experts' terms for a token (k ascending),
 * the home rank sums those partial sums in ascending rank order and rounds to
 * BF16. The weights are the ones given to the dispatch of handle. */
EP_API epResult_t epLowLatencyCombine(epComm_t comm, const epLowLatencyCombineArgs_t *args,
                                      epHandle_t handle, epStream_t stream);
/* The receive half of a call made with EP_LL_SEND_ONLY: waits for arrival and
 * finishes its outputs. Between the two halves the library holds no SM. */
EP_API epResult_t epLowLatencyComplete(epComm_t comm, epHandle_t handle, epStream_t stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MOEEP_H_ */
