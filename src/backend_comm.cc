#include "backend_comm.h"

#include <cstdarg>

#include "debug.h"
#include "process.h"

namespace ep {

bool BackendComm::peerExited(int r) const {
  return pidVisible(r) && !processAlive(facts_->peers[size_t(r)].pid);
}

epResult_t setError(const BackendComm& comm, epResult_t res, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsetError(comm.errorTarget(), res, fmt, ap);
  va_end(ap);
  return res;
}

}  // namespace ep
