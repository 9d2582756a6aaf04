/*
 * rlaunch-pmix-host: the OpenPMIx server of one node of one job, started by that node's
 * rlaunch-proxy when the job serves PMIx. It is a thin adapter: it holds libpmix (a shared
 * library: Debian ships no static libpmix, and the proxy is a static executable) and turns the
 * server module's callbacks into messages to the proxy, and the proxy's answers into callback
 * completions. Every decision (who is in a fence, where a name is published, what an abort
 * does) is the proxy's; see crates/proxy/src/pmix/ for the protocol and the other side.
 *
 *   libpmix progress thread ── callback ──► event message ──► proxy dispatcher (tokio)
 *   main thread ◄── command message ◄────────────────────────── proxy
 *        └── PMIx_server_* calls, callback completions (cbfunc(cbdata)) by id
 *
 * The link is fd 3, a stream socket: each message is a little-endian u32 length, then a tag
 * byte, then fields: u32 and i32 little-endian, strings and blobs as a u32 length and bytes.
 * The host exits when the link closes, after PMIx_server_finalize.
 *
 * Started late (for a job whose ranks may never use PMIx, once the first of them connects),
 * the host takes over a listening socket the proxy made before the ranks started, whose
 * address their environment already names, and whose backlog holds the clients that came
 * first: libpmix's own listener is that socket (see "the proxy's listener" below), and no
 * client is accepted before its namespace and ranks are registered.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <pmix.h>
#include <pmix_server.h>

#define LINK_FD 3
/* SETUP's node index for a job with no rank on this node. */
#define NOT_HERE UINT32_MAX
/* A message longer than this from the proxy is a broken link, not a job: a fence's data of
 * 1 GiB at most, and room for the fields around it (as crates/proxy/src/pmix/wire.rs). */
#define MAX_MESSAGE ((1u << 30) + (64u << 10))

/* Commands, proxy -> host. */
enum {
    CMD_SETUP = 1,
    CMD_CLIENTS = 2,
    CMD_FENCE_DONE = 3,
    CMD_OP_DONE = 4,
    CMD_LOOKUP_DONE = 5,
    CMD_DMODEX_DONE = 6,
    CMD_DMODEX_ASK = 7,
    CMD_SPAWN_DONE = 8,
    CMD_SYNC = 9,
    CMD_DEAD = 10,
};

/* Events, host -> proxy. */
enum {
    EV_READY = 101,
    EV_FAILED = 102,
    EV_ENV = 103,
    EV_FENCE = 104,
    EV_ABORT = 105,
    EV_PUBLISH = 106,
    EV_LOOKUP = 107,
    EV_UNPUBLISH = 108,
    EV_CONNECTED = 109,
    EV_FINALIZED = 110,
    EV_DMODEX = 111,
    EV_DMODEX_DATA = 112,
    EV_NOTICE = 113,
    EV_SETUP_DONE = 114,
    EV_SPAWN = 115,
    EV_SYNCED = 116,
    EV_LOST = 117,
};

/* How a published value travels: a string, or any other pmix_value_t packed by
 * PMIx_Data_pack (unpacked by the server that looks it up). */
enum { VALUE_TEXT = 0, VALUE_PACKED = 1 };

/* ---- messages -------------------------------------------------------------------------- */

struct buf {
    char *data;
    size_t len, cap;
};

static void put_bytes(struct buf *b, const void *p, size_t n)
{
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n)
            cap *= 2;
        b->data = realloc(b->data, cap);
        if (!b->data)
            abort();
        b->cap = cap;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
}

static void put_u32(struct buf *b, uint32_t v)
{
    unsigned char le[4] = {v, v >> 8, v >> 16, v >> 24};
    put_bytes(b, le, 4);
}

static void put_blob(struct buf *b, const void *p, size_t n)
{
    put_u32(b, (uint32_t)n);
    put_bytes(b, p, n);
}

static void put_str(struct buf *b, const char *s)
{
    put_blob(b, s ? s : "", s ? strlen(s) : 0);
}

/* A message under construction: room for the length, then the tag. */
static struct buf message(int tag)
{
    struct buf b = {0};
    put_u32(&b, 0);
    unsigned char t = (unsigned char)tag;
    put_bytes(&b, &t, 1);
    return b;
}

static pthread_mutex_t send_lock = PTHREAD_MUTEX_INITIALIZER;

/* Sends and frees a message; callbacks on libpmix's thread and the main thread both send. */
static void send_message(struct buf *b)
{
    uint32_t n = (uint32_t)(b->len - 4);
    unsigned char le[4] = {n, n >> 8, n >> 16, n >> 24};
    memcpy(b->data, le, 4);
    pthread_mutex_lock(&send_lock);
    size_t off = 0;
    while (off < b->len) {
        ssize_t w = write(LINK_FD, b->data + off, b->len - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            _exit(3); /* the proxy is gone: nothing of this node can go on */
        off += (size_t)w;
    }
    pthread_mutex_unlock(&send_lock);
    free(b->data);
}

static void put_proc(struct buf *b, const pmix_proc_t *proc)
{
    put_str(b, proc->nspace);
    put_u32(b, proc->rank);
}

static void notice(const char *fmt, ...)
{
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    struct buf b = message(EV_NOTICE);
    put_str(&b, text);
    send_message(&b);
}

/* A received message being read; a short or malformed one ends the host. */
struct reader {
    const unsigned char *p, *end;
};

/* _exit, not exit: libpmix's threads are running, and exit would run its destructors under
 * them. */
static void broken(const char *what)
{
    fprintf(stderr, "rlaunch-pmix-host: malformed message from the proxy (%s)\n", what);
    _exit(4);
}

static uint32_t get_u32(struct reader *r)
{
    if (r->end - r->p < 4)
        broken("short number");
    uint32_t v = r->p[0] | (uint32_t)r->p[1] << 8 | (uint32_t)r->p[2] << 16 | (uint32_t)r->p[3] << 24;
    r->p += 4;
    return v;
}

/* A count of things that take at least `least` bytes each of what is left of the message:
 * checked before anything is allocated for them, so that a bad count cannot ask for
 * gigabytes. */
static void check_count(const struct reader *r, uint32_t n, size_t least, const char *what)
{
    if ((size_t)(r->end - r->p) / least < n)
        broken(what);
}

static uint32_t get_count(struct reader *r, size_t least, const char *what)
{
    uint32_t n = get_u32(r);
    check_count(r, n, least, what);
    return n;
}

/* A blob, pointing into the message. */
static const unsigned char *get_blob(struct reader *r, size_t *len)
{
    uint32_t n = get_u32(r);
    if ((size_t)(r->end - r->p) < n)
        broken("short field");
    const unsigned char *at = r->p;
    r->p += n;
    *len = n;
    return at;
}

/* A string, copied and terminated (the caller frees it). */
static char *get_str(struct reader *r)
{
    size_t n;
    const unsigned char *at = get_blob(r, &n);
    char *s = malloc(n + 1);
    if (!s)
        abort();
    memcpy(s, at, n);
    s[n] = 0;
    return s;
}

static int read_full(void *p, size_t n)
{
    size_t off = 0;
    while (off < n) {
        ssize_t got = read(LINK_FD, (char *)p + off, n - off);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return -1;
        off += (size_t)got;
    }
    return 0;
}

/* ---- pending callbacks -------------------------------------------------------------------- */

/* A callback libpmix waits for, by the id the proxy answers with. */
struct pending {
    int kind;
    void *cbfunc;
    void *cbdata;
    char *data; /* a fence's or dmodex's result, kept until libpmix releases it */
};

enum { PEND_FREE = 0, PEND_MODEX, PEND_OP, PEND_LOOKUP, PEND_SPAWN };

static pthread_mutex_t pending_lock = PTHREAD_MUTEX_INITIALIZER;
static struct pending *pending;
static uint32_t npending;

static uint32_t remember(int kind, void *cbfunc, void *cbdata)
{
    pthread_mutex_lock(&pending_lock);
    uint32_t id = 0;
    while (id < npending && pending[id].kind != PEND_FREE)
        id++;
    if (id == npending) {
        uint32_t grown = npending ? npending * 2 : 64;
        pending = realloc(pending, grown * sizeof *pending);
        if (!pending)
            abort();
        memset(pending + npending, 0, (grown - npending) * sizeof *pending);
        npending = grown;
    }
    pending[id] = (struct pending){kind, cbfunc, cbdata, NULL};
    pthread_mutex_unlock(&pending_lock);
    return id;
}

/* Takes the callback with this id and kind out of the table; 0 if there is none. */
static int take(uint32_t id, int kind, struct pending *out)
{
    pthread_mutex_lock(&pending_lock);
    int ok = id < npending && pending[id].kind == kind;
    if (ok) {
        *out = pending[id];
        pending[id].kind = PEND_FREE;
    }
    pthread_mutex_unlock(&pending_lock);
    return ok;
}

/* ---- the job ------------------------------------------------------------------------------- */

/* The launched job's namespace: the one whose fences rlaunch folds and whose process sets it
 * defines. A job spawned on this node (MPI_Comm_spawn) is one more namespace beside it. */
static char nspace[PMIX_MAX_NSLEN + 1];
/* Every namespace registered here: the launched job's, then the spawned jobs'. Written by
 * the main thread, read by libpmix's. */
static pthread_mutex_t nspaces_lock = PTHREAD_MUTEX_INITIALIZER;
static char (*nspaces)[PMIX_MAX_NSLEN + 1];
static size_t nnspaces;

static void nspace_known(const char *ns)
{
    pthread_mutex_lock(&nspaces_lock);
    nspaces = realloc(nspaces, (nnspaces + 1) * sizeof *nspaces);
    if (!nspaces)
        abort();
    snprintf(nspaces[nnspaces++], sizeof *nspaces, "%s", ns);
    pthread_mutex_unlock(&nspaces_lock);
}

static int nspace_is_known(const char *ns)
{
    pthread_mutex_lock(&nspaces_lock);
    int found = 0;
    for (size_t i = 0; i < nnspaces && !found; i++)
        found = PMIX_CHECK_NSPACE(nspaces[i], ns);
    pthread_mutex_unlock(&nspaces_lock);
    return found;
}

/* The directory of this node's server (argv[1]): also the job's session directory here. */
static const char *tmpdir;

/* The job's process sets, as rlaunch defined them: written by SETUP before any rank runs,
 * read by the query callback. libpmix 4.2.2 keeps the sets it is given but answers no query
 * about them: it asks its host. */
struct pset {
    char *name;
    uint32_t n;
    pmix_rank_t *members;
};
static struct pset *psets;
static uint32_t npsets;

/* Waits for a PMIx operation's completion callback. */
struct waiter {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int done;
    pmix_status_t status;
};

static void waiter_init(struct waiter *w)
{
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->cond, NULL);
    w->done = 0;
    w->status = PMIX_SUCCESS;
}

static void op_wakeup(pmix_status_t status, void *cbdata)
{
    struct waiter *w = cbdata;
    pthread_mutex_lock(&w->lock);
    w->status = status;
    w->done = 1;
    pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&w->lock);
}

static pmix_status_t waiter_wait(struct waiter *w, pmix_status_t started)
{
    if (started == PMIX_OPERATION_SUCCEEDED)
        return PMIX_SUCCESS;
    if (started != PMIX_SUCCESS)
        return started;
    pthread_mutex_lock(&w->lock);
    while (!w->done)
        pthread_cond_wait(&w->cond, &w->lock);
    pthread_mutex_unlock(&w->lock);
    return w->status;
}

/* A list of info structs being filled. */
struct infos {
    pmix_info_t *info;
    size_t n, cap;
};

static pmix_info_t *info_next(struct infos *l)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 32;
        pmix_info_t *grown;
        PMIX_INFO_CREATE(grown, cap);
        for (size_t i = 0; i < l->n; i++)
            PMIX_INFO_XFER(&grown[i], &l->info[i]);
        if (l->info)
            PMIX_INFO_FREE(l->info, l->cap);
        l->info = grown;
        l->cap = cap;
    }
    return &l->info[l->n++];
}

static void info_add(struct infos *l, const char *key, const void *value, pmix_data_type_t type)
{
    PMIx_Info_load(info_next(l), key, value, type);
}

/* A growing string. */
struct text {
    char *s;
    size_t len, cap;
};

static void text_add(struct text *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (t->len + (size_t)n + 1 > t->cap) {
        t->cap = (t->len + (size_t)n + 1) * 2;
        t->s = realloc(t->s, t->cap);
        if (!t->s)
            abort();
    }
    va_start(ap, fmt);
    vsnprintf(t->s + t->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    t->len += (size_t)n;
}

/* The ranks on node n, as "0,1,2"; their count and the first of them in *count, *leader. */
static struct text ranks_on(uint32_t n, const uint32_t *node_of, uint32_t size, uint32_t *count,
                            pmix_rank_t *leader)
{
    struct text t = {0};
    text_add(&t, "");
    *count = 0;
    *leader = PMIX_RANK_UNDEF;
    for (uint32_t i = 0; i < size; i++) {
        if (node_of[i] != n)
            continue;
        text_add(&t, "%s%u", *count ? "," : "", i);
        if (*count == 0)
            *leader = i;
        (*count)++;
    }
    return t;
}

/* Says how a spawned job's registration went (the launched job's failure is EV_FAILED). */
static void setup_done(const char *ns, pmix_status_t rc)
{
    struct buf b = message(EV_SETUP_DONE);
    put_str(&b, ns);
    put_u32(&b, (uint32_t)rc);
    send_message(&b);
}

/*
 * SETUP: spawned, nspace, jobid, size, this node's index (or NOT_HERE), the nodes' names, each rank's node
 * and application number, and the process sets (name, members). Registers the namespace with
 * what Open MPI's MPI_Init reads, and defines the process sets. The launched job's is the
 * first; a spawned job's (spawned = 1) is registered beside it, marked as spawned.
 */
static void setup(struct reader *r)
{
    bool spawned = get_u32(r) != 0;
    char *ns = get_str(r);
    char *jobid = get_str(r);
    uint32_t size = get_u32(r);
    uint32_t me = get_u32(r);
    /* Each node's name is a length at least; each rank, its node and its application. */
    uint32_t nnodes = get_count(r, 4, "node count");
    char **hosts = calloc(nnodes ? nnodes : 1, sizeof *hosts);
    if (!hosts)
        abort();
    for (uint32_t i = 0; i < nnodes; i++)
        hosts[i] = get_str(r);
    check_count(r, size, 8, "rank count");
    uint32_t *node_of = calloc(size ? size : 1, sizeof *node_of);
    uint32_t *app_of = calloc(size ? size : 1, sizeof *app_of);
    if (!node_of || !app_of)
        abort();
    for (uint32_t i = 0; i < size; i++)
        node_of[i] = get_u32(r);
    for (uint32_t i = 0; i < size; i++)
        app_of[i] = get_u32(r);
    /* A spawned job registered where it has no rank (its parents' other nodes): no local
     * share, but the whole map, for the parents here to connect to it and find its ranks. */
    bool here = me != NOT_HERE;
    if (here && me >= nnodes)
        broken("node index");
    /* libpmix keeps a namespace in a fixed array: a longer name would be cut short, and
     * registered as one nobody asks for. */
    if (strlen(ns) > PMIX_MAX_NSLEN) {
        if (spawned)
            return setup_done(ns, PMIX_ERR_BAD_PARAM);
        struct buf b = message(EV_FAILED);
        char text[128];
        snprintf(text, sizeof text, "the job's id is longer than the %d bytes PMIx takes",
                 PMIX_MAX_NSLEN);
        put_str(&b, text);
        send_message(&b);
        return;
    }
    char this_ns[PMIX_MAX_NSLEN + 1];
    snprintf(this_ns, sizeof this_ns, "%s", ns);
    if (!spawned)
        snprintf(nspace, sizeof nspace, "%s", ns);
    uint32_t napps = 0;
    for (uint32_t i = 0; i < size; i++) {
        if (node_of[i] >= nnodes)
            broken("rank's node");
        if (app_of[i] + 1 > napps)
            napps = app_of[i] + 1;
    }

    /* The node list, and per node its ranks: "a,b" and "0,1;2,3". */
    struct text nodelist = {0}, ppn = {0};
    for (uint32_t n = 0; n < nnodes; n++) {
        uint32_t count;
        pmix_rank_t leader;
        struct text on = ranks_on(n, node_of, size, &count, &leader);
        text_add(&nodelist, "%s%s", n ? "," : "", hosts[n]);
        text_add(&ppn, "%s%s", n ? ";" : "", on.s);
        free(on.s);
    }
    uint32_t nlocal;
    pmix_rank_t local_leader;
    struct text local_peers = ranks_on(me, node_of, size, &nlocal, &local_leader);
    char *node_regex = NULL, *proc_regex = NULL;
    pmix_status_t rc = PMIx_generate_regex(nodelist.s, &node_regex);
    if (rc == PMIX_SUCCESS)
        rc = PMIx_generate_ppn(ppn.s, &proc_regex);
    if (rc != PMIX_SUCCESS) {
        if (spawned)
            return setup_done(this_ns, rc);
        struct buf b = message(EV_FAILED);
        char text[128];
        snprintf(text, sizeof text, "cannot describe the job's map to PMIx: %s", PMIx_Error_string(rc));
        put_str(&b, text);
        send_message(&b);
        return;
    }

    struct infos job = {0};
    info_add(&job, PMIX_UNIV_SIZE, &size, PMIX_UINT32);
    info_add(&job, PMIX_JOB_SIZE, &size, PMIX_UINT32);
    info_add(&job, PMIX_MAX_PROCS, &size, PMIX_UINT32);
    info_add(&job, PMIX_JOBID, jobid, PMIX_STRING);
    info_add(&job, PMIX_SPAWNED, &spawned, PMIX_BOOL);
    info_add(&job, PMIX_TMPDIR, tmpdir, PMIX_STRING);
    info_add(&job, PMIX_NUM_NODES, &nnodes, PMIX_UINT32);
    info_add(&job, PMIX_NODE_MAP, node_regex, PMIX_REGEX);
    info_add(&job, PMIX_PROC_MAP, proc_regex, PMIX_REGEX);
    info_add(&job, PMIX_JOB_NUM_APPS, &napps, PMIX_UINT32);
    if (here) {
        info_add(&job, PMIX_LOCAL_SIZE, &nlocal, PMIX_UINT32);
        info_add(&job, PMIX_LOCAL_PEERS, local_peers.s, PMIX_STRING);
        info_add(&job, PMIX_LOCALLDR, &local_leader, PMIX_PROC_RANK);
        info_add(&job, PMIX_NODEID, &me, PMIX_UINT32);
        info_add(&job, PMIX_HOSTNAME, hosts[me], PMIX_STRING);
    }
    /* Per application: its number, size and leader. */
    for (uint32_t a = 0; a < napps; a++) {
        uint32_t asize = 0;
        pmix_rank_t leader = PMIX_RANK_UNDEF;
        for (uint32_t i = 0; i < size; i++) {
            if (app_of[i] == a) {
                if (asize == 0)
                    leader = i;
                asize++;
            }
        }
        pmix_data_array_t *arr;
        PMIX_DATA_ARRAY_CREATE(arr, 3, PMIX_INFO);
        pmix_info_t *ai = arr->array;
        PMIx_Info_load(&ai[0], PMIX_APPNUM, &a, PMIX_UINT32);
        PMIx_Info_load(&ai[1], PMIX_APP_SIZE, &asize, PMIX_UINT32);
        PMIx_Info_load(&ai[2], PMIX_APPLDR, &leader, PMIX_PROC_RANK);
        info_add(&job, PMIX_APP_INFO, arr, PMIX_DATA_ARRAY);
        PMIX_DATA_ARRAY_FREE(arr);
    }
    /* Per node: its id, name, size and ranks. */
    for (uint32_t n = 0; n < nnodes; n++) {
        uint32_t count;
        pmix_rank_t leader;
        struct text peers = ranks_on(n, node_of, size, &count, &leader);
        pmix_data_array_t *arr;
        PMIX_DATA_ARRAY_CREATE(arr, 5, PMIX_INFO);
        pmix_info_t *ni = arr->array;
        PMIx_Info_load(&ni[0], PMIX_NODEID, &n, PMIX_UINT32);
        PMIx_Info_load(&ni[1], PMIX_HOSTNAME, hosts[n], PMIX_STRING);
        PMIx_Info_load(&ni[2], PMIX_LOCAL_SIZE, &count, PMIX_UINT32);
        PMIx_Info_load(&ni[3], PMIX_LOCAL_PEERS, peers.s, PMIX_STRING);
        PMIx_Info_load(&ni[4], PMIX_LOCALLDR, &leader, PMIX_PROC_RANK);
        info_add(&job, PMIX_NODE_INFO, arr, PMIX_DATA_ARRAY);
        PMIX_DATA_ARRAY_FREE(arr);
        free(peers.s);
    }
    /* Per process: where it is and what it is. */
    uint16_t *node_rank = calloc(nnodes ? nnodes : 1, sizeof *node_rank);
    /* Counted as the ranks go: counting each rank's predecessors took seconds for 100 000
     * ranks, while the proxy waits for this thread to answer its heartbeat. */
    pmix_rank_t *app_next = calloc(napps ? napps : 1, sizeof *app_next);
    if (!node_rank || !app_next)
        abort();
    for (uint32_t i = 0; i < size; i++) {
        uint32_t n = node_of[i], a = app_of[i];
        uint16_t local_rank = node_rank[n]++;
        pmix_rank_t app_rank = app_next[a]++;
        pmix_rank_t rank = i;
        pmix_data_array_t *arr;
        PMIX_DATA_ARRAY_CREATE(arr, 8, PMIX_INFO);
        pmix_info_t *pi = arr->array;
        PMIx_Info_load(&pi[0], PMIX_RANK, &rank, PMIX_PROC_RANK);
        PMIx_Info_load(&pi[1], PMIX_GLOBAL_RANK, &rank, PMIX_PROC_RANK);
        PMIx_Info_load(&pi[2], PMIX_APP_RANK, &app_rank, PMIX_PROC_RANK);
        PMIx_Info_load(&pi[3], PMIX_APPNUM, &a, PMIX_UINT32);
        PMIx_Info_load(&pi[4], PMIX_LOCAL_RANK, &local_rank, PMIX_UINT16);
        PMIx_Info_load(&pi[5], PMIX_NODE_RANK, &local_rank, PMIX_UINT16);
        PMIx_Info_load(&pi[6], PMIX_NODEID, &n, PMIX_UINT32);
        PMIx_Info_load(&pi[7], PMIX_HOSTNAME, hosts[n], PMIX_STRING);
        info_add(&job, PMIX_PROC_DATA, arr, PMIX_DATA_ARRAY);
        PMIX_DATA_ARRAY_FREE(arr);
    }
    free(node_rank);
    free(app_next);

    struct waiter w;
    waiter_init(&w);
    rc = waiter_wait(&w, PMIx_server_register_nspace(this_ns, (int)nlocal, job.info, job.n,
                                                     op_wakeup, &w));
    if (rc == PMIX_SUCCESS)
        nspace_known(this_ns);
    if (rc == PMIX_SUCCESS && spawned) {
        if (get_u32(r) != 0)
            broken("a spawned job's process sets");
    } else if (rc == PMIX_SUCCESS) {
        /* Each set is a name's length and a count at least; each member a number. */
        npsets = get_count(r, 8, "process set count");
        psets = calloc(npsets ? npsets : 1, sizeof *psets);
        if (!psets)
            abort();
        for (uint32_t s = 0; s < npsets; s++) {
            struct pset *set = &psets[s];
            set->name = get_str(r);
            set->n = get_count(r, 4, "process set size");
            set->members = calloc(set->n ? set->n : 1, sizeof *set->members);
            pmix_proc_t *members = calloc(set->n ? set->n : 1, sizeof *members);
            if (!set->members || !members)
                abort();
            for (uint32_t m = 0; m < set->n; m++) {
                set->members[m] = get_u32(r);
                PMIX_PROC_LOAD(&members[m], nspace, set->members[m]);
            }
            /* OpenPMIx 4.2.2 records the set but returns an uninitialised status (seen here
             * as ASCII of the set's name): only a plausible PMIx error is believed, and none
             * fails the job. */
            pmix_status_t defined = PMIx_server_define_process_set(members, set->n, set->name);
            if (defined < 0 && defined > -1000 && defined != PMIX_OPERATION_SUCCEEDED)
                notice("cannot define the process set %s: %s", set->name, PMIx_Error_string(defined));
            free(members);
        }
    }
    if (rc == PMIX_SUCCESS || spawned) {
        setup_done(this_ns, rc);
    } else {
        struct buf b = message(EV_FAILED);
        char text[128];
        snprintf(text, sizeof text, "cannot register the job with PMIx: %s", PMIx_Error_string(rc));
        put_str(&b, text);
        send_message(&b);
    }

    if (job.info)
        PMIX_INFO_FREE(job.info, job.cap);
    free(node_regex);
    free(proc_regex);
    free(nodelist.s);
    free(ppn.s);
    free(local_peers.s);
    for (uint32_t i = 0; i < nnodes; i++)
        free(hosts[i]);
    free(hosts);
    free(node_of);
    free(app_of);
    free(ns);
    free(jobid);
}

/* CLIENTS: nspace, uid, gid, then ranks; answers each with its environment (EV_ENV). */
static void clients(struct reader *r)
{
    char *ns = get_str(r);
    uint32_t uid = get_u32(r), gid = get_u32(r), n = get_count(r, 4, "client count");
    /* A namespace SETUP refused as too long: libpmix would take its clients cut short. */
    bool too_long = strlen(ns) > PMIX_MAX_NSLEN;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t rank = get_u32(r);
        pmix_proc_t proc;
        PMIX_PROC_LOAD(&proc, ns, rank);
        struct waiter w;
        waiter_init(&w);
        pmix_status_t rc = too_long ? PMIX_ERR_BAD_PARAM : waiter_wait(
            &w, PMIx_server_register_client(&proc, uid, gid, NULL, op_wakeup, &w));
        char **env = NULL;
        if (rc == PMIX_SUCCESS)
            rc = PMIx_server_setup_fork(&proc, &env);
        struct buf b = message(EV_ENV);
        put_str(&b, ns);
        put_u32(&b, rank);
        put_u32(&b, (uint32_t)rc);
        uint32_t count = 0;
        while (env && env[count])
            count++;
        put_u32(&b, count);
        for (uint32_t e = 0; e < count; e++)
            put_str(&b, env[e]);
        send_message(&b);
        for (uint32_t e = 0; e < count; e++)
            free(env[e]);
        free(env);
    }
    free(ns);
}

static void release_data(void *cbdata)
{
    free(cbdata);
}

/* FENCE_DONE / DMODEX_DONE: id, status, data. */
static void modex_done(struct reader *r)
{
    uint32_t id = get_u32(r);
    pmix_status_t status = (pmix_status_t)get_u32(r);
    size_t n;
    const unsigned char *at = get_blob(r, &n);
    struct pending p;
    if (!take(id, PEND_MODEX, &p))
        return notice("an answer to no fence (%u)", id);
    char *copy = malloc(n ? n : 1);
    if (!copy)
        abort();
    memcpy(copy, at, n);
    ((pmix_modex_cbfunc_t)p.cbfunc)(status, n ? copy : NULL, n, p.cbdata, release_data, copy);
}

/* OP_DONE: id, status. */
static void op_done(struct reader *r)
{
    uint32_t id = get_u32(r);
    pmix_status_t status = (pmix_status_t)get_u32(r);
    struct pending p;
    if (!take(id, PEND_OP, &p))
        return notice("an answer to no operation (%u)", id);
    if (p.cbfunc)
        ((pmix_op_cbfunc_t)p.cbfunc)(status, p.cbdata);
}

/* LOOKUP_DONE: id, status, count, then (key, value, publisher's rank) each. */
static void lookup_done(struct reader *r)
{
    uint32_t id = get_u32(r);
    pmix_status_t status = (pmix_status_t)get_u32(r);
    /* Each found value is a key's length, a kind, a value's length and a rank at least. */
    uint32_t n = get_count(r, 16, "lookup count");
    struct pending p;
    if (!take(id, PEND_LOOKUP, &p))
        return notice("an answer to no lookup (%u)", id);
    pmix_pdata_t *pdata = NULL;
    if (n)
        PMIX_PDATA_CREATE(pdata, n);
    for (uint32_t i = 0; i < n; i++) {
        char *key = get_str(r);
        uint32_t kind = get_u32(r);
        size_t len;
        const unsigned char *at = get_blob(r, &len);
        uint32_t rank = get_u32(r);
        PMIX_LOAD_KEY(pdata[i].key, key);
        PMIX_LOAD_PROCID(&pdata[i].proc, nspace, rank);
        if (kind == VALUE_TEXT) {
            char *text = strndup((const char *)at, len);
            if (!text)
                abort();
            PMIx_Value_load(&pdata[i].value, text, PMIX_STRING);
            free(text);
        } else if (kind == VALUE_PACKED) {
            /* PMIx_Data_load takes the bytes over: give it a copy. */
            pmix_data_buffer_t buffer;
            PMIX_DATA_BUFFER_CONSTRUCT(&buffer);
            pmix_byte_object_t bytes = {.bytes = malloc(len ? len : 1), .size = len};
            if (!bytes.bytes)
                abort();
            memcpy(bytes.bytes, at, len);
            PMIx_Data_load(&buffer, &bytes);
            /* Unpacked into our storage, as many values as asked for. */
            pmix_value_t value;
            PMIX_VALUE_CONSTRUCT(&value);
            int32_t count = 1;
            pmix_status_t rc = PMIx_Data_unpack(NULL, &buffer, &value, &count, PMIX_VALUE);
            if (rc == PMIX_SUCCESS) {
                PMIx_Value_xfer(&pdata[i].value, &value);
                PMIX_VALUE_DESTRUCT(&value);
            } else {
                notice("cannot unpack the value of %s: %s", key, PMIx_Error_string(rc));
                status = rc;
            }
            PMIX_DATA_BUFFER_DESTRUCT(&buffer);
        } else {
            broken("value kind");
        }
        free(key);
    }
    ((pmix_lookup_cbfunc_t)p.cbfunc)(status, pdata, n, p.cbdata);
    if (pdata)
        PMIX_PDATA_FREE(pdata, n);
}

/* SPAWN_DONE: id, status, the new job's namespace. */
static void spawn_done(struct reader *r)
{
    uint32_t id = get_u32(r);
    pmix_status_t status = (pmix_status_t)get_u32(r);
    char *ns = get_str(r);
    struct pending p;
    if (!take(id, PEND_SPAWN, &p)) {
        free(ns);
        return notice("an answer to no spawn (%u)", id);
    }
    ((pmix_spawn_cbfunc_t)p.cbfunc)(status, status == PMIX_SUCCESS ? ns : NULL, p.cbdata);
    free(ns);
}

static void dmodex_answer(pmix_status_t status, char *data, size_t sz, void *cbdata)
{
    struct buf b = message(EV_DMODEX_DATA);
    put_u32(&b, (uint32_t)(uintptr_t)cbdata);
    put_u32(&b, (uint32_t)status);
    put_blob(&b, data, data ? sz : 0);
    send_message(&b);
}

/* DMODEX_ASK: id, nspace, rank: another node wants a local rank's data. libpmix answers once
 * the rank has committed it (at once if it has). */
static void dmodex_ask(struct reader *r)
{
    uint32_t id = get_u32(r);
    char *ns = get_str(r);
    uint32_t rank = get_u32(r);
    pmix_proc_t proc;
    PMIX_PROC_LOAD(&proc, ns, rank);
    free(ns);
    pmix_status_t rc = PMIx_server_dmodex_request(&proc, dmodex_answer, (void *)(uintptr_t)id);
    if (rc != PMIX_SUCCESS)
        dmodex_answer(rc, NULL, 0, (void *)(uintptr_t)id);
}

/* DEAD: nspace, count, ranks: these processes failed and the job goes on without them
 * (--on-failure continue). Each local client of the namespace with a handler registered for
 * PMIX_ERR_PROC_ABORTED hears of each, the failed process as PMIX_EVENT_AFFECTED_PROC; not
 * default handlers (PMIX_EVENT_NON_DEFAULT): Open MPI's would abort the survivors. */
static void dead(struct reader *r)
{
    char *ns = get_str(r);
    uint32_t n = get_count(r, 4, "dead ranks");
    for (uint32_t i = 0; i < n; i++) {
        pmix_proc_t gone;
        PMIX_PROC_LOAD(&gone, ns, get_u32(r));
        pmix_info_t info[2];
        bool non_default = true;
        PMIX_INFO_LOAD(&info[0], PMIX_EVENT_AFFECTED_PROC, &gone, PMIX_PROC);
        PMIX_INFO_LOAD(&info[1], PMIX_EVENT_NON_DEFAULT, &non_default, PMIX_BOOL);
        struct waiter w;
        waiter_init(&w);
        pmix_status_t rc = PMIx_Notify_event(PMIX_ERR_PROC_ABORTED, &gone, PMIX_RANGE_LOCAL, info,
                                             2, op_wakeup, &w);
        rc = waiter_wait(&w, rc);
        if (rc != PMIX_SUCCESS)
            notice("cannot tell the clients that rank %u failed: %s", gone.rank,
                   PMIx_Error_string(rc));
        PMIX_INFO_DESTRUCT(&info[0]);
        PMIX_INFO_DESTRUCT(&info[1]);
    }
    free(ns);
}

/* ---- the server module: libpmix's thread -------------------------------------------------- */

static pmix_status_t on_connected(const pmix_proc_t *proc, void *obj, pmix_op_cbfunc_t cbfunc,
                                  void *cbdata)
{
    (void)obj;
    struct buf b = message(EV_CONNECTED);
    put_proc(&b, proc);
    send_message(&b);
    if (cbfunc)
        cbfunc(PMIX_SUCCESS, cbdata);
    return PMIX_SUCCESS;
}

/* libpmix lost clients' connections without a finalize (PMIX_ERR_LOST_CONNECTION, reported
 * once the event caching window is over: main sets it to 0). The proxy hears each, in the
 * order libpmix lost them: the first is the rank whose end made the others' fence answer
 * PARTIAL SUCCESS. libpmix names the first as the source; a later one lost in the same window
 * is prepended to the info as a PMIX_PROCID, so those are read backwards. */
static void on_lost(size_t id, pmix_status_t status, const pmix_proc_t *source, pmix_info_t info[],
                    size_t ninfo, pmix_info_t results[], size_t nresults,
                    pmix_event_notification_cbfunc_fn_t cbfunc, void *cbdata)
{
    (void)id, (void)status, (void)results, (void)nresults;
    if (source) {
        struct buf b = message(EV_LOST);
        put_proc(&b, source);
        send_message(&b);
    }
    for (size_t n = ninfo; n-- > 0;) {
        if (strcmp(info[n].key, PMIX_PROCID) == 0 && info[n].value.type == PMIX_PROC &&
            info[n].value.data.proc) {
            struct buf b = message(EV_LOST);
            put_proc(&b, info[n].value.data.proc);
            send_message(&b);
        }
    }
    if (cbfunc)
        cbfunc(PMIX_EVENT_ACTION_COMPLETE, NULL, 0, NULL, NULL, cbdata);
}

static pmix_status_t on_finalized(const pmix_proc_t *proc, void *obj, pmix_op_cbfunc_t cbfunc,
                                  void *cbdata)
{
    (void)obj;
    struct buf b = message(EV_FINALIZED);
    put_proc(&b, proc);
    send_message(&b);
    if (cbfunc)
        cbfunc(PMIX_SUCCESS, cbdata);
    return PMIX_SUCCESS;
}

static pmix_status_t on_abort(const pmix_proc_t *proc, void *obj, int status, const char msg[],
                              pmix_proc_t procs[], size_t nprocs, pmix_op_cbfunc_t cbfunc,
                              void *cbdata)
{
    (void)obj, (void)procs, (void)nprocs;
    uint32_t id = remember(PEND_OP, (void *)cbfunc, cbdata);
    struct buf b = message(EV_ABORT);
    put_u32(&b, id);
    put_proc(&b, proc);
    put_u32(&b, (uint32_t)status);
    put_str(&b, msg);
    send_message(&b);
    return PMIX_SUCCESS;
}

/* Every local process of a fence is in: the proxy folds it with the other nodes' (the whole
 * launched job's up the tree; a fence over other processes, such as Open MPI's disconnect
 * of parents and spawned children, at the root) and answers FENCE_DONE. */
static pmix_status_t on_fence(const pmix_proc_t procs[], size_t nprocs, const pmix_info_t info[],
                              size_t ninfo, char *data, size_t ndata, pmix_modex_cbfunc_t cbfunc,
                              void *cbdata)
{
    int collect = 0;
    for (size_t i = 0; i < ninfo; i++)
        if (PMIX_CHECK_KEY(&info[i], PMIX_COLLECT_DATA))
            collect = PMIX_INFO_TRUE(&info[i]);
    uint32_t id = remember(PEND_MODEX, (void *)cbfunc, cbdata);
    struct buf b = message(EV_FENCE);
    put_u32(&b, id);
    put_u32(&b, (uint32_t)collect);
    put_u32(&b, (uint32_t)nprocs);
    for (size_t i = 0; i < nprocs; i++)
        put_proc(&b, &procs[i]);
    put_blob(&b, data, data ? ndata : 0);
    send_message(&b);
    return PMIX_SUCCESS;
}

/* libpmix wants a rank's data that no fence brought it (a PMIx_Get for a remote rank with the
 * fence's data collection off, or of a job spawned on another node): the proxy asks the node
 * that owns the rank, and answers DMODEX_DONE with its blob (or the status that kept it). */
static pmix_status_t on_dmodex(const pmix_proc_t *proc, const pmix_info_t info[], size_t ninfo,
                               pmix_modex_cbfunc_t cbfunc, void *cbdata)
{
    (void)info, (void)ninfo;
    if (!nspace_is_known(proc->nspace))
        return PMIX_ERR_NOT_FOUND;
    uint32_t id = remember(PEND_MODEX, (void *)cbfunc, cbdata);
    struct buf b = message(EV_DMODEX);
    put_u32(&b, id);
    put_proc(&b, proc);
    send_message(&b);
    return PMIX_SUCCESS;
}

/* A directive's number, whatever integer type the client gave it in; -1 if it has none. */
static long directive_number(const pmix_info_t *info)
{
    const pmix_value_t *v = &info->value;
    switch (v->type) {
    case PMIX_BOOL: return v->data.flag;
    case PMIX_INT: return v->data.integer;
    case PMIX_INT8: return v->data.int8;
    case PMIX_INT16: return v->data.int16;
    case PMIX_INT32: return v->data.int32;
    case PMIX_INT64: return (long)v->data.int64;
    case PMIX_UINT: return (long)v->data.uint;
    case PMIX_UINT8: return v->data.uint8;
    case PMIX_UINT16: return v->data.uint16;
    case PMIX_UINT32: return (long)v->data.uint32;
    case PMIX_UINT64: return (long)v->data.uint64;
    case PMIX_SIZE: return (long)v->data.size;
    case PMIX_PERSIST: return v->data.persist;
    default: return -1;
    }
}

/* A published value: strings as they are, anything else packed whole. */
static pmix_status_t put_value(struct buf *b, const pmix_value_t *value)
{
    if (value->type == PMIX_STRING) {
        put_u32(b, VALUE_TEXT);
        put_str(b, value->data.string);
        return PMIX_SUCCESS;
    }
    pmix_data_buffer_t buffer;
    PMIX_DATA_BUFFER_CONSTRUCT(&buffer);
    pmix_status_t rc = PMIx_Data_pack(NULL, &buffer, (void *)value, 1, PMIX_VALUE);
    if (rc == PMIX_SUCCESS) {
        pmix_byte_object_t bytes;
        PMIx_Data_unload(&buffer, &bytes);
        put_u32(b, VALUE_PACKED);
        put_blob(b, bytes.bytes, bytes.size);
        PMIX_BYTE_OBJECT_DESTRUCT(&bytes);
    }
    PMIX_DATA_BUFFER_DESTRUCT(&buffer);
    return rc;
}

static pmix_status_t on_publish(const pmix_proc_t *proc, const pmix_info_t info[], size_t ninfo,
                                pmix_op_cbfunc_t cbfunc, void *cbdata)
{
    /* Keys of PMIx's own ("pmix.*") are directives, not data. */
    uint32_t count = 0, once = 0;
    for (size_t i = 0; i < ninfo; i++) {
        if (strncmp(info[i].key, "pmix.", 5) != 0)
            count++;
        else if (PMIX_CHECK_KEY(&info[i], PMIX_PERSISTENCE))
            once = directive_number(&info[i]) == PMIX_PERSIST_FIRST_READ;
    }
    struct buf b = message(EV_PUBLISH);
    put_u32(&b, 0); /* the id, once the message is sure to go */
    put_proc(&b, proc);
    put_u32(&b, once);
    put_u32(&b, count);
    for (size_t i = 0; i < ninfo; i++) {
        if (strncmp(info[i].key, "pmix.", 5) == 0)
            continue;
        put_str(&b, info[i].key);
        pmix_status_t rc = put_value(&b, &info[i].value);
        if (rc != PMIX_SUCCESS) {
            notice("cannot pack the value of %s: %s", info[i].key, PMIx_Error_string(rc));
            free(b.data);
            return rc;
        }
    }
    uint32_t id = remember(PEND_OP, (void *)cbfunc, cbdata);
    unsigned char le[4] = {id, id >> 8, id >> 16, id >> 24};
    memcpy(b.data + 5, le, 4);
    send_message(&b);
    return PMIX_SUCCESS;
}

static void send_keys(struct buf *b, char **keys)
{
    uint32_t count = 0;
    while (keys && keys[count])
        count++;
    put_u32(b, count);
    for (uint32_t i = 0; i < count; i++)
        put_str(b, keys[i]);
    send_message(b);
}

static pmix_status_t on_lookup(const pmix_proc_t *proc, char **keys, const pmix_info_t info[],
                               size_t ninfo, pmix_lookup_cbfunc_t cbfunc, void *cbdata)
{
    /* PMIX_WAIT: until the keys are published; PMIX_TIMEOUT: but no longer (seconds). */
    long wait = 0, timeout = 0;
    for (size_t i = 0; i < ninfo; i++) {
        if (PMIX_CHECK_KEY(&info[i], PMIX_WAIT))
            wait = directive_number(&info[i]);
        else if (PMIX_CHECK_KEY(&info[i], PMIX_TIMEOUT))
            timeout = directive_number(&info[i]);
    }
    struct buf b = message(EV_LOOKUP);
    put_u32(&b, remember(PEND_LOOKUP, (void *)cbfunc, cbdata));
    put_proc(&b, proc);
    put_u32(&b, wait > 0);
    put_u32(&b, timeout > 0 ? (uint32_t)timeout : 0);
    send_keys(&b, keys);
    return PMIX_SUCCESS;
}

static pmix_status_t on_unpublish(const pmix_proc_t *proc, char **keys, const pmix_info_t info[],
                                  size_t ninfo, pmix_op_cbfunc_t cbfunc, void *cbdata)
{
    (void)info, (void)ninfo;
    struct buf b = message(EV_UNPUBLISH);
    put_u32(&b, remember(PEND_OP, (void *)cbfunc, cbdata));
    put_proc(&b, proc);
    send_keys(&b, keys);
    return PMIX_SUCCESS;
}

static void put_strs(struct buf *b, char **list)
{
    uint32_t count = 0;
    while (list && list[count])
        count++;
    put_u32(b, count);
    for (uint32_t i = 0; i < count; i++)
        put_str(b, list[i]);
}

/* Open MPI's connect/accept and disconnect (after the exchange through publish and lookup)
 * call PMIx_Connect and PMIx_Disconnect; libpmix asks its host once every local process of
 * the call is in. As with Open MPI's own runtime, nothing more is needed when this server
 * knows every namespace involved: every process's data is here already (the launched job's
 * from its first fence, a spawned job's because it runs on this node). */
static pmix_status_t connected_procs(const pmix_proc_t procs[], size_t nprocs, const char *what)
{
    for (size_t i = 0; i < nprocs; i++) {
        if (!nspace_is_known(procs[i].nspace)) {
            notice("a %s with %s, a job this node does not serve, is not supported", what,
                   procs[i].nspace);
            return PMIX_ERR_NOT_SUPPORTED;
        }
    }
    return PMIX_OPERATION_SUCCEEDED;
}

static pmix_status_t on_connect(const pmix_proc_t procs[], size_t nprocs, const pmix_info_t info[],
                                size_t ninfo, pmix_op_cbfunc_t cbfunc, void *cbdata)
{
    (void)info, (void)ninfo, (void)cbfunc, (void)cbdata;
    return connected_procs(procs, nprocs, "connect");
}

static pmix_status_t on_disconnect(const pmix_proc_t procs[], size_t nprocs,
                                   const pmix_info_t info[], size_t ninfo, pmix_op_cbfunc_t cbfunc,
                                   void *cbdata)
{
    (void)info, (void)ninfo, (void)cbfunc, (void)cbdata;
    return connected_procs(procs, nprocs, "disconnect");
}

/* A client calls PMIx_Spawn: the proxy starts the job on this node, registering its namespace
 * here (SETUP, CLIENTS), and answers SPAWN_DONE with it. Nothing blocks on this thread. */
static pmix_status_t on_spawn(const pmix_proc_t *proc, const pmix_info_t job_info[], size_t ninfo,
                              const pmix_app_t apps[], size_t napps, pmix_spawn_cbfunc_t cbfunc,
                              void *cbdata)
{
    struct buf b = message(EV_SPAWN);
    put_u32(&b, remember(PEND_SPAWN, (void *)cbfunc, cbdata));
    put_proc(&b, proc);
    put_u32(&b, (uint32_t)napps);
    for (size_t a = 0; a < napps; a++) {
        const pmix_app_t *app = &apps[a];
        put_str(&b, app->cmd);
        put_strs(&b, app->argv);
        put_strs(&b, app->env);
        put_u32(&b, app->maxprocs > 0 ? (uint32_t)app->maxprocs : 0);
        /* The application's string hints, then the job's (Open MPI puts its mapping there),
         * which the proxy reads as the application's where it has none of its own. */
        uint32_t count = 0;
        for (size_t i = 0; i < app->ninfo; i++)
            count += app->info[i].value.type == PMIX_STRING;
        for (size_t i = 0; i < ninfo; i++)
            count += job_info[i].value.type == PMIX_STRING;
        put_u32(&b, count);
        for (size_t i = 0; i < app->ninfo; i++) {
            if (app->info[i].value.type != PMIX_STRING)
                continue;
            put_str(&b, app->info[i].key);
            put_str(&b, app->info[i].value.data.string);
        }
        for (size_t i = 0; i < ninfo; i++) {
            if (job_info[i].value.type != PMIX_STRING)
                continue;
            put_str(&b, job_info[i].key);
            put_str(&b, job_info[i].value.data.string);
        }
    }
    send_message(&b);
    return PMIX_SUCCESS;
}

/* Answers what a client asks about process sets: their number, names, and members. */
static pmix_status_t on_query(pmix_proc_t *proct, pmix_query_t *queries, size_t nqueries,
                              pmix_info_cbfunc_t cbfunc, void *cbdata)
{
    (void)proct;
    struct infos out = {0};
    for (size_t q = 0; q < nqueries; q++) {
        for (size_t k = 0; queries[q].keys && queries[q].keys[k]; k++) {
            const char *key = queries[q].keys[k];
            if (strcmp(key, PMIX_QUERY_NUM_PSETS) == 0) {
                size_t n = npsets;
                info_add(&out, PMIX_QUERY_NUM_PSETS, &n, PMIX_SIZE);
            } else if (strcmp(key, PMIX_QUERY_PSET_NAMES) == 0) {
                struct text names = {0};
                text_add(&names, "");
                for (uint32_t s = 0; s < npsets; s++)
                    text_add(&names, "%s%s", s ? "," : "", psets[s].name);
                info_add(&out, PMIX_QUERY_PSET_NAMES, names.s, PMIX_STRING);
                free(names.s);
            } else if (strcmp(key, PMIX_QUERY_PSET_MEMBERSHIP) == 0) {
                const char *name = NULL;
                for (size_t u = 0; u < queries[q].nqual; u++)
                    if (PMIX_CHECK_KEY(&queries[q].qualifiers[u], PMIX_PSET_NAME) &&
                        queries[q].qualifiers[u].value.type == PMIX_STRING)
                        name = queries[q].qualifiers[u].value.data.string; /* may be NULL */
                for (uint32_t s = 0; name && s < npsets; s++) {
                    if (strcmp(psets[s].name, name) != 0)
                        continue;
                    pmix_data_array_t members;
                    PMIX_DATA_ARRAY_CONSTRUCT(&members, psets[s].n, PMIX_PROC);
                    pmix_proc_t *procs = members.array;
                    for (uint32_t m = 0; m < psets[s].n; m++)
                        PMIX_LOAD_PROCID(&procs[m], nspace, psets[s].members[m]);
                    info_add(&out, PMIX_QUERY_PSET_MEMBERSHIP, &members, PMIX_DATA_ARRAY);
                    PMIX_DATA_ARRAY_DESTRUCT(&members);
                }
            }
        }
    }
    /* Completed before returning: libpmix copies the answers it keeps. */
    cbfunc(out.n ? PMIX_SUCCESS : PMIX_ERR_NOT_FOUND, out.info, out.n, cbdata, NULL, NULL);
    if (out.info)
        PMIX_INFO_FREE(out.info, out.cap);
    return PMIX_SUCCESS;
}

static pmix_server_module_t module = {
    .client_connected = on_connected,
    .client_finalized = on_finalized,
    .abort = on_abort,
    .fence_nb = on_fence,
    .direct_modex = on_dmodex,
    .publish = on_publish,
    .lookup = on_lookup,
    .unpublish = on_unpublish,
    .query = on_query,
    .spawn = on_spawn,
    .connect = on_connect,
    .disconnect = on_disconnect,
};

/* ---- the proxy's listener ------------------------------------------------------------------ */

/* libpmix makes its listener with socket(), bind(), getsockname() and listen(), then accepts
 * on its own thread. This executable's bind() and accept() come first in the symbol search
 * (the program before its libraries), so a late host can make libpmix's listener the proxy's
 * socket, and hold libpmix's accepts until the clients are registered: a client that libpmix
 * accepts before then is refused as unknown. */

/* The proxy's listening socket, until libpmix binds its listener (-1: none, or taken). */
static int adopt_fd = -1;
static pthread_mutex_t gate_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cond = PTHREAD_COND_INITIALIZER;
/* Accepts wait while this is set: from a late start until the launched job's clients are
 * registered. */
static bool gate_shut = false;

static void open_gate(void)
{
    pthread_mutex_lock(&gate_lock);
    gate_shut = false;
    pthread_cond_broadcast(&gate_cond);
    pthread_mutex_unlock(&gate_lock);
}

static void wait_at_gate(void)
{
    pthread_mutex_lock(&gate_lock);
    while (gate_shut)
        pthread_cond_wait(&gate_cond, &gate_lock);
    pthread_mutex_unlock(&gate_lock);
}

int bind(int fd, const struct sockaddr *addr, socklen_t len)
{
    bool inet = addr && (addr->sa_family == AF_INET || addr->sa_family == AF_INET6);
    if (adopt_fd >= 0 && inet) {
        /* The proxy's socket, bound and listening, in place of libpmix's fresh one. */
        if (dup3(adopt_fd, fd, O_CLOEXEC) < 0)
            return -1;
        close(adopt_fd);
        adopt_fd = -1;
        return 0;
    }
    return (int)syscall(SYS_bind, fd, addr, len);
}

int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags)
{
    wait_at_gate();
    return (int)syscall(SYS_accept4, fd, addr, len, flags);
}

int accept(int fd, struct sockaddr *addr, socklen_t *len)
{
    return accept4(fd, addr, len, 0);
}

/* ---- main ---------------------------------------------------------------------------------- */

/* argv[1]: the directory for the server's rendezvous files (private to this job and node);
 * argv[2]: the node's name in the job (what its ranks call their host); for a late start,
 * argv[3]: the proxy's listening socket's descriptor, argv[4]: the server's namespace (its
 * rank is 0), as the ranks' environment names them. */
int main(int argc, char **argv)
{
    if (argc != 3 && argc != 5) {
        fprintf(stderr, "usage: rlaunch-pmix-host TMPDIR HOST [LISTENER NSPACE] (started by "
                        "rlaunch-proxy, link on fd 3)\n");
        return 2;
    }
    bool late = argc == 5;
    if (late) {
        adopt_fd = atoi(argv[3]);
        gate_shut = true;
    }
    /* Exec'd from a memfd, the process would be named after its descriptor's number. */
    prctl(PR_SET_NAME, "rlaunch-pmix", 0, 0, 0);
    tmpdir = argv[1];
    pmix_info_t info[7];
    size_t ninfo = 5;
    bool no = false;
    PMIx_Info_load(&info[0], PMIX_SERVER_TMPDIR, argv[1], PMIX_STRING);
    PMIx_Info_load(&info[1], PMIX_SYSTEM_TMPDIR, argv[1], PMIX_STRING);
    /* No system-wide rendezvous file: tools need not find this server, and two jobs on one
     * machine must not collide. */
    PMIx_Info_load(&info[2], PMIX_SERVER_SYSTEM_SUPPORT, &no, PMIX_BOOL);
    PMIx_Info_load(&info[3], PMIX_HOSTNAME, argv[2], PMIX_STRING);
    bool yes = true;
    PMIx_Info_load(&info[4], PMIX_SERVER_SHARE_TOPOLOGY, &yes, PMIX_BOOL);
    pmix_rank_t server_rank = 0;
    if (late) {
        PMIx_Info_load(&info[ninfo++], PMIX_SERVER_NSPACE, argv[4], PMIX_STRING);
        PMIx_Info_load(&info[ninfo++], PMIX_SERVER_RANK, &server_rank, PMIX_PROC_RANK);
    }
    /* Lost connections are reported at once, not gathered for a second (on_lost). */
    setenv("PMIX_MCA_pmix_event_caching_window", "0", 0);
    pmix_status_t rc = PMIx_server_init(&module, info, ninfo);
    if (rc == PMIX_SUCCESS) {
        pmix_status_t lost = PMIX_ERR_LOST_CONNECTION;
        pmix_status_t registered = PMIx_Register_event_handler(&lost, 1, NULL, 0, on_lost, NULL, NULL);
        if (registered < 0)
            rc = registered;
    }
    if (rc == PMIX_SUCCESS && adopt_fd >= 0) {
        /* libpmix bound no TCP listener: the ranks could never reach it. */
        rc = PMIX_ERR_INIT;
    }
    struct buf b = message(rc == PMIX_SUCCESS ? EV_READY : EV_FAILED);
    if (rc == PMIX_SUCCESS) {
        put_str(&b, PMIx_Get_version());
    } else {
        char text[128];
        snprintf(text, sizeof text, "cannot start the PMIx server: %s", PMIx_Error_string(rc));
        put_str(&b, text);
    }
    send_message(&b);
    if (rc != PMIX_SUCCESS)
        return 1;

    for (;;) {
        unsigned char le[4];
        if (read_full(le, 4) != 0)
            break;
        uint32_t n = le[0] | (uint32_t)le[1] << 8 | (uint32_t)le[2] << 16 | (uint32_t)le[3] << 24;
        if (n == 0 || n > MAX_MESSAGE)
            broken("length");
        unsigned char *body = malloc(n);
        if (!body)
            abort();
        if (read_full(body, n) != 0)
            broken("short message");
        struct reader r = {body + 1, body + n};
        switch (body[0]) {
        case CMD_SETUP: setup(&r); break;
        case CMD_CLIENTS:
            clients(&r);
            /* The launched job's clients come first: the ones waiting may be accepted. */
            open_gate();
            break;
        case CMD_FENCE_DONE:
        case CMD_DMODEX_DONE: modex_done(&r); break;
        case CMD_OP_DONE: op_done(&r); break;
        case CMD_LOOKUP_DONE: lookup_done(&r); break;
        case CMD_DMODEX_ASK: dmodex_ask(&r); break;
        case CMD_SPAWN_DONE: spawn_done(&r); break;
        case CMD_DEAD: dead(&r); break;
        case CMD_SYNC: {
            /* Answered after everything sent before it: a client's finalize reaches the
             * proxy ahead of this, so the proxy can tell a finalized client that exited
             * from one that left without finalizing. */
            struct buf b = message(EV_SYNCED);
            put_u32(&b, get_u32(&r));
            send_message(&b);
            break;
        }
        default: broken("tag");
        }
        free(body);
    }
    PMIx_server_finalize();
    return 0;
}
