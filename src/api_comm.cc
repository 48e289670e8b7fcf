// Public entry points of a communicator's life cycle: epCommInitRank,
// epCommInitAll, epCommDestroy, epCommAbort. The life cycle itself is in
// comm.cc; here the arguments are checked, the ranks of epCommInitAll get
// their threads, and a destroy or abort is claimed once.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "api_guard.h"
#include "backend.h"
#include "bootstrap.h"
#include "checks.h"
#include "comm.h"
#include "params.h"

namespace ep {
namespace {

// The one destroy or abort of a live communicator: the first caller gets it,
// a second one racing it is refused (both would free it).
epResult_t claimClose(epComm* comm, const char* fn) {
  if (comm->magic != kCommMagic) return setError(nullptr, epInvalidArgument, "%s: comm is not a live communicator", fn);
  if (comm->closing.exchange(1) != 0)
    return setError(nullptr, epInvalidUsage,
                    "%s: the communicator is already being destroyed or aborted in another thread", fn);
  return epSuccess;
}

// Destroys what an epCommInitAll that failed made, leaving every slot NULL.
void destroyAll(epComm_t* comms, int nranks) {
  for (int r = 0; r < nranks; r++) {
    if (comms[r]) epCommDestroy(comms[r]);
    comms[r] = nullptr;
  }
}

// epCommInitRank; init_abort (may be NULL) gives up the bootstrap (epCommInitAll).
epResult_t commInitRank(epComm_t* out, int nranks, const epUniqueId& id, int rank, const epConfig_t* config,
                        const std::atomic<int>* init_abort) {
  clearThreadError();
  paramWarnUnknown();
  if (out == nullptr) return setError(nullptr, epInvalidArgument, "comm is NULL");
  *out = nullptr;
  if (nranks < 1) return setError(nullptr, epInvalidArgument, "nranks = %d must be at least 1", nranks);
  if (rank < 0 || rank >= nranks)
    return setError(nullptr, epInvalidArgument, "rank = %d is outside [0, %d)", rank, nranks);
  if (!bootstrapIdValid(id))
    return setError(nullptr, epInvalidArgument, "unique_id was not made by epGetUniqueId");
  Config cfg;
  EPCHECK(configResolve(config, nranks, &cfg, nullptr));
  return commCreate(nranks, id, rank, cfg, init_abort, out);
}

// Runs body(rank, give_up) in a thread per rank and joins them. A thread that
// cannot be started (RLIMIT_NPROC, pids.max, address space) sets give_up, so
// that the started ranks leave the bootstrap at once instead of waiting for
// the rest until their timeout. Returns false with *why set then.
bool runRankThreads(int nranks, const std::function<void(int, const std::atomic<int>*)>& body,
                    char* why, size_t why_size) {
  std::atomic<int> give_up{0};
  std::vector<std::thread> threads;
  threads.reserve(size_t(nranks));  // before any thread: a throw here leaves none to join
  for (int r = 0; r < nranks; r++) {
    try {
      threads.emplace_back(body, r, &give_up);
    } catch (const std::exception& e) {  // std::system_error; std::bad_alloc for the thread's state
      // No allocation here: a joinable thread destroyed by a throw would terminate the process.
      snprintf(why, why_size, "cannot start the thread of rank %d of %d: %s", r, nranks, e.what());
      give_up.store(1);
      break;
    }
  }
  for (std::thread& t : threads) t.join();
  return give_up.load() == 0;
}

}  // namespace
}  // namespace ep

using namespace ep;

extern "C" {

EP_API epResult_t epCommInitRank(epComm_t* out, int nranks, epUniqueId id, int rank,
                                 const epConfig_t* config) try {
  return commInitRank(out, nranks, id, rank, config, nullptr);
} catch (...) {
  return apiException("epCommInitRank", nullptr);
}

EP_API epResult_t epCommInitAll(epComm_t* comms, int nranks, const int* devices,
                                const epConfig_t* config) try {
  clearThreadError();
  if (comms == nullptr) return setError(nullptr, epInvalidArgument, "comms is NULL");
  if (nranks < 1) return setError(nullptr, epInvalidArgument, "nranks = %d must be at least 1", nranks);
  if (config == nullptr) return setError(nullptr, epInvalidArgument, "config is NULL");
  Config probe;
  EPCHECK(configResolve(config, nranks, &probe, nullptr));
  for (int r = 0; r < nranks; r++) comms[r] = nullptr;
  epUniqueId id;  // private to this process: EP_COMM_ID names the job's address, not this one
  EPCHECK(bootstrapGetUniqueId(&id, false));
  std::vector<epResult_t> results(nranks, epSuccess);
  std::vector<std::string> errors(nranks);
  char thread_failure[256] = "";
  const bool all_ran = runRankThreads(
      nranks,
      [&](int r, const std::atomic<int>* give_up) {
        epConfig_t c = EP_CONFIG_INITIALIZER;
        memcpy(&c, config, configCallerBytes(*config));
        c.size = sizeof(c);
        if (devices != nullptr) c.device = devices[r];
        else if (c.device < 0 && (c.backend == epBackendCuda || c.backend == epBackendAuto)) c.device = r;
        try {  // nothing may leave a thread
          results[r] = commInitRank(&comms[r], nranks, id, r, &c, give_up);
          if (results[r] != epSuccess) errors[r] = threadLastError();
        } catch (...) {
          results[r] = apiException("epCommInitAll", nullptr);
        }
      },
      thread_failure, sizeof(thread_failure));
  for (int r = 0; r < nranks && all_ran; r++) {
    if (results[r] == epSuccess) continue;
    destroyAll(comms, nranks);
    return setError(nullptr, results[r], "rank %d: %s", r, errors[r].c_str());
  }
  if (!all_ran) {
    destroyAll(comms, nranks);
    return setError(nullptr, epSystemError,
                    "epCommInitAll: %s (the limit on processes or threads, ulimit -u or the cgroup's "
                    "pids.max, or on address space, ulimit -v, is too low for %d ranks in one process)",
                    thread_failure, nranks);
  }
  return epSuccess;
} catch (...) {
  return apiException("epCommInitAll", nullptr);
}

EP_API epResult_t epCommDestroy(epComm_t comm) try {
  if (comm == nullptr) return epSuccess;  // like free(NULL)
  EPCHECK(claimClose(comm, "epCommDestroy"));
  // Freeing it under a call of another thread would pull the memory from
  // under that call: refuse (epCommAbort is the way to unblock a call).
  if (comm->active_calls.load() > 0) {
    comm->closing.store(0);
    return setError(comm, epInvalidUsage,
                    "epCommDestroy: a call on this communicator is in progress in another thread; destroy "
                    "it after the call returned, or unblock the call with epCommAbort");
  }
  commFree(comm);
  return epSuccess;
} catch (...) {
  return apiException("epCommDestroy", nullptr);
}

EP_API epResult_t epCommAbort(epComm_t comm) try {
  if (comm == nullptr) return epSuccess;
  EPCHECK(claimClose(comm, "epCommAbort"));
  comm->abort_flag.store(1);
  if (comm->bootstrap) bootstrapAbort(comm->bootstrap);
  if (comm->backend) comm->backend->abort();
  // Let calls blocked in other threads see the flag and leave before freeing.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (comm->active_calls.load() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (comm->active_calls.load() > 0)
    return setError(nullptr, epInternalError, "epCommAbort: a call on this communicator did not return");
  commFree(comm);
  return epSuccess;
} catch (...) {
  return apiException("epCommAbort", nullptr);
}

}  // extern "C"
