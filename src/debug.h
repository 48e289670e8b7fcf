// Logging and the last error of a communicator.
//
// EP_DEBUG=WARN|INFO|TRACE picks the level, EP_DEBUG_SUBSYS=INIT,BOOTSTRAP,...
// (or ^SUBSYS to exclude) the subsystems. A line looks like
//   host:pid:tid [dev] EP INFO message
// epSetError() records the message of a failed call: per communicator when one
// is given, else in a thread-local slot (what epGetLastError(NULL) returns).
#pragma once

#include <cstdarg>

#include "moeep.h"

struct epComm;

namespace ep {

enum LogLevel { kLogNone = 0, kLogWarn = 1, kLogInfo = 2, kLogTrace = 3 };

enum LogSubsys : unsigned {
  kSubsysInit = 1u << 0,
  kSubsysBootstrap = 1u << 1,
  kSubsysTopo = 1u << 2,
  kSubsysTransport = 1u << 3,
  kSubsysDispatch = 1u << 4,
  kSubsysCombine = 1u << 5,
  kSubsysParams = 1u << 6,
  kSubsysCuda = 1u << 7,
  kSubsysAll = ~0u
};

void logMessage(LogLevel level, unsigned subsys, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 5, 6)));
bool logEnabled(LogLevel level, unsigned subsys);
// The device shown in the log prefix of this thread (-1: none).
void logSetDevice(int device);

// Where setError keeps the message of a failed call on a communicator: set
// once by the communicator's own code (comm.cc), so that logging, at the
// bottom of the layers, needs nothing of the layers above it.
using CommErrorStore = void (*)(struct epComm* comm, const char* msg);
void setCommErrorStore(CommErrorStore store);

// Records the message of a failed call (printf style). comm may be NULL.
// Also logged at WARN. Returns res so that `return setError(...)` reads well.
epResult_t setError(struct epComm* comm, epResult_t res, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
epResult_t vsetError(struct epComm* comm, epResult_t res, const char* fmt, va_list ap);
// Clears the thread-local last error at the start of each public call. The
// communicator's message stays until the next failure on it (epGetLastError(comm)
// is the message of the last failed call, as moeep.h says).
void clearThreadError();
const char* threadLastError();

}  // namespace ep

#define EP_WARN(subsys, ...) ::ep::logMessage(::ep::kLogWarn, (subsys), __FILE__, __LINE__, __VA_ARGS__)
#define EP_INFO(subsys, ...)                                                           \
  do {                                                                                  \
    if (::ep::logEnabled(::ep::kLogInfo, (subsys)))                                     \
      ::ep::logMessage(::ep::kLogInfo, (subsys), __FILE__, __LINE__, __VA_ARGS__);      \
  } while (0)
#define EP_TRACE(subsys, ...)                                                          \
  do {                                                                                  \
    if (::ep::logEnabled(::ep::kLogTrace, (subsys)))                                    \
      ::ep::logMessage(::ep::kLogTrace, (subsys), __FILE__, __LINE__, __VA_ARGS__);     \
  } while (0)
