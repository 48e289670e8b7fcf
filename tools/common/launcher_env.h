// Whether an MPI-style launcher started this process, and which rank of how
// many: the one reading of the launcher's variables, for launchRanks and for
// tools that must know the rank before (or without) it, to print a usage
// message once or to print as rank 0 only.
//
// Open MPI sets OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE (and PMIX_RANK);
// MPICH's Hydra and Slurm's pmi2 plugin set PMI_RANK / PMI_SIZE; Slurm's pmix
// plugin sets PMIX_RANK and SLURM_NTASKS. SLURM_PROCID alone is not taken for a
// rank: the shell of a batch script has it too, and a tool run there forks its
// ranks itself.
#pragma once

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <initializer_list>
#include <string>

namespace tools {

struct LauncherEnv {
  bool started = false;  // a launcher's rank variable is set
  int rank = -1;         // valid when started and error is empty
  int size = 0;
  std::string error;     // started, but the variables cannot be used: why
};

namespace launcher_detail {

// The first of names set to a non-empty value (its name in *which), or nullptr.
inline const char* firstSet(std::initializer_list<const char*> names, const char** which) {
  for (const char* n : names) {
    const char* v = getenv(n);
    if (v != nullptr && *v != '\0') {
      *which = n;
      return v;
    }
  }
  return nullptr;
}

// A whole decimal number in [lo, INT_MAX], digits only (no sign, no blanks).
inline bool parseInt(const char* text, int lo, int* out) {
  if (*text < '0' || *text > '9') return false;
  char* end = nullptr;
  errno = 0;
  const long v = strtol(text, &end, 10);
  if (errno != 0 || *end != '\0' || v < lo || v > INT_MAX) return false;
  *out = int(v);
  return true;
}

}  // namespace launcher_detail

inline LauncherEnv launcherEnv() {
  using launcher_detail::firstSet;
  using launcher_detail::parseInt;
  LauncherEnv env;
  const char *rank_var = nullptr, *size_var = nullptr;
  const char* rank = firstSet({"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"}, &rank_var);
  if (rank == nullptr) return env;
  env.started = true;
  const char* size = firstSet({"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"}, &size_var);
  if (size == nullptr) {
    env.error = std::string(rank_var) + "=" + rank +
                " is set but no job size is (OMPI_COMM_WORLD_SIZE, PMI_SIZE or SLURM_NTASKS): "
                "unset " + rank_var + " to let the tool fork its ranks, or start it with mpirun";
  } else if (!parseInt(rank, 0, &env.rank)) {
    env.error = std::string(rank_var) + "='" + rank + "' is not a rank (a whole number >= 0)";
  } else if (!parseInt(size, 1, &env.size)) {
    env.error = std::string(size_var) + "='" + size + "' is not a job size (a whole number >= 1)";
  } else if (env.rank >= env.size) {
    env.error = std::string(rank_var) + "=" + rank + " is not below " + size_var + "=" + size;
  }
  if (!env.error.empty()) {
    env.rank = -1;
    env.size = 0;
  }
  return env;
}

// The launcher's rank of this process, or -1 when no launcher started it (or
// its variables cannot be used: launchRanks then says why).
inline int launcherRank() { return launcherEnv().rank; }

}  // namespace tools
