#include "config.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>

#include "checks.h"
#include "data_types.h"
#include "params.h"

namespace ep {

// The bytes of a caller's config that are its fields: up to the end of the
// last field of its version, never its tail padding (the current struct has
// 4 bytes of it, where a field added later would otherwise read an older
// caller's garbage). A field added to epConfig_t raises EP_CONFIG_VERSION and
// gives its version's end here; a newer caller is read as far as this
// library knows.
size_t configCallerBytes(const epConfig_t& user) {
  constexpr size_t kVersion1End = offsetof(epConfig_t, ib_ar_control) + sizeof(int);
  constexpr size_t kVersion2End = offsetof(epConfig_t, ib_qp_budget) + sizeof(int);
  constexpr size_t kVersion3End = offsetof(epConfig_t, enable_shrink) + sizeof(int);
  static_assert(EP_CONFIG_VERSION == 3, "a new version of epConfig_t needs its end in configCallerBytes");
  return std::min(user.size, user.version <= 1 ? kVersion1End : user.version == 2 ? kVersion2End : kVersion3End);
}

epResult_t configResolve(const epConfig_t* user, int nranks, Config* out, epComm* comm) {
  if (user == nullptr) return setError(comm, epInvalidArgument, "config is NULL");
  if (nranks < 1 || nranks > kMaxCommRanks)
    return setError(comm, epInvalidArgument, "nranks = %d is outside 1..%d", nranks, kMaxCommRanks);
  if (user->magic != EP_CONFIG_MAGIC)
    return setError(comm, epInvalidArgument,
                    "config.magic = 0x%x is not EP_CONFIG_MAGIC: initialise the config with "
                    "EP_CONFIG_INITIALIZER",
                    user->magic);
  // Version 1 ends with max_nodes_per_token; a caller compiled against it is the smallest we accept.
  const size_t min_size = offsetof(epConfig_t, max_nodes_per_token) + sizeof(int);
  if (user->size < min_size)
    return setError(comm, epInvalidArgument, "config.size = %zu is smaller than any known epConfig_t",
                    user->size);
  // Copy what the caller knew about; later fields keep their defaults.
  epConfig_t c = EP_CONFIG_INITIALIZER;
  memcpy(&c, user, configCallerBytes(*user));
  c.size = sizeof(epConfig_t);

  Config r;
  r.num_experts = c.num_experts;
  r.hidden = c.hidden;
  r.max_tokens_per_rank = c.max_tokens_per_rank;
  r.max_topk = c.max_topk;
  // The enum fields come from C callers as any int: checked as ints before
  // they are held as enums (an enum holding a value outside its range is
  // undefined behaviour in C++).
  const int dispatch_type = rawEnum(c.dispatch_type), combine_type = rawEnum(c.combine_type),
            backend = rawEnum(c.backend);
  if (dispatch_type != epBfloat16 && dispatch_type != epFloat16 && dispatch_type != epFloat32 &&
      dispatch_type != epFloat8E4M3)
    return setError(comm, epInvalidArgument, "config.dispatch_type = %d is not bf16, fp16, fp32 or fp8e4m3",
                    dispatch_type);
  if (combine_type != epBfloat16 && combine_type != epFloat16 && combine_type != epFloat32)
    return setError(comm, epInvalidArgument, "config.combine_type = %d is not bf16, fp16 or fp32",
                    combine_type);
  if (backend != epBackendAuto && backend != epBackendHost && backend != epBackendCuda)
    return setError(comm, epInvalidArgument, "config.backend = %d is unknown", backend);
  r.dispatch_type = epDataType_t(dispatch_type);
  r.combine_type = epDataType_t(combine_type);
  r.backend = epBackend_t(backend);
  r.device = c.device;
  // 0 means "not set here": the EP_* variable, else the default. Negative
  // values are errors, named after where they came from.
  if (c.timeout_ms < 0)
    return setError(comm, epInvalidArgument, "config.timeout_ms = %d is negative", c.timeout_ms);
  if (c.num_sms < 0) return setError(comm, epInvalidArgument, "config.num_sms = %d is negative", c.num_sms);
  if (c.buffer_bytes_cap == 0 && param::BUFFER_BYTES_CAP() < 0)
    return setError(comm, epInvalidArgument, "EP_BUFFER_BYTES_CAP = %lld is negative",
                    (long long)param::BUFFER_BYTES_CAP());
  if (c.timeout_ms == 0 && (param::TIMEOUT_MS() <= 0 || param::TIMEOUT_MS() > INT32_MAX))
    return setError(comm, epInvalidArgument, "EP_TIMEOUT_MS = %lld must be in 1..%d",
                    (long long)param::TIMEOUT_MS(), INT32_MAX);
  if (c.num_sms == 0 && (param::NUM_SMS() < 0 || param::NUM_SMS() > 1024))
    return setError(comm, epInvalidArgument, "EP_NUM_SMS = %lld must be in 0..1024", (long long)param::NUM_SMS());
  if (param::NODE_SIZE() < 0 || param::NODE_SIZE() > nranks)
    return setError(comm, epInvalidArgument, "EP_NODE_SIZE = %lld is outside 0..%d (the ranks; 0: by host)",
                    (long long)param::NODE_SIZE(), nranks);
  r.buffer_bytes_cap = c.buffer_bytes_cap ? c.buffer_bytes_cap : size_t(param::BUFFER_BYTES_CAP());
  r.timeout_ms = c.timeout_ms > 0 ? c.timeout_ms : int(param::TIMEOUT_MS());
  r.num_sms = c.num_sms > 0 ? c.num_sms : int(param::NUM_SMS());
  r.max_nodes_per_token = c.max_nodes_per_token;
  r.low_latency = c.low_latency;
  r.enable_shrink = c.enable_shrink != 0 ? c.enable_shrink : int(param::ENABLE_SHRINK());

  // Upper bounds keep every buffer size computed from the config far from
  // overflowing size_t (a larger buffer could not be allocated anyway).
  if (r.num_experts <= 0 || r.num_experts > kMaxExperts)
    return setError(comm, epInvalidArgument, "config.num_experts = %d is outside 1..%d", r.num_experts,
                    kMaxExperts);
  if (r.num_experts % nranks != 0)
    return setError(comm, epInvalidArgument,
                    "config.num_experts = %d is not a multiple of the %d ranks", r.num_experts, nranks);
  if (r.hidden <= 0 || r.hidden > kMaxHidden)
    return setError(comm, epInvalidArgument, "config.hidden = %d is outside 1..%d", r.hidden, kMaxHidden);
  if (r.max_tokens_per_rank < 0 || r.max_tokens_per_rank > kMaxTokensPerRank)
    return setError(comm, epInvalidArgument, "config.max_tokens_per_rank = %d is outside 0..%d",
                    r.max_tokens_per_rank, kMaxTokensPerRank);
  if (r.max_topk < 1 || r.max_topk > 32)
    return setError(comm, epInvalidArgument, "config.max_topk = %d is outside 1..32", r.max_topk);
  for (epDataType_t t : {r.dispatch_type, r.combine_type})
    if ((size_t(r.hidden) * dataTypeSize(t)) % 16 != 0)
      return setError(comm, epInvalidArgument,
                      "config.hidden = %d: a %s row is %zu bytes, not a multiple of 16", r.hidden,
                      dataTypeName(t), size_t(r.hidden) * dataTypeSize(t));
  if (r.low_latency != 0 && r.low_latency != 1)
    return setError(comm, epInvalidArgument, "config.low_latency = %d must be 0 or 1", r.low_latency);
  if (r.enable_shrink != 0 && r.enable_shrink != 1)
    return setError(comm, epInvalidArgument, "config.enable_shrink = %d (else EP_ENABLE_SHRINK) must be 0 or 1",
                    r.enable_shrink);
  if (r.max_nodes_per_token < 0)
    return setError(comm, epInvalidArgument, "config.max_nodes_per_token = %d is negative",
                    r.max_nodes_per_token);
  EPCHECK(ibTrafficResolve(c, &r.ib, comm));
  *out = r;
  return epSuccess;
}

}  // namespace ep
