// Cases that must run in a fresh process: the EP_* accessors cache the first
// value they read, so a case that sets variables re-runs this program as
// "PROGRAM --child NAME" with them set, and reports through its exit status
// (0 passed, N: check N failed).
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "common.h"

namespace eptest {

struct ChildCase {
  const char* name;
  std::vector<std::pair<const char*, const char*>> env;
  int (*body)();
};

inline void runInFreshProcess(const std::vector<ChildCase>& cases, const char* name) {
  const ChildCase* found = nullptr;
  for (const ChildCase& c : cases)
    if (strcmp(c.name, name) == 0) found = &c;
  assert_non_null(found);
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    for (auto& kv : found->env) setenv(kv.first, kv.second, 1);
    execl("/proc/self/exe", "child", "--child", name, (char*)nullptr);
    _exit(127);
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  if (WEXITSTATUS(status) != 0)
    print_error("child case %s failed at check %d: %s\n", name, WEXITSTATUS(status),
                WEXITSTATUS(status) == 127 ? "could not re-run this program" : "see the case");
  assert_int_equal(WEXITSTATUS(status), 0);
}

// In main, first: true when this process is a child case; *rc is its status.
inline bool runChildCase(int argc, char** argv, const std::vector<ChildCase>& cases, int* rc) {
  if (argc != 3 || strcmp(argv[1], "--child") != 0) return false;
  *rc = 126;  // unknown case
  for (const ChildCase& c : cases)
    if (strcmp(c.name, argv[2]) == 0) *rc = c.body();
  return true;
}

}  // namespace eptest
