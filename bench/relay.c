/* relay: the floor of a hop, for the stdio section's `3 hops` commands.
 *
 *   writers | relay [splice] | relay [splice] | wc -c
 *
 * is the path of rank output under a launcher without the launcher: the rank's pipe, a proxy
 * that takes it and passes it on, the launcher that does the same, the consumer. Each relay
 * asks for 1 MiB pipe buffers on both sides (as rlaunch and its proxy do), then copies stdin
 * to stdout with read() and write() of up to 1 MiB: the cheapest honest hop that looks at
 * the bytes. With `splice` it moves them with blocking splice() of up to 1 MiB instead, never
 * looking at them: the physical floor of a hop, and of the path when both hops do it.
 * Exits 0 at end of input, 1 on an error.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BUF (1 << 20)

static int spliced(void)
{
    for (;;) {
        ssize_t n = splice(0, NULL, 1, NULL, BUF, SPLICE_F_MOVE);
        if (n == 0)
            return 0;
        if (n < 0) {
            perror("relay: splice");
            return 1;
        }
    }
}

int main(int argc, char **argv)
{
    /* Best effort: a plain file or a terminal has no pipe buffer to grow. */
    fcntl(0, F_SETPIPE_SZ, BUF);
    fcntl(1, F_SETPIPE_SZ, BUF);
    if (argc > 1 && strcmp(argv[1], "splice") == 0)
        return spliced();
    char *buf = malloc(BUF);
    if (!buf) {
        perror("relay");
        return 1;
    }
    for (;;) {
        ssize_t n = read(0, buf, BUF);
        if (n == 0)
            return 0;
        if (n < 0) {
            perror("relay: read");
            return 1;
        }
        for (ssize_t done = 0; done < n;) {
            ssize_t w = write(1, buf + done, n - done);
            if (w < 0) {
                perror("relay: write");
                return 1;
            }
            done += w;
        }
    }
}
