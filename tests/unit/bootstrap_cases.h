// What the bootstrap test programs (bootstrap_selftest, bootstrap_guard)
// share: cases and ranks as forked processes, checks that report where they
// failed, loopback listeners.
#pragma once

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "debug.h"
#include "moeep.h"
#include "socket.h"

// Weak stand-ins for symbols that debug.cc needs from the rest of the library,
// so the test links with or without comm.cc / the API file; real definitions win.
namespace ep {
__attribute__((weak)) void commStoreError(epComm*, const char*) {}
}  // namespace ep
extern "C" __attribute__((weak)) const char* epGetErrorString(epResult_t result) {
  switch (result) {
    case epSuccess: return "epSuccess";
    case epTimeout: return "epTimeout";
    case epAborted: return "epAborted";
    case epInvalidArgument: return "epInvalidArgument";
    case epInvalidUsage: return "epInvalidUsage";
    case epRemoteError: return "epRemoteError";
    case epSystemError: return "epSystemError";
    default: return "epResult";
  }
}

using Clock = std::chrono::steady_clock;

inline long msSince(Clock::time_point t0) {
  return long(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count());
}

// Failure report of the current process; a case or rank fails when it is non-empty.
#define CHECK(cond, ...)                                                   \
  do {                                                                     \
    if (!(cond)) {                                                         \
      fprintf(stderr, "    [pid %d] %s:%d: check failed: %s: ", getpid(), \
              __FILE__, __LINE__, #cond);                                  \
      fprintf(stderr, __VA_ARGS__);                                        \
      fprintf(stderr, "\n");                                               \
      return 1;                                                            \
    }                                                                      \
  } while (0)

inline bool contains(const char* haystack, const char* needle) { return strstr(haystack, needle) != nullptr; }

// Waits for pid up to limit_ms; kills it (only that pid) when it overstays. Returns its
// exit code, or 100 + signal / 99 on a kill.
inline int waitChild(pid_t pid, long limit_ms) {
  auto t0 = Clock::now();
  for (;;) {
    int status = 0;
    pid_t got = waitpid(pid, &status, WNOHANG);
    if (got == pid) {
      if (WIFEXITED(status)) return WEXITSTATUS(status);
      if (WIFSIGNALED(status)) return 100 + WTERMSIG(status);
      return 98;
    }
    if (got < 0) return 97;
    if (msSince(t0) > limit_ms) {
      fprintf(stderr, "    [pid %d] still running after %ld ms, killed\n", pid, limit_ms);
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return 99;
    }
    usleep(5000);
  }
}

// Forks one child per body (their pids). Fork from a thread while no other
// thread of the process may hold a lock: a child inherits a lock held
// elsewhere (an allocator's) locked, for good.
inline std::vector<pid_t> forkAll(const std::vector<std::function<int()>>& bodies) {
  std::vector<pid_t> pids;
  for (const auto& body : bodies) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) _exit(body());  // no atexit handlers, no destructors of the parent's state
    pids.push_back(pid);
  }
  return pids;
}

// The children's exit codes (0: the body returned 0), each waited for up to limit_ms.
inline std::vector<int> waitAll(const std::vector<pid_t>& pids, long limit_ms = 12000) {
  std::vector<int> codes;
  for (pid_t pid : pids) codes.push_back(pid > 0 ? waitChild(pid, limit_ms) : 96);
  return codes;
}

// Forks one child per body; returns their exit codes (0: the body returned 0).
inline std::vector<int> runForked(const std::vector<std::function<int()>>& bodies, long limit_ms = 12000) {
  return waitAll(forkAll(bodies), limit_ms);
}

inline bool allZero(const std::vector<int>& codes) {
  for (int c : codes)
    if (c != 0) return false;
  return true;
}

// A listening socket on a free port of the loopback `spec` ("127.0.0.1:0",
// "[::1]:0"); false with *err set where there is none.
inline bool listenOnFreePort(const char* spec, int family, ep::Fd* fd, ep::SocketAddress* bound, std::string* err) {
  ep::SocketAddress a;
  return ep::parseSocketAddress(spec, family, &a, err) && ep::listenSocket(a, fd, bound, err);
}

// A loopback address whose port was free a moment ago (bound, then released).
inline bool freeLoopbackAddress(ep::SocketAddress* addr, std::string* err) {
  ep::Fd probe;
  if (!listenOnFreePort("127.0.0.1:0", AF_INET, &probe, addr, err)) return false;
  probe.reset();
  return true;
}


// Descriptors this process has open.
inline int countOpenFds() {
  int n = 0;
  if (DIR* dir = opendir("/proc/self/fd")) {
    while (readdir(dir) != nullptr) n++;
    closedir(dir);
    n -= 3;  // ".", ".." and the directory's own descriptor
  }
  return n;
}
