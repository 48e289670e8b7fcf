// Public entry points of the low-latency mode. As in api.cc, every argument is
// checked before any communication.
#include <atomic>
#include <cstring>
#include <memory>

#include "api_guard.h"
#include "backend.h"
#include "checks.h"
#include "comm.h"
#include "ll_layout.h"

using namespace ep;

namespace {

constexpr size_t kLLDispatchV1 = offsetof(epLowLatencyDispatchArgs_t, recv_src) + sizeof(void*);
constexpr size_t kLLCombineV1 = offsetof(epLowLatencyCombineArgs_t, out) + sizeof(void*);

// The low-latency calls need the buffers registered at init.
epResult_t checkLowLatency(epComm* comm, const char* fn) {
  if (!comm->cfg.low_latency)
    return setError(comm, epInvalidUsage, "%s: the communicator was made with config.low_latency = 0", fn);
  return epSuccess;
}

bool misaligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 != 0; }

epResult_t checkLLHandle(epComm* comm, const char* fn, epHandle* h) {
  if (h == nullptr) return setError(comm, epInvalidArgument, "%s: handle is NULL", fn);
  if (h->magic != kHandleMagic) return setError(comm, epInvalidArgument, "%s: handle is not a live handle", fn);
  if (h->comm != comm) return setError(comm, epInvalidArgument, "%s: handle belongs to another communicator", fn);
  if (h->epoch != comm->shrink_epoch)
    return setError(comm, epInvalidUsage, "%s: the handle was made before epCommShrink (its routing names dead ranks)",
                    fn);
  if (!h->low_latency)
    return setError(comm, epInvalidArgument, "%s: handle comes from epDispatch, not epLowLatencyDispatch", fn);
  return epSuccess;
}

// Refuses a call whose buffer set still owes an earlier pair's call (`owed`)
// or never will get it (`lost`): on the device the call would wait for it
// until the timeout (epComm::ll_uncombined, ll_receive_owed).
epResult_t checkSetState(epComm* comm, const char* fn, const std::atomic<int>& state, const char* owed,
                         const char* lost) {
  const int s = state.load();
  if (s == epComm::kLLFree) return epSuccess;
  return setError(comm, epInvalidUsage, "%s: %s", fn, s == epComm::kLLOwed ? owed : lost);
}

}  // namespace

void ep::llForgetHandle(epComm* comm, const epHandle* h) {
  // A handle from before a shrink owes nothing: the shrink freed its set.
  if (!h->low_latency || h->epoch != comm->shrink_epoch) return;
  // A combine (or its receive half) this handle owes will never run: its set
  // stays owed for good.
  if (h->dispatched && !h->ll_combined) comm->ll_uncombined[h->ll_set].store(epComm::kLLLost);
  if (h->pending == epHandle::Pending::kCombine) comm->ll_receive_owed[h->ll_set].store(epComm::kLLLost);
}

extern "C" {

EP_API epResult_t epLowLatencyBufferBytes(const epConfig_t* config, int nranks, size_t* bytes) try {
  clearThreadError();
  if (bytes == nullptr) return setError(nullptr, epInvalidArgument, "epLowLatencyBufferBytes: bytes is NULL");
  if (nranks < 1) return setError(nullptr, epInvalidArgument, "epLowLatencyBufferBytes: nranks = %d", nranks);
  Config c;
  EPCHECK(configResolve(config, nranks, &c, nullptr));
  *bytes = llBufferBytes(nranks, c.max_tokens_per_rank, c.hidden, c.max_topk, c.num_experts);
  return epSuccess;
} catch (...) {
  return apiException("epLowLatencyBufferBytes", nullptr);
}

EP_API epResult_t epLowLatencyDispatch(epComm_t comm, const epLowLatencyDispatchArgs_t* user,
                                       epHandle_t* handle, epStream_t stream) {
  CallGuard guard(comm);
  try {
    const char* fn = "epLowLatencyDispatch";
    EPCHECK(guard.enterCollective(fn));
    EPCHECK(checkLowLatency(comm, fn));
    if (user == nullptr) return setError(comm, epInvalidArgument, "%s: args is NULL", fn);
    if (user->magic != EP_LL_DISPATCH_ARGS_MAGIC || user->size < kLLDispatchV1)
      return setError(comm, epInvalidArgument,
                      "%s: args.magic / args.size are wrong: initialise with EP_LL_DISPATCH_ARGS_INITIALIZER",
                      fn);
    epLowLatencyDispatchArgs_t a = EP_LL_DISPATCH_ARGS_INITIALIZER;
    memcpy(&a, user, std::min(user->size, sizeof(a)));
    EPCHECK(checkDataTypeField(comm, fn, "topk_idx_type", a.topk_idx_type));
    EPCHECK(checkDataTypeField(comm, fn, "wire_type", a.wire_type));
    if (handle == nullptr) return setError(comm, epInvalidArgument, "%s: handle is NULL", fn);
    const Config& c = comm->cfg;
    if (a.flags & ~(EP_LL_SEND_ONLY | EP_LL_ROUND_SCALE_POW2))
      return setError(comm, epInvalidArgument, "%s: args.flags = 0x%x has unknown bits", fn, a.flags);
    if (a.num_tokens < 0 || a.num_tokens > c.max_tokens_per_rank)
      return setError(comm, epInvalidArgument,
                      "%s: num_tokens = %d is outside 0..config.max_tokens_per_rank (%d)", fn, a.num_tokens,
                      c.max_tokens_per_rank);
    if (a.num_topk < 1 || a.num_topk > c.max_topk)
      return setError(comm, epInvalidArgument, "%s: num_topk = %d is outside 1..config.max_topk (%d)", fn,
                      a.num_topk, c.max_topk);
    if (a.topk_idx_type != epInt64 && a.topk_idx_type != epInt32)
      return setError(comm, epInvalidArgument, "%s: topk_idx_type must be epInt64 or epInt32", fn);
    if (a.num_tokens > 0 && (a.x == nullptr || a.topk_idx == nullptr))
      return setError(comm, epInvalidArgument, "%s: x or topk_idx is NULL with num_tokens = %d", fn,
                      a.num_tokens);
    if (a.wire_type != epFloat8E4M3 && a.wire_type != epBfloat16)
      return setError(comm, epInvalidArgument, "%s: wire_type must be epFloat8E4M3 or epBfloat16", fn);
    const size_t wire_row = a.wire_type == epFloat8E4M3 ? size_t(c.hidden) : size_t(c.hidden) * 2;
    if (wire_row % 16 != 0)
      return setError(comm, epInvalidArgument,
                      "%s: a %s row of hidden = %d is %zu bytes, not a multiple of 16", fn,
                      a.wire_type == epFloat8E4M3 ? "fp8" : "bf16", c.hidden, wire_row);
    if (a.recv_x == nullptr || a.recv_count == nullptr)
      return setError(comm, epInvalidArgument, "%s: recv_x and recv_count are required", fn);
    if (a.wire_type == epFloat8E4M3 && a.recv_scales == nullptr)
      return setError(comm, epInvalidArgument, "%s: recv_scales is NULL with an FP8 wire", fn);
    if (misaligned(a.x) || misaligned(a.recv_x))
      return setError(comm, epInvalidArgument, "%s: x and recv_x must be 16-byte aligned", fn);
    EPCHECK(checkTopkValues(comm, fn, a.topk_idx, a.topk_idx_type, a.num_tokens, a.num_topk));
    const int set = int(comm->ll_dispatches & 1u);
    EPCHECK(checkSetState(
        comm, fn, comm->ll_uncombined[set],
        "the low-latency dispatch two before this one (the same buffer set) is not combined yet; "
        "combine it first (pairs alternate between two buffer sets, and this dispatch would wait "
        "for that set forever)",
        "the dispatch two before this one (the same buffer set) was destroyed without its combine, "
        "so its set is never released: make a new communicator (combine every low-latency "
        "dispatch)"));
    auto h = std::make_unique<epHandle>();
    h->comm = comm;
    h->epoch = comm->shrink_epoch;
    h->low_latency = true;
    h->routing.num_tokens = a.num_tokens;
    h->routing.num_topk = a.num_topk;
    epResult_t res = comm->backend->llDispatch(a, h.get(), (a.flags & EP_LL_SEND_ONLY) != 0, stream);
    if (res != epSuccess) {
      comm->backend->releaseHandle(h.get());
      if (res == epNotSupported)
        return setError(comm, res, "%s: the %s backend has no low-latency mode yet", fn,
                        comm->backend->name());
      return res;
    }
    h->dispatched = true;
    h->ll_set = set;
    comm->ll_dispatches++;
    comm->ll_uncombined[set].store(epComm::kLLOwed);
    commAddHandle(comm, h.get());
    *handle = h.release();
    return epSuccess;
  } catch (...) {
    return guard.exception("epLowLatencyDispatch");
  }
}

EP_API epResult_t epLowLatencyCombine(epComm_t comm, const epLowLatencyCombineArgs_t* user, epHandle_t handle,
                                      epStream_t stream) {
  CallGuard guard(comm);
  try {
    const char* fn = "epLowLatencyCombine";
    EPCHECK(guard.enterCollective(fn));
    EPCHECK(checkLowLatency(comm, fn));
    if (user == nullptr) return setError(comm, epInvalidArgument, "%s: args is NULL", fn);
    if (user->magic != EP_LL_COMBINE_ARGS_MAGIC || user->size < kLLCombineV1)
      return setError(comm, epInvalidArgument,
                      "%s: args.magic / args.size are wrong: initialise with EP_LL_COMBINE_ARGS_INITIALIZER",
                      fn);
    epLowLatencyCombineArgs_t a = EP_LL_COMBINE_ARGS_INITIALIZER;
    memcpy(&a, user, std::min(user->size, sizeof(a)));
    EPCHECK(checkLLHandle(comm, fn, handle));
    if (a.flags & ~EP_LL_SEND_ONLY)
      return setError(comm, epInvalidArgument, "%s: args.flags = 0x%x has unknown bits", fn, a.flags);
    if (handle->pending != epHandle::Pending::kNone)
      return setError(comm, epInvalidUsage,
                      "%s: the handle's send-only call was not completed (epLowLatencyComplete)", fn);
    if (handle->ll_combined)
      return setError(comm, epInvalidUsage,
                      "%s: this handle was already combined: each low-latency dispatch is combined once", fn);
    if (a.y == nullptr) return setError(comm, epInvalidArgument, "%s: y is NULL", fn);
    if (handle->routing.num_tokens > 0 && a.out == nullptr)
      return setError(comm, epInvalidArgument, "%s: out is NULL with %d tokens", fn,
                      handle->routing.num_tokens);
    if (misaligned(a.y) || misaligned(a.out))
      return setError(comm, epInvalidArgument, "%s: y and out must be 16-byte aligned", fn);
    EPCHECK(checkSetState(
        comm, fn, comm->ll_receive_owed[handle->ll_set],
        "the send-only combine of the dispatch two before this one (the same buffer set) is not "
        "completed: call epLowLatencyComplete on it first (this combine would wait for it)",
        "a handle of this buffer set was destroyed after a send-only combine without "
        "epLowLatencyComplete; no combine can use the set again: make a new communicator"));
    const bool send_only = (a.flags & EP_LL_SEND_ONLY) != 0;
    EPCHECK(comm->backend->llCombine(a, handle, send_only, stream));
    handle->ll_combined = true;
    comm->ll_uncombined[handle->ll_set].store(epComm::kLLFree);
    if (send_only) comm->ll_receive_owed[handle->ll_set].store(epComm::kLLOwed);
    return epSuccess;
  } catch (...) {
    return guard.exception("epLowLatencyCombine");
  }
}

EP_API epResult_t epLowLatencyComplete(epComm_t comm, epHandle_t handle, epStream_t stream) {
  CallGuard guard(comm);
  try {
    const char* fn = "epLowLatencyComplete";
    EPCHECK(guard.enterCollective(fn));
    EPCHECK(checkLowLatency(comm, fn));
    EPCHECK(checkLLHandle(comm, fn, handle));
    if (handle->pending == epHandle::Pending::kNone)
      return setError(comm, epInvalidUsage, "%s: the handle has no send-only call to finish", fn);
    const bool combine = handle->pending == epHandle::Pending::kCombine;
    EPCHECK(comm->backend->llComplete(handle, stream));
    if (combine) comm->ll_receive_owed[handle->ll_set].store(epComm::kLLFree);
    return epSuccess;
  } catch (...) {
    return guard.exception("epLowLatencyComplete");
  }
}

}  // extern "C"
