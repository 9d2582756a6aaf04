/* A PMI-2 client built on Slurm's libpmi2 (link with -lpmi2). Every rank puts `k<rank>`,
 * fences, and gets every rank's key; local rank 0 of each node (MPI_LOCALRANKID) puts the node
 * attribute `nodeattr`, the other ranks of the node wait for it; every rank reads the job
 * attribute PMI_process_mapping. Each result is a line `OK <rank> <what> <value>`; anything
 * wrong is a line `FAIL <rank> ...` on stderr and exit code 1. */
#include <slurm/pmi2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int failures;

#define CHECK(call)                                                                      \
    do {                                                                                 \
        int rc_ = (call);                                                                \
        if (rc_ != PMI2_SUCCESS) {                                                       \
            fprintf(stderr, "FAIL %d %s returned %d\n", rank, #call, rc_);               \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

int main(void)
{
    int spawned = -1, size = -1, rank = -1, appnum = -1;
    CHECK(PMI2_Init(&spawned, &size, &rank, &appnum));
    printf("OK %d init size %d spawned %d appnum %d\n", rank, size, spawned, appnum);

    char jobid[256] = "";
    CHECK(PMI2_Job_GetId(jobid, sizeof jobid));
    printf("OK %d jobid %s\n", rank, jobid);

    /* Job-wide KVS: put, fence, get everyone's key. The value holds a ';', which PMI-2 must
     * escape on the wire and give back whole. */
    char key[PMI2_MAX_KEYLEN], value[PMI2_MAX_VALLEN], got[PMI2_MAX_VALLEN];
    snprintf(key, sizeof key, "k%d", rank);
    snprintf(value, sizeof value, "value-of-%d;x=%d", rank, rank * 7);
    CHECK(PMI2_KVS_Put(key, value));
    CHECK(PMI2_KVS_Fence());
    for (int r = 0; r < size; r++) {
        int len = -1;
        snprintf(key, sizeof key, "k%d", r);
        snprintf(value, sizeof value, "value-of-%d;x=%d", r, r * 7);
        memset(got, 0, sizeof got);
        CHECK(PMI2_KVS_Get(jobid, r, key, got, sizeof got, &len));
        if (strcmp(got, value) != 0 || len != (int)strlen(value)) {
            fprintf(stderr, "FAIL %d kvs-get %s gave %s (length %d), expected %s\n", rank, key,
                    got, len, value);
            failures++;
        }
    }
    printf("OK %d kvs %d keys\n", rank, size);

    /* Node attributes: local rank 0 of each node puts one, the others wait for it. */
    const char *local = getenv("MPI_LOCALRANKID");
    int found = 0;
    memset(got, 0, sizeof got);
    if (local != NULL && strcmp(local, "0") == 0) {
        /* Late on purpose, so that the others are likely already waiting; the result must be
         * the same either way. */
        usleep(100 * 1000);
        snprintf(value, sizeof value, "put-by-%d", rank);
        CHECK(PMI2_Info_PutNodeAttr("nodeattr", value));
        CHECK(PMI2_Info_GetNodeAttr("nodeattr", got, sizeof got, &found, 0));
    } else {
        CHECK(PMI2_Info_GetNodeAttr("nodeattr", got, sizeof got, &found, 1));
    }
    if (!found) {
        fprintf(stderr, "FAIL %d node attribute not found\n", rank);
        failures++;
    }
    printf("OK %d nodeattr %s\n", rank, got);

    memset(got, 0, sizeof got);
    found = 0;
    CHECK(PMI2_Info_GetJobAttr("PMI_process_mapping", got, sizeof got, &found));
    if (!found) {
        fprintf(stderr, "FAIL %d PMI_process_mapping not found\n", rank);
        failures++;
    }
    printf("OK %d mapping %s\n", rank, got);

    /* A fence after the node attributes, so that no rank finalizes while a neighbour still
     * waits for its attribute. */
    CHECK(PMI2_KVS_Fence());
    CHECK(PMI2_Finalize());
    printf("OK %d finalized\n", rank);
    return failures ? 1 : 0;
}
