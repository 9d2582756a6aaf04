/* psets: a PMIx client that asks its server for the process sets, and prints
 * `psets N`, then `pset NAME: R R ...` for each, in the order the server names them.
 * Only rank 0 asks; every rank initialises and finalizes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pmix_client.h"

static int query(pmix_query_t *q, pmix_info_t **results, size_t *n)
{
    pmix_status_t rc = PMIx_Query_info(q, 1, results, n);
    if (rc != PMIX_SUCCESS) {
        fprintf(stderr, "psets: PMIx_Query_info: %s\n", PMIx_Error_string(rc));
        return 1;
    }
    return 0;
}

int main(void)
{
    pmix_proc_t me = client_init("psets");
    /* Where PMIX_ARGV_APPEND puts its status, which only a lack of memory makes an error. */
    pmix_status_t rc __attribute__((unused));
    int failed = 0;
    if (me.rank == 0) {
        pmix_query_t q;
        pmix_info_t *res = NULL;
        size_t nres = 0;
        PMIX_QUERY_CONSTRUCT(&q);
        PMIX_ARGV_APPEND(rc, q.keys, PMIX_QUERY_NUM_PSETS);
        PMIX_ARGV_APPEND(rc, q.keys, PMIX_QUERY_PSET_NAMES);
        failed = query(&q, &res, &nres);
        char *names = NULL;
        for (size_t i = 0; !failed && i < nres; i++) {
            if (PMIX_CHECK_KEY(&res[i], PMIX_QUERY_NUM_PSETS))
                printf("psets %zu\n", res[i].value.data.size);
            if (PMIX_CHECK_KEY(&res[i], PMIX_QUERY_PSET_NAMES))
                names = strdup(res[i].value.data.string);
        }
        for (char *name = names ? strtok(names, ",") : NULL; name && !failed; name = strtok(NULL, ",")) {
            pmix_query_t mq;
            pmix_info_t *mres = NULL;
            size_t nm = 0;
            PMIX_QUERY_CONSTRUCT(&mq);
            PMIX_ARGV_APPEND(rc, mq.keys, PMIX_QUERY_PSET_MEMBERSHIP);
            PMIX_QUERY_QUALIFIERS_CREATE(&mq, 1);
            PMIX_INFO_LOAD(&mq.qualifiers[0], PMIX_PSET_NAME, name, PMIX_STRING);
            failed = query(&mq, &mres, &nm);
            printf("pset %s:", name);
            for (size_t i = 0; !failed && i < nm; i++) {
                pmix_data_array_t *members = mres[i].value.data.darray;
                pmix_proc_t *procs = members->array;
                for (size_t m = 0; m < members->size; m++)
                    printf(" %u", procs[m].rank);
            }
            printf("\n");
        }
        if (!names)
            failed = 1;
        free(names);
    }
    PMIx_Fence(NULL, 0, NULL, 0);
    PMIx_Finalize(NULL, 0);
    return failed;
}
