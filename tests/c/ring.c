/* A token goes around the ring of all ranks: rank 0 sends 0, every rank adds 1 and passes it
 * on, and rank 0 checks that it came back as `size`. Prints `ring R got T` on every rank and
 * `ring done size N token T` on rank 0. */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    int token = 0, ok = 1;
    if (rank == 0) {
        MPI_Send(&token, 1, MPI_INT, next, 7, MPI_COMM_WORLD);
        MPI_Recv(&token, 1, MPI_INT, prev, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        token += 1;
        printf("ring %d got %d\n", rank, token);
        printf("ring done size %d token %d\n", size, token);
        ok = token == size;
    } else {
        MPI_Recv(&token, 1, MPI_INT, prev, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        token += 1;
        printf("ring %d got %d\n", rank, token);
        ok = token == rank;
        MPI_Send(&token, 1, MPI_INT, next, 7, MPI_COMM_WORLD);
    }
    fflush(stdout);
    if (!ok)
        fprintf(stderr, "ring: rank %d: bad token %d\n", rank, token);
    MPI_Finalize();
    return ok ? 0 : 1;
}
