// A communicator's config as the library uses it: the caller's epConfig_t
// of any known size, with the defaults and EP_* variables applied and every
// field checked.
#pragma once

#include <cstddef>

#include "moeep.h"
#include "plan.h"

struct epComm;

namespace ep {

struct Config {
  int num_experts = 0;
  int hidden = 0;
  int max_tokens_per_rank = 0;
  int max_topk = 0;
  epDataType_t dispatch_type = epBfloat16;
  epDataType_t combine_type = epBfloat16;
  epBackend_t backend = epBackendAuto;
  int device = -1;
  size_t buffer_bytes_cap = 0;
  int timeout_ms = 0;
  int num_sms = 0;
  int max_nodes_per_token = 0;
  int low_latency = 0;
  int enable_shrink = 0;  // epCommShrink allowed (a recovery listener per rank)
  IbTraffic ib;  // InfiniBand traffic settings, resolved by ibTrafficResolve
};

// Limits of a communicator (SEMANTICS.md): far above any model, low enough
// that no buffer size computed from them overflows size_t.
constexpr int kMaxCommRanks = 1 << 16;
constexpr int kMaxExperts = 1 << 20;
constexpr int kMaxHidden = 1 << 18;
constexpr int kMaxTokensPerRank = 1 << 24;
constexpr int kMaxExpertAlignment = 1 << 20;

// Reads a caller's epConfig_t of any known size, fills defaults, validates.
// comm may be NULL (errors go to the thread-local slot).
epResult_t configResolve(const epConfig_t* user, int nranks, Config* out, struct epComm* comm);

// The bytes of a caller's config that are its fields (configResolve copies
// these and keeps the defaults of the rest).
size_t configCallerBytes(const epConfig_t& user);

}  // namespace ep
