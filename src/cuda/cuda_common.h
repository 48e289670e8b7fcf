// Shared between the CUDA backend's host code (cuda_*.cc, g++) and its
// kernels (*.cu, nvcc): the layout of the communication buffer, the per-handle
// device state, the kernel parameter blocks and the launch functions.
//
// Memory map of one rank's communication buffer (registered with cuda_ipc and
// mapped by every peer of the node):
//   [Ctrl]                      flags, written by peers (remote stores only)
//   [rows: slots x row_stride]  staging rows: dispatch rows pushed by sources,
//                               combine rows pushed back by destinations
//   [meta: slots x meta_stride] per staged row: FP8 scales, local expert ids,
//                               weights (dispatch) / weights (combine)
// slots = R * max_tokens_per_rank: every row has a fixed worst-case slot, so no
// flow control is needed; a barrier at the start of every data kernel keeps a
// fast rank from writing staging that a slow rank still reads.
//
// Every flag is a 64-bit word "epoch << 32 | value": the epoch is a device-side
// counter of collective kernels (DevLocal::epoch), bumped by the last block of
// each kernel, so nothing per call is baked on the host (CUDA-graph safe).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ep {
namespace cuda {

constexpr int kMaxRanks = 8;
constexpr int kMaxChannels = 132;

struct Ctrl {
  uint64_t fin[kMaxRanks];                      // [src] = epoch of the last collective kernel src finished
  uint64_t counts[2][kMaxRanks][kMaxRanks];      // [epoch & 1][src][dst] = epoch << 32 | rows
  uint64_t dinfo[kMaxRanks][kMaxChannels];       // [src][channel] = epoch << 32 | rows of that channel
  uint32_t dstart[kMaxRanks][kMaxChannels];      // [src][channel] first position (valid with dinfo)
  uint64_t dprog[kMaxRanks][kMaxChannels];       // dispatch progress: epoch << 32 | rows written
  uint64_t cprog[kMaxRanks][kMaxChannels];       // combine progress: epoch << 32 | rows written
};

// The collective high-throughput kernels (as a report of ranks out of step
// names them): the same values as their calls' CallKind (src/call_log.h).
enum HtKernel { kHtRouting = 1, kHtDispatch = 2, kHtCombine = 3 };

// What a high-throughput wait reads once it has lasted kFamilyProbeNs
// (device.cuh: peerOutOfStep), to tell a peer in another call (ranks out of
// step) from a slow one, and where it then tells a peer found in a
// low-latency call. Written at init; the low-latency pointers are null
// without low-latency buffers.
struct FamilyWatch {
  const Ctrl* ht_ctrl;            // this rank's Ctrl (the words its peers wrote)
  const uint64_t* ll_counters;    // this rank's LLCtrl signal counters, [kind][set][rank] (ll_common.h)
  uint8_t* peer_ll_gone[kMaxRanks];  // [r]: LLLocal::gone of rank r as mapped here
  int rank, nranks, channels;
};
// What peerOutOfStep found (ErrorInfo::b of the report): the peer in a
// low-latency call, or (above 255) its kernel kind << 8 | this rank's, the
// two in different high-throughput kernels of the same epoch.
constexpr uint32_t kOutOfStepLowLatency = 1;

// Device memory private to one rank (not mapped by peers).
struct DevLocal {
  uint32_t epoch;        // collective kernels completed
  uint32_t blocks_done;  // last-block detection of the collective kernels
  uint32_t layout_done;  // last-block detection of the layout kernel
  int err_claim;         // the first argument error of a kernel wins err[kArgSlot]
  int timed_out;         // a wait of this rank failed, or the communicator is being aborted (the
                         // host writes 1): every other wait leaves at once
  uint32_t route_ticket; // routing kernel: tiles taken so far (reset by its last block)
  alignas(8) uint8_t gone[kMaxRanks];  // [rank]: its process exited (written by the host's watcher)
  FamilyWatch watch;
  int fail_claim;        // the first failed wait wins err[kFailSlot] (cleared only by epCommShrink)
  uint32_t dead;         // ranks an epCommShrink removed (bit r), written by the host in the shrink
                         // (docs/SHRINK.md, "GPUs"): the high-throughput kernels skip them (htDead)
  uint32_t shrinks;      // epCommShrinks so far; a handle's routing keeps the count it ran under
                         // (HState::shrinks, htStaleHandle)
};

// Routing kernel: tokens per block (one tile), and the per-tile scratch it
// needs ([tiles][4] 64-bit words: epoch flag, packed counts lo, hi, unused).
constexpr int kRouteTile = 512;
inline size_t routeScratchBytes(int max_tokens) {
  return (size_t(max_tokens > 0 ? max_tokens : 1) / kRouteTile + 2) * 32;
}

// Host-mapped (pinned) error slot: kernels write, the host reads at its next
// host-visible point. code is an epResult_t.
struct ErrorInfo {
  volatile int code;
  volatile int what;
  volatile int peer;
  volatile int channel;
  volatile long long a, b;
};
// Each kernel family has two host-mapped slots: err[kArgSlot] for argument
// errors (reported once, then cleared: the communicator goes on) and
// err[kFailSlot] for failed waits (timeout, exited peer, ranks out of step:
// the communicator is broken, the slot is never cleared).
constexpr int kArgSlot = 0, kFailSlot = 1, kErrorSlots = 2;

enum ErrWhat {
  kWhatNone = 0,
  kWhatPrevious = 1,
  kWhatCounts = 2,
  kWhatDispatchInfo = 3,
  kWhatDispatchData = 4,
  kWhatCombineData = 5,
  kWhatBadTopk = 6,
  kWhatCapacity = 7,
  kWhatWiderTopk = 8,  // a source passed more top-k columns than this rank (a: its count, b: this rank's)
  kWhatNodeLimit = 9,  // a token on more nodes than config.max_nodes_per_token (a: the token, b: its nodes)
  kWhatStaleHandle = 10  // a graph replayed the dispatch or combine of a handle routed before an epCommShrink
};

// Dispatch meta: the id column codes besides a local expert id and -1.
constexpr int kIdPastTopk = -2;  // past the sender's num_topk
constexpr int kIdNoIds = -3;     // the sender passed no topk_idx (a cached re-dispatch)

// Routing of one handle, on the device.
struct HState {
  long long recv_offset[kMaxRanks + 1];  // first recv row of each source
  long long num_recv;
  int recv_count[kMaxRanks];
  int dst_base[kMaxRanks];   // first staging slot of this rank's rows at each destination
  int comb_base[kMaxRanks];  // [s]: first slot of this rank's combine rows in s's staging
  int send_base[kMaxRanks];  // first slot of the combine rows coming back from each destination
  int send_count[kMaxRanks];
  int num_tokens;
  int num_topk;
  uint32_t shrinks;  // DevLocal::shrinks when the routing ran (htStaleHandle)
};

struct HandleView {
  HState* hs;
  int* tok_pos;     // [(T + 1) * R]: bit 31 = sent, bits 0..30 = position in the send list
  int* chan_start;  // [R][channels]: receive side, first position of each source channel
  int* chan_count;  // [R][channels]
  int* expert_acc;  // [local experts]: per-expert counts being summed
  int* expert_saved;  // [local experts]: counts of the last dispatch with topk ids
  int* rows_without_ids;  // dispatch: nonzero once a row without ids arrived (reset by its last block)
};

struct CommView {
  int rank, nranks, channels;
  int num_experts, experts_per_rank;
  char* bufs[kMaxRanks];  // every rank's buffer as mapped here
  size_t rows_off, meta_off, row_stride, meta_stride;
  DevLocal* local;
  ErrorInfo* err;  // device view of the host-mapped slots [kErrorSlots]
  unsigned long long timeout_ns;
};

struct RoutingParams {
  CommView cv;
  HandleView hv;
  uint64_t* scratch;  // routeScratchBytes(max tokens), any contents
  const void* topk;
  int idx64;
  int num_tokens, num_topk;
  // config.max_nodes_per_token where a token could exceed it (0: not
  // checked) and the ranks of each node (bit r of node_ranks[q]: rank r is on
  // node q; at most kMaxRanks nodes).
  int max_nodes;
  unsigned node_ranks[kMaxRanks];
};

// The node-limit check of a low-latency dispatch, a kernel of its own (the
// low-latency kernels do not look at nodes): tokens whose experts lie on more
// than max_nodes nodes are reported into the slot `err` (claimed through
// err_claim) as `what`, the token in a and its node count in b.
struct NodeLimitParams {
  const void* topk;
  int idx64;
  int num_tokens, num_topk, num_experts, experts_per_rank;
  int max_nodes;
  unsigned node_ranks[kMaxRanks];
  int* err_claim;
  ErrorInfo* err;
  int what;
};

struct DispatchParams {
  CommView cv;
  HandleView hv;
  const char* x;
  size_t x_stride, row_bytes;
  const float* x_scales;
  size_t s_tok, s_blk;
  int nb;  // scales per token (FP8), else 0
  const void* topk;  // NULL: no ids this time
  int idx64;
  int check_ids;     // the ids are not those the routing kernel checked: range-check them
  const float* topk_w;
  int num_tokens, num_topk;
  int max_topk;  // id columns of the meta (config.max_topk, the same on every rank)
  char* recv_x;
  float* recv_scales;
  long long* recv_idx;
  float* recv_w;
  long long capacity;
  int* recv_tpe;
  long long* num_recv_dev;
  int alignment;
  int drop;           // the host knows the rows do not fit: move nothing into recv_*
  int capacity_mode;  // NO_HOST_SYNC: mark unused rows, write num_recv on the device
  int send_warps, recv_warps;
  int chunk_tokens;   // tokens between two progress signals of a channel
};

struct CombineParams {
  CommView cv;
  HandleView hv;
  const char* y;
  size_t y_stride, row_bytes;
  const float* recv_w;  // NULL: no weights
  int num_topk;
  const char* bias;
  char* out;
  float* out_w;
  int type;  // epDataType_t of the rows
  int push_warps, reduce_warps;
};

struct LayoutParams {
  const void* topk;
  int idx64;
  int num_tokens, num_topk, num_experts, experts_per_rank, nranks, num_nodes;
  int node_of_rank[kMaxRanks];
  int max_nodes;  // config.max_nodes_per_token where a token could exceed it (0: not checked)
  int* tokens_per_rank;
  int* tokens_per_node;
  int* tokens_per_expert;
  uint8_t* is_token_in_rank;
  int* scratch;  // [E + R + N] zeroed, left zeroed
  DevLocal* local;
  ErrorInfo* err;
};

// Launchers (return a cudaError_t as int, 0 on success).
int launchLayout(const LayoutParams& p, void* stream);
int launchRouting(const RoutingParams& p, void* stream);
int launchNodeLimit(const NodeLimitParams& p, void* stream);
int launchDispatch(const DispatchParams& p, int blocks, void* stream);
int launchCombine(const CombineParams& p, int blocks, void* stream);
// Load every kernel of a file now (preload.cuh says why).
int preloadLayoutKernels();
int preloadDispatchKernels();
int preloadCombineKernels();

}  // namespace cuda
}  // namespace ep
