#include <mpi.h>
#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int rank;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) { printf("rank0 pid %d\n", getpid()); fflush(stdout); }
    if (rank == 1) sleep(1000);   /* rank 1 never arrives */
    MPI_Barrier(MPI_COMM_WORLD);   /* rank 0 blocks here */
    MPI_Finalize();
    return 0;
}
