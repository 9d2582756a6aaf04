/* MPI_Comm_accept and MPI_Comm_connect between two ranks of one job, through the name
 * service: rank 0 opens a port and publishes it as argv[1]; after a barrier rank 1 looks it
 * up and connects over MPI_COMM_SELF while rank 0 accepts. Over the new intercommunicator
 * rank 1 sends 42 and rank 0 answers 43. Prints `accepted 42` and `connected 43`. */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc < 2 || size != 2) {
        fprintf(stderr, "connect: usage: connect SERVICE, with 2 ranks\n");
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
    char port[MPI_MAX_PORT_NAME] = "";
    MPI_Comm inter;
    if (rank == 0) {
        MPI_Open_port(MPI_INFO_NULL, port);
        if (MPI_Publish_name(argv[1], MPI_INFO_NULL, port) != MPI_SUCCESS)
            MPI_Abort(MPI_COMM_WORLD, 4);
        MPI_Barrier(MPI_COMM_WORLD);
        MPI_Comm_accept(port, MPI_INFO_NULL, 0, MPI_COMM_SELF, &inter);
        MPI_Recv(&n, 1, MPI_INT, 0, 1, inter, MPI_STATUS_IGNORE);
        printf("accepted %d\n", n);
        fflush(stdout);
        n++;
        MPI_Send(&n, 1, MPI_INT, 0, 2, inter);
        MPI_Unpublish_name(argv[1], MPI_INFO_NULL, port);
    } else {
        MPI_Barrier(MPI_COMM_WORLD);
        if (MPI_Lookup_name(argv[1], MPI_INFO_NULL, port) != MPI_SUCCESS)
            MPI_Abort(MPI_COMM_WORLD, 5);
        MPI_Comm_connect(port, MPI_INFO_NULL, 0, MPI_COMM_SELF, &inter);
        n = 42;
        MPI_Send(&n, 1, MPI_INT, 0, 1, inter);
        MPI_Recv(&n, 1, MPI_INT, 0, 2, inter, MPI_STATUS_IGNORE);
        printf("connected %d\n", n);
        fflush(stdout);
    }
    MPI_Comm_disconnect(&inter);
    if (rank == 0)
        MPI_Close_port(port);
    MPI_Finalize();
    return 0;
}
