/* mpi_hello: the smallest MPI job: MPI_Init, MPI_Barrier, MPI_Finalize.
 *
 *   mpi_hello [FIFO]
 *
 * With FIFO (used by the memory section), each rank opens FIFO after MPI_Finalize, prints
 * "ready", and blocks reading FIFO until EOF: the harness samples the launcher's memory while
 * every rank is alive, then closes its end to let the job finish. The wait comes after
 * MPI_Finalize because a rank blocked outside MPI makes no MPI progress: with ch4:ucx, a peer
 * can then stay stuck in the barrier waiting for a message the blocked rank never pushed out.
 */
#include <fcntl.h>
#include <mpi.h>
#include <stdio.h>
#include <unistd.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
    if (argc > 1) {
        int fd = open(argv[1], O_RDONLY);
        if (fd < 0) {
            perror(argv[1]);
            return 1;
        }
        printf("ready\n");
        fflush(stdout);
        char buf[64];
        while (read(fd, buf, sizeof buf) > 0) {
        }
        close(fd);
    }
    return 0;
}
