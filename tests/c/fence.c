/* fence: a PMIx client whose ranks exchange data through one fence that collects it.
 * `fence BYTES ABSENT [wait]`: each rank puts `rlaunch.blob`, BYTES bytes made from its rank,
 * commits and prints `ready R`; with `wait` it then reads a line from stdin. It fences over
 * the whole job with PMIX_COLLECT_DATA, and gets the blob of every other rank but those of
 * ABSENT (a list such as `0,4`, or `-`: ranks that are no PMIx clients) from what the fence
 * brought (PMIX_IMMEDIATE: no direct modex makes up for a fence that brought too little). It
 * checks every byte and prints `rank R has N blobs`, or `rank R lacks P's blob: STATUS` /
 * `rank R has a wrong blob from P` and exits 3. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pmix_client.h"

static unsigned char byte_of(uint32_t rank, size_t i)
{
    return (unsigned char)(rank * 131 + i * 7 + i / 4096);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: fence BYTES ABSENT [wait]\n");
        return 2;
    }
    size_t bytes = strtoull(argv[1], NULL, 10);
    char absent[256];
    snprintf(absent, sizeof absent, ",%s,", argv[2]);
    int wait = argc > 3 && strcmp(argv[3], "wait") == 0;
    pmix_proc_t me = client_init("fence");
    pmix_proc_t job;
    uint32_t size = client_job_size("fence", &me, &job);
    unsigned char *mine = malloc(bytes ? bytes : 1);
    if (!mine)
        return 1;
    for (size_t i = 0; i < bytes; i++)
        mine[i] = byte_of(me.rank, i);
    pmix_value_t value;
    value.type = PMIX_BYTE_OBJECT;
    value.data.bo.bytes = (char *)mine;
    value.data.bo.size = bytes;
    if (PMIx_Put(PMIX_GLOBAL, "rlaunch.blob", &value) != PMIX_SUCCESS || PMIx_Commit() != PMIX_SUCCESS) {
        fprintf(stderr, "fence: cannot put and commit\n");
        return 1;
    }
    free(mine);
    printf("ready %u\n", me.rank);
    fflush(stdout);
    char line[64];
    if (wait && !fgets(line, sizeof line, stdin)) {
        fprintf(stderr, "fence: no line on stdin\n");
        return 1;
    }
    client_fence("fence", &job, true);
    bool yes = true;
    pmix_info_t immediate;
    PMIx_Info_load(&immediate, PMIX_IMMEDIATE, &yes, PMIX_BOOL);
    uint32_t blobs = 0;
    for (uint32_t p = 0; p < size; p++) {
        char item[16];
        snprintf(item, sizeof item, ",%u,", p);
        if (p == me.rank || strstr(absent, item))
            continue;
        pmix_proc_t peer;
        PMIX_LOAD_PROCID(&peer, me.nspace, p);
        pmix_value_t *got = NULL;
        pmix_status_t rc = PMIx_Get(&peer, "rlaunch.blob", &immediate, 1, &got);
        if (rc != PMIX_SUCCESS || got->type != PMIX_BYTE_OBJECT) {
            printf("rank %u lacks %u's blob: %s\n", me.rank, p, PMIx_Error_string(rc));
            fflush(stdout);
            return 3;
        }
        int right = got->data.bo.size == bytes;
        for (size_t i = 0; right && i < bytes; i++)
            right = (unsigned char)got->data.bo.bytes[i] == byte_of(p, i);
        if (!right) {
            printf("rank %u has a wrong blob from %u\n", me.rank, p);
            fflush(stdout);
            return 3;
        }
        PMIX_VALUE_RELEASE(got);
        blobs++;
    }
    printf("rank %u has %u blobs\n", me.rank, blobs);
    fflush(stdout);
    PMIx_Finalize(NULL, 0);
    return 0;
}
