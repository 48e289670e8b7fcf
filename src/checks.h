// Check macros with one cleanup exit, in the manner of NCCL's checks.h.
#pragma once

#include <cerrno>
#include <cstring>

#include "debug.h"

// Propagate a failed epResult_t.
#define EPCHECK(call)                          \
  do {                                         \
    epResult_t ep_res_ = (call);               \
    if (ep_res_ != epSuccess) return ep_res_;  \
  } while (0)

// Store a failed epResult_t in res and jump to label.
#define EPCHECKGOTO(call, res, label) \
  do {                                \
    (res) = (call);                   \
    if ((res) != epSuccess) goto label; \
  } while (0)

// A system call that returns -1 and sets errno.
#define SYSCHECK(call, name)                                                              \
  do {                                                                                    \
    if ((call) == -1) {                                                                   \
      int sys_errno_ = errno;                                                             \
      return ::ep::setError(nullptr, epSystemError, "%s failed: %s", name, strerror(sys_errno_)); \
    }                                                                                     \
  } while (0)
