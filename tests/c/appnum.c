/* One segment of an MPMD job: every rank prints its rank, the world size, its MPI_APPNUM
 * (the index of its segment on the launcher's command line) and its role (argv[1]), after
 * an MPI_Allreduce that proves all segments share one MPI_COMM_WORLD. */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size, flag = 0;
    int *appnum = NULL;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_APPNUM, &appnum, &flag);
    long mine = 1, count = 0;
    MPI_Allreduce(&mine, &count, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    printf("rank %d size %d count %ld appnum %d role %s\n", rank, size, count,
           flag ? *appnum : -1, argc > 1 ? argv[1] : "-");
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
