/* MPI_Comm_spawn: `spawn SPAWNER` or `spawn world`. With SPAWNER, that rank of
 * MPI_COMM_WORLD spawns two copies of this program (argv "child") over MPI_COMM_SELF; with
 * `world`, every rank spawns them together over MPI_COMM_WORLD (root 0). Each parent P (its
 * rank in the spawning communicator) sends each child 100 + P over the intercommunicator; each
 * child checks that it has a parent, that its world has 2 ranks and its parent's group the
 * spawning communicator's size, and sends each parent back what it got plus its rank.
 * Prints `parent R spawned 2`, `child C of 2 got N from P`, `parent R heard C: N`, and
 * `rank R idle` from the ranks that spawn nothing. Parents and children disconnect before
 * MPI_Finalize. SPAWN_INFO=key=value gives the spawn that hint (`host=b`); a spawn that
 * fails prints `parent R spawn failed` and the parent finalizes as if nothing happened. */
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
    int world = argc > 1 && strcmp(argv[1], "world") == 0;
    if (parent != MPI_COMM_NULL) {
        int remote;
        MPI_Comm_remote_size(parent, &remote);
        if (argc < 2 || strcmp(argv[1], "child") != 0 || size != 2 || remote < 1) {
            fprintf(stderr, "spawn: child %d: world size %d, parent size %d, argv[1] %s\n", rank,
                    size, remote, argc > 1 ? argv[1] : "(none)");
            MPI_Abort(MPI_COMM_WORLD, 5);
        }
        for (int p = 0; p < remote; p++) {
            int n;
            MPI_Recv(&n, 1, MPI_INT, p, 7, parent, MPI_STATUS_IGNORE);
            printf("child %d of %d got %d from %d\n", rank, size, n, p);
            fflush(stdout);
            n += rank;
            MPI_Send(&n, 1, MPI_INT, p, 8, parent);
        }
        MPI_Comm_disconnect(&parent);
    } else if (world || rank == (argc > 1 ? atoi(argv[1]) : 0)) {
        char *args[] = {"child", NULL};
        int errs[2], remote;
        MPI_Comm inter;
        MPI_Comm comm = world ? MPI_COMM_WORLD : MPI_COMM_SELF;
        MPI_Info info = MPI_INFO_NULL;
        const char *hint = getenv("SPAWN_INFO");
        if (hint && strchr(hint, '=')) {
            char key[64];
            snprintf(key, sizeof key, "%.*s", (int)(strchr(hint, '=') - hint), hint);
            MPI_Info_create(&info);
            MPI_Info_set(info, key, strchr(hint, '=') + 1);
        }
        MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
        if (MPI_Comm_spawn(argv[0], args, 2, info, 0, comm, &inter, errs) != MPI_SUCCESS) {
            printf("parent %d spawn failed\n", rank);
            MPI_Finalize();
            return 0;
        }
        int me;
        MPI_Comm_rank(comm, &me);
        MPI_Comm_remote_size(inter, &remote);
        printf("parent %d spawned %d\n", rank, remote);
        fflush(stdout);
        for (int c = 0; c < remote; c++) {
            int n = 100 + me;
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
