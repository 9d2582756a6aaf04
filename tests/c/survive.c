/* survive: an Open MPI program that outlives a failed rank under --on-failure continue. Every
 * rank registers a PMIx handler for PMIX_ERR_PROC_ABORTED; after a barrier rank 1 exits 3;
 * the others wait (10 s at most) to be told, sum their ranks over a communicator of the
 * survivors (MPI_Comm_create_group: collective over its group only), print
 * `rank R told rank F failed, survivors' sum S`, finalize, and print `rank R finalized`. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "aborted.h"

int main(int argc, char **argv)
{
    int rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    pmix_proc_t me;
    pmix_status_t rc = PMIx_Init(&me, NULL, 0);
    if (rc != PMIX_SUCCESS) {
        fprintf(stderr, "survive: PMIx_Init: %s\n", PMIx_Error_string(rc));
        return 1;
    }
    hear_aborted("survive");
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 1)
        exit(3);
    for (int i = 0; i < 1000 && told < 0; i++)
        usleep(10000);
    if (told < 0) {
        printf("rank %d not told\n", rank);
        return 3;
    }
    MPI_Group world, alive;
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    int gone[1] = {told};
    MPI_Group_excl(world, 1, gone, &alive);
    MPI_Comm survivors;
    MPI_Comm_create_group(MPI_COMM_WORLD, alive, 7, &survivors);
    int sum = 0;
    MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, survivors);
    printf("rank %d told rank %d failed, survivors' sum %d\n", rank, told, sum);
    fflush(stdout);
    MPI_Comm_free(&survivors);
    PMIx_Finalize(NULL, 0);
    MPI_Finalize();
    printf("rank %d finalized\n", rank);
    return 0;
}
