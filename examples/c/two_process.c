/*
 * Two processes, one communicator: rank 0 makes the unique id and hands its
 * 128 bytes to rank 1 through a pipe (any channel will do: a file, a socket,
 * a launcher's broadcast), then both run one MoE layer (moe_layer.h).
 *
 *   cc -std=c11 examples/c/two_process.c -Iinclude -Lbuild/lib -lmoeep -Wl,-rpath,$PWD/build/lib
 *
 * SPDX-License-Identifier: MIT
 */
#define _POSIX_C_SOURCE 200809L
#include <sys/wait.h>
#include <unistd.h>

#include "moe_layer.h"

static int read_all(int fd, void* buf, size_t n) {
  char* p = (char*)buf;
  while (n > 0) {
    ssize_t got = read(fd, p, n);
    if (got <= 0) return -1;
    p += got;
    n -= (size_t)got;
  }
  return 0;
}

int main(void) {
  int fds[2];
  if (pipe(fds) != 0) return perror("pipe"), 1;
  fflush(stdout);
  /* Fork before any library call: rank 1 starts with a clean process. */
  pid_t child = fork();
  if (child < 0) return perror("fork"), 1;
  const int rank = child == 0 ? 1 : 0;

  epUniqueId id;
  if (rank == 0) {
    /* Starts the bootstrap root in this process, which serves this communicator. */
    if (epGetUniqueId(&id) != epSuccess || write(fds[1], &id, sizeof(id)) != (ssize_t)sizeof(id)) {
      fprintf(stderr, "rank 0: cannot make or send the unique id: %s\n", epGetLastError(NULL));
      return 1;
    }
  } else if (read_all(fds[0], &id, sizeof(id)) != 0) {
    fprintf(stderr, "rank 1: no unique id from rank 0\n");
    _exit(1);
  }

  epConfig_t cfg = moe_config(2);
  epComm_t comm = NULL;
  int status = 1;
  if (epCommInitRank(&comm, 2, id, rank, &cfg) != epSuccess)
    fprintf(stderr, "rank %d: epCommInitRank: %s\n", rank, epGetLastError(NULL));
  else
    status = moe_layer(comm, rank, 2);
  epCommDestroy(comm);
  if (rank == 1) {
    fflush(stdout);  /* _exit does not flush */
    _exit(status);
  }

  int child_status = 0;
  waitpid(child, &child_status, 0);
  const int ok = status == 0 && WIFEXITED(child_status) && WEXITSTATUS(child_status) == 0;
  printf("two_process: %s\n", ok ? "both ranks correct" : "FAILED");
  return ok ? 0 : 1;
}
