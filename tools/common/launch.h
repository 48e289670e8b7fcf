// Starting the ranks of a job, with or without MPI.
//
// Under mpirun (Open MPI, or any launcher that sets PMIX_RANK / PMI_RANK), each
// process is a rank; the unique id comes from EP_COMM_ID when it is set (every
// rank derives the same id and rank 0 serves it), else rank 0 writes it to a
// file named after the launcher's job id that the other ranks read (one machine).
// Without a launcher, launchRanks forks `nranks` children and returns in each
// of them; the parent waits for all and exits with the worst status. The
// parent stays single-threaded until it forks (see launchRanksWithIds).
#pragma once

#include "moeep.h"

struct LaunchInfo {
  int rank;
  int nranks;
  epUniqueId id;
  int under_mpi;  // 1 when an MPI launcher started this process
};

// nranks: ranks to fork when no MPI launcher is present (ignored under MPI).
// timeout_s: the parent kills children still running after this (0: never).
// Returns 0 in every rank; prints a message and returns non-zero on failure.
int launchRanks(int nranks, int timeout_s, LaunchInfo* info);

// The same, with num_ids unique ids made before the fork, all of them in every
// rank (ids[0] is info->id). The ids are made by a helper process, so that this
// one forks its ranks without threads (the ids' bootstrap roots are threads).
// Under an MPI launcher only ids[0] is filled (one id per launch).
int launchRanksWithIds(int nranks, int timeout_s, int num_ids, epUniqueId* ids, LaunchInfo* info);
