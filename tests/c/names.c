/* names: a PMIx client whose rank 1 leaves a lookup behind. Rank 1 asks for `rlaunch.once`
 * with PMIX_WAIT and does not wait for the answer (PMIx_Lookup_nb): it prints `rank 1
 * leaves`, finalizes and exits 0. Rank 0 reads a line from stdin, publishes `rlaunch.once`
 * for one read (PMIX_PERSIST_FIRST_READ), looks it up with PMIX_WAIT for at most 10 s, and
 * prints `rank 0 found V`, or `rank 0 cannot find it: STATUS` and exits 3. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pmix_client.h"

static const char *KEY = "rlaunch.once";

static void never_heard(pmix_status_t status, pmix_pdata_t data[], size_t ndata, void *cbdata)
{
    (void)status, (void)data, (void)ndata, (void)cbdata;
}

int main(void)
{
    pmix_proc_t me = client_init("names");
    pmix_status_t rc;
    bool yes = true;
    if (me.rank == 1) {
        char *keys[] = {(char *)KEY, NULL};
        pmix_info_t wait;
        PMIx_Info_load(&wait, PMIX_WAIT, &yes, PMIX_BOOL);
        rc = PMIx_Lookup_nb(keys, &wait, 1, never_heard, NULL);
        if (rc != PMIX_SUCCESS) {
            fprintf(stderr, "names: PMIx_Lookup_nb: %s\n", PMIx_Error_string(rc));
            return 1;
        }
        printf("rank 1 leaves\n");
        fflush(stdout);
        PMIx_Finalize(NULL, 0);
        return 0;
    }
    char line[64];
    if (!fgets(line, sizeof line, stdin)) {
        fprintf(stderr, "names: no line on stdin\n");
        return 1;
    }
    pmix_info_t publish[2];
    PMIx_Info_load(&publish[0], KEY, "v1", PMIX_STRING);
    pmix_persistence_t once = PMIX_PERSIST_FIRST_READ;
    PMIx_Info_load(&publish[1], PMIX_PERSISTENCE, &once, PMIX_PERSIST);
    rc = PMIx_Publish(publish, 2);
    if (rc != PMIX_SUCCESS) {
        fprintf(stderr, "names: PMIx_Publish: %s\n", PMIx_Error_string(rc));
        return 1;
    }
    pmix_pdata_t found;
    PMIX_PDATA_CONSTRUCT(&found);
    PMIX_LOAD_KEY(found.key, KEY);
    pmix_info_t wait[2];
    int seconds = 10;
    PMIx_Info_load(&wait[0], PMIX_WAIT, &yes, PMIX_BOOL);
    PMIx_Info_load(&wait[1], PMIX_TIMEOUT, &seconds, PMIX_INT);
    rc = PMIx_Lookup(&found, 1, wait, 2);
    if (rc != PMIX_SUCCESS || found.value.type != PMIX_STRING) {
        printf("rank 0 cannot find it: %s\n", PMIx_Error_string(rc));
        fflush(stdout);
        return 3;
    }
    printf("rank 0 found %s\n", found.value.data.string);
    fflush(stdout);
    PMIx_Finalize(NULL, 0);
    return 0;
}
