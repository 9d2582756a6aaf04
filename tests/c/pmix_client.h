/* What the PMIx client test programs (dmodex, fence, names, psets) all do: start, learn the
 * job's size, fence over the whole job. Each step that fails prints `PROG: STEP: STATUS` on
 * stderr and exits 1. */
#ifndef RLAUNCH_TEST_PMIX_CLIENT_H
#define RLAUNCH_TEST_PMIX_CLIENT_H

#include <pmix.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

/* PMIx_Init: this process's name. */
static inline pmix_proc_t client_init(const char *prog)
{
    pmix_proc_t me;
    pmix_status_t rc = PMIx_Init(&me, NULL, 0);
    if (rc != PMIX_SUCCESS) {
        fprintf(stderr, "%s: PMIx_Init: %s\n", prog, PMIx_Error_string(rc));
        exit(1);
    }
    return me;
}

/* The whole job of `me` (`*job`), and its size. */
static inline uint32_t client_job_size(const char *prog, const pmix_proc_t *me, pmix_proc_t *job)
{
    PMIX_LOAD_PROCID(job, me->nspace, PMIX_RANK_WILDCARD);
    pmix_value_t *size = NULL;
    pmix_status_t rc = PMIx_Get(job, PMIX_JOB_SIZE, NULL, 0, &size);
    if (rc != PMIX_SUCCESS) {
        fprintf(stderr, "%s: job size: %s\n", prog, PMIx_Error_string(rc));
        exit(1);
    }
    return size->data.uint32;
}

/* A fence over the whole job, collecting the data put before it or not. */
static inline void client_fence(const char *prog, const pmix_proc_t *job, bool collect)
{
    pmix_info_t info;
    PMIx_Info_load(&info, PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
    pmix_status_t rc = PMIx_Fence(job, 1, &info, 1);
    if (rc != PMIX_SUCCESS) {
        fprintf(stderr, "%s: PMIx_Fence: %s\n", prog, PMIx_Error_string(rc));
        exit(1);
    }
}

#endif
