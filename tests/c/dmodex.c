/* dmodex: a PMIx client whose ranks fetch each other's data with no fence to bring it, so
 * that their servers must ask the owning rank's node (direct modex). `dmodex`: each rank puts
 * `rlaunch.test` = "from R" (remote scope), commits, then gets rank (R+1)%size's value and
 * prints `rank R got from P`, or `rank R cannot get P: STATUS` and exits 3. A fence that
 * collects nothing keeps every rank (and its data) there until all have got theirs. */
#include <stdio.h>
#include <string.h>

#include "pmix_client.h"

int main(void)
{
    pmix_proc_t me = client_init("dmodex");
    pmix_proc_t job;
    uint32_t size = client_job_size("dmodex", &me, &job);
    char mine[64];
    snprintf(mine, sizeof mine, "from %u", me.rank);
    pmix_value_t value;
    PMIX_VALUE_LOAD(&value, mine, PMIX_STRING);
    if (PMIx_Put(PMIX_REMOTE, "rlaunch.test", &value) != PMIX_SUCCESS || PMIx_Commit() != PMIX_SUCCESS) {
        fprintf(stderr, "dmodex: cannot put and commit\n");
        return 1;
    }
    pmix_proc_t peer;
    PMIX_LOAD_PROCID(&peer, me.nspace, (me.rank + 1) % size);
    pmix_value_t *got = NULL;
    pmix_status_t rc = PMIx_Get(&peer, "rlaunch.test", NULL, 0, &got);
    if (rc != PMIX_SUCCESS || got->type != PMIX_STRING) {
        printf("rank %u cannot get %u: %s\n", me.rank, peer.rank, PMIx_Error_string(rc));
        fflush(stdout);
        return 3;
    }
    printf("rank %u got %s\n", me.rank, got->data.string);
    fflush(stdout);
    client_fence("dmodex", &job, false);
    PMIx_Finalize(NULL, 0);
    return 0;
}
