/* MPI_Publish_name / MPI_Lookup_name through the launcher's name service. Rank 0 publishes
 * argv[1] with the port string argv[2]; after a barrier rank 1 looks it up; after another
 * barrier rank 0 unpublishes it, and after a third rank 1 checks the name is gone.
 * Prints `published S`, `lookup S = P`, `gone S`, `unpublished S`. */
#include <mpi.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size, ok = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc < 3 || size < 2) {
        fprintf(stderr, "publish: usage: publish SERVICE PORT, with 2 ranks or more\n");
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
    const char *service = argv[1], *port = argv[2];
    char found[MPI_MAX_PORT_NAME] = "";

    if (rank == 0) {
        if (MPI_Publish_name(service, MPI_INFO_NULL, port) != MPI_SUCCESS)
            ok = 0;
        else
            printf("published %s\n", service);
        fflush(stdout);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 1) {
        if (MPI_Lookup_name(service, MPI_INFO_NULL, found) != MPI_SUCCESS)
            ok = 0;
        printf("lookup %s = %s\n", service, found);
        fflush(stdout);
        ok = ok && strcmp(found, port) == 0;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        if (MPI_Unpublish_name(service, MPI_INFO_NULL, port) != MPI_SUCCESS)
            ok = 0;
        else
            printf("unpublished %s\n", service);
        fflush(stdout);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 1) {
        /* Errors must come back as codes, not abort the job. */
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
        if (MPI_Lookup_name(service, MPI_INFO_NULL, found) != MPI_SUCCESS)
            printf("gone %s\n", service);
        else
            ok = 0;
        fflush(stdout);
    }
    if (!ok)
        fprintf(stderr, "publish: rank %d failed\n", rank);
    MPI_Finalize();
    return ok ? 0 : 1;
}
