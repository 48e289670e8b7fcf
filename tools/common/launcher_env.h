// The rank an MPI-style launcher gave this process, read from the variables
// launch.cc looks at, for tools that must know it before (or without)
// launchRanks: to print a usage message once, or to print as rank 0 only.
#pragma once

#include <cstdlib>

namespace tools {

// The launcher's rank of this process, or -1 when no launcher started it.
inline int launcherRank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"}) {
    const char* v = getenv(name);
    if (v != nullptr && *v != '\0') return atoi(v);
  }
  return -1;
}

}  // namespace tools
