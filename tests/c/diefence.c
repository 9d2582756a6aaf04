/* diefence: a PMIx client whose rank 1 dies by SIGALRM inside a fence that collects data.
 * Every rank puts `k` (its rank) and commits; rank 1 sets an alarm for 1 s and fences; the
 * others ignore SIGTERM (the teardown's first word), sleep 1.5 s, and fence after rank 1 died
 * in it. A rank that comes out of the fence gets every other rank's `k` and prints `rank R
 * has every key`, or `rank R lacks P's key: STATUS` and exits 4. None must: libpmix completes
 * a node's part without a client whose connection it lost, and the proxy holds that part
 * while the job is being ended for the dead rank (until SIGKILL, after the kill grace). */
#include <signal.h>
#include <unistd.h>

#include "pmix_client.h"

int main(void)
{
    pmix_proc_t me = client_init("diefence");
    pmix_proc_t job;
    uint32_t size = client_job_size("diefence", &me, &job);
    pmix_value_t v;
    PMIX_VALUE_LOAD(&v, &me.rank, PMIX_UINT32);
    if (PMIx_Put(PMIX_GLOBAL, "k", &v) != PMIX_SUCCESS || PMIx_Commit() != PMIX_SUCCESS) {
        fprintf(stderr, "diefence: put or commit failed\n");
        return 1;
    }
    if (me.rank == 1) {
        alarm(1);
    } else {
        signal(SIGTERM, SIG_IGN);
        usleep(1500000);
    }
    client_fence("diefence", &job, true);
    for (uint32_t r = 0; r < size; r++) {
        pmix_proc_t of;
        PMIX_LOAD_PROCID(&of, me.nspace, r);
        pmix_value_t *got = NULL;
        pmix_status_t rc = PMIx_Get(&of, "k", NULL, 0, &got);
        if (rc != PMIX_SUCCESS) {
            printf("rank %u lacks %u's key: %s\n", me.rank, r, PMIx_Error_string(rc));
            return 4;
        }
    }
    printf("rank %u has every key\n", me.rank);
    PMIx_Finalize(NULL, 0);
    return 0;
}
