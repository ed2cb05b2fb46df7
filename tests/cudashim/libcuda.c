/*
 * A host-memory libcuda.so.1 for the tests: the CUDA driver API as cuda-python calls it,
 * on machines without a GPU.
 *
 * The fake driver (devices/cuda/_fake.py) stands in for our own driver interface; this
 * library stands in one layer lower, for the NVIDIA driver itself, so that RealDriver's
 * calls go through cuda-python's bindings into C exactly as they would on a GPU: the
 * structs the bindings fill (kernel, memcpy, mem-op and host node parameters), the
 * kernel parameter arrays, returned handles and the per-thread current context are all
 * read here as a driver reads them. tests/test_cuda_shim.py builds it and runs the
 * `gpu`-marked tests against it.
 *
 * What it does:
 * - Device memory is host memory (unified addressing): a device pointer is an address.
 *   Every pointer a copy or kernel touches is checked against the allocations, and a
 *   device allocation used from another device needs peer access, as on a GPU.
 * - A stream is a thread running its operations in order: kernels, copies, 64-bit waits
 *   (GEQ, the driver's cyclic comparison) and writes on words, host functions, event
 *   records and waits, and graph launches.
 * - Kernels are the ones the tests, the CUDA benchmark and the CUDA example use (xor_k,
 *   inc_k, the fuzzer's fz_*, spin_k, stage): cuModuleGetFunction finds the
 *   name in the image NVRTC built (a cubin or PTX) and runs a C body of the same kernel
 *   over the launch's grid x block threads.
 * - Calls that need a current context (allocations, streams, events, modules, peer
 *   access) fail with CUDA_ERROR_INVALID_CONTEXT without one, as on a GPU, where the
 *   current context is per thread.
 * - Graph exec updates keep the driver's rules: a kernel node keeps its context, a memcpy
 *   node the contexts of its memory, a mem-op node its kind.
 * - A misuse the driver would only report later, or not at all (a bad address in a
 *   kernel, a CUDA call from a host function), aborts the process with a message: the
 *   test that ran it fails loudly.
 *
 * Environment: CUDASHIM_DEVICES (default 2), CUDASHIM_NO_MEMOPS=1 (no 64-bit stream
 * memory operations), CUDASHIM_NO_PEER=1 (no peer access), CUDASHIM_JITTER=seed (pauses
 * before operations), CUDASHIM_REPORT=1 (what is still allocated at exit).
 */

#define _GNU_SOURCE
#include <cuda.h>

#include <elf.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_DEVICES 16
#define MAX_ARGS 8

static void die(const char *what) {
    fprintf(stderr, "cudashim: %s\n", what);
    fflush(stderr);
    abort();
}

static int env_int(const char *name, int fallback) {
    const char *value = getenv(name);
    return value && *value ? atoi(value) : fallback;
}

/* ---------------------------------------------------------------- devices and contexts */

struct CUctx_st {
    int ordinal;
    int retained;
    int peer[MAX_DEVICES]; /* this context may access memory of device i */
};

static struct CUctx_st contexts[MAX_DEVICES];
static int device_count = -1;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static __thread CUcontext current;

static int ndevices(void) {
    if (device_count < 0) {
        int n = env_int("CUDASHIM_DEVICES", 2);
        device_count = n < 1 ? 1 : (n > MAX_DEVICES ? MAX_DEVICES : n);
    }
    return device_count;
}

CUresult cuInit(unsigned int flags) {
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; i < MAX_DEVICES; i++) contexts[i].ordinal = i;
    ndevices();
    return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int *version) {
    *version = CUDA_VERSION;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count) {
    *count = ndevices();
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    if (ordinal < 0 || ordinal >= ndevices()) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

static int valid_device(CUdevice d) { return d >= 0 && d < ndevices(); }

CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
    if (!valid_device(d)) return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "cudashim host-memory GPU %d", d);
    return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem(size_t *bytes, CUdevice d) {
    if (!valid_device(d)) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = (size_t)16 << 30;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int *value, CUdevice_attribute attribute, CUdevice d) {
    if (!valid_device(d)) return CUDA_ERROR_INVALID_DEVICE;
    int memops = !env_int("CUDASHIM_NO_MEMOPS", 0);
    switch (attribute) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *value = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *value = 0; break;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS: *value = memops; break;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR: *value = memops; break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: *value = 1; break;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: *value = 1; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *value = 4; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *value = 1024; break;
    default: *value = 0;
    }
    return CUDA_SUCCESS;
}

CUresult cuDeviceCanAccessPeer(int *can, CUdevice d, CUdevice peer) {
    if (!valid_device(d) || !valid_device(peer)) return CUDA_ERROR_INVALID_DEVICE;
    *can = d != peer && !env_int("CUDASHIM_NO_PEER", 0);
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice d) {
    if (!valid_device(d)) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&lock);
    contexts[d].retained++;
    pthread_mutex_unlock(&lock);
    *ctx = &contexts[d];
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice d) {
    if (!valid_device(d)) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&lock);
    CUresult r = contexts[d].retained > 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
    if (r == CUDA_SUCCESS) contexts[d].retained--;
    pthread_mutex_unlock(&lock);
    return r;
}

static int valid_context(CUcontext ctx) {
    return ctx >= &contexts[0] && ctx < &contexts[ndevices()] && ctx->retained > 0;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
    if (ctx != NULL && !valid_context(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
    current = ctx;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext *ctx) {
    *ctx = current;
    return CUDA_SUCCESS;
}

static __thread int in_host_function;

/* Host functions "must not make any CUDA API calls": the calls that check for a context
   check for that too. */
#define NEED_CONTEXT() \
    do { \
        if (in_host_function) die("a CUDA call from inside a host function"); \
        if (!valid_context(current)) return CUDA_ERROR_INVALID_CONTEXT; \
    } while (0)

CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags) {
    NEED_CONTEXT();
    if (flags != 0 || !valid_context(peer) || peer == current) return CUDA_ERROR_INVALID_VALUE;
    if (env_int("CUDASHIM_NO_PEER", 0)) return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&lock);
    if (current->peer[peer->ordinal]) r = CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
    current->peer[peer->ordinal] = 1;
    pthread_mutex_unlock(&lock);
    return r;
}

/* ---------------------------------------------------------------- memory */

enum { DEVICE_MEMORY, MAPPED_HOST_MEMORY };

struct allocation {
    uintptr_t start;
    size_t size;
    int kind;
    int device; /* the owning device of DEVICE_MEMORY */
    struct allocation *next;
};

static struct allocation *allocations;

static void *remember(size_t size, int kind, int device) {
    size_t rounded = (size + 255) / 256 * 256;
    void *p = aligned_alloc(256, rounded ? rounded : 256);
    if (!p) return NULL;
    memset(p, 0, rounded ? rounded : 256);
    struct allocation *a = malloc(sizeof *a);
    a->start = (uintptr_t)p;
    a->size = size;
    a->kind = kind;
    a->device = device;
    pthread_mutex_lock(&lock);
    a->next = allocations;
    allocations = a;
    pthread_mutex_unlock(&lock);
    return p;
}

static CUresult forget(uintptr_t start, int kind) {
    pthread_mutex_lock(&lock);
    for (struct allocation **a = &allocations; *a; a = &(*a)->next) {
        if ((*a)->start == start && (*a)->kind == kind) {
            struct allocation *gone = *a;
            *a = gone->next;
            pthread_mutex_unlock(&lock);
            free((void *)gone->start);
            free(gone);
            return CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_INVALID_VALUE;
}

/* The allocation holding [p, p + n), or NULL. */
static struct allocation *find(uintptr_t p, size_t n) {
    struct allocation *found = NULL;
    pthread_mutex_lock(&lock);
    for (struct allocation *a = allocations; a; a = a->next) {
        if (p >= a->start && p + n <= a->start + a->size) {
            found = a;
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    return found;
}

/* Device `device` touches [p, p + n) from a kernel: its own memory, a peer's with peer
   access, or mapped host memory. A copy (device < 0) may touch any device's memory: with
   unified addressing the driver routes it, through the host where there is no peer access. */
static void check_access(int device, uintptr_t p, size_t n, const char *what) {
    struct allocation *a = find(p, n);
    char message[256];
    if (!a) {
        snprintf(message, sizeof message, "%s: %#lx..+%zu is not GPU-visible memory (device %d)",
                 what, (unsigned long)p, n, device);
        die(message);
    }
    if (device >= 0 && a->kind == DEVICE_MEMORY && a->device != device && !contexts[device].peer[a->device]) {
        snprintf(message, sizeof message,
                 "%s: device %d touched memory of device %d without peer access", what,
                 device, a->device);
        die(message);
    }
}

CUresult cuMemAlloc(CUdeviceptr *p, size_t size) {
    NEED_CONTEXT();
    if (size == 0) return CUDA_ERROR_INVALID_VALUE;
    void *m = remember(size, DEVICE_MEMORY, current->ordinal);
    if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
    *p = (CUdeviceptr)(uintptr_t)m;
    return CUDA_SUCCESS;
}

CUresult cuMemFree(CUdeviceptr p) {
    NEED_CONTEXT();
    return forget((uintptr_t)p, DEVICE_MEMORY);
}

CUresult cuMemHostAlloc(void **p, size_t size, unsigned int flags) {
    NEED_CONTEXT();
    if (size == 0) return CUDA_ERROR_INVALID_VALUE;
    if (!(flags & CU_MEMHOSTALLOC_DEVICEMAP)) die("cuMemHostAlloc without DEVICEMAP: the GPU could not see it");
    void *m = remember(size, MAPPED_HOST_MEMORY, -1);
    if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
    *p = m;
    return CUDA_SUCCESS;
}

CUresult cuMemHostGetDevicePointer(CUdeviceptr *p, void *host, unsigned int flags) {
    NEED_CONTEXT();
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    struct allocation *a = find((uintptr_t)host, 1);
    if (!a || a->kind != MAPPED_HOST_MEMORY) return CUDA_ERROR_INVALID_VALUE;
    *p = (CUdeviceptr)(uintptr_t)host;
    return CUDA_SUCCESS;
}

CUresult cuMemFreeHost(void *p) {
    NEED_CONTEXT();
    return forget((uintptr_t)p, MAPPED_HOST_MEMORY);
}

/* With CUDASHIM_REPORT=1, what is still allocated when the process ends. */
__attribute__((destructor)) static void report(void) {
    if (!env_int("CUDASHIM_REPORT", 0)) return;
    int device = 0, host = 0;
    for (struct allocation *a = allocations; a; a = a->next) {
        if (a->kind == DEVICE_MEMORY) device++;
        else host++;
    }
    fprintf(stderr, "cudashim: at exit %d device and %d mapped host allocations live\n", device, host);
}

/* ---------------------------------------------------------------- kernels */

struct CUmod_st {
    const char *image;
    size_t size;
    int device;
};

/* The kernels the tests launch, as C bodies over element indices [0, count): each takes
   `pointers` 32-bit-element buffers, then `int n` (the element count), then `ints - 1`
   more ints. A launch runs min(n, grid x block) elements, as `if (i < n)` does. */
typedef void kernel_body(void **p, const int32_t *v, uint64_t count);

static void k_xor(void **p, const int32_t *v, uint64_t c) {
    int32_t *o = p[0]; const int32_t *a = p[1], *b = p[2];
    for (uint64_t i = 0; i < c; i++) o[i] = a[i] ^ b[i];
}
static void k_inc(void **p, const int32_t *v, uint64_t c) {
    int32_t *x = p[0];
    for (uint64_t i = 0; i < c; i++) x[i] += 1;
}
static void k_add(void **p, const int32_t *v, uint64_t c) {
    uint32_t *o = p[0]; const uint32_t *a = p[1], *b = p[2];
    for (uint64_t i = 0; i < c; i++) o[i] = a[i] + b[i];
}
static void k_move(void **p, const int32_t *v, uint64_t c) {
    uint32_t *o = p[0]; const uint32_t *a = p[1];
    for (uint64_t i = 0; i < c; i++) o[i] = a[i];
}
static void k_salt(void **p, const int32_t *v, uint64_t c) {
    uint32_t *o = p[0]; const uint32_t *a = p[1];
    for (uint64_t i = 0; i < c; i++) o[i] = a[i] + (uint32_t)v[1];
}

static void k_spin(void **p, const int32_t *v, uint64_t c) {
    float *x = p[0];
    for (uint64_t i = 0; i < c; i++) {
        float y = x[i];
        for (int32_t k = 0; k < v[1]; k++) y = y * 0.999999f + 0.000001f;
        x[i] = y;
    }
}

static void k_stage(void **p, const int32_t *v, uint64_t c) {
    float *o = p[0]; const float *x = p[1];
    for (uint64_t i = 0; i < c; i++) o[i] = x[i] * 0.5f + 1.0f;
}

static const struct {
    const char *name;
    int pointers, ints;
    kernel_body *body;
} KERNELS[] = {
    {"xor_k", 3, 1, k_xor}, {"inc_k", 1, 1, k_inc},   {"fz_xor", 3, 1, k_xor},
    {"fz_add", 3, 1, k_add}, {"fz_move", 2, 1, k_move}, {"fz_bump", 1, 1, k_inc},
    {"fz_salt", 2, 2, k_salt}, {"spin_k", 1, 2, k_spin}, /* benchmarks/cuda_replay.py */
    {"stage", 2, 1, k_stage},                          /* examples/multi_gpu_pipeline.py */
};

struct CUfunc_st {
    int kernel;
    int device;
};

/* A launch with its parameters read out of kernelParams at the call, as a driver does. */
struct launch {
    int kernel;
    int device;
    unsigned long long threads;
    uint64_t args[MAX_ARGS];
};

static size_t image_size(const char *image) {
    const Elf64_Ehdr *elf = (const Elf64_Ehdr *)image;
    if (memcmp(image, ELFMAG, SELFMAG) == 0)
        return elf->e_shoff + (size_t)elf->e_shnum * elf->e_shentsize;
    return strlen(image); /* PTX: a C string */
}

CUresult cuModuleLoadData(CUmodule *module, const void *image) {
    NEED_CONTEXT();
    const char *bytes = image;
    if (memcmp(bytes, ELFMAG, SELFMAG) != 0 && strstr(bytes, ".entry") == NULL)
        return CUDA_ERROR_INVALID_IMAGE;
    struct CUmod_st *m = malloc(sizeof *m);
    m->size = image_size(bytes);
    m->image = malloc(m->size);
    memcpy((char *)m->image, bytes, m->size);
    m->device = current->ordinal;
    *module = m;
    return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction *function, CUmodule module, const char *name) {
    if (!memmem(module->image, module->size, name, strlen(name))) return CUDA_ERROR_NOT_FOUND;
    for (int k = 0; k < (int)(sizeof KERNELS / sizeof KERNELS[0]); k++) {
        if (strcmp(KERNELS[k].name, name) == 0) {
            struct CUfunc_st *f = malloc(sizeof *f);
            f->kernel = k;
            f->device = module->device;
            *function = f;
            return CUDA_SUCCESS;
        }
    }
    fprintf(stderr, "cudashim: no C body for kernel %s: add one to KERNELS\n", name);
    return CUDA_ERROR_NOT_FOUND;
}

static CUresult read_launch(struct launch *l, CUfunction f, unsigned gx, unsigned gy,
                            unsigned gz, unsigned bx, unsigned by, unsigned bz,
                            void **params, void **extra) {
    if (!f || extra) return CUDA_ERROR_INVALID_VALUE;
    if (!params) return CUDA_ERROR_INVALID_VALUE;
    if (bx * by * bz > 1024 || !gx || !gy || !gz || !bx || !by || !bz) return CUDA_ERROR_INVALID_VALUE;
    l->kernel = f->kernel;
    l->device = f->device;
    l->threads = (unsigned long long)gx * gy * gz * bx * by * bz;
    for (int i = 0; i < KERNELS[f->kernel].pointers + KERNELS[f->kernel].ints; i++) {
        if (i < KERNELS[f->kernel].pointers) l->args[i] = *(uint64_t *)params[i];
        else l->args[i] = (uint64_t)(uint32_t) * (int32_t *)params[i];
    }
    return CUDA_SUCCESS;
}

static void run_kernel(const struct launch *l) {
    int pointers = KERNELS[l->kernel].pointers;
    int32_t ints[MAX_ARGS];
    void *buffers[MAX_ARGS];
    for (int i = 0; i < KERNELS[l->kernel].ints; i++) ints[i] = (int32_t)(uint32_t)l->args[pointers + i];
    uint64_t count = ints[0] > 0 ? (uint64_t)ints[0] : 0;
    if (count > l->threads) count = l->threads;
    for (int i = 0; i < pointers; i++) {
        buffers[i] = (void *)(uintptr_t)l->args[i];
        check_access(l->device, l->args[i], count * 4, KERNELS[l->kernel].name);
    }
    KERNELS[l->kernel].body(buffers, ints, count);
}

/* ---------------------------------------------------------------- events */

struct CUevent_st {
    atomic_ullong recorded;  /* records enqueued */
    atomic_ullong completed; /* records the stream has passed */
};

CUresult cuEventCreate(CUevent *event, unsigned int flags) {
    NEED_CONTEXT();
    (void)flags;
    struct CUevent_st *e = calloc(1, sizeof *e);
    *event = e;
    return CUDA_SUCCESS;
}

CUresult cuEventDestroy(CUevent event) {
    (void)event; /* a stream may still record it: kept, as the driver defers the release */
    return CUDA_SUCCESS;
}

/* ---------------------------------------------------------------- streams */

enum { OP_KERNEL, OP_COPY, OP_WAIT, OP_WRITE, OP_HOST, OP_RECORD, OP_WAIT_EVENT, OP_GRAPH };

struct node; /* a graph node: one op */

struct op {
    int kind;
    struct launch launch;                                /* OP_KERNEL */
    uintptr_t dst, src;                                  /* OP_COPY */
    size_t nbytes;
    int dst_on_device, src_on_device;
    int dst_owner, src_owner;                            /* owning device, or -1: host */
    volatile uint64_t *word;                             /* OP_WAIT, OP_WRITE */
    uint64_t value;
    CUhostFn fn;                                         /* OP_HOST */
    void *user;
    struct CUevent_st *event;                            /* OP_RECORD, OP_WAIT_EVENT */
    unsigned long long sequence;
    struct op *graph;                                    /* OP_GRAPH: a copy of its ops */
    int graph_ops;
    struct op *next;
};

struct CUstream_st {
    pthread_t thread;
    pthread_mutex_t mutex;
    pthread_cond_t changed;
    struct op *head, *tail;
    int running; /* an op is executing */
    int destroyed;
    int device;
};

static void pause_briefly(void) {
    struct timespec t = {0, 20000};
    nanosleep(&t, NULL);
}

static int reached(uint64_t word, uint64_t value) { return (int64_t)(word - value) >= 0; }

/* With CUDASHIM_JITTER=N (a seed, not 0) every operation starts after a pseudo-random
   pause of up to 50 us: streams then interleave in more ways, as a GPU's do, and a
   missing wait shows. Each stream thread draws from its own sequence. */
static atomic_uint jitter_streams;

static void jitter(void) {
    static __thread unsigned seed;
    int base = env_int("CUDASHIM_JITTER", 0);
    if (!base) return;
    if (!seed) seed = (unsigned)base * 2654435761u + atomic_fetch_add(&jitter_streams, 1) + 1;
    struct timespec t = {0, (long)(rand_r(&seed) % 50000)};
    nanosleep(&t, NULL);
}

static void execute(struct op *op) {
    if (op->kind != OP_GRAPH) jitter();
    switch (op->kind) {
    case OP_KERNEL: run_kernel(&op->launch); break;
    case OP_COPY:
        /* Host sides may be any host memory (pageable too); device sides are checked. */
        if (op->dst_on_device) check_access(-1, op->dst, op->nbytes, "copy destination");
        if (op->src_on_device) check_access(-1, op->src, op->nbytes, "copy source");
        memmove((void *)op->dst, (const void *)op->src, op->nbytes);
        break;
    case OP_WAIT:
        while (!reached(atomic_load((_Atomic uint64_t *)op->word), op->value)) pause_briefly();
        break;
    case OP_WRITE: atomic_store((_Atomic uint64_t *)op->word, op->value); break;
    case OP_HOST:
        in_host_function = 1;
        op->fn(op->user);
        in_host_function = 0;
        break;
    case OP_RECORD: {
        unsigned long long seen = atomic_load(&op->event->completed);
        while (seen < op->sequence && !atomic_compare_exchange_weak(&op->event->completed, &seen, op->sequence)) {}
        break;
    }
    case OP_WAIT_EVENT:
        while (atomic_load(&op->event->completed) < op->sequence) pause_briefly();
        break;
    case OP_GRAPH:
        for (int i = 0; i < op->graph_ops; i++) execute(&op->graph[i]);
        free(op->graph);
        break;
    }
}

static void *stream_main(void *arg) {
    struct CUstream_st *s = arg;
    pthread_mutex_lock(&s->mutex);
    for (;;) {
        while (!s->head && !s->destroyed) pthread_cond_wait(&s->changed, &s->mutex);
        if (!s->head) break; /* destroyed and drained */
        struct op *op = s->head;
        s->head = op->next;
        if (!s->head) s->tail = NULL;
        s->running = 1;
        pthread_mutex_unlock(&s->mutex);
        execute(op);
        free(op);
        pthread_mutex_lock(&s->mutex);
        s->running = 0;
        pthread_cond_broadcast(&s->changed);
    }
    pthread_mutex_unlock(&s->mutex);
    return NULL;
}

CUresult cuStreamCreate(CUstream *stream, unsigned int flags) {
    NEED_CONTEXT();
    if (flags & ~CU_STREAM_NON_BLOCKING) return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *s = calloc(1, sizeof *s);
    pthread_mutex_init(&s->mutex, NULL);
    pthread_cond_init(&s->changed, NULL);
    s->device = current->ordinal;
    pthread_create(&s->thread, NULL, stream_main, s);
    pthread_detach(s->thread);
    *stream = s;
    return CUDA_SUCCESS;
}

static CUresult enqueue(CUstream s, struct op *op) {
    if (!s) die("an operation on the legacy default stream: actorgraph uses its own streams");
    op->next = NULL;
    pthread_mutex_lock(&s->mutex);
    if (s->destroyed) {
        pthread_mutex_unlock(&s->mutex);
        free(op);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    if (s->tail) s->tail->next = op;
    else s->head = op;
    s->tail = op;
    pthread_cond_broadcast(&s->changed);
    pthread_mutex_unlock(&s->mutex);
    return CUDA_SUCCESS;
}

static struct op *new_op(int kind) {
    struct op *op = calloc(1, sizeof *op);
    op->kind = kind;
    return op;
}

CUresult cuStreamDestroy(CUstream s) {
    NEED_CONTEXT();
    /* Returns at once; work already enqueued still runs (the thread drains, then ends). */
    pthread_mutex_lock(&s->mutex);
    s->destroyed = 1;
    pthread_cond_broadcast(&s->changed);
    pthread_mutex_unlock(&s->mutex);
    return CUDA_SUCCESS;
}

CUresult cuStreamQuery(CUstream s) {
    NEED_CONTEXT();
    pthread_mutex_lock(&s->mutex);
    int idle = !s->head && !s->running;
    pthread_mutex_unlock(&s->mutex);
    return idle ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult cuStreamSynchronize(CUstream s) {
    NEED_CONTEXT();
    pthread_mutex_lock(&s->mutex);
    while (s->head || s->running) pthread_cond_wait(&s->changed, &s->mutex);
    pthread_mutex_unlock(&s->mutex);
    return CUDA_SUCCESS;
}

static CUresult word_op(struct op *op, CUdeviceptr address, cuuint64_t value, unsigned int flags, int wait) {
    if (env_int("CUDASHIM_NO_MEMOPS", 0)) return CUDA_ERROR_NOT_SUPPORTED;
    if (address % 8) return CUDA_ERROR_INVALID_VALUE;
    if (wait && flags != CU_STREAM_WAIT_VALUE_GEQ) die("a wait with flags other than GEQ");
    if (!wait && flags != CU_STREAM_WRITE_VALUE_DEFAULT) die("a write with flags other than DEFAULT");
    struct allocation *a = find((uintptr_t)address, 8);
    if (!a || a->kind != MAPPED_HOST_MEMORY) die("a stream memory operation on a word that is not mapped host memory");
    op->kind = wait ? OP_WAIT : OP_WRITE;
    op->word = (volatile uint64_t *)(uintptr_t)address;
    op->value = value;
    return CUDA_SUCCESS;
}

static CUresult enqueue_word_op(CUstream s, CUdeviceptr address, cuuint64_t value,
                                unsigned int flags, int wait) {
    struct op *op = new_op(OP_WAIT);
    CUresult r = word_op(op, address, value, flags, wait);
    if (r != CUDA_SUCCESS) {
        free(op);
        return r;
    }
    return enqueue(s, op);
}

CUresult cuStreamWaitValue64(CUstream s, CUdeviceptr address, cuuint64_t value, unsigned int flags) {
    NEED_CONTEXT();
    return enqueue_word_op(s, address, value, flags, 1);
}

CUresult cuStreamWriteValue64(CUstream s, CUdeviceptr address, cuuint64_t value, unsigned int flags) {
    NEED_CONTEXT();
    return enqueue_word_op(s, address, value, flags, 0);
}

CUresult cuLaunchHostFunc(CUstream s, CUhostFn fn, void *user) {
    NEED_CONTEXT();
    if (!fn) return CUDA_ERROR_INVALID_VALUE;
    struct op *op = new_op(OP_HOST);
    op->fn = fn;
    op->user = user;
    return enqueue(s, op);
}

CUresult cuEventRecord(CUevent event, CUstream s) {
    NEED_CONTEXT();
    struct op *op = new_op(OP_RECORD);
    op->event = event;
    op->sequence = atomic_fetch_add(&event->recorded, 1) + 1;
    return enqueue(s, op);
}

CUresult cuStreamWaitEvent(CUstream s, CUevent event, unsigned int flags) {
    NEED_CONTEXT();
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    struct op *op = new_op(OP_WAIT_EVENT);
    op->event = event;
    op->sequence = atomic_load(&event->recorded); /* the latest record at this call */
    return enqueue(s, op);
}

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned shared, CUstream s, void **params,
                        void **extra) {
    NEED_CONTEXT();
    if (shared) return CUDA_ERROR_INVALID_VALUE;
    if (s && f && f->device != s->device) return CUDA_ERROR_INVALID_HANDLE;
    struct op *op = new_op(OP_KERNEL);
    CUresult r = read_launch(&op->launch, f, gx, gy, gz, bx, by, bz, params, extra);
    if (r != CUDA_SUCCESS) { free(op); return r; }
    return enqueue(s, op);
}

static CUresult copy(CUstream s, uintptr_t dst, int dst_on_device, uintptr_t src,
                     int src_on_device, size_t n) {
    if (!s) die("a copy on the legacy default stream");
    struct op *op = new_op(OP_COPY);
    op->dst = dst;
    op->src = src;
    op->dst_on_device = dst_on_device;
    op->src_on_device = src_on_device;
    op->nbytes = n;
    return enqueue(s, op);
}

CUresult cuMemcpyHtoDAsync(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
    NEED_CONTEXT();
    return copy(s, (uintptr_t)dst, 1, (uintptr_t)src, 0, n);
}

CUresult cuMemcpyDtoHAsync(void *dst, CUdeviceptr src, size_t n, CUstream s) {
    NEED_CONTEXT();
    return copy(s, (uintptr_t)dst, 0, (uintptr_t)src, 1, n);
}

CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t n, CUstream s) {
    NEED_CONTEXT();
    if (!find((uintptr_t)dst, n)) die("cuMemsetD8Async: the range is not GPU memory");
    /* In stream order: what the stream holds runs first, then the bytes are set. */
    CUresult drained = cuStreamSynchronize(s);
    if (drained != CUDA_SUCCESS) return drained;
    memset((void *)(uintptr_t)dst, value, n);
    return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
    NEED_CONTEXT();
    /* Unified addressing: a copy between two devices' memory needs no peer access. */
    struct allocation *d = find((uintptr_t)dst, n), *r = find((uintptr_t)src, n);
    if (!d || !r) die("cuMemcpyDtoDAsync: a pointer is not GPU memory");
    return copy(s, (uintptr_t)dst, 0, (uintptr_t)src, 0, n);
}

CUresult cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx,
                           size_t n, CUstream s) {
    NEED_CONTEXT();
    if (!valid_context(dst_ctx) || !valid_context(src_ctx)) return CUDA_ERROR_INVALID_CONTEXT;
    struct allocation *d = find((uintptr_t)dst, n), *r = find((uintptr_t)src, n);
    if (!d || !r || d->device != dst_ctx->ordinal || r->device != src_ctx->ordinal)
        die("cuMemcpyPeerAsync: a pointer is not memory of the context given with it");
    /* A peer copy needs no peer access: the driver stages it when there is none. */
    return copy(s, (uintptr_t)dst, 0, (uintptr_t)src, 0, n);
}

/* ---------------------------------------------------------------- graphs */

struct node {
    struct CUgraph_st *graph;
    int index;
};

struct CUgraph_st {
    struct op *ops; /* one per node, in the order added (a topological order) */
    struct node **nodes;
    int count, capacity;
};

struct CUgraphExec_st {
    struct CUgraph_st *graph;
    struct op *ops;
    int count;
};

CUresult cuGraphCreate(CUgraph *graph, unsigned int flags) {
    if (flags) return CUDA_ERROR_INVALID_VALUE;
    *graph = calloc(1, sizeof(struct CUgraph_st));
    return CUDA_SUCCESS;
}

static CUresult add_node(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t ndeps,
                         const struct op *op) {
    for (size_t i = 0; i < ndeps; i++) {
        const struct node *dep = (const struct node *)deps[i];
        if (!dep || dep->graph != g) return CUDA_ERROR_INVALID_VALUE;
    }
    if (g->count == g->capacity) {
        g->capacity = g->capacity ? 2 * g->capacity : 16;
        g->ops = realloc(g->ops, sizeof(struct op) * (size_t)g->capacity);
        g->nodes = realloc(g->nodes, sizeof(struct node *) * (size_t)g->capacity);
    }
    struct node *n = malloc(sizeof *n);
    n->graph = g;
    n->index = g->count;
    g->ops[g->count] = *op;
    g->nodes[g->count++] = n;
    *out = (CUgraphNode)n;
    return CUDA_SUCCESS;
}

static CUresult kernel_op(struct op *op, const CUDA_KERNEL_NODE_PARAMS *p) {
    if (!p->func || p->sharedMemBytes) return CUDA_ERROR_INVALID_VALUE;
    op->kind = OP_KERNEL;
    return read_launch(&op->launch, p->func, p->gridDimX, p->gridDimY, p->gridDimZ, p->blockDimX,
                       p->blockDimY, p->blockDimZ, p->kernelParams, p->extra);
}

CUresult cuGraphAddKernelNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t ndeps,
                              const CUDA_KERNEL_NODE_PARAMS *p) {
    struct op op = {0};
    CUresult r = kernel_op(&op, p);
    return r != CUDA_SUCCESS ? r : add_node(node, g, deps, ndeps, &op);
}

static CUresult memcpy_op(struct op *op, const CUDA_MEMCPY3D *p, CUcontext ctx) {
    if (!valid_context(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
    if (p->Height != 1 || p->Depth != 1 || p->srcXInBytes || p->dstXInBytes || p->srcY ||
        p->dstY || p->srcZ || p->dstZ || p->srcPitch < p->WidthInBytes ||
        p->dstPitch < p->WidthInBytes || p->srcHeight < 1 || p->dstHeight < 1)
        return CUDA_ERROR_INVALID_VALUE;
    uintptr_t src, dst;
    switch (p->srcMemoryType) {
    case CU_MEMORYTYPE_HOST: src = (uintptr_t)p->srcHost; break;
    case CU_MEMORYTYPE_DEVICE: src = (uintptr_t)p->srcDevice; break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    switch (p->dstMemoryType) {
    case CU_MEMORYTYPE_HOST: dst = (uintptr_t)p->dstHost; break;
    case CU_MEMORYTYPE_DEVICE: dst = (uintptr_t)p->dstDevice; break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    if (!src || !dst || !p->WidthInBytes) return CUDA_ERROR_INVALID_VALUE;
    op->kind = OP_COPY;
    op->src = src;
    op->dst = dst;
    op->src_on_device = p->srcMemoryType == CU_MEMORYTYPE_DEVICE;
    op->dst_on_device = p->dstMemoryType == CU_MEMORYTYPE_DEVICE;
    op->nbytes = p->WidthInBytes;
    struct allocation *d = find(dst, op->nbytes), *r = find(src, op->nbytes);
    op->dst_owner = d && d->kind == DEVICE_MEMORY ? d->device : -1;
    op->src_owner = r && r->kind == DEVICE_MEMORY ? r->device : -1;
    return CUDA_SUCCESS;
}

CUresult cuGraphAddMemcpyNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t ndeps,
                              const CUDA_MEMCPY3D *p, CUcontext ctx) {
    struct op op = {0};
    CUresult r = memcpy_op(&op, p, ctx);
    return r != CUDA_SUCCESS ? r : add_node(node, g, deps, ndeps, &op);
}

static CUresult mem_op(struct op *op, const CUDA_BATCH_MEM_OP_NODE_PARAMS *p) {
    if (!valid_context(p->ctx) || p->count != 1 || !p->paramArray || p->flags) return CUDA_ERROR_INVALID_VALUE;
    const CUstreamBatchMemOpParams *m = &p->paramArray[0];
    switch (m->operation) {
    case CU_STREAM_MEM_OP_WAIT_VALUE_64:
        return word_op(op, m->waitValue.address, m->waitValue.value64, m->waitValue.flags, 1);
    case CU_STREAM_MEM_OP_WRITE_VALUE_64:
        return word_op(op, m->writeValue.address, m->writeValue.value64, m->writeValue.flags, 0);
    default: return CUDA_ERROR_INVALID_VALUE;
    }
}

CUresult cuGraphAddBatchMemOpNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t ndeps,
                                  const CUDA_BATCH_MEM_OP_NODE_PARAMS *p) {
    struct op op = {0};
    CUresult r = mem_op(&op, p);
    return r != CUDA_SUCCESS ? r : add_node(node, g, deps, ndeps, &op);
}

CUresult cuGraphAddHostNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t ndeps,
                            const CUDA_HOST_NODE_PARAMS *p) {
    if (!p->fn) return CUDA_ERROR_INVALID_VALUE;
    struct op op = {0};
    op.kind = OP_HOST;
    op.fn = p->fn;
    op.user = p->userData;
    return add_node(node, g, deps, ndeps, &op);
}

CUresult cuGraphInstantiate(CUgraphExec *exec, CUgraph g, unsigned long long flags) {
    NEED_CONTEXT();
    if (flags) return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphExec_st *e = malloc(sizeof *e);
    e->graph = g;
    e->count = g->count;
    e->ops = malloc(sizeof(struct op) * (size_t)(g->count ? g->count : 1));
    memcpy(e->ops, g->ops, sizeof(struct op) * (size_t)g->count);
    *exec = e;
    return CUDA_SUCCESS;
}

/* The exec's copy of `node`, which must keep its kind across updates. */
static struct op *exec_op(CUgraphExec e, CUgraphNode node, int kind) {
    const struct node *n = (const struct node *)node;
    if (!n || n->graph != e->graph || n->index >= e->count || e->ops[n->index].kind != kind) return NULL;
    return &e->ops[n->index];
}

CUresult cuGraphExecKernelNodeSetParams(CUgraphExec e, CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS *p) {
    NEED_CONTEXT();
    struct op *target = exec_op(e, node, OP_KERNEL), op = {0};
    if (!target) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = kernel_op(&op, p);
    if (r != CUDA_SUCCESS) return r;
    if (op.launch.device != target->launch.device) return CUDA_ERROR_INVALID_VALUE; /* same context */
    *target = op;
    return CUDA_SUCCESS;
}

CUresult cuGraphExecMemcpyNodeSetParams(CUgraphExec e, CUgraphNode node, const CUDA_MEMCPY3D *p, CUcontext ctx) {
    NEED_CONTEXT();
    struct op *target = exec_op(e, node, OP_COPY), op = {0};
    if (!target) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = memcpy_op(&op, p, ctx);
    if (r != CUDA_SUCCESS) return r;
    /* "The source and destination memory must be allocated from the same contexts as the
       original", and host stays host. */
    if (op.dst_owner != target->dst_owner || op.src_owner != target->src_owner ||
        op.dst_on_device != target->dst_on_device || op.src_on_device != target->src_on_device)
        return CUDA_ERROR_INVALID_VALUE;
    *target = op;
    return CUDA_SUCCESS;
}

CUresult cuGraphExecBatchMemOpNodeSetParams(CUgraphExec e, CUgraphNode node, const CUDA_BATCH_MEM_OP_NODE_PARAMS *p) {
    NEED_CONTEXT();
    struct op *target = NULL, op = {0};
    const struct node *n = (const struct node *)node;
    if (n && n->graph == e->graph && n->index < e->count &&
        (e->ops[n->index].kind == OP_WAIT || e->ops[n->index].kind == OP_WRITE))
        target = &e->ops[n->index];
    if (!target) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = mem_op(&op, p);
    if (r != CUDA_SUCCESS) return r;
    if (op.kind != target->kind) return CUDA_ERROR_INVALID_VALUE; /* a wait stays a wait */
    *target = op;
    return CUDA_SUCCESS;
}

CUresult cuGraphLaunch(CUgraphExec e, CUstream s) {
    NEED_CONTEXT();
    /* Later updates of the exec do not touch a launch already made: copy its ops. */
    struct op *op = new_op(OP_GRAPH);
    op->graph_ops = e->count;
    op->graph = malloc(sizeof(struct op) * (size_t)(e->count ? e->count : 1));
    memcpy(op->graph, e->ops, sizeof(struct op) * (size_t)e->count);
    return enqueue(s, op);
}

CUresult cuGraphExecDestroy(CUgraphExec e) {
    free(e->ops);
    free(e);
    return CUDA_SUCCESS;
}

CUresult cuGraphDestroy(CUgraph g) {
    for (int i = 0; i < g->count; i++) free(g->nodes[i]);
    free(g->nodes);
    free(g->ops);
    free(g);
    return CUDA_SUCCESS;
}

/* ---------------------------------------------------------------- errors and lookup */

static const struct { CUresult code; const char *name; } ERRORS[] = {
#define E(x) {x, #x}
    E(CUDA_SUCCESS), E(CUDA_ERROR_INVALID_VALUE), E(CUDA_ERROR_OUT_OF_MEMORY),
    E(CUDA_ERROR_NOT_INITIALIZED), E(CUDA_ERROR_INVALID_DEVICE), E(CUDA_ERROR_INVALID_IMAGE),
    E(CUDA_ERROR_INVALID_CONTEXT), E(CUDA_ERROR_INVALID_HANDLE), E(CUDA_ERROR_NOT_FOUND),
    E(CUDA_ERROR_NOT_READY), E(CUDA_ERROR_NOT_SUPPORTED), E(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED),
    E(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED),
#undef E
};

CUresult cuGetErrorName(CUresult error, const char **name) {
    for (size_t i = 0; i < sizeof ERRORS / sizeof ERRORS[0]; i++) {
        if (ERRORS[i].code == error) {
            *name = ERRORS[i].name;
            return CUDA_SUCCESS;
        }
    }
    *name = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult error, const char **text) { return cuGetErrorName(error, text); }

/* NVRTC, when it finds a libcuda, asks it for private tables: there are none here. */
CUresult cuGetExportTable(const void **table, const CUuuid *id) {
    *table = NULL;
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* Each name as cuda.h declares it: the macros there map it to the versioned entry point
   whose signature the bindings call it with (cuMemAlloc -> cuMemAlloc_v2, ...). */
static const struct { const char *name; void *fn; } TABLE[] = {
#define F(x) {#x, (void *)x}
    F(cuInit), F(cuDriverGetVersion), F(cuDeviceGetCount), F(cuDeviceGet), F(cuDeviceGetName),
    F(cuDeviceTotalMem), F(cuDeviceGetAttribute), F(cuDeviceCanAccessPeer),
    F(cuDevicePrimaryCtxRetain), F(cuDevicePrimaryCtxRelease), F(cuCtxSetCurrent),
    F(cuCtxGetCurrent), F(cuCtxEnablePeerAccess), F(cuMemAlloc), F(cuMemFree), F(cuMemHostAlloc),
    F(cuMemHostGetDevicePointer), F(cuMemFreeHost), F(cuModuleLoadData), F(cuModuleGetFunction),
    F(cuEventCreate), F(cuEventDestroy), F(cuEventRecord), F(cuStreamWaitEvent),
    F(cuStreamCreate), F(cuStreamDestroy), F(cuStreamQuery), F(cuStreamSynchronize),
    F(cuStreamWaitValue64), F(cuStreamWriteValue64), F(cuLaunchHostFunc), F(cuLaunchKernel),
    F(cuMemcpyHtoDAsync), F(cuMemcpyDtoHAsync), F(cuMemcpyDtoDAsync), F(cuMemcpyPeerAsync),
    F(cuMemsetD8Async),
    F(cuGraphCreate), F(cuGraphAddKernelNode), F(cuGraphAddMemcpyNode),
    F(cuGraphAddBatchMemOpNode), F(cuGraphAddHostNode), F(cuGraphExecKernelNodeSetParams),
    F(cuGraphExecMemcpyNodeSetParams), F(cuGraphExecBatchMemOpNodeSetParams), F(cuGraphLaunch),
    F(cuGraphExecDestroy), F(cuGraphDestroy), F(cuGetErrorName), F(cuGetErrorString),
    {"cuGraphInstantiateWithFlags", (void *)cuGraphInstantiate},
#undef F
};

/* Newer entry points of the same name that this shim does not have (their older version
   is in the table): the bindings fall back to the older one. */
static const struct { const char *name; int from_version; } NEWER[] = {
    {"cuLaunchHostFunc", 13020},
};

#undef cuGetProcAddress
CUresult cuGetProcAddress_v2(const char *symbol, void **fn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status) {
    (void)flags;
    for (size_t i = 0; i < sizeof NEWER / sizeof NEWER[0]; i++) {
        if (strcmp(NEWER[i].name, symbol) == 0 && version >= NEWER[i].from_version) goto missing;
    }
    for (size_t i = 0; i < sizeof TABLE / sizeof TABLE[0]; i++) {
        if (strcmp(TABLE[i].name, symbol) == 0) {
            *fn = TABLE[i].fn;
            if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
            return CUDA_SUCCESS;
        }
    }
missing:
    *fn = NULL;
    if (status) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_ERROR_NOT_FOUND;
}
