// The entry guard of every public call on a communicator: refuses dead,
// aborted or failed communicators and counts the call in flight, so that
// epCommAbort can wait for calls in other threads to leave.
#pragma once

#include "comm.h"
#include "debug.h"

namespace ep {

class CallGuard {
 public:
  explicit CallGuard(epComm* comm) : comm_(comm) {}
  ~CallGuard() {
    if (counted_) comm_->active_calls.fetch_sub(1);
  }
  CallGuard(const CallGuard&) = delete;
  CallGuard& operator=(const CallGuard&) = delete;

  epResult_t enter(const char* fn) {
    clearThreadError();
    if (comm_ == nullptr) return setError(nullptr, epInvalidArgument, "%s: comm is NULL", fn);
    if (comm_->magic != kCommMagic)
      return setError(nullptr, epInvalidArgument, "%s: comm is not a live communicator", fn);
    comm_->active_calls.fetch_add(1);
    counted_ = true;
    if (comm_->abort_flag.load()) return setError(comm_, epAborted, "%s: communicator was aborted", fn);
    int broken = comm_->broken.load();
    if (broken != epSuccess)
      return setError(comm_, epRemoteError,
                      "%s: the communicator failed in an earlier call (%s) and cannot be used; "
                      "destroy it and create a new one",
                      fn, epGetErrorString(epResult_t(broken)));
    return epSuccess;
  }

 private:
  epComm* comm_;
  bool counted_ = false;
};

}  // namespace ep
