/* cuda_devices: print which CUDA devices this process can see, as one line:
 *
 *   rank R local L count N devices BUSID1,BUSID2,... cvd=VALUE
 *
 * R is $RANK (or $PMI_RANK), L is $LOCAL_RANK ("?" when unset), N is what
 * cuDeviceGetCount says, the bus ids are cuDeviceGetPCIBusId's, lowercased
 * ("-" when there are none), and VALUE is $CUDA_VISIBLE_DEVICES ("unset" when
 * unset). Used by bench/gpu/check.sh.
 *
 * It does not link CUDA: libcuda.so.1 (the driver's library) is dlopen'ed at
 * run time, so it builds anywhere with
 *
 *   cc -O2 -o cuda_devices cuda_devices.c -ldl
 *
 * Exit status: 0 on success, 2 if libcuda.so.1 cannot be loaded, 3 if a CUDA
 * call (or looking one up) fails, 1 if memory runs out or stdout cannot be
 * written.
 */
#define _POSIX_C_SOURCE 200809L

#include <ctype.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

/* The little of cuda.h that is needed: both are plain ints in the driver API. */
typedef int CUresult; /* 0 is CUDA_SUCCESS */
typedef int CUdevice;

typedef CUresult (*cuInit_t)(unsigned int flags);
typedef CUresult (*cuDeviceGetCount_t)(int *count);
typedef CUresult (*cuDeviceGet_t)(CUdevice *device, int ordinal);
typedef CUresult (*cuDeviceGetPCIBusId_t)(char *busid, int len, CUdevice dev);

static const char *rank = "?";

/* A CUDA call returned an error: say which, and with what number. */
static void cuda_failed(const char *call, CUresult rc)
{
    fprintf(stderr, "rank %s %s failed: error %d\n", rank, call, rc);
    exit(3);
}

/* Look up a libcuda symbol; a missing one counts as a failed CUDA call. */
static void *sym(void *lib, const char *name)
{
    dlerror(); /* clear any earlier error */
    void *p = dlsym(lib, name);
    if (p == NULL) {
        const char *err = dlerror();
        fprintf(stderr, "rank %s dlsym %s failed: %s\n", rank, name,
                err != NULL ? err : "symbol is NULL");
        exit(3);
    }
    return p;
}

/* The environment variable's value, or `dflt` when it is unset. */
static const char *env_or(const char *name, const char *dflt)
{
    const char *v = getenv(name);
    return v != NULL ? v : dflt;
}

int main(void)
{
    rank = env_or("RANK", env_or("PMI_RANK", "?"));
    const char *local = env_or("LOCAL_RANK", "?");
    const char *cvd = env_or("CUDA_VISIBLE_DEVICES", "unset");

    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        const char *err = dlerror();
        fprintf(stderr, "rank %s no libcuda: %s\n", rank,
                err != NULL ? err : "unknown error");
        return 2;
    }

    /* POSIX guarantees that dlsym's void * converts to a function pointer. */
    cuInit_t cu_init = (cuInit_t)sym(lib, "cuInit");
    cuDeviceGetCount_t cu_count = (cuDeviceGetCount_t)sym(lib, "cuDeviceGetCount");
    cuDeviceGet_t cu_get = (cuDeviceGet_t)sym(lib, "cuDeviceGet");
    cuDeviceGetPCIBusId_t cu_busid =
        (cuDeviceGetPCIBusId_t)sym(lib, "cuDeviceGetPCIBusId");

    CUresult rc = cu_init(0);
    if (rc != 0)
        cuda_failed("cuInit", rc);

    int count = 0;
    rc = cu_count(&count);
    if (rc != 0)
        cuda_failed("cuDeviceGetCount", rc);

    /* Collect every bus id before printing, so a failure leaves no half line. */
    typedef char busid_t[64]; /* "dddd:bb:dd.f" is 13 bytes with its NUL */
    busid_t *busids = NULL;
    if (count > 0) {
        busids = calloc((size_t)count, sizeof *busids);
        if (busids == NULL) {
            perror("cuda_devices: calloc");
            return 1;
        }
    }
    for (int i = 0; i < count; i++) {
        CUdevice dev;
        rc = cu_get(&dev, i);
        if (rc != 0)
            cuda_failed("cuDeviceGet", rc);

        rc = cu_busid(busids[i], (int)sizeof busids[i], dev);
        if (rc != 0)
            cuda_failed("cuDeviceGetPCIBusId", rc);
        busids[i][sizeof busids[i] - 1] = '\0'; /* in case it filled the buffer */

        for (char *c = busids[i]; *c != '\0'; c++)
            *c = (char)tolower((unsigned char)*c);
    }

    printf("rank %s local %s count %d devices ", rank, local, count);
    if (count <= 0)
        fputs("-", stdout); /* keep the line's fields in place */
    for (int i = 0; i < count; i++)
        printf("%s%s", i > 0 ? "," : "", busids[i]);
    printf(" cvd=%s\n", cvd);
    free(busids);

    /* libcuda stays loaded until exit: unloading the driver early gains nothing. */
    if (fflush(stdout) != 0 || ferror(stdout)) {
        perror("cuda_devices: stdout");
        return 1;
    }
    return 0;
}
