#include "process.h"

#include <signal.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace ep {

bool processAlive(int pid) {
  if (pid <= 0) return true;
  if (kill(pid, 0) == -1 && errno == ESRCH) return false;
  // A zombie still answers kill(): its state in /proc tells.
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  FILE* f = fopen(path, "r");
  if (f == nullptr) return true;  // no procfs: assume alive
  char buf[256];
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[n] = '\0';
  const char* paren = strrchr(buf, ')');
  return !(paren != nullptr && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X'));
}

unsigned long long pidNamespaceId() {
  struct stat st;
  if (stat("/proc/self/ns/pid", &st) != 0) return 0;
  return (unsigned long long)st.st_ino;
}

}  // namespace ep
