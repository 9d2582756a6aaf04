/* dead: a PMIx client for --on-failure continue. Every rank but 1 registers a handler for
 * PMIX_ERR_PROC_ABORTED; all fence; then rank 1 exits 3, and every other rank waits (10 s at
 * most) to be told, fences again over the whole job (the failed rank included: the fence
 * must not wait for it), prints `rank R told rank F failed` (or `rank R not told`, exit 3)
 * and finalizes. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "aborted.h"
#include "pmix_client.h"

int main(void)
{
    pmix_proc_t me = client_init("dead");
    pmix_proc_t job;
    client_job_size("dead", &me, &job);
    if (me.rank != 1)
        hear_aborted("dead");
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
