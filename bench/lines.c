/* lines: writer and checker of numbered 64-byte lines, for the stdio section.
 *
 *   lines write BYTES [RANK]     write BYTES (a multiple of 64 KiB) of lines, 64 KiB per write()
 *   lines check NRANKS LINES     read stdin; check every line is intact and in order per rank
 *
 * A line is exactly 64 bytes:
 *
 *   RRRRR SSSSSSSSSSSSSSSS <40 filler bytes>\n
 *   rank  sequence (0, 1, ...)
 *
 * RANK defaults to $PMI_RANK, else 0. The writer only rewrites the sequence digits of a
 * prebuilt 64 KiB buffer, so it runs at memory speed and the pipe path is what gets measured.
 *
 * The checker counts a line as bad if it is not 64 bytes of the right shape, or comes after a
 * later line of its rank (repeated or reordered); lines never seen intact and in order are
 * counted as missing. It prints one summary line:
 *   lines=L bad=B missing=M
 * and exits 0 only if B and M are 0 and L is NRANKS * LINES.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LINE 64
#define CHUNK 65536
#define PER_CHUNK (CHUNK / LINE)
#define RANK_DIGITS 5
#define SEQ_DIGITS 16
#define SEQ_AT (RANK_DIGITS + 1)
#define FILL_AT (SEQ_AT + SEQ_DIGITS + 1)
#define FILL_LEN (LINE - 1 - FILL_AT)

static char filler(int i) { return (char)('a' + i % 26); }

static void die(const char *what) {
    fprintf(stderr, "lines: %s: %s\n", what, strerror(errno));
    exit(2);
}

/* Adds 1 to a fixed-width decimal counter in place. */
static void increment(char *digits) {
    for (int i = SEQ_DIGITS - 1; i >= 0; i--) {
        if (digits[i] != '9') {
            digits[i]++;
            return;
        }
        digits[i] = '0';
    }
}

static int write_lines(long long bytes, int rank) {
    if (bytes <= 0 || bytes % CHUNK != 0) {
        fprintf(stderr, "lines: BYTES must be a positive multiple of %d\n", CHUNK);
        return 2;
    }
    static char buf[CHUNK];
    for (int l = 0; l < PER_CHUNK; l++) {
        char *line = buf + l * LINE;
        snprintf(line, RANK_DIGITS + 2, "%0*d ", RANK_DIGITS, rank);
        memset(line + SEQ_AT, '0', SEQ_DIGITS);
        line[SEQ_AT + SEQ_DIGITS] = ' ';
        for (int i = 0; i < FILL_LEN; i++) line[FILL_AT + i] = filler(i);
        line[LINE - 1] = '\n';
    }
    char seq[SEQ_DIGITS];
    memset(seq, '0', SEQ_DIGITS);
    for (long long chunks = bytes / CHUNK; chunks > 0; chunks--) {
        for (int l = 0; l < PER_CHUNK; l++) {
            memcpy(buf + l * LINE + SEQ_AT, seq, SEQ_DIGITS);
            increment(seq);
        }
        for (size_t off = 0; off < CHUNK;) {
            ssize_t w = write(1, buf + off, CHUNK - off);
            if (w < 0) {
                if (errno == EINTR) continue;
                die("write");
            }
            off += (size_t)w;
        }
    }
    return 0;
}

/* Parses a line of exactly LINE bytes; returns 0 and sets rank/seq if it has the right shape. */
static int parse(const char *l, long nranks, long *rank, long long *seq) {
    long r = 0;
    long long s = 0;
    for (int i = 0; i < RANK_DIGITS; i++) {
        if (l[i] < '0' || l[i] > '9') return -1;
        r = r * 10 + (l[i] - '0');
    }
    if (l[RANK_DIGITS] != ' ' || l[SEQ_AT + SEQ_DIGITS] != ' ' || l[LINE - 1] != '\n') return -1;
    for (int i = 0; i < SEQ_DIGITS; i++) {
        char c = l[SEQ_AT + i];
        if (c < '0' || c > '9') return -1;
        s = s * 10 + (c - '0');
    }
    for (int i = 0; i < FILL_LEN; i++)
        if (l[FILL_AT + i] != filler(i)) return -1;
    if (r >= nranks) return -1;
    *rank = r;
    *seq = s;
    return 0;
}

static int check_lines(long nranks, long long per_rank) {
    long long *next = calloc((size_t)nranks, sizeof *next); /* next expected sequence per rank */
    long long *good = calloc((size_t)nranks, sizeof *good); /* in-order lines seen per rank */
    size_t cap = 1 << 20;
    char *buf = malloc(cap + LINE * 4);
    if (!next || !good || !buf) die("malloc");
    long long lines = 0, bad = 0;
    size_t have = 0; /* bytes of an unfinished line kept at the start of buf */
    for (;;) {
        ssize_t r = read(0, buf + have, cap - have);
        if (r < 0) {
            if (errno == EINTR) continue;
            die("read");
        }
        size_t end = have + (size_t)r;
        size_t start = 0;
        for (;;) {
            char *nl = memchr(buf + start, '\n', end - start);
            if (!nl) break;
            size_t len = (size_t)(nl - (buf + start)) + 1;
            long rank;
            long long seq;
            lines++;
            if (len != LINE || parse(buf + start, nranks, &rank, &seq) != 0) {
                bad++;
            } else if (seq < next[rank]) { /* repeated or reordered */
                bad++;
            } else { /* a gap before it is counted as missing at the end */
                next[rank] = seq + 1;
                good[rank]++;
            }
            start += len;
        }
        if (r == 0) {
            if (start < end) { /* a final fragment without a newline */
                lines++;
                bad++;
            }
            break;
        }
        have = end - start;
        if (have >= cap / 2) { /* a runaway line: count it and drop it */
            bad++;
            lines++;
            have = 0;
        } else {
            memmove(buf, buf + start, have);
        }
    }
    long long missing = 0;
    for (long i = 0; i < nranks; i++)
        if (good[i] < per_rank) missing += per_rank - good[i];
    printf("lines=%lld bad=%lld missing=%lld\n", lines, bad, missing);
    return (bad == 0 && missing == 0 && lines == nranks * per_rank) ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc >= 3 && strcmp(argv[1], "write") == 0) {
        const char *env = getenv("PMI_RANK");
        int rank = argc > 3 ? atoi(argv[3]) : env ? atoi(env) : 0;
        return write_lines(atoll(argv[2]), rank);
    }
    if (argc == 4 && strcmp(argv[1], "check") == 0) return check_lines(atol(argv[2]), atoll(argv[3]));
    fprintf(stderr, "usage: lines write BYTES [RANK] | lines check NRANKS LINES_PER_RANK\n");
    return 2;
}
