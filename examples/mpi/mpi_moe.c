/*
 * The MoE layer of examples/c/moe_layer.h under MPI: rank 0 makes the unique
 * id, MPI_Bcast hands it to every rank, each rank joins the communicator.
 * libmoeep itself uses no MPI.
 *
 *   mpicc -std=c11 examples/mpi/mpi_moe.c -Iinclude -Iexamples/c -Lbuild/lib -lmoeep -Wl,-rpath,$PWD/build/lib
 *   mpirun -np 4 ./a.out
 *
 * SPDX-License-Identifier: MIT
 */
#include <mpi.h>

#include "moe_layer.h"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, nranks = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);

  epUniqueId id;
  int made = 1;
  if (rank == 0 && epGetUniqueId(&id) != epSuccess) {
    fprintf(stderr, "rank 0: epGetUniqueId: %s\n", epGetLastError(NULL));
    made = 0;
  }
  MPI_Bcast(&made, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (!made) {
    MPI_Finalize();
    return 1;
  }
  MPI_Bcast(&id, (int)sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);

  epConfig_t cfg = moe_config(nranks);
  epComm_t comm = NULL;
  int status = 1;
  if (epCommInitRank(&comm, nranks, id, rank, &cfg) != epSuccess)
    fprintf(stderr, "rank %d: epCommInitRank: %s\n", rank, epGetLastError(NULL));
  else
    status = moe_layer(comm, rank, nranks);
  epCommDestroy(comm);

  int failed = 0;
  MPI_Allreduce(&status, &failed, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) printf("mpi_moe: %d ranks, %s\n", nranks, failed ? "FAILED" : "every rank correct");
  MPI_Finalize();
  return failed ? 1 : 0;
}
