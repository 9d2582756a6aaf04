/* An explicit finite-difference solver of the 1-D wave equation, split over the ranks as a
 * ring: every step each rank updates its cells and swaps one halo cell with each neighbour
 * (MPI_Sendrecv), and every 100 steps all of them sum the field's energy (MPI_Allreduce).
 * The shape of an FDTD code: little compute between frequent small messages, so a rank
 * that waits for a neighbour that is not running waits for the scheduler.
 *
 *   halo CELLS_PER_RANK STEPS       prints "energy E after STEPS steps on N ranks" (rank 0)
 *
 * The result depends only on the arguments and the number of ranks: the same under every
 * launcher. Built with mpicc.openmpi and mpicc.mpich by bench/contended.py.
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc != 3) {
        if (rank == 0) fprintf(stderr, "usage: halo CELLS_PER_RANK STEPS\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    long n = atol(argv[1]), steps = atol(argv[2]);
    /* u[0] and u[n+1] are the halo cells. */
    double *prev = calloc(n + 2, sizeof *prev), *u = calloc(n + 2, sizeof *u),
           *next = calloc(n + 2, sizeof *next);
    if (!prev || !u || !next) MPI_Abort(MPI_COMM_WORLD, 1);
    const double pi = 3.14159265358979323846, c2 = 0.25;
    long total = n * size;
    for (long i = 1; i <= n; i++) {
        double x = (double)(rank * n + i - 1) / (double)total;
        u[i] = prev[i] = sin(2 * pi * x) + 0.5 * sin(6 * pi * x);
    }
    int left = (rank + size - 1) % size, right = (rank + 1) % size;
    double energy = 0;
    for (long s = 1; s <= steps; s++) {
        MPI_Sendrecv(&u[1], 1, MPI_DOUBLE, left, 0, &u[n + 1], 1, MPI_DOUBLE, right, 0,
                     MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Sendrecv(&u[n], 1, MPI_DOUBLE, right, 1, &u[0], 1, MPI_DOUBLE, left, 1,
                     MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        for (long i = 1; i <= n; i++)
            next[i] = 2 * u[i] - prev[i] + c2 * (u[i - 1] - 2 * u[i] + u[i + 1]);
        double *t = prev;
        prev = u;
        u = next;
        next = t;
        if (s % 100 == 0 || s == steps) {
            double local = 0;
            for (long i = 1; i <= n; i++) local += u[i] * u[i];
            MPI_Allreduce(&local, &energy, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        }
    }
    if (rank == 0) printf("energy %.9e after %ld steps on %d ranks\n", energy, steps, size);
    free(prev);
    free(u);
    free(next);
    MPI_Finalize();
    return 0;
}
