/* Ranks whose stacks cannot be read, for the hang report: `unreadable vfork` makes rank 0
 * wait for a vfork child that sleeps (the kernel holds rank 0 in uninterruptible sleep, D
 * state), `unreadable nodump` makes rank 0 non-dumpable (prctl), which its own user may then
 * not trace. Every other rank waits in wait_readably(). Each rank prints `ready R` first. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

/* Not inlined: the report names it. */
__attribute__((noinline)) void wait_readably(void)
{
    for (;;)
        pause();
}

int main(int argc, char **argv)
{
    const char *value = getenv("PMI_RANK");
    int rank = value ? atoi(value) : -1;
    int vfork_mode = argc > 1 && strcmp(argv[1], "vfork") == 0;
    if (rank == 0 && !vfork_mode)
        prctl(PR_SET_DUMPABLE, 0);
    printf("ready %d\n", rank);
    fflush(stdout);
    if (rank == 0 && vfork_mode) {
        /* The child shares the parent's memory until it exits: it only sleeps. */
        if (vfork() == 0) {
            sleep(600);
            _exit(0);
        }
    }
    wait_readably();
    return 0;
}
