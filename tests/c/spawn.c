/* MPI_Comm_spawn from one rank: `spawn SPAWNER`. Rank SPAWNER of MPI_COMM_WORLD spawns two
 * copies of this program (argv "child") over MPI_COMM_SELF and sends each child 100 over the
 * intercommunicator; each child checks that it has a parent, that its world has 2 ranks and
 * its parent's group 1, and sends back 100 plus its rank. Prints `parent R spawned 2`,
 * `child C of 2 got 100`, `parent R heard C: 10C`, and `rank R idle` from the other ranks.
 * Parent and children disconnect before MPI_Finalize. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm parent;
    MPI_Comm_get_parent(&parent);
    if (parent != MPI_COMM_NULL) {
        int remote, n;
        MPI_Comm_remote_size(parent, &remote);
        if (argc < 2 || strcmp(argv[1], "child") != 0 || size != 2 || remote != 1) {
            fprintf(stderr, "spawn: child %d: world size %d, parent size %d, argv[1] %s\n", rank,
                    size, remote, argc > 1 ? argv[1] : "(none)");
            MPI_Abort(MPI_COMM_WORLD, 5);
        }
        MPI_Recv(&n, 1, MPI_INT, 0, 7, parent, MPI_STATUS_IGNORE);
        printf("child %d of %d got %d\n", rank, size, n);
        fflush(stdout);
        n += rank;
        MPI_Send(&n, 1, MPI_INT, 0, 8, parent);
        MPI_Comm_disconnect(&parent);
    } else if (rank == (argc > 1 ? atoi(argv[1]) : 0)) {
        char *args[] = {"child", NULL};
        int errs[2], remote;
        MPI_Comm inter;
        if (MPI_Comm_spawn(argv[0], args, 2, MPI_INFO_NULL, 0, MPI_COMM_SELF, &inter, errs) !=
            MPI_SUCCESS)
            MPI_Abort(MPI_COMM_WORLD, 6);
        MPI_Comm_remote_size(inter, &remote);
        printf("parent %d spawned %d\n", rank, remote);
        fflush(stdout);
        for (int c = 0; c < remote; c++) {
            int n = 100;
            MPI_Send(&n, 1, MPI_INT, c, 7, inter);
        }
        for (int c = 0; c < remote; c++) {
            int n;
            MPI_Recv(&n, 1, MPI_INT, c, 8, inter, MPI_STATUS_IGNORE);
            printf("parent %d heard %d: %d\n", rank, c, n);
        }
        fflush(stdout);
        MPI_Comm_disconnect(&inter);
    } else {
        printf("rank %d idle\n", rank);
        fflush(stdout);
    }
    MPI_Finalize();
    return 0;
}
