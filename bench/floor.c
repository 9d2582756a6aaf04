/* floor: the physical floor for launching N processes on one machine.
 *
 *   floor N PROGRAM [ARGS...]
 *
 * Forks and execs N copies of PROGRAM, each with its own stdout and stderr pipe and stdin
 * from /dev/null; drains every pipe with poll(), copying the bytes to our own stdout/stderr;
 * reaps every child. Exits 0 if every child exited 0, else 1. A launcher cannot do less work
 * than this and still relay output and exit status, so its time over this is its overhead.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void die(const char *what) {
    fprintf(stderr, "floor: %s: %s\n", what, strerror(errno));
    exit(2);
}

static void write_all(int fd, const char *buf, ssize_t len) {
    while (len > 0) {
        ssize_t w = write(fd, buf, (size_t)len);
        if (w < 0) {
            if (errno == EINTR) continue;
            die("write");
        }
        buf += w;
        len -= w;
    }
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: floor N PROGRAM [ARGS...]\n");
        return 2;
    }
    int n = atoi(argv[1]);
    if (n < 1) {
        fprintf(stderr, "floor: N must be at least 1\n");
        return 2;
    }
    int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (devnull < 0) die("open /dev/null");

    struct pollfd *fds = calloc((size_t)n * 2, sizeof *fds);
    int *out_of = calloc((size_t)n * 2, sizeof *out_of); /* which of our fds a pipe relays to */
    pid_t *pids = calloc((size_t)n, sizeof *pids);
    if (!fds || !out_of || !pids) die("calloc");

    for (int i = 0; i < n; i++) {
        int out[2], err[2];
        /* O_CLOEXEC: a sibling must not hold another child's pipe open past its exit. */
        if (pipe2(out, O_CLOEXEC) < 0 || pipe2(err, O_CLOEXEC) < 0) die("pipe2");
        pid_t pid = fork();
        if (pid < 0) die("fork");
        if (pid == 0) {
            if (dup2(devnull, 0) < 0 || dup2(out[1], 1) < 0 || dup2(err[1], 2) < 0) _exit(126);
            execvp(argv[2], argv + 2);
            _exit(errno == ENOENT ? 127 : 126);
        }
        pids[i] = pid;
        close(out[1]);
        close(err[1]);
        fds[2 * i] = (struct pollfd){.fd = out[0], .events = POLLIN};
        fds[2 * i + 1] = (struct pollfd){.fd = err[0], .events = POLLIN};
        out_of[2 * i] = 1;
        out_of[2 * i + 1] = 2;
    }

    int open_pipes = 2 * n;
    char buf[65536];
    while (open_pipes > 0) {
        if (poll(fds, (nfds_t)(2 * n), -1) < 0) {
            if (errno == EINTR) continue;
            die("poll");
        }
        for (int i = 0; i < 2 * n; i++) {
            if (fds[i].fd < 0 || !fds[i].revents) continue;
            ssize_t r = read(fds[i].fd, buf, sizeof buf);
            if (r > 0) {
                write_all(out_of[i], buf, r);
            } else if (r == 0 || errno != EINTR) {
                close(fds[i].fd);
                fds[i].fd = -1; /* poll ignores negative fds */
                open_pipes--;
            }
        }
    }

    int failed = 0;
    for (int i = 0; i < n; i++) {
        int status;
        while (waitpid(pids[i], &status, 0) < 0) {
            if (errno != EINTR) die("waitpid");
        }
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failed = 1;
    }
    return failed;
}
