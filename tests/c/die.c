/* die VICTIM: every rank initialises, prints `ready R` and passes a barrier (so every line
 * is out before anyone dies); then rank VICTIM kills itself with SIGKILL while the others
 * enter MPI_Finalize, whose fence waits for it forever. The launcher must end them and name
 * the victim. */
#include <mpi.h>
#include <signal.h>
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
        raise(SIGKILL);
    MPI_Finalize();
    return 0;
}
