/* Rank 1 calls MPI_Abort(MPI_COMM_WORLD, 42) once every other rank is about to block: rank 0
 * in MPI_Barrier, the others in MPI_Recv, none of which can ever complete. Each rank prints
 * `blocking R`, then tells rank 1 (a small, eager send) before it blocks. */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size, x = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    printf("blocking %d\n", rank);
    fflush(stdout);
    if (rank == 1) {
        for (int i = 0; i < size - 1; i++)
            MPI_Recv(&x, 1, MPI_INT, MPI_ANY_SOURCE, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Abort(MPI_COMM_WORLD, 42);
    } else {
        MPI_Send(&rank, 1, MPI_INT, 1, 1, MPI_COMM_WORLD);
        if (rank == 0)
            MPI_Barrier(MPI_COMM_WORLD);
        else
            MPI_Recv(&x, 1, MPI_INT, 1, 99, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
    printf("unblocked %d\n", rank);
    MPI_Finalize();
    return 0;
}
