// The entry guard of every public call on a communicator: refuses dead,
// aborted or closing communicators (and failed ones, for collective calls)
// and counts the call in flight, so
// that epCommAbort can wait for calls in other threads to leave and
// epCommDestroy can refuse to free a communicator in use. Collective calls
// (the data calls) also claim the communicator: two at once, from two
// threads, would share its exchange state, so the second is refused.
#pragma once

#include "comm.h"
#include "debug.h"

namespace ep {

// The catch of every public call (a function-try-block around its body): an
// exception from below (std::bad_alloc above all) becomes a result and a
// message instead of terminating the caller's process. A data call that threw
// may have left its peers mid-exchange, so its communicator is marked failed.
epResult_t apiException(const char* fn, epComm* comm) noexcept;

// The expert ids of a data call where the backend reads host memory: each -1
// or an expert, each token within config.max_nodes_per_token nodes
// (epInvalidArgument naming the position or the token). Elsewhere the kernels
// check them. epLayout and epDispatch (through their checks) and
// epLowLatencyDispatch.
epResult_t checkTopkValues(epComm* comm, const char* fn, const void* topk_idx, epDataType_t type,
                           int num_tokens, int num_topk);

// A low-latency handle being destroyed: the buffer set of a combine (or a
// receive half) it still owes is marked lost (api_ll.cc). Other handles: nothing.
void llForgetHandle(epComm* comm, const epHandle* h);

// A caller's epDataType_t field (by reference: not loaded as the enum before
// it is known to be one): epInvalidArgument naming it unless it is a value of
// the enum. The checks after it compare it with the types they accept.
epResult_t checkDataTypeField(epComm* comm, const char* fn, const char* name, const epDataType_t& field);

class CallGuard {
 public:
  explicit CallGuard(epComm* comm) : comm_(comm) {}
  ~CallGuard() {
    if (collective_) comm_->collective_busy.store(0);
    if (counted_) comm_->active_calls.fetch_sub(1);
  }
  CallGuard(const CallGuard&) = delete;
  CallGuard& operator=(const CallGuard&) = delete;

  // An exception that left the call's body, turned into its result while
  // the guard still counts the call: an epCommAbort or epCommDestroy in
  // another thread waits for that count, so comm is not freed meanwhile.
  // (A handler after the guard's destructor could find it freed.) A call
  // that never entered touches no communicator.
  epResult_t exception(const char* fn) noexcept { return apiException(fn, counted_ ? comm_ : nullptr); }

  epResult_t enter(const char* fn) {
    clearThreadError();
    if (comm_ == nullptr) return setError(nullptr, epInvalidArgument, "%s: comm is NULL", fn);
    if (comm_->magic != kCommMagic)
      return setError(nullptr, epInvalidArgument, "%s: comm is not a live communicator", fn);
    comm_->active_calls.fetch_add(1);
    counted_ = true;
    if (comm_->abort_flag.load()) return setError(comm_, epAborted, "%s: communicator was aborted", fn);
    if (comm_->closing.load())
      return setError(comm_, epInvalidUsage, "%s: the communicator is being destroyed in another thread", fn);
    return epSuccess;
  }

  // enter() for a collective call (layout, dispatch, combine, low latency).
  // A communicator that failed refuses these only: its queries (rank, size,
  // buffer bytes, paths) still answer, for the caller's error handling.
  epResult_t enterCollective(const char* fn) {
    epResult_t res = enter(fn);
    if (res != epSuccess) return res;
    int broken = comm_->broken.load();
    if (broken != epSuccess)
      return setError(comm_, epRemoteError,
                      "%s: the communicator failed in an earlier call (%s) and cannot be used; "
                      "destroy it and create a new one",
                      fn, epGetErrorString(epResult_t(broken)));
    if (comm_->collective_busy.exchange(1) != 0)
      return setError(comm_, epInvalidUsage,
                      "%s: another call on this communicator is in progress in another thread; the data "
                      "calls of one communicator must not overlap (use one thread, or one communicator "
                      "per thread)",
                      fn);
    collective_ = true;
    return epSuccess;
  }

 private:
  epComm* comm_;
  bool counted_ = false;
  bool collective_ = false;
};

}  // namespace ep
