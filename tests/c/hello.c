/* MPI hello with a check: every rank verifies the job size (argv[1]) and the sum of all ranks
 * from MPI_Allreduce, then prints `rank R size N sum S name H`. A launcher whose PMI is
 * misconfigured starts N singletons, each of size 1: they print size 1 and exit 1. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    long mine = rank, sum = -1;
    MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    char name[MPI_MAX_PROCESSOR_NAME];
    int len = 0;
    MPI_Get_processor_name(name, &len);
    printf("rank %d size %d sum %ld name %s\n", rank, size, sum, name);
    fflush(stdout);

    int expected = argc > 1 ? atoi(argv[1]) : -1;
    long want = (long)size * (size - 1) / 2;
    int ok = size == expected && sum == want;
    if (!ok)
        fprintf(stderr, "hello: rank %d: size %d (expected %d), sum %ld (expected %ld)\n", rank,
                size, expected, sum, want);
    MPI_Finalize();
    return ok ? 0 : 1;
}
