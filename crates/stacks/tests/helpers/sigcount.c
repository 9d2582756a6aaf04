/* Counts SIGRTMIN deliveries (RT signals queue, so none may be lost); prints the count on
   SIGRTMIN+1, which the kernel delivers only after every queued SIGRTMIN (lowest first). */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
static int n;
static void on_rt(int s) { (void)s; __atomic_fetch_add(&n, 1, __ATOMIC_SEQ_CST); }  /* handlers may run concurrently on several threads */
static void on_report(int s) { (void)s; char b[32]; int l = snprintf(b, sizeof b, "%d\n", __atomic_load_n(&n, __ATOMIC_SEQ_CST)); write(1, b, l); _exit(0); }
static void *idle(void *a) { (void)a; for (;;) pause(); }
int main(void) {
    struct sigaction sa; memset(&sa, 0, sizeof sa); sa.sa_flags = SA_RESTART;
    sa.sa_handler = on_rt; sigaction(SIGRTMIN, &sa, 0);
    sa.sa_handler = on_report; sigaction(SIGRTMIN + 1, &sa, 0);
    pthread_t t; pthread_create(&t, 0, idle, 0); pthread_create(&t, 0, idle, 0);
    write(1, "ready\n", 6);
    for (;;) pause();
}
