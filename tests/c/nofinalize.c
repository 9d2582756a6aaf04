/* nofinalize VICTIM: every rank initialises and passes a barrier (printing `ready R`
 * before it); then rank VICTIM exits 0 without MPI_Finalize while the others finalize,
 * whose fence waits for it for ever. The launcher must end the job and name the rank. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    int rank;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int victim = argc > 1 ? atoi(argv[1]) : 0;
    printf("ready %d\n", rank);
    fflush(stdout);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == victim)
        exit(0);
    MPI_Finalize();
    return 0;
}
