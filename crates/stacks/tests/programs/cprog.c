#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static int mode_sleep;
volatile unsigned long counter;
__attribute__((noinline)) void spin_forever(void) { for (;;) counter++; }
__attribute__((noinline)) void sleep_forever(void) { for (;;) sleep(100); }
__attribute__((noinline)) void worker_body(int depth) {
    if (depth > 0) { worker_body(depth - 1); __asm__ volatile(""); return; }
    if (mode_sleep) sleep_forever(); else spin_forever();
}
static void *thread_main(void *arg) { (void)arg; worker_body(2); return NULL; }
int main(int argc, char **argv) {
    mode_sleep = argc > 1 && strcmp(argv[1], "sleep") == 0;
    int n = argc > 2 ? atoi(argv[2]) : 1;
    pthread_t t[64];
    for (int i = 1; i < n; i++) pthread_create(&t[i], NULL, thread_main, NULL);
    worker_body(3);
    return 0;
}
