/* dead: a PMIx client for --on-failure continue. Every rank but 1 registers a handler for
 * PMIX_ERR_PROC_ABORTED; all fence; then rank 1 exits 3, and every other rank waits (10 s at
 * most) to be told, fences again over the whole job (the failed rank included: the fence
 * must not wait for it), prints `rank R told rank F failed` (or `rank R not told`, exit 3)
 * and finalizes. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "pmix_client.h"

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

int main(void)
{
    pmix_proc_t me = client_init("dead");
    pmix_proc_t job;
    client_job_size("dead", &me, &job);
    if (me.rank != 1) {
        pmix_status_t code = PMIX_ERR_PROC_ABORTED;
        pmix_status_t rc = PMIx_Register_event_handler(&code, 1, NULL, 0, on_aborted, NULL, NULL);
        if (rc < 0) {
            fprintf(stderr, "dead: PMIx_Register_event_handler: %s\n", PMIx_Error_string(rc));
            return 1;
        }
    }
    /* Every handler is in before rank 1 goes. */
    client_fence("dead", &job, false);
    if (me.rank == 1)
        exit(3);
    for (int i = 0; i < 1000 && told < 0; i++)
        usleep(10000);
    if (told < 0) {
        printf("rank %u not told\n", me.rank);
        return 3;
    }
    client_fence("dead", &job, false);
    printf("rank %u told rank %d failed\n", me.rank, told);
    fflush(stdout);
    PMIx_Finalize(NULL, 0);
    return 0;
}
