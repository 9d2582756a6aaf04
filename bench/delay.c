/* delay: a TCP relay that adds a fixed one-way latency, as an ssh ProxyCommand.
 *
 *   delay ONE_WAY_USEC HOST PORT
 *   ssh -o 'ProxyCommand bench/build/delay 500 %h %p' n1    # 1 ms more per round trip
 *
 * This kernel has no netem (`tc qdisc ... netem`), so the fake cluster's links
 * (tests/cluster/cluster.sh) get their latency here instead: connect to HOST:PORT, then copy
 * stdin to the socket and the socket to stdout, holding every chunk read, in either
 * direction, until ONE_WAY_USEC microseconds (CLOCK_MONOTONIC) after it was read. Each
 * direction has its own queue, so bytes keep streaming and neither direction waits for the
 * other. A round trip through it costs 2 x ONE_WAY_USEC more; so does the connect, as TCP's
 * handshake would (relaying starts that long after it). With 0 it is a plain relay.
 * bench/latency.py builds it and writes the ssh configs that use it.
 *
 * Timers wake a process of this VM 20-40 us late, so it sleeps until DELAY_SPIN_USEC (default
 * 60) before a chunk is due and polls without sleeping from there: at most that much CPU time
 * a chunk, and chunks leave within a microsecond of when they are due. DELAY_NAGLE=1 leaves
 * Nagle's algorithm on for the socket (below). In an ssh tree, set these in the ProxyCommand
 * itself (`env DELAY_NAGLE=1 .../delay ...`): the nodes' ssh does not get the head's
 * environment.
 *
 * Exit status: 0 when the socket's input has ended and all of it was written out (or stdout's
 * reader is gone), 1 when the connection fails or on an I/O error (one line on stderr), 2 on
 * bad usage.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define CHUNK (64 * 1024)       /* the most one read takes */
#define MAXQ (8 * 1024 * 1024)  /* stop reading while this much waits in a direction */
#define SPIN_US 60              /* the default of DELAY_SPIN_USEC */

struct chunk {
    struct chunk *next;
    int64_t due;        /* CLOCK_MONOTONIC ns at which it may be written */
    size_t len, off;    /* off: bytes of it already written */
    char data[];
};

struct dir {
    int in, out;
    int eof;            /* `in` has ended */
    size_t queued;
    struct chunk *head, *tail;
};

static int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static _Noreturn void fail(const char *what)
{
    fprintf(stderr, "delay: %s: %s\n", what, strerror(errno));
    exit(1);
}

/* Read what d->in has into d's queue, due `delay` ns from now. */
static void take(struct dir *d, int64_t delay, const char *name)
{
    static char buf[CHUNK];
    ssize_t n = read(d->in, buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return;
    if (n < 0)
        fail(name);
    if (n == 0) {
        d->eof = 1;
        return;
    }
    struct chunk *c = malloc(sizeof *c + (size_t)n);
    if (!c)
        fail("malloc");
    *c = (struct chunk){.due = now_ns() + delay, .len = (size_t)n};
    memcpy(c->data, buf, (size_t)n);
    if (d->tail)
        d->tail->next = c;
    else
        d->head = c;
    d->tail = c;
    d->queued += (size_t)n;
}

/* Write what is due of d's queue to d->out, as far as it takes it without blocking. */
static void give(struct dir *d, const char *name)
{
    int64_t t = now_ns();
    struct chunk *c;
    while ((c = d->head) && c->due <= t) {
        ssize_t n = write(d->out, c->data + c->off, c->len - c->off);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN)
                return;
            if (errno == EPIPE && d->out == 1)
                exit(0); /* ssh is gone: nobody is left to read */
            fail(name);
        }
        c->off += (size_t)n;
        d->queued -= (size_t)n;
        if (c->off < c->len)
            continue;
        d->head = c->next;
        if (!d->head)
            d->tail = NULL;
        free(c);
    }
}

static int dial(const char *host, const char *port)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res, *ai;
    int rc = getaddrinfo(host, port, &hints, &res);
    if (rc != 0) {
        fprintf(stderr, "delay: connect to %s:%s: %s\n", host, port, gai_strerror(rc));
        exit(1);
    }
    int fd = -1, err = 0;
    for (ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0)
            break;
        err = errno;
        if (fd >= 0)
            close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0) {
        fprintf(stderr, "delay: connect to %s:%s: %s\n", host, port, strerror(err));
        exit(1);
    }
    return fd;
}

static int stdout_flags;

static void restore_stdout(void)
{
    fcntl(1, F_SETFL, stdout_flags);
}

int main(int argc, char **argv)
{
    char *end;
    errno = 0;
    unsigned long long usec = argc == 4 ? strtoull(argv[1], &end, 10) : 0;
    if (argc != 4 || argv[1][0] < '0' || argv[1][0] > '9' || *end || errno || usec > 60000000) {
        fprintf(stderr, "usage: delay ONE_WAY_USEC HOST PORT (ONE_WAY_USEC: 0 to 60000000)\n");
        return 2;
    }
    int64_t delay = (int64_t)usec * 1000;
    const char *e = getenv("DELAY_SPIN_USEC"); /* 0: never spin (chunks 20-40 us late) */
    int64_t spin = (e && *e ? strtoll(e, NULL, 10) : SPIN_US) * 1000;
    spin = spin < 0 ? 0 : spin;
    signal(SIGPIPE, SIG_IGN);
    prctl(PR_SET_TIMERSLACK, 1UL); /* wake on time, not up to 50 us late */

    int sock = dial(argv[2], argv[3]);
    /* No Nagle on top of the delay, as ssh -W's relays do; DELAY_NAGLE=1 leaves it on, as
     * ssh's own socket has it until its session starts (~40 ms stalls in the handshake). */
    int one = 1;
    if (!(e = getenv("DELAY_NAGLE")) || strcmp(e, "1") != 0)
        setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    /* On a real link the TCP handshake takes a round trip before the first byte moves. */
    struct timespec hs = {.tv_sec = 2 * delay / 1000000000, .tv_nsec = 2 * delay % 1000000000};
    while (clock_nanosleep(CLOCK_MONOTONIC, 0, &hs, &hs) == EINTR) {}
    /* Writes must not block, or one direction would hold up the other. */
    fcntl(sock, F_SETFL, fcntl(sock, F_GETFL) | O_NONBLOCK);
    stdout_flags = fcntl(1, F_GETFL);
    fcntl(1, F_SETFL, stdout_flags | O_NONBLOCK);
    atexit(restore_stdout);

    struct dir up = {.in = 0, .out = sock}, down = {.in = sock, .out = 1};
    struct dir *ds[2] = {&up, &down};
    int shut = 0;
    while (!(down.eof && !down.head)) {
        if (up.eof && !up.head && !shut) {
            shutdown(sock, SHUT_WR); /* pass stdin's end on once all of it went out */
            shut = 1;
        }
        struct pollfd p[4];
        int np = 0, at[2] = {-1, -1}; /* at[i]: where ds[i]->in is in p */
        int64_t t = now_ns(), wait = -1;
        for (int i = 0; i < 2; i++) {
            struct dir *d = ds[i];
            if (!d->eof && d->queued < MAXQ) {
                at[i] = np;
                p[np++] = (struct pollfd){.fd = d->in, .events = POLLIN};
            }
            if (d->head && d->head->due <= t)
                p[np++] = (struct pollfd){.fd = d->out, .events = POLLOUT};
            else if (d->head && (wait < 0 || d->head->due - t < wait))
                wait = d->head->due - t;
        }
        /* Sleep until `spin` before the earliest chunk is due, then poll without sleeping.
         * ppoll, not poll: a timeout in ns, where poll's is in whole ms. */
        wait = wait < 0 ? -1 : wait > spin ? wait - spin : 0;
        struct timespec ts = {.tv_sec = wait / 1000000000, .tv_nsec = wait % 1000000000};
        if (ppoll(p, (nfds_t)np, wait < 0 ? NULL : &ts, NULL) < 0) {
            if (errno != EINTR)
                fail("poll");
            continue;
        }
        for (int i = 0; i < 2; i++)
            if (at[i] >= 0 && p[at[i]].revents)
                take(ds[i], delay, i == 0 ? "read stdin" : "read socket");
        give(&up, "write socket");
        give(&down, "write stdout");
    }
    return 0;
}
