// Public entry points: version, errors, unique id, queries, layout, dispatch,
// combine. Every argument is checked here, before any communication, so an
// argument error leaves the communicator usable and the caller's buffers
// untouched.
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "api_guard.h"
#include "backend.h"
#include "bootstrap.h"
#include "checks.h"
#include "comm.h"
#include "params.h"
#include "routing.h"
#include "transport.h"

using namespace ep;

namespace {

// The epDataType_t fields of each argument struct (checkDataTypeField).
epResult_t checkEnums(epComm* comm, const char* fn, const epLayoutArgs_t& a) {
  return checkDataTypeField(comm, fn, "topk_idx_type", a.topk_idx_type);
}
epResult_t checkEnums(epComm* comm, const char* fn, const epDispatchArgs_t& a) {
  EPCHECK(checkDataTypeField(comm, fn, "x_type", a.x_type));
  return checkDataTypeField(comm, fn, "topk_idx_type", a.topk_idx_type);
}
epResult_t checkEnums(epComm* comm, const char* fn, const epCombineArgs_t& a) {
  return checkDataTypeField(comm, fn, "y_type", a.y_type);
}

// Copies a caller's versioned struct of any known size into a full one.
template <typename T>
epResult_t readArgs(epComm* comm, const T* user, unsigned magic, size_t v1_size, T* out,
                    const char* fn, const char* type_name) {
  if (user == nullptr) return setError(comm, epInvalidArgument, "%s: args is NULL", fn);
  if (user->magic != magic)
    return setError(comm, epInvalidArgument,
                    "%s: args.magic = 0x%x is wrong: initialise %s with its _INITIALIZER macro", fn,
                    user->magic, type_name);
  if (user->size < v1_size)
    return setError(comm, epInvalidArgument, "%s: args.size = %zu is smaller than any known %s", fn,
                    user->size, type_name);
  memcpy(out, user, std::min(user->size, sizeof(T)));
  return checkEnums(comm, fn, *out);
}

constexpr size_t kLayoutV1 = offsetof(epLayoutArgs_t, is_token_in_rank) + sizeof(void*);
constexpr size_t kDispatchV1 = offsetof(epDispatchArgs_t, num_recv) + sizeof(void*);
constexpr size_t kCombineV1 = offsetof(epCombineArgs_t, out_topk_weights) + sizeof(void*);

epResult_t checkTopk(epComm* comm, const char* fn, const void* topk_idx, epDataType_t type,
                     int num_tokens, int num_topk) {
  if (num_topk < 1 || num_topk > comm->cfg.max_topk)
    return setError(comm, epInvalidArgument, "%s: num_topk = %d is outside 1..config.max_topk (%d)",
                    fn, num_topk, comm->cfg.max_topk);
  if (type != epInt64 && type != epInt32)
    return setError(comm, epInvalidArgument, "%s: topk_idx_type must be epInt64 or epInt32", fn);
  if (num_tokens > 0 && topk_idx == nullptr)
    return setError(comm, epInvalidArgument, "%s: topk_idx is NULL with num_tokens = %d", fn, num_tokens);
  return checkTopkValues(comm, fn, topk_idx, type, num_tokens, num_topk);
}

epResult_t checkNumTokens(epComm* comm, const char* fn, int num_tokens) {
  if (num_tokens < 0 || num_tokens > comm->cfg.max_tokens_per_rank)
    return setError(comm, epInvalidArgument,
                    "%s: num_tokens = %d is outside 0..config.max_tokens_per_rank (%d)", fn,
                    num_tokens, comm->cfg.max_tokens_per_rank);
  return epSuccess;
}

epResult_t checkHandle(epComm* comm, const char* fn, epHandle* h) {
  if (h->magic != kHandleMagic)
    return setError(comm, epInvalidArgument, "%s: handle is not a live routing handle", fn);
  if (h->comm != comm)
    return setError(comm, epInvalidArgument, "%s: handle belongs to another communicator (or to one already destroyed)", fn);
  if (h->epoch != comm->shrink_epoch)
    return setError(comm, epInvalidUsage, "%s: the handle was made before epCommShrink (its routing names dead ranks)",
                    fn);
  if (h->low_latency)
    return setError(comm, epInvalidArgument,
                    "%s: handle comes from epLowLatencyDispatch (use epLowLatencyCombine; its routing has no "
                    "high-throughput layout)", fn);
  return epSuccess;
}

// The fields of the routing and the counts: what epDispatchPrepare checks
// (x, its type and the buffers come with the epDispatch that follows, which
// checks them too).
epResult_t checkRoutingArgs(epComm* comm, const char* fn, const epDispatchArgs_t& a, bool new_routing) {
  if (a.flags & ~EP_DISPATCH_NO_HOST_SYNC)
    return setError(comm, epInvalidArgument, "%s: args.flags = 0x%x has unknown bits", fn, a.flags);
  EPCHECK(checkNumTokens(comm, fn, a.num_tokens));
  // A cached re-dispatch given ids forwards them (recv_topk_idx): checked like a new routing's.
  if (new_routing || a.topk_idx != nullptr)
    EPCHECK(checkTopk(comm, fn, a.topk_idx, a.topk_idx_type, a.num_tokens, a.num_topk));
  if (a.expert_alignment < 0 || a.expert_alignment > kMaxExpertAlignment)
    return setError(comm, epInvalidArgument, "%s: expert_alignment = %d is outside 0..%d", fn,
                    a.expert_alignment, kMaxExpertAlignment);
  return epSuccess;
}

epResult_t checkDispatchArgs(epComm* comm, const char* fn, const epDispatchArgs_t& a, bool new_routing) {
  const Config& c = comm->cfg;
  EPCHECK(checkRoutingArgs(comm, fn, a, new_routing));
  if (a.x_type != c.dispatch_type)
    return setError(comm, epInvalidArgument, "%s: x_type = %s but config.dispatch_type = %s", fn,
                    dataTypeName(a.x_type), dataTypeName(c.dispatch_type));
  const size_t row_bytes = size_t(c.hidden) * dataTypeSize(c.dispatch_type);
  if (a.num_tokens > 0 && a.x == nullptr)
    return setError(comm, epInvalidArgument, "%s: x is NULL with num_tokens = %d", fn, a.num_tokens);
  if (a.x_stride != 0 && (a.x_stride < row_bytes || a.x_stride % 16 != 0))
    return setError(comm, epInvalidArgument,
                    "%s: x_stride = %zu must be 0 or a multiple of 16 of at least %zu bytes", fn,
                    a.x_stride, row_bytes);
  if ((reinterpret_cast<uintptr_t>(a.x) | reinterpret_cast<uintptr_t>(a.recv_x)) % 16 != 0)
    return setError(comm, epInvalidArgument, "%s: x and recv_x must be 16-byte aligned", fn);
  if (c.dispatch_type == epFloat8E4M3 && a.num_tokens > 0 && a.x_scales == nullptr)
    return setError(comm, epInvalidArgument, "%s: x_scales is NULL with FP8 dispatch", fn);
  if (c.dispatch_type == epFloat8E4M3 && a.recv_x != nullptr && a.recv_scales == nullptr)
    return setError(comm, epInvalidArgument, "%s: recv_scales is NULL with FP8 dispatch", fn);
  if (a.recv_capacity < 0)
    return setError(comm, epInvalidArgument, "%s: recv_capacity = %lld is negative", fn,
                    (long long)a.recv_capacity);
  if (a.recv_capacity > 0 && a.recv_x == nullptr)
    return setError(comm, epInvalidArgument, "%s: recv_x is NULL with recv_capacity = %lld", fn,
                    (long long)a.recv_capacity);
  return epSuccess;
}

// The backend's prepare, giving back the routing state it took when it fails
// after taking it (the handle is dropped, so nothing else would).
epResult_t prepareRouting(epComm* comm, const char* fn, const epDispatchArgs_t& a, epHandle* h, epStream_t stream) {
  epResult_t res = comm->backend->prepare(fn, a, h, stream);
  if (res != epSuccess) comm->backend->releaseHandle(h);
  return res;
}

}  // namespace

epResult_t ep::checkDataTypeField(epComm* comm, const char* fn, const char* name, const epDataType_t& field) {
  const int v = rawEnum(field);
  if (v < epBfloat16 || v > epInt64)
    return setError(comm, epInvalidArgument, "%s: %s = %d is not an epDataType_t value", fn, name, v);
  return epSuccess;
}

epResult_t ep::checkTopkValues(epComm* comm, const char* fn, const void* topk_idx, epDataType_t type,
                               int num_tokens, int num_topk) {
  // Host memory can be read here; device memory is checked by the kernels
  // (or, on a backend that stages it into host memory, there).
  if (comm->backend == nullptr || !comm->backend->hostMemory() || num_tokens <= 0) return epSuccess;
  const BackendComm view(comm, comm, comm->bootstrap, &comm->abort_flag, &comm->broken);
  return checkTopkIds(view, fn, topk_idx, type, num_tokens, num_topk);
}

epResult_t ep::apiException(const char* fn, epComm* comm) noexcept {
  epResult_t code = epInternalError;
  char what[160] = "unknown exception";
  try {
    throw;
  } catch (const std::bad_alloc&) {
    code = epOutOfMemory;
    snprintf(what, sizeof(what), "out of host memory");
  } catch (const std::exception& e) {
    snprintf(what, sizeof(what), "internal exception: %s", e.what());
  } catch (...) {
  }
  if (comm != nullptr && comm->magic == kCommMagic) {
    comm->broken.store(code);
    return setError(comm, code, "%s: %s; the communicator cannot be used further", fn, what);
  }
  return setError(nullptr, code, "%s: %s", fn, what);
}

extern "C" {

EP_API epResult_t epGetVersion(int* version) {
  if (version == nullptr) return setError(nullptr, epInvalidArgument, "epGetVersion: version is NULL");
  *version = EP_VERSION_CODE;
  return epSuccess;
}

EP_API const char* epGetErrorString(epResult_t result) {
  switch (result) {
    case epSuccess: return "no error";
    case epUnhandledCudaError: return "unhandled CUDA error";
    case epSystemError: return "system error";
    case epInternalError: return "internal error";
    case epInvalidArgument: return "invalid argument";
    case epInvalidUsage: return "invalid usage";
    case epRemoteError: return "remote process failed";
    case epInProgress: return "operation in progress";
    case epTimeout: return "timeout";
    case epNotSupported: return "not supported";
    case epAborted: return "communicator aborted";
    case epOutOfMemory: return "out of memory";
  }
  return "unknown result code";
}

EP_API const char* epGetLastError(epComm_t comm) {
  if (comm == nullptr || comm->magic != kCommMagic) return threadLastError();
  std::lock_guard<std::mutex> lock(comm->error_mu);
  // The string lives in the comm; copy to a thread-local so it outlives the lock.
  static thread_local std::string copy;
  copy = comm->last_error;
  return copy.c_str();
}

EP_API epResult_t epGetUniqueId(epUniqueId* id) try {
  clearThreadError();
  if (id == nullptr) return setError(nullptr, epInvalidArgument, "epGetUniqueId: unique_id is NULL");
  paramWarnUnknown();
  return bootstrapGetUniqueId(id);
} catch (...) {
  return apiException("epGetUniqueId", nullptr);
}

EP_API epResult_t epCommRank(epComm_t comm, int* rank) try {
  CallGuard g(comm);
  EPCHECK(g.enter("epCommRank"));
  if (rank == nullptr) return setError(comm, epInvalidArgument, "epCommRank: rank is NULL");
  *rank = comm->rank;
  return epSuccess;
} catch (...) {
  return apiException("epCommRank", nullptr);
}

EP_API epResult_t epCommSize(epComm_t comm, int* size) try {
  CallGuard g(comm);
  EPCHECK(g.enter("epCommSize"));
  if (size == nullptr) return setError(comm, epInvalidArgument, "epCommSize: size is NULL");
  *size = comm->nranks;
  return epSuccess;
} catch (...) {
  return apiException("epCommSize", nullptr);
}

EP_API epResult_t epCommLocalExperts(epComm_t comm, int* first, int* count) try {
  CallGuard g(comm);
  EPCHECK(g.enter("epCommLocalExperts"));
  if (first == nullptr || count == nullptr)
    return setError(comm, epInvalidArgument, "epCommLocalExperts: first or count is NULL");
  *first = comm->first_expert;
  *count = comm->num_local_experts;
  return epSuccess;
} catch (...) {
  return apiException("epCommLocalExperts", nullptr);
}

EP_API epResult_t epCommBufferBytes(epComm_t comm, size_t* bytes) try {
  CallGuard g(comm);
  EPCHECK(g.enter("epCommBufferBytes"));
  if (bytes == nullptr) return setError(comm, epInvalidArgument, "epCommBufferBytes: bytes is NULL");
  *bytes = comm->backend->bufferBytes();
  return epSuccess;
} catch (...) {
  return apiException("epCommBufferBytes", nullptr);
}

EP_API epResult_t epCommNodes(epComm_t comm, int* num_nodes, int* node_of_rank) try {
  CallGuard g(comm);
  EPCHECK(g.enter("epCommNodes"));
  if (num_nodes == nullptr) return setError(comm, epInvalidArgument, "epCommNodes: num_nodes is NULL");
  *num_nodes = comm->nodes.num_nodes;
  if (node_of_rank)
    for (int r = 0; r < comm->nranks; r++) node_of_rank[r] = comm->nodes.node_of_rank[r];
  return epSuccess;
} catch (...) {
  return apiException("epCommNodes", nullptr);
}

EP_API epResult_t epLayout(epComm_t comm, const epLayoutArgs_t* user, epStream_t stream) {
  CallGuard g(comm);
  try {
    const char* fn = "epLayout";
    EPCHECK(g.enterCollective(fn));
    epLayoutArgs_t a = EP_LAYOUT_ARGS_INITIALIZER;
    EPCHECK(readArgs(comm, user, EP_LAYOUT_ARGS_MAGIC, kLayoutV1, &a, fn, "epLayoutArgs_t"));
    EPCHECK(checkNumTokens(comm, fn, a.num_tokens));
    EPCHECK(checkTopk(comm, fn, a.topk_idx, a.topk_idx_type, a.num_tokens, a.num_topk));
    return comm->backend->layout(a, stream);
  } catch (...) {
    return g.exception("epLayout");
  }
}

EP_API epResult_t epDispatchPrepare(epComm_t comm, const epDispatchArgs_t* user, epHandle_t* handle,
                                    epStream_t stream) {
  CallGuard g(comm);
  try {
    const char* fn = "epDispatchPrepare";
    EPCHECK(g.enterCollective(fn));
    epDispatchArgs_t a = EP_DISPATCH_ARGS_INITIALIZER;
    EPCHECK(readArgs(comm, user, EP_DISPATCH_ARGS_MAGIC, kDispatchV1, &a, fn, "epDispatchArgs_t"));
    if (handle == nullptr) return setError(comm, epInvalidArgument, "%s: handle is NULL", fn);
    EPCHECK(checkRoutingArgs(comm, fn, a, true));
    auto h = std::make_unique<epHandle>();
    h->comm = comm;
    h->epoch = comm->shrink_epoch;
    EPCHECK(prepareRouting(comm, fn, a, h.get(), stream));
    commAddHandle(comm, h.get());
    *handle = h.release();
    return epSuccess;
  } catch (...) {
    return g.exception("epDispatchPrepare");
  }
}

EP_API epResult_t epDispatch(epComm_t comm, const epDispatchArgs_t* user, epHandle_t* handle,
                             epStream_t stream) {
  CallGuard g(comm);
  try {
    const char* fn = "epDispatch";
    EPCHECK(g.enterCollective(fn));
    epDispatchArgs_t a = EP_DISPATCH_ARGS_INITIALIZER;
    EPCHECK(readArgs(comm, user, EP_DISPATCH_ARGS_MAGIC, kDispatchV1, &a, fn, "epDispatchArgs_t"));
    if (handle == nullptr) return setError(comm, epInvalidArgument, "%s: handle is NULL", fn);
    epHandle* existing = *handle;
    if (existing != nullptr) {
      EPCHECK(checkHandle(comm, fn, existing));
      if (a.num_tokens != existing->routing.num_tokens)
        return setError(comm, epInvalidArgument,
                        "%s: num_tokens = %d differs from the handle's %d (a cached dispatch reuses "
                        "the routing of the same tokens)",
                        fn, a.num_tokens, existing->routing.num_tokens);
      if (a.topk_idx != nullptr && a.num_topk != existing->routing.num_topk)
        return setError(comm, epInvalidArgument, "%s: num_topk = %d differs from the handle's %d", fn,
                        a.num_topk, existing->routing.num_topk);
      // The ids travel with the rows: the receivers' recv_topk_idx and their
      // per-expert counts come from them, so the first dispatch of a prepared
      // handle needs them (only a re-dispatch may leave them out).
      if (a.topk_idx == nullptr && a.num_tokens > 0 && !existing->dispatched)
        return setError(comm, epInvalidArgument,
                        "%s: topk_idx is NULL in the first dispatch of a prepared handle (the receivers' "
                        "recv_topk_idx and recv_tokens_per_expert come from the ids sent with the rows; "
                        "only a cached re-dispatch may leave them out)",
                        fn);
      if (a.topk_idx == nullptr)
        a.num_topk = existing->routing.num_topk;  // without ids, the handle's K applies
      EPCHECK(checkDispatchArgs(comm, fn, a, false));
      EPCHECK(comm->backend->dispatch(a, existing, false, stream));
      existing->dispatched = true;
      return epSuccess;
    }
    EPCHECK(checkDispatchArgs(comm, fn, a, true));
    auto h = std::make_unique<epHandle>();
    h->comm = comm;
    h->epoch = comm->shrink_epoch;
    EPCHECK(prepareRouting(comm, fn, a, h.get(), stream));
    epResult_t res = comm->backend->dispatch(a, h.get(), true, stream);
    if (res != epSuccess) {
      comm->backend->releaseHandle(h.get());
      return res;
    }
    h->dispatched = true;
    commAddHandle(comm, h.get());
    *handle = h.release();
    return epSuccess;
  } catch (...) {
    return g.exception("epDispatch");
  }
}

EP_API epResult_t epHandleRecvCount(epHandle_t handle, int64_t* num_recv) try {
  clearThreadError();
  if (handle == nullptr || handle->magic != kHandleMagic)
    return setError(nullptr, epInvalidArgument, "epHandleRecvCount: handle is not a live routing handle");
  if (num_recv == nullptr) return setError(nullptr, epInvalidArgument, "epHandleRecvCount: num_recv is NULL");
  if (handle->low_latency)
    return setError(nullptr, epInvalidArgument,
                    "epHandleRecvCount: handle comes from epLowLatencyDispatch, whose counts are its recv_count "
                    "output (rows per local expert)");
  if (!handle->counts_known)
    return setError(nullptr, epInvalidUsage,
                    "epHandleRecvCount: the handle's counts are on the device only (it came from a "
                    "dispatch with EP_DISPATCH_NO_HOST_SYNC)");
  *num_recv = handle->routing.num_recv;
  return epSuccess;
} catch (...) {
  return apiException("epHandleRecvCount", nullptr);
}

EP_API epResult_t epHandleDestroy(epHandle_t handle) try {
  if (handle == nullptr) return epSuccess;
  if (handle->magic != kHandleMagic)
    return setError(nullptr, epInvalidArgument, "epHandleDestroy: handle is not a live routing handle");
  {
    // Held while comm is used: a destroy or abort of comm in another thread
    // detaches the handle (comm = nullptr) before or after, never during.
    std::lock_guard<std::mutex> link(handleLinkMutex());
    epComm* comm = handle->comm;  // nullptr once its communicator was destroyed
    if (comm != nullptr) {
      llForgetHandle(comm, handle);
      commRemoveHandle(comm, handle);
      if (comm->backend) comm->backend->releaseHandle(handle);
    }
  }
  handle->magic = kDeadMagic;
  delete handle;
  return epSuccess;
} catch (...) {
  return apiException("epHandleDestroy", nullptr);
}

EP_API epResult_t epCombine(epComm_t comm, const epCombineArgs_t* user, epHandle_t handle,
                            epStream_t stream) {
  CallGuard g(comm);
  try {
    const char* fn = "epCombine";
    EPCHECK(g.enterCollective(fn));
    epCombineArgs_t a = EP_COMBINE_ARGS_INITIALIZER;
    EPCHECK(readArgs(comm, user, EP_COMBINE_ARGS_MAGIC, kCombineV1, &a, fn, "epCombineArgs_t"));
    if (handle == nullptr) return setError(comm, epInvalidArgument, "%s: handle is NULL", fn);
    EPCHECK(checkHandle(comm, fn, handle));
    if (!handle->dispatched)
      return setError(comm, epInvalidUsage, "%s: the handle has not been used by a dispatch yet", fn);
    const Config& c = comm->cfg;
    if (a.flags & ~EP_COMBINE_DETERMINISTIC)
      return setError(comm, epInvalidArgument, "%s: args.flags = 0x%x has unknown bits", fn, a.flags);
    if (a.y_type != c.combine_type)
      return setError(comm, epInvalidArgument, "%s: y_type = %s but config.combine_type = %s", fn,
                      dataTypeName(a.y_type), dataTypeName(c.combine_type));
    const size_t row_bytes = size_t(c.hidden) * dataTypeSize(c.combine_type);
    if (a.y_stride != 0 && (a.y_stride < row_bytes || a.y_stride % 16 != 0))
      return setError(comm, epInvalidArgument,
                      "%s: y_stride = %zu must be 0 or a multiple of 16 of at least %zu bytes", fn,
                      a.y_stride, row_bytes);
    if (handle->counts_known && handle->routing.num_recv > 0 && a.y == nullptr)
      return setError(comm, epInvalidArgument, "%s: y is NULL but this rank received %lld rows", fn,
                      (long long)handle->routing.num_recv);
    if (handle->routing.num_tokens > 0 && a.out == nullptr)
      return setError(comm, epInvalidArgument, "%s: out is NULL with %d tokens", fn,
                      handle->routing.num_tokens);
    const uintptr_t addresses = reinterpret_cast<uintptr_t>(a.y) | reinterpret_cast<uintptr_t>(a.out) |
                                reinterpret_cast<uintptr_t>(a.bias);
    if (addresses % 16 != 0)
      return setError(comm, epInvalidArgument, "%s: y, out and bias must be 16-byte aligned", fn);
    if (a.out_topk_weights != nullptr && a.recv_topk_weights == nullptr)
      return setError(comm, epInvalidArgument, "%s: out_topk_weights needs recv_topk_weights", fn);
    if (a.recv_topk_weights != nullptr && a.num_topk != handle->routing.num_topk)
      return setError(comm, epInvalidArgument, "%s: num_topk = %d differs from the dispatch's %d", fn,
                      a.num_topk, handle->routing.num_topk);
    return comm->backend->combine(a, handle, stream);
  } catch (...) {
    return g.exception("epCombine");
  }
}

EP_API epResult_t epGetParam(int index, const char** name, const char** default_value,
                             const char** value, const char** doc) try {
  clearThreadError();
  if (index < 0 || index >= paramCount())
    return setError(nullptr, epInvalidArgument, "epGetParam: index = %d is outside [0, %d)", index, paramCount());
  const ParamInfo& p = paramInfo(index);
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (int i = 0; i < paramCount(); i++) v.push_back(std::string("EP_") + paramInfo(i).name);
    return v;
  }();
  if (name) *name = names[index].c_str();
  if (default_value) *default_value = p.default_value;
  if (value) *value = paramShownValue(p);
  if (doc) *doc = p.doc;
  return epSuccess;
} catch (...) {
  return apiException("epGetParam", nullptr);
}

EP_API epResult_t epGetTransport(int index, const char** name, int* available, const char** detail) try {
  const auto& list = transportList();
  clearThreadError();
  if (index < 0 || index >= int(list.size()))
    return setError(nullptr, epInvalidArgument, "epGetTransport: index = %d is outside [0, %d)", index,
                    int(list.size()));
  const TransportEntry& e = list[index];
  if (name) *name = e.name;
  if (available) *available = e.available ? 1 : 0;
  if (detail) *detail = e.available ? e.origin.c_str() : e.reason.c_str();
  return epSuccess;
} catch (...) {
  return apiException("epGetTransport", nullptr);
}

}  // extern "C"
