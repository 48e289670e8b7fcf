#include "control.h"

#include <cstdint>
#include <cstring>

namespace tools {

namespace {
constexpr int kRowFloats = int(ControlChannel::kPayloadBytes / sizeof(float));
}  // namespace

ControlChannel::~ControlChannel() {
  if (comm_ != nullptr) epCommDestroy(comm_);
}

epResult_t ControlChannel::fail(const char* what, epResult_t res) {
  error_ =
      std::string("control channel: ") + what + ": " + epGetErrorString(res) + ": " + epGetLastError(comm_);
  return res;
}

epResult_t ControlChannel::misuse(const char* what, size_t bytes) {
  error_ = std::string("control channel: ") + what +
           (comm_ == nullptr ? std::string(": not initialised")
                             : ": " + std::to_string(bytes) + " bytes do not fit in one payload row");
  return epInvalidUsage;
}

epResult_t ControlChannel::init(const epUniqueId& id, int rank, int nranks, int timeout_ms) {
  rank_ = rank;
  nranks_ = nranks;
  epConfig_t cfg = EP_CONFIG_INITIALIZER;
  cfg.num_experts = nranks;  // expert r lives on rank r
  cfg.hidden = kRowFloats;
  cfg.max_tokens_per_rank = nranks;  // rank 0 sends one row per rank in a broadcast
  cfg.max_topk = 1;
  cfg.dispatch_type = epFloat32;
  cfg.combine_type = epFloat32;
  cfg.backend = epBackendHost;
  cfg.timeout_ms = timeout_ms;
  // Control messages are one row per rank: keep the rings small even for many ranks.
  cfg.buffer_bytes_cap = size_t(nranks) * 128 * 1024;
  send_.assign(size_t(nranks) * kRowFloats, 0.0f);
  recv_.assign(size_t(nranks) * kRowFloats, 0.0f);
  epResult_t res = epCommInitRank(&comm_, nranks, id, rank, &cfg);
  if (res != epSuccess) {
    comm_ = nullptr;
    return fail("epCommInitRank", res);
  }
  return epSuccess;
}

epResult_t ControlChannel::route(int rows_out, const int64_t* experts, int64_t expect_rows,
                                 const char* what) {
  epDispatchArgs_t args = EP_DISPATCH_ARGS_INITIALIZER;
  args.x = rows_out > 0 ? send_.data() : nullptr;
  args.x_type = epFloat32;
  args.topk_idx = experts;
  args.topk_idx_type = epInt64;
  args.num_tokens = rows_out;
  args.num_topk = 1;
  args.recv_x = expect_rows > 0 ? recv_.data() : nullptr;
  args.recv_capacity = expect_rows;
  int64_t got_rows = -1;
  args.num_recv = &got_rows;
  epHandle_t handle = nullptr;
  epResult_t res = epDispatch(comm_, &args, &handle, nullptr);
  if (res != epSuccess) return fail(what, res);
  epHandleDestroy(handle);
  if (got_rows != expect_rows) {
    error_ = std::string("control channel: ") + what + ": received " + std::to_string(got_rows) +
             " rows instead of " + std::to_string(expect_rows);
    return epInternalError;
  }
  return epSuccess;
}

epResult_t ControlChannel::barrier() {
  if (comm_ == nullptr) return misuse("barrier", 0);
  epDispatchArgs_t args = EP_DISPATCH_ARGS_INITIALIZER;
  args.num_tokens = 0;
  args.num_topk = 1;
  epHandle_t handle = nullptr;
  epResult_t res = epDispatchPrepare(comm_, &args, &handle, nullptr);
  if (res != epSuccess) return fail("barrier (epDispatchPrepare of 0 tokens)", res);
  epHandleDestroy(handle);
  return epSuccess;
}

epResult_t ControlChannel::gather(const void* mine, size_t bytes, void* all) {
  if (comm_ == nullptr || bytes > kPayloadBytes) return misuse("gather", bytes);
  memset(send_.data(), 0, kPayloadBytes);
  memcpy(send_.data(), mine, bytes);
  const int64_t to_rank0 = 0;  // expert 0 lives on rank 0
  epResult_t res = route(1, &to_rank0, rank_ == 0 ? nranks_ : 0, "gather (epDispatch)");
  if (res != epSuccess) return res;
  if (rank_ == 0 && all != nullptr)
    for (int r = 0; r < nranks_; r++)
      memcpy(static_cast<char*>(all) + size_t(r) * bytes, recv_.data() + size_t(r) * kRowFloats, bytes);
  return epSuccess;
}

epResult_t ControlChannel::broadcast(void* data, size_t bytes) {
  if (comm_ == nullptr || bytes > kPayloadBytes) return misuse("broadcast", bytes);
  std::vector<int64_t> experts;
  if (rank_ == 0) {
    for (int r = 0; r < nranks_; r++) {
      float* row = send_.data() + size_t(r) * kRowFloats;
      memset(row, 0, kPayloadBytes);
      memcpy(row, data, bytes);
      experts.push_back(r);  // token r to expert r, i.e. to rank r
    }
  }
  epResult_t res = route(rank_ == 0 ? nranks_ : 0, experts.data(), 1, "broadcast (epDispatch)");
  if (res != epSuccess) return res;
  memcpy(data, recv_.data(), bytes);
  return epSuccess;
}

}  // namespace tools
