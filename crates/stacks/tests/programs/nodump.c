#include <stdio.h>
#include <sys/prctl.h>
#include <unistd.h>
__attribute__((noinline)) void wait_here(void) { for (;;) pause(); }
int main(void) {
    prctl(PR_SET_DUMPABLE, 0);
    printf("dumpable=%d uid=%d\n", prctl(PR_GET_DUMPABLE), getuid()); fflush(stdout);
    wait_here();
}
