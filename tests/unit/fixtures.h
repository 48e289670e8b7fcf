// The hwloc XML fixtures of tests/data and a way to capture what a printer writes.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>

#include "common.h"
#include "topo/topo.h"

namespace eptest {

// tests/data/NAME, found from this program (build/tests/...) or the working directory.
inline std::string fixturePath(const char* name) {
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    std::string dir(exe, size_t(n));
    std::string path = dir.substr(0, dir.rfind('/')) + "/../../tests/data/" + name;
    if (access(path.c_str(), R_OK) == 0) return path;
  }
  return std::string("tests/data/") + name;
}

inline void requireHwloc() {
#ifndef EP_WITH_HWLOC
  print_message("SKIPPED: libmoeep was built without hwloc\n");
  skip();
#endif
}

inline void loadFixture(const char* name, ep::Topology* t) {
  requireHwloc();
  assert_ok(ep::topoLoad(fixturePath(name).c_str(), t));
  assert_true(t->available);
}

// What fn writes to a FILE*, as a string.
inline std::string printed(const std::function<void(FILE*)>& fn) {
  char* buf = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&buf, &len);
  fn(f);
  fclose(f);
  std::string s(buf, len);
  free(buf);
  return s;
}

}  // namespace eptest
