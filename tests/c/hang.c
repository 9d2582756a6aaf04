/* A job that hangs, for the hang report: `hang LATE SPIN`. Every rank prints `pid R P` (its
 * rank from the launcher's variables, before MPI_Init). Rank LATE then sleeps for ever before
 * MPI_Init, so the others wait for it in MPI_Init's fence; rank SPIN (after MPI_Init) loops in
 * a function of its own while the others wait in MPI_Barrier. -1: no such rank. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* Not inlined, and kept: the stacks of the hang report name it. */
__attribute__((noinline)) void spin_for_ever(void)
{
    volatile unsigned long n = 0;
    for (;;)
        n++;
}

static int launcher_rank(void)
{
    const char *names[] = {"PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"};
    for (unsigned i = 0; i < sizeof names / sizeof names[0]; i++) {
        const char *value = getenv(names[i]);
        if (value)
            return atoi(value);
    }
    return -2;
}

int main(int argc, char **argv)
{
    int late = argc > 1 ? atoi(argv[1]) : -1, spin = argc > 2 ? atoi(argv[2]) : -1;
    int me = launcher_rank();
    printf("pid %d %d\n", me, (int)getpid());
    fflush(stdout);
    if (me == late)
        for (;;)
            pause();
    MPI_Init(&argc, &argv);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == spin)
        spin_for_ever();
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
    return 0;
}
