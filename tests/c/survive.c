/* survive: an Open MPI program that outlives a failed rank under --on-failure continue. Every
 * rank registers a PMIx handler for PMIX_ERR_PROC_ABORTED; after a barrier rank 1 exits 3;
 * the others wait (10 s at most) to be told, sum their ranks over a communicator of the
 * survivors (MPI_Comm_create_group: collective over its group only), print
 * `rank R told rank F failed, survivors' sum S`, and finalize. */
#include <mpi.h>
#include <pmix.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static volatile int told = -1;

static void on_aborted(size_t id, pmix_status_t status, const pmix_proc_t *source,
                       pmix_info_t info[], size_t ninfo, pmix_info_t *results, size_t nresults,
                       pmix_event_notification_cbfunc_fn_t cbfunc, void *cbdata)
{
    (void)id, (void)status, (void)source, (void)results, (void)nresults;
    for (size_t i = 0; i < ninfo; i++)
        if (PMIX_CHECK_KEY(&info[i], PMIX_EVENT_AFFECTED_PROC))
            told = (int)info[i].value.data.proc->rank;
    if (cbfunc)
        cbfunc(PMIX_EVENT_ACTION_COMPLETE, NULL, 0, NULL, NULL, cbdata);
}

int main(int argc, char **argv)
{
    int rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    pmix_proc_t me;
    pmix_status_t rc = PMIx_Init(&me, NULL, 0);
    if (rc != PMIX_SUCCESS) {
        fprintf(stderr, "survive: PMIx_Init: %s\n", PMIx_Error_string(rc));
        return 1;
    }
    pmix_status_t code = PMIX_ERR_PROC_ABORTED;
    rc = PMIx_Register_event_handler(&code, 1, NULL, 0, on_aborted, NULL, NULL);
    if (rc < 0) {
        fprintf(stderr, "survive: PMIx_Register_event_handler: %s\n", PMIx_Error_string(rc));
        return 1;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 1)
        exit(3);
    for (int i = 0; i < 1000 && told < 0; i++)
        usleep(10000);
    if (told < 0) {
        printf("rank %d not told\n", rank);
        return 3;
    }
    MPI_Group world, alive;
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    int gone[1] = {told};
    MPI_Group_excl(world, 1, gone, &alive);
    MPI_Comm survivors;
    MPI_Comm_create_group(MPI_COMM_WORLD, alive, 7, &survivors);
    int sum = 0;
    MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, survivors);
    printf("rank %d told rank %d failed, survivors' sum %d\n", rank, told, sum);
    fflush(stdout);
    MPI_Comm_free(&survivors);
    PMIx_Finalize(NULL, 0);
    MPI_Finalize();
    printf("rank %d finalized\n", rank);
    return 0;
}
