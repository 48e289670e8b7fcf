#include "launch.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

const char* firstEnv(std::initializer_list<const char*> names) {
  for (const char* n : names) {
    const char* v = getenv(n);
    if (v != nullptr && *v != '\0') return v;
  }
  return nullptr;
}

// Rank 0 publishes the id in a file; the others wait for it (write + rename is atomic).
int shareIdByFile(LaunchInfo* info) {
  const char* job = firstEnv({"OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "PMI_JOBID", "SLURM_JOB_ID"});
  std::string path = std::string("/tmp/moeep-launch-") + (job ? job : "nojob") + "-" +
                     std::to_string(getuid()) + ".id";
  if (info->rank == 0) {
    if (epGetUniqueId(&info->id) != epSuccess) {
      fprintf(stderr, "launch: epGetUniqueId failed: %s\n", epGetLastError(nullptr));
      return 1;
    }
    std::string tmp = path + ".tmp";
    FILE* f = fopen(tmp.c_str(), "wb");
    if (f == nullptr || fwrite(&info->id, sizeof(info->id), 1, f) != 1) {
      fprintf(stderr, "launch: cannot write %s\n", tmp.c_str());
      if (f) fclose(f);
      return 1;
    }
    fclose(f);
    rename(tmp.c_str(), path.c_str());
    return 0;
  }
  for (int i = 0; i < 6000; i++) {  // up to 60 s
    FILE* f = fopen(path.c_str(), "rb");
    if (f != nullptr) {
      size_t n = fread(&info->id, sizeof(info->id), 1, f);
      fclose(f);
      if (n == 1) return 0;
    }
    struct timespec nap = {0, 10 * 1000 * 1000};
    nanosleep(&nap, nullptr);
  }
  fprintf(stderr, "launch: rank %d found no unique id in %s (set EP_COMM_ID=host:port for several machines)\n",
          info->rank, path.c_str());
  return 1;
}

}  // namespace

int launchRanks(int nranks, int timeout_s, LaunchInfo* info) {
  memset(info, 0, sizeof(*info));
  const char* mpi_rank = firstEnv({"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"});
  const char* mpi_size = firstEnv({"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"});
  if (mpi_rank != nullptr && mpi_size != nullptr) {
    info->under_mpi = 1;
    info->rank = atoi(mpi_rank);
    info->nranks = atoi(mpi_size);
    if (getenv("EP_COMM_ID") != nullptr) {
      // Every rank derives the same id from EP_COMM_ID; rank 0 serves it.
      if (epGetUniqueId(&info->id) != epSuccess) {
        fprintf(stderr, "launch: epGetUniqueId failed: %s\n", epGetLastError(nullptr));
        return 1;
      }
      return 0;
    }
    return shareIdByFile(info);
  }
  if (nranks < 1) {
    fprintf(stderr, "launch: nranks = %d must be at least 1\n", nranks);
    return 1;
  }
  info->nranks = nranks;
  if (epGetUniqueId(&info->id) != epSuccess) {
    fprintf(stderr, "launch: epGetUniqueId failed: %s\n", epGetLastError(nullptr));
    return 1;
  }
  fflush(stdout);
  fflush(stderr);
  std::vector<pid_t> pids(nranks, -1);
  for (int r = 0; r < nranks; r++) {
    pid_t pid = fork();
    if (pid < 0) {
      perror("launch: fork");
      for (int q = 0; q < r; q++) kill(pids[q], SIGKILL);
      return 1;
    }
    if (pid == 0) {
      info->rank = r;
      return 0;
    }
    pids[r] = pid;
  }
  // Parent: wait for every child; kill stragglers after the timeout.
  int worst = 0, alive = nranks;
  time_t deadline = timeout_s > 0 ? time(nullptr) + timeout_s : 0;
  while (alive > 0) {
    int status = 0;
    pid_t done = waitpid(-1, &status, WNOHANG);
    if (done > 0) {
      alive--;
      int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
      if (code != 0) {
        int r = 0;
        while (r < nranks && pids[r] != done) r++;
        fprintf(stderr, "launch: rank %d exited with status %d\n", r, code);
      }
      if (code > worst) worst = code;
      continue;
    }
    if (deadline != 0 && time(nullptr) > deadline) {
      fprintf(stderr, "launch: ranks still running after %d s: killed\n", timeout_s);
      for (pid_t p : pids) kill(p, SIGKILL);
      deadline = 0;
      if (worst == 0) worst = 124;
    }
    struct timespec nap = {0, 5 * 1000 * 1000};
    nanosleep(&nap, nullptr);
  }
  exit(worst);
}
