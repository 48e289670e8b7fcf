// Starting the ranks of a job, with or without MPI.
//
// Under mpirun (Open MPI, or any launcher that sets a rank and a job size: see
// launcher_env.h), each process is a rank (a rank variable without a size, or
// values out of range, are refused with a message). The unique id comes from
// EP_COMM_ID when it is set (every rank derives the same id and rank 0 serves
// it), else rank 0 writes it to a file named after the launcher's job id that
// the other ranks read (one machine).
// Without a launcher, launchRanks forks `nranks` children and returns in each
// of them; the parent waits for all and exits with the worst status. The
// parent stays single-threaded until it forks (see launchRanksWithIds).
#pragma once

#include <vector>

#include "moeep.h"

struct LaunchInfo {
  int rank;
  int nranks;
  epUniqueId id;
  int under_mpi;  // 1 when an MPI launcher started this process
};

// Under a launcher without EP_COMM_ID, rank 0 removes the id file once every
// rank has read it: call this when the first communicator made with the id is
// initialised (the file goes at exit otherwise). A no-op elsewhere.
void launchJoined();

// nranks: ranks to fork when no MPI launcher is present (ignored under MPI).
// timeout_s: the parent kills children still running after this (0: never).
// Returns 0 in every rank; prints a message and returns non-zero on failure.
int launchRanks(int nranks, int timeout_s, LaunchInfo* info);

// The same, with num_ids unique ids made before the fork, all of them in every
// rank (ids[0] is info->id). The ids are made by a helper process, so that this
// one forks its ranks without threads (the ids' bootstrap roots are threads).
// Under an MPI launcher only ids[0] is filled (one id per launch).
int launchRanksWithIds(int nranks, int timeout_s, int num_ids, epUniqueId* ids, LaunchInfo* info);

// Forks nranks ranks with num_ids unique ids made before the fork (as
// launchRanksWithIds, without looking for an MPI launcher), and returns in the
// parent too, for programs that report on their ranks. In rank r: *rank = r.
// In the parent, once every rank ended (those still running after timeout_s
// are killed, 0: never): *rank = -1, (*exit_codes)[r] = rank r's exit status
// (128 + the signal when one ended it), *timed_out = whether ranks were killed.
// Returns 0 in both; prints a message and returns non-zero when it cannot fork.
// The caller must be single-threaded (and, on GPUs, should not have
// initialised CUDA: the children inherit none of it).
int forkRanksWithIds(int nranks, int timeout_s, int num_ids, epUniqueId* ids, int* rank,
                     std::vector<int>* exit_codes, bool* timed_out);
