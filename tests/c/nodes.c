/* nodes: Open MPI's view of where each rank is. Prints
 * `rank R size N shared S host H`: S is the size of the rank's MPI_COMM_TYPE_SHARED
 * communicator (the ranks the process manager placed on its node), H the node name its PMIx
 * server gave it (PMIX_HOSTNAME). Open MPI's MPI_Get_processor_name is gethostname(), the
 * same on every fake node of one machine, so it cannot tell fake nodes apart. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    int rank, size, shared_size;
    MPI_Comm shared;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &shared);
    MPI_Comm_size(shared, &shared_size);
    const char *host = getenv("PMIX_HOSTNAME");
    printf("rank %d size %d shared %d host %s\n", rank, size, shared_size, host ? host : "-");
    MPI_Comm_free(&shared);
    MPI_Finalize();
    return 0;
}
