/* What the --on-failure continue test programs (dead, survive) share: a handler for
 * PMIX_ERR_PROC_ABORTED that keeps the failed rank in `told` (-1 until told), and its
 * registration, which exits 1 saying why if PMIx refuses it. */
#ifndef RLAUNCH_TEST_ABORTED_H
#define RLAUNCH_TEST_ABORTED_H

#include <pmix.h>
#include <stdio.h>
#include <stdlib.h>

static volatile int told = -1;

static void on_aborted(size_t id, pmix_status_t status, const pmix_proc_t *source,
                       pmix_info_t info[], size_t ninfo, pmix_info_t *results, size_t nresults,
                       pmix_event_notification_cbfunc_fn_t cbfunc, void *cbdata)
{
    (void)id, (void)status, (void)source, (void)results, (void)nresults;
    for (size_t i = 0; i < ninfo; i++)
        if (PMIX_CHECK_KEY(&info[i], PMIX_EVENT_AFFECTED_PROC))
            told = (int)info[i].value.data.proc->rank;
    if (cbfunc)
        cbfunc(PMIX_EVENT_ACTION_COMPLETE, NULL, 0, NULL, NULL, cbdata);
}

/* Registers on_aborted for this process; `prog` names the program in the error. */
static void hear_aborted(const char *prog)
{
    pmix_status_t code = PMIX_ERR_PROC_ABORTED;
    pmix_status_t rc = PMIx_Register_event_handler(&code, 1, NULL, 0, on_aborted, NULL, NULL);
    if (rc < 0) {
        fprintf(stderr, "%s: PMIx_Register_event_handler: %s\n", prog, PMIx_Error_string(rc));
        exit(1);
    }
}

#endif
