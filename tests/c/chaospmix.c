/* chaospmix: the chaos runner's rank program for PMIx (`chaos --ranks pmix`), a libpmix client
 * that does what `chaosrank` (tests/src/bin/chaosrank.rs) does with PMI-1, with the same
 * arguments, side files and output lines:
 *
 *   chaospmix DIR PHASE [FAULT_RANK FAULT WHEN]
 *     PHASE  launch | fence | output | stdin | exit
 *     FAULT  exit:C | signal:S | abort:C | pmi-close     (abort: PMIx_Abort; pmi-close: exit 0
 *                                                         without PMIx_Finalize)
 *     WHEN   start | usr1
 *
 * The fence phase puts a key, fences collecting the data, and gets the neighbour's, for ever;
 * under --on-failure continue (RLAUNCH_DEAD_RANKS_FILE set) every rank puts whether the file
 * lists a failed rank yet, and all stop after the first fence in which one did (and a fault at
 * the start strikes after PMIx_Init, see main). Side files in
 * DIR: pid.R, ready.R (after the first fence), lines.R (lines written, 20 digits), told.R
 * (under continue: the failed ranks). In a later attempt (RLAUNCH_RESTART_COUNT above 0) a
 * rank only inits, fences and finalizes. Exit codes of its own: 2 bad arguments, 1 a PMIx call
 * failed. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "pmix_client.h"

#define LINE 64
#define HEAD 21
#define WRITE 4096

enum fault { NONE, EXIT, SIGNAL, ABORT, PMI_CLOSE };

static const char *dir;
static uint32_t rank;
static pmix_proc_t me, job;
static enum fault fault = NONE;
static int fault_value;
static atomic_bool faulting;
static int count_fd = -1;
static unsigned long long written;

static void usage(const char *what)
{
    fprintf(stderr, "chaospmix: %s; usage: chaospmix DIR PHASE [FAULT_RANK FAULT start|usr1]\n",
            what);
    exit(2);
}

static void idle(void)
{
    for (;;)
        pause();
}

/* A PMIx call failed: the fault's doing once it began, else the rank fails. */
static void failed(const char *what, pmix_status_t rc)
{
    if (atomic_load(&faulting))
        idle();
    fprintf(stderr, "chaospmix: %s: %s\n", what, PMIx_Error_string(rc));
    exit(1);
}

static void side_file(const char *name, const char *contents)
{
    char path[4096], tmp[4096];
    snprintf(path, sizeof path, "%s/%s.%u", dir, name, rank);
    snprintf(tmp, sizeof tmp, "%s/.%s.%u", dir, name, rank);
    FILE *f = fopen(tmp, "w");
    if (!f || fputs(contents, f) < 0 || fclose(f) != 0 || rename(tmp, path) != 0)
        usage("cannot write a side file");
}

static void strike(void)
{
    atomic_store(&faulting, true);
    switch (fault) {
    case EXIT:
        /* At once, as a crash would: no exit handler runs on libpmix's behalf meanwhile. */
        _exit(fault_value);
    case SIGNAL: {
        signal(fault_value, SIG_DFL);
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, fault_value);
        pthread_sigmask(SIG_UNBLOCK, &set, NULL);
        raise(fault_value);
        idle();
    }
    case ABORT:
        PMIx_Abort(fault_value, NULL, NULL, 0);
        idle();
    case PMI_CLOSE:
        _exit(0);
    case NONE:
        break;
    }
}

static void *on_usr1(void *set)
{
    int sig;
    if (sigwait(set, &sig) == 0)
        strike();
    return NULL;
}

/* Writes `block` whole, then the count of lines so far in lines.R. */
static void emit(const char *block, size_t len)
{
    size_t done = 0;
    while (done < len) {
        ssize_t n = write(1, block + done, len - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            idle(); /* the launcher is gone: the job is being torn down */
        done += (size_t)n;
    }
    written += len / LINE;
    char count[32];
    snprintf(count, sizeof count, "%020llu", written);
    if (pwrite(count_fd, count, 20, 0) != 20)
        usage("cannot count lines");
}

/* `n` of this rank's flood lines (tests/src/flood.rs), in one write. */
static void lines(unsigned n)
{
    char block[WRITE];
    for (unsigned k = 0; k < n; k++) {
        char *line = block + k * LINE;
        unsigned long long seq = written + k;
        char head[HEAD + 1];
        snprintf(head, sizeof head, "r%06u %012llu ", rank, seq);
        memcpy(line, head, HEAD);
        for (int i = 0; i < LINE - 1 - HEAD; i++)
            line[HEAD + i] = (char)('a' + (rank + seq + (unsigned long long)i) % 26);
        line[LINE - 1] = '\n';
    }
    emit(block, (size_t)n * LINE);
}

/* Under continue: the failed ranks the node's file lists, or "" (none yet, or not continue). */
static void dead_list(char *out, size_t size)
{
    out[0] = '\0';
    const char *file = getenv("RLAUNCH_DEAD_RANKS_FILE");
    FILE *f = file ? fopen(file, "r") : NULL;
    if (!f)
        return;
    if (!fgets(out, (int)size, f))
        out[0] = '\0';
    fclose(f);
    out[strcspn(out, "\n")] = '\0';
}

/* Told of failed ranks (under continue): said once in told.R. */
static bool told(void)
{
    char list[4096];
    dead_list(list, sizeof list);
    if (!list[0])
        return false;
    side_file("told", list);
    return true;
}

static void put(const char *key, const char *value)
{
    pmix_value_t v;
    PMIX_VALUE_LOAD(&v, value, PMIX_STRING);
    pmix_status_t rc = PMIx_Put(PMIX_GLOBAL, key, &v);
    if (rc != PMIX_SUCCESS)
        failed("PMIx_Put", rc);
}

static void fence(void)
{
    pmix_status_t rc = PMIx_Commit();
    if (rc != PMIX_SUCCESS)
        failed("PMIx_Commit", rc);
    bool collect = true;
    pmix_info_t info;
    PMIx_Info_load(&info, PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
    rc = PMIx_Fence(&job, 1, &info, 1);
    /* Under continue (the dead ranks' file is named), a fence that lost a member completes
     * for the others: libpmix says PARTIAL SUCCESS when it lost a local client's connection
     * in it, and the survivors go on, to be told who failed. */
    bool goes_on = getenv("RLAUNCH_DEAD_RANKS_FILE") != NULL;
    if (rc != PMIX_SUCCESS && !(goes_on && rc == PMIX_ERR_PARTIAL_SUCCESS))
        failed("PMIx_Fence", rc);
}

/* Rank `r`'s value of `key` after a fence that collected it, or NULL if it has none (a
 * failed rank's: its server answers that it has none rather than wait for it). Not
 * PMIX_OPTIONAL: a local peer's data is the server's, not in this client's cache. Not
 * PMIX_GET_REFRESH_CACHE either: libpmix answers it for a local peer from a shared-memory
 * store, and the servers keep theirs in `hash` (crates/proxy/src/pmix/mod.rs, `spawn_host`). */
static pmix_status_t got_status;
static char *get(uint32_t r, const char *key)
{
    pmix_proc_t of;
    PMIX_LOAD_PROCID(&of, me.nspace, r);
    pmix_value_t *v = NULL;
    pmix_status_t rc = PMIx_Get(&of, key, NULL, 0, &v);
    got_status = rc;
    if (rc != PMIX_SUCCESS)
        return NULL;
    char *value = v->type == PMIX_STRING ? strdup(v->data.string) : NULL;
    PMIX_VALUE_RELEASE(v);
    return value;
}

static void fence_phase(uint32_t size)
{
    bool watching = getenv("RLAUNCH_DEAD_RANKS_FILE") != NULL;
    for (unsigned long long epoch = 1;; epoch++) {
        char key[64], value[64], list[4096];
        dead_list(list, sizeof list);
        bool heard = list[0] != '\0';
        snprintf(key, sizeof key, "k%u.%llu", rank, epoch);
        snprintf(value, sizeof value, "%u.%llu", rank, epoch);
        put(key, value);
        if (watching) {
            /* All survivors stop after the same fence (see the header). */
            snprintf(key, sizeof key, "h%u.%llu", rank, epoch);
            put(key, heard ? "1" : "0");
        }
        fence();
        if (watching) {
            bool any = false;
            for (uint32_t r = 0; r < size && !any; r++) {
                snprintf(key, sizeof key, "h%u.%llu", r, epoch);
                char *flag = get(r, key);
                any = flag && strcmp(flag, "1") == 0;
                free(flag);
            }
            if (any && told())
                return;
            dead_list(list, sizeof list);
            if (list[0])
                continue; /* the neighbour may be the failed rank, with no key of this epoch */
        }
        uint32_t neighbour = (rank + 1) % size;
        snprintf(key, sizeof key, "k%u.%llu", neighbour, epoch);
        snprintf(value, sizeof value, "%u.%llu", neighbour, epoch);
        char *got = get(neighbour, key);
        if (!got || strcmp(got, value) != 0) {
            fprintf(stderr, "chaospmix %u: %s is %s (%s)\n", rank, key, got ? got : "missing",
                    PMIx_Error_string(got_status));
            exit(1);
        }
        free(got);
        lines(1);
        usleep(2000);
    }
}

/* Rank 0 of the stdin phase: stdin to stdout in whole lines until EOF (or, under continue,
 * until told of a failure). */
static void copy_stdin(void)
{
    bool watching = getenv("RLAUNCH_DEAD_RANKS_FILE") != NULL;
    char buf[WRITE];
    size_t filled = 0;
    for (;;) {
        /* Told while stdin keeps coming, too (as chaosrank): before each read. */
        while (watching) {
            if (told())
                return;
            struct pollfd in = {.fd = 0, .events = POLLIN};
            int ready = poll(&in, 1, 20);
            if (ready > 0 || (ready < 0 && errno != EINTR))
                break;
        }
        ssize_t n = read(0, buf + filled, sizeof buf - filled);
        if (n == 0)
            return;
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            usage("cannot read stdin");
        filled += (size_t)n;
        size_t whole = filled / LINE * LINE;
        if (whole > 0) {
            emit(buf, whole);
            memmove(buf, buf + whole, filled - whole);
            filled -= whole;
        }
    }
}

int main(int argc, char **argv)
{
    if (argc != 3 && argc != 6)
        usage("wrong number of arguments");
    dir = argv[1];
    const char *phase = argv[2];
    const char *env_rank = getenv("PMIX_RANK");
    rank = env_rank ? (uint32_t)atoi(env_rank) : 0;
    bool at_start = false;
    if (argc == 6) {
        uint32_t target = (uint32_t)atoi(argv[3]);
        const char *word = argv[4];
        if (strcmp(word, "pmi-close") == 0)
            fault = PMI_CLOSE;
        else if (sscanf(word, "exit:%d", &fault_value) == 1)
            fault = EXIT;
        else if (sscanf(word, "abort:%d", &fault_value) == 1)
            fault = ABORT;
        else if (sscanf(word, "signal:%d", &fault_value) == 1)
            fault = SIGNAL;
        else
            usage("bad FAULT");
        if (strcmp(argv[5], "start") == 0)
            at_start = true;
        else if (strcmp(argv[5], "usr1") != 0)
            usage("bad WHEN");
        if (target != rank)
            fault = NONE;
    }
    const char *attempt = getenv("RLAUNCH_RESTART_COUNT");
    if (attempt && atoi(attempt) > 0) {
        me = client_init("chaospmix");
        client_job_size("chaospmix", &me, &job);
        client_fence("chaospmix", &job, false);
        PMIx_Finalize(NULL, 0);
        return 0;
    }
    char pid[32];
    snprintf(pid, sizeof pid, "%d", (int)getpid());
    side_file("pid", pid);
    struct rlimit none = {0, 0};
    setrlimit(RLIMIT_CORE, &none);

    static sigset_t usr1;
    /* Under continue a rank fails at its start only once connected: libpmix counts a node's
     * processes from its registration and only a lost connection lowers the count, so a
     * process that failed before PMIx_Init leaves its node's fences waiting (README). */
    bool after_init = fault == ABORT || fault == PMI_CLOSE || getenv("RLAUNCH_DEAD_RANKS_FILE");
    if (fault != NONE && at_start && !after_init)
        strike();
    if (fault != NONE && !at_start) {
        /* Blocked before libpmix starts its thread, which inherits the mask. */
        sigemptyset(&usr1);
        sigaddset(&usr1, SIGUSR1);
        pthread_sigmask(SIG_BLOCK, &usr1, NULL);
        pthread_t waiter;
        if (pthread_create(&waiter, NULL, on_usr1, &usr1) != 0)
            usage("cannot start a thread");
    }
    me = client_init("chaospmix");
    if (fault != NONE && at_start && after_init)
        strike();
    uint32_t size = client_job_size("chaospmix", &me, &job);
    char key[32];
    snprintf(key, sizeof key, "k%u", rank);
    put(key, "0");
    fence();
    side_file("ready", "");

    char path[4096];
    snprintf(path, sizeof path, "%s/lines.%u", dir, rank);
    count_fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (count_fd < 0)
        usage("cannot create lines.R");
    bool watching = getenv("RLAUNCH_DEAD_RANKS_FILE") != NULL;
    if (strcmp(phase, "fence") == 0) {
        fence_phase(size);
    } else if (strcmp(phase, "output") == 0) {
        while (!(watching && told()))
            lines(WRITE / LINE);
    } else if (strcmp(phase, "stdin") == 0 && rank == 0) {
        copy_stdin();
    } else if (strcmp(phase, "stdin") == 0) {
        while (!(watching && told())) {
            if (watching)
                usleep(20000);
            else
                sleep(3600);
        }
    } else if (strcmp(phase, "exit") == 0) {
        lines(8);
        usleep((useconds_t)((unsigned)getpid() * 7919u % 200u) * 1000);
    } else if (strcmp(phase, "launch") != 0) {
        usage("unknown phase");
    }
    pmix_status_t rc = PMIx_Finalize(NULL, 0);
    if (rc != PMIX_SUCCESS)
        failed("PMIx_Finalize", rc);
    return 0;
}
