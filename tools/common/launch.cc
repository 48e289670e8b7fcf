#include "launch.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "launcher_env.h"

namespace {

const char* firstEnv(std::initializer_list<const char*> names) {
  for (const char* n : names) {
    const char* v = getenv(n);
    if (v != nullptr && *v != '\0') return v;
  }
  return nullptr;
}

// Id files of earlier jobs of this user: nobody reads them after the job's
// ranks started, so those older than ten minutes go.
void removeStaleIdFiles() {
  DIR* d = opendir("/tmp");
  if (d == nullptr) return;
  const std::string suffix = "-" + std::to_string(getuid()) + ".id";
  const time_t old = time(nullptr) - 600;
  while (struct dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind("moeep-launch-", 0) != 0 || name.size() < suffix.size() ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    const std::string path = "/tmp/" + name;
    struct stat st;
    if (stat(path.c_str(), &st) == 0 && st.st_mtime < old) unlink(path.c_str());
  }
  closedir(d);
}

// The id file rank 0 wrote, until every rank has read it (launchJoined, or
// this process's exit).
std::string g_id_file;

void removeIdFile() {
  if (g_id_file.empty()) return;
  unlink(g_id_file.c_str());
  g_id_file.clear();
}

// Writes id and writer to a new file path, readable by this user only.
bool writeIdFile(const std::string& path, const epUniqueId& id, int32_t writer) {
  unlink(path.c_str());  // left by a run that died; O_EXCL follows nothing found there
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    fprintf(stderr, "launch: cannot create %s: %s\n", path.c_str(), strerror(errno));
    return false;
  }
  char bytes[sizeof(id) + sizeof(writer)];
  memcpy(bytes, &id, sizeof(id));
  memcpy(bytes + sizeof(id), &writer, sizeof(writer));
  const bool written = write(fd, bytes, sizeof(bytes)) == ssize_t(sizeof(bytes));
  if (!written) fprintf(stderr, "launch: cannot write %s: %s\n", path.c_str(), strerror(errno));
  close(fd);
  if (!written) unlink(path.c_str());
  return written;
}

// Rank 0 publishes the id in a file; the others wait for it (write + rename is atomic).
int shareIdByFile(LaunchInfo* info) {
  const char* job = firstEnv({"OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "PMI_JOBID", "SLURM_JOB_ID"});
  std::string path = std::string("/tmp/moeep-launch-") + (job ? job : "nojob") + "-" +
                     std::to_string(getuid()) + ".id";
  if (info->rank == 0) {
    removeStaleIdFiles();
    if (epGetUniqueId(&info->id) != epSuccess) {
      fprintf(stderr, "launch: epGetUniqueId failed: %s\n", epGetLastError(nullptr));
      return 1;
    }
    std::string tmp = path + ".tmp";
    const int32_t writer = int32_t(getpid());  // readers take the id only while its writer lives
    if (!writeIdFile(tmp, info->id, writer)) return 1;
    if (rename(tmp.c_str(), path.c_str()) != 0) {  // else the other ranks would wait for it in vain
      fprintf(stderr, "launch: cannot rename %s to %s: %s\n", tmp.c_str(), path.c_str(), strerror(errno));
      unlink(tmp.c_str());
      return 1;
    }
    g_id_file = path;
    static bool at_exit = atexit(removeIdFile) == 0;
    (void)at_exit;
    return 0;
  }
  // A file left by an earlier job with the same job id is older than this
  // process: only a file written after this rank started (give or take the
  // launch skew) is this job's. Within that skew (runs without a job id, one
  // right after another) the earlier job's file names a rank 0 that exited:
  // its id is not taken either.
  const time_t started = time(nullptr) - 10;
  for (int i = 0; i < 6000; i++) {  // up to 60 s
    struct stat st;
    FILE* f = (stat(path.c_str(), &st) == 0 && st.st_mtime >= started) ? fopen(path.c_str(), "rb") : nullptr;
    if (f != nullptr) {
      int32_t writer = 0;
      size_t n = fread(&info->id, sizeof(info->id), 1, f);
      if (n == 1) n = fread(&writer, 4, 1, f);
      fclose(f);
      if (n == 1 && writer > 0 && (kill(pid_t(writer), 0) == 0 || errno != ESRCH)) return 0;
    }
    struct timespec nap = {0, 10 * 1000 * 1000};
    nanosleep(&nap, nullptr);
  }
  fprintf(stderr, "launch: rank %d found no unique id in %s (set EP_COMM_ID=host:port for several machines)\n",
          info->rank, path.c_str());
  return 1;
}

}  // namespace

namespace {

// The roots of the unique ids run as threads of whichever process made the
// ids. Forking ranks from a process with threads can deadlock a child (a
// lock held by another thread at fork time stays held in the child: the
// allocator's, a static's initialisation guard), so the ids are made in a
// separate server process, and this one stays single-threaded until it forks.
// The server keeps the roots alive until `hold` is closed (all ranks done).
struct IdServer {
  pid_t pid = -1;
  int hold = -1;  // write end: the server lives while it is open
};

int startIdServer(int count, epUniqueId* ids, IdServer* server) {
  int ids_pipe[2], hold_pipe[2];
  if (pipe(ids_pipe) != 0 || pipe(hold_pipe) != 0) {
    perror("launch: pipe");
    return 1;
  }
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) {
    perror("launch: fork");
    return 1;
  }
  if (pid == 0) {  // the server: make the ids, hand them over, keep the roots alive
    close(ids_pipe[0]);
    close(hold_pipe[1]);
    for (int c = 0; c < count; c++) {
      if (epGetUniqueId(&ids[c]) != epSuccess) {
        fprintf(stderr, "launch: epGetUniqueId failed: %s\n", epGetLastError(nullptr));
        _exit(1);
      }
    }
    const char* p = reinterpret_cast<const char*>(ids);
    size_t left = sizeof(epUniqueId) * size_t(count);
    while (left > 0) {
      ssize_t n = write(ids_pipe[1], p, left);
      if (n <= 0) _exit(1);
      p += n;
      left -= size_t(n);
    }
    close(ids_pipe[1]);
    char byte;
    while (read(hold_pipe[0], &byte, 1) != 0) {
    }
    _exit(0);
  }
  close(ids_pipe[1]);
  close(hold_pipe[0]);
  char* p = reinterpret_cast<char*>(ids);
  size_t left = sizeof(epUniqueId) * size_t(count);
  while (left > 0) {
    ssize_t n = read(ids_pipe[0], p, left);
    if (n <= 0) {
      fprintf(stderr, "launch: the id server made no ids\n");
      close(ids_pipe[0]);
      close(hold_pipe[1]);
      return 1;
    }
    p += n;
    left -= size_t(n);
  }
  close(ids_pipe[0]);
  server->pid = pid;
  server->hold = hold_pipe[1];
  return 0;
}

void stopIdServer(IdServer* server) {
  if (server->hold >= 0) close(server->hold);
  if (server->pid > 0) waitpid(server->pid, nullptr, 0);
  server->hold = -1;
  server->pid = -1;
}

// Makes the ids, forks the ranks and, in the parent, waits for them (killing
// those still running after timeout_s). In rank r: *rank = r, returns 0. In the
// parent: *rank = -1, codes[r] = rank r's exit status (128 + signal when one
// ended it), *worst = the status launchRanksWithIds exits with, returns 0.
int forkAndWait(int nranks, int timeout_s, int num_ids, epUniqueId* ids, int* rank, std::vector<int>* codes,
                int* worst_out, bool* timed_out) {
  IdServer server;
  if (startIdServer(num_ids, ids, &server) != 0) return 1;
  fflush(stdout);
  fflush(stderr);
  std::vector<pid_t> pids(nranks, -1);
  const pid_t launcher = getpid();
  for (int r = 0; r < nranks; r++) {
    pid_t pid = fork();
    if (pid < 0) {
      perror("launch: fork");
      for (int q = 0; q < r; q++) kill(pids[q], SIGKILL);
      stopIdServer(&server);
      return 1;
    }
    if (pid == 0) {
      close(server.hold);  // only the launcher keeps the server alive
      // A rank must not outlive its launcher (killed by a SIGTERM of its own,
      // not of the group: nobody would wait for the ranks or report them).
      // The check after prctl covers a launcher that died before it.
      if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != launcher) _exit(1);
      *rank = r;
      return 0;
    }
    pids[r] = pid;
  }
  // Parent: wait for every rank; kill stragglers after the timeout.
  *rank = -1;
  codes->assign(nranks, -1);
  *timed_out = false;
  int worst = 0, alive = nranks;
  time_t deadline = timeout_s > 0 ? time(nullptr) + timeout_s : 0;
  while (alive > 0) {
    int status = 0;
    pid_t done = waitpid(-1, &status, WNOHANG);
    if (done > 0) {
      int r = 0;
      while (r < nranks && pids[r] != done) r++;
      if (r == nranks) continue;  // not a rank (the id server)
      alive--;
      int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
      (*codes)[r] = code;
      if (code != 0) fprintf(stderr, "launch: rank %d exited with status %d\n", r, code);
      if (code > worst) worst = code;
      continue;
    }
    if (deadline != 0 && time(nullptr) > deadline) {
      fprintf(stderr, "launch: ranks still running after %d s: killed\n", timeout_s);
      for (pid_t p : pids) kill(p, SIGKILL);
      deadline = 0;
      *timed_out = true;
      if (worst == 0) worst = 124;
    }
    struct timespec nap = {0, 5 * 1000 * 1000};
    nanosleep(&nap, nullptr);
  }
  stopIdServer(&server);
  *worst_out = worst;
  return 0;
}

}  // namespace

int launchRanksWithIds(int nranks, int timeout_s, int num_ids, epUniqueId* ids, LaunchInfo* info) {
  memset(info, 0, sizeof(*info));
  const tools::LauncherEnv launcher = tools::launcherEnv();
  if (!launcher.error.empty()) {
    fprintf(stderr, "launch: %s\n", launcher.error.c_str());
    return 1;
  }
  if (launcher.started) {
    info->under_mpi = 1;
    info->rank = launcher.rank;
    info->nranks = launcher.size;
    if (getenv("EP_COMM_ID") != nullptr) {
      // Every rank derives the same id from EP_COMM_ID; rank 0 serves it.
      if (epGetUniqueId(&info->id) != epSuccess) {
        fprintf(stderr, "launch: epGetUniqueId failed: %s\n", epGetLastError(nullptr));
        return 1;
      }
    } else if (shareIdByFile(info) != 0) {
      return 1;
    }
    if (ids != nullptr && num_ids > 0) ids[0] = info->id;
    return 0;
  }
  if (nranks < 1) {
    fprintf(stderr, "launch: nranks = %d must be at least 1\n", nranks);
    return 1;
  }
  info->nranks = nranks;
  std::vector<epUniqueId> own(1);
  if (ids == nullptr || num_ids < 1) {
    ids = own.data();
    num_ids = 1;
  }
  int rank = -1, worst = 0;
  bool timed_out = false;
  std::vector<int> codes;
  if (forkAndWait(nranks, timeout_s, num_ids, ids, &rank, &codes, &worst, &timed_out) != 0) return 1;
  if (rank >= 0) {
    info->id = ids[0];
    info->rank = rank;
    return 0;
  }
  exit(worst);
}

int forkRanksWithIds(int nranks, int timeout_s, int num_ids, epUniqueId* ids, int* rank,
                     std::vector<int>* exit_codes, bool* timed_out) {
  if (nranks < 1 || num_ids < 1 || ids == nullptr || rank == nullptr || exit_codes == nullptr ||
      timed_out == nullptr) {
    fprintf(stderr, "launch: forkRanksWithIds: nranks = %d and num_ids = %d must be at least 1, pointers non-NULL\n",
            nranks, num_ids);
    return 1;
  }
  int worst = 0;
  return forkAndWait(nranks, timeout_s, num_ids, ids, rank, exit_codes, &worst, timed_out);
}

void launchJoined() { removeIdFile(); }

int launchRanks(int nranks, int timeout_s, LaunchInfo* info) {
  return launchRanksWithIds(nranks, timeout_s, 0, nullptr, info);
}
