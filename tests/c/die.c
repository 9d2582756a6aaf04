/* die VICTIM [exit]: every rank initialises, prints `ready R` and passes a barrier (so every
 * line is out before anyone leaves); then rank VICTIM leaves while the others enter
 * MPI_Finalize, whose fence waits for it for ever: killed by SIGKILL, or with `exit`,
 * exiting 0 without MPI_Finalize. The launcher must end the job and name the victim. */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    int rank;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int victim = argc > 1 ? atoi(argv[1]) : 0;
    int quietly = argc > 2 && strcmp(argv[2], "exit") == 0;
    printf("ready %d\n", rank);
    fflush(stdout);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == victim) {
        if (quietly)
            exit(0);
        raise(SIGKILL);
    }
    MPI_Finalize();
    return 0;
}
