/* allgather: MPI_Allgather of 64 bytes per rank, checked.
 *
 * Rank r contributes 64 bytes b[i] = (r * 131 + i * 7) & 0xff; every rank checks every byte it
 * gathered and exits 1 (after printing the first mismatch) if any is wrong.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#define BLOCK 64

static unsigned char expected(int rank, int i) { return (unsigned char)((rank * 131 + i * 7) & 0xff); }

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);

    unsigned char mine[BLOCK];
    for (int i = 0; i < BLOCK; i++) mine[i] = expected(rank, i);
    unsigned char *all = malloc((size_t)size * BLOCK);
    if (!all) MPI_Abort(MPI_COMM_WORLD, 2);
    MPI_Allgather(mine, BLOCK, MPI_BYTE, all, BLOCK, MPI_BYTE, MPI_COMM_WORLD);

    int bad = 0;
    for (int r = 0; r < size && !bad; r++) {
        for (int i = 0; i < BLOCK; i++) {
            if (all[r * BLOCK + i] != expected(r, i)) {
                fprintf(stderr, "allgather: rank %d: byte %d from rank %d is %u, expected %u\n", rank, i, r,
                        all[r * BLOCK + i], expected(r, i));
                bad = 1;
                break;
            }
        }
    }
    free(all);
    MPI_Finalize();
    return bad;
}
