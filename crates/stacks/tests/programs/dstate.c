/* Parent sits in D state (vfork wait) for N seconds while the child sleeps, then loops. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <time.h>
int main(int argc, char **argv) {
    int secs = argc > 1 ? atoi(argv[1]) : 3;
    pid_t c = vfork();
    if (c == 0) { sleep(secs); _exit(0); }
    printf("parent resumed after vfork\n"); fflush(stdout);
    for (;;) { sleep(1); printf("parent alive %ld\n", (long)time(NULL)); fflush(stdout); }
}
