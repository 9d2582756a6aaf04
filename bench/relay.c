/* relay: the floor of a hop, for the stdio section's `3 hops` command.
 *
 *   writers | relay | relay | wc -c
 *
 * is the path of rank output under a launcher without the launcher: the rank's pipe, a proxy
 * that reads it and writes it on, the launcher that does the same, the consumer. Each relay
 * copies stdin to stdout with read() and write() of up to 1 MiB, after asking for 1 MiB pipe
 * buffers on both sides (as rlaunch and its proxy do): the cheapest honest hop that still
 * looks at the bytes (no splice). Exits 0 at end of input, 1 on an error.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define BUF (1 << 20)

int main(void)
{
    /* Best effort: a plain file or a terminal has no pipe buffer to grow. */
    fcntl(0, F_SETPIPE_SZ, BUF);
    fcntl(1, F_SETPIPE_SZ, BUF);
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
