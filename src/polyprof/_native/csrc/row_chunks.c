/* Memory for recorded rows, in chunks of PP_CHUNK_BYTES, faulted in ahead of use.
 *
 * A fresh page costs the thread that first writes it a page fault: ~1.7 us per 4 KiB on this
 * project's VMs (the kernel zeroes the page): 13 ns a row when rows were 32 bytes, a fifth of an
 * instant's cost.
 * While recording, from the first time a buffer past its first chunk finds none faulted in for it
 * (none of those warmed at the start left), a helper thread keeps a pool of chunks mapped and faulted
 * in (MADV_POPULATE_WRITE, or a write per page on kernels before 5.14): one at first, one more each
 * time a buffer takes one, up to PP_CHUNK_READY, so that a recording thread taking its next chunk
 * finds its pages already there and a recording that ends soon leaves little faulted in for nothing;
 * when the pool is empty (many threads recording at full rate) a chunk is mapped fresh and faults in
 * as it fills, as any memory would. The helper takes no GIL and no Python object, blocks every signal,
 * and is joined when recording ends, when the pool's chunks are unmapped: what stays mapped is only
 * the rows buffers hold, each chunk unmapped when its buffer lets it go.
 *
 *     void *chunk = pp_chunk_new(1);   // faulted in ahead where the pool has one
 *     ...
 *     pp_chunk_free(chunk);
 */
#include "speedups.h"

#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  /* Linux 5.14; older kernels answer EINVAL and the pages are written instead */
#endif

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_wake = PTHREAD_COND_INITIALIZER;
static void *g_ready[PP_CHUNK_READY];
static int g_n_ready = 0;
static void *g_warm[PP_CHUNK_READY];  /* faulted in at a profile's start, for buffers' first chunks */
static int g_n_warm = 0;
static int g_wanted = 0;        /* recording: the helper keeps the pool at g_target */
static int g_target = 1;        /* the pool's size the helper keeps: 1 when recording starts, 1 more each
                                   time a buffer takes from the pool, up to PP_CHUNK_READY */
static int g_helper_alive = 0;  /* a helper thread exists (joinable) */
static pthread_t g_helper;
static int g_populate = 1;      /* MADV_POPULATE_WRITE works here */
static long g_mapped = 0;       /* chunks mapped now, pool included (row_chunks_stats) */
static long g_faulted_ahead = 0; /* chunks handed out from the pool so far */

static void *map_chunk(void) {
    void *p = mmap(NULL, PP_CHUNK_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    __atomic_add_fetch(&g_mapped, 1, __ATOMIC_RELAXED);
    return p;
}

static void unmap_chunk(void *p) {
    munmap(p, PP_CHUNK_BYTES);
    __atomic_sub_fetch(&g_mapped, 1, __ATOMIC_RELAXED);
}

static void fault_in(void *p) {
    if (__atomic_load_n(&g_populate, __ATOMIC_RELAXED) && madvise(p, PP_CHUNK_BYTES, MADV_POPULATE_WRITE) == 0)
        return;
    __atomic_store_n(&g_populate, 0, __ATOMIC_RELAXED);
    for (size_t at = 0; at < PP_CHUNK_BYTES; at += 4096) ((volatile char *)p)[at] = 0;
}

static void *helper_main(void *unused) {
    (void)unused;
    pthread_mutex_lock(&g_lock);
    while (g_wanted) {
        if (g_n_ready >= g_target) {
            pthread_cond_wait(&g_wake, &g_lock);
            continue;
        }
        pthread_mutex_unlock(&g_lock);
        void *p = map_chunk();
        if (p != NULL) fault_in(p);
        pthread_mutex_lock(&g_lock);
        if (p == NULL) {  /* out of memory: the recording threads map their own (and see the error) */
            pthread_cond_wait(&g_wake, &g_lock);
        } else if (g_wanted && g_n_ready < g_target) {
            g_ready[g_n_ready++] = p;
        } else {
            unmap_chunk(p);
        }
    }
    pthread_mutex_unlock(&g_lock);
    return NULL;
}

/* With g_lock held. A helper started from a thread with every signal blocked inherits that mask, so
   SIGINT/SIGTERM keep going to the threads that handle them. */
static void start_helper(void) {
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    g_helper_alive = pthread_create(&g_helper, NULL, helper_main, NULL) == 0;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

void *pp_chunk_new(int ahead) {
    void *p = NULL;
    pthread_mutex_lock(&g_lock);  /* (a buffer's first chunk asks once a buffer: the lock is no cost) */
    if (ahead && g_n_ready > 0) {
        p = g_ready[--g_n_ready];
        g_faulted_ahead++;
        if (g_target < PP_CHUNK_READY) g_target++;
    } else if (g_n_warm > 0) {  /* a first chunk, or a later one while the pool is empty */
        p = g_warm[--g_n_warm];
    }
    if (ahead) {
        /* The helper starts when a buffer past its first chunk finds none faulted in (the pool empty,
           the start's warm chunks all taken): a recording that those hold never starts it, nor pays
           for a pool it would drop unused at the stop (on the 2-core VM, four chunks faulted in beside
           a 4,000-op window that the warm chunks held added ~200 ns to each of its ops) */
        if (p == NULL && g_wanted && !g_helper_alive) start_helper();
        pthread_cond_signal(&g_wake);
    }
    pthread_mutex_unlock(&g_lock);
    return p != NULL ? p : map_chunk();
}

/* Up to n chunks mapped and faulted in now, on the calling thread (a profile's start, which knows how
   many its first operations fill: the observer's rows, and its shapes records), handed out as buffers'
   first chunks, and as later ones while the pool is still empty; otherwise a profile's first thousands
   of operations fault their pages in one by one (90 faults over the first 4,000 ops of an MLP with
   record_shapes). At most PP_CHUNK_READY are held; those not taken are unmapped when recording ends. */
void pp_chunk_warm(int n) {
    while (n-- > 0) {
        pthread_mutex_lock(&g_lock);
        int room = g_n_warm < PP_CHUNK_READY;
        pthread_mutex_unlock(&g_lock);
        if (!room) return;
        void *p = map_chunk();
        if (p == NULL) return;
        fault_in(p);
        pthread_mutex_lock(&g_lock);
        if (g_n_warm < PP_CHUNK_READY) {
            g_warm[g_n_warm++] = p;
            p = NULL;
        }
        pthread_mutex_unlock(&g_lock);
        if (p != NULL) unmap_chunk(p);
    }
}

void pp_chunk_free(void *chunk) {
    if (chunk == NULL) return;
    pthread_mutex_lock(&g_lock);
    int kept = g_wanted && g_n_ready < PP_CHUNK_READY;  /* reused: the pages it wrote are faulted in */
    if (kept) g_ready[g_n_ready++] = chunk;
    pthread_mutex_unlock(&g_lock);
    if (!kept) unmap_chunk(chunk);
}

void pp_chunk_pool_run(int on) {
    pthread_mutex_lock(&g_lock);
    g_wanted = on;  /* the helper itself starts when a buffer asks for a chunk ahead and finds none */
    if (on) g_target = 1;
    pthread_cond_signal(&g_wake);
    int join = !on && g_helper_alive;
    pthread_mutex_unlock(&g_lock);
    if (on) return;
    if (join) pthread_join(g_helper, NULL);  /* at most one chunk's faulting away (~0.1 ms) */
    pthread_mutex_lock(&g_lock);
    if (join) g_helper_alive = 0;
    void *drop[2 * PP_CHUNK_READY];
    int n = 0;
    if (!g_wanted) {  /* the pool (the helper's, chunks freed while recording) and the warm chunks left,
                         unless recording again */
        while (g_n_ready > 0) drop[n++] = g_ready[--g_n_ready];
        while (g_n_warm > 0) drop[n++] = g_warm[--g_n_warm];
    }
    pthread_mutex_unlock(&g_lock);
    for (int i = 0; i < n; i++) unmap_chunk(drop[i]);
}

/* fork(): the lock is held across it, so the child finds the pool consistent; there the helper does
   not exist, and the pool's chunks (shared copy-on-write with the parent now) are unmapped. */
static void before_fork(void) { pthread_mutex_lock(&g_lock); }
static void after_fork_parent(void) { pthread_mutex_unlock(&g_lock); }
static void after_fork_child(void) {
    pthread_cond_init(&g_wake, NULL);
    g_helper_alive = 0;
    while (g_n_ready > 0) unmap_chunk(g_ready[--g_n_ready]);
    while (g_n_warm > 0) unmap_chunk(g_warm[--g_n_warm]);
    pthread_mutex_unlock(&g_lock);
}

int pp_row_chunks_init(void) {
    static int registered = 0;  /* once per process, however many times the module is initialised */
    if (registered) return 0;
    registered = pthread_atfork(before_fork, after_fork_parent, after_fork_child) == 0;
    return registered ? 0 : -1;
}

static PyObject *sp_row_chunks_stats(PyObject *m, PyObject *unused) {
    pthread_mutex_lock(&g_lock);
    int ready = g_n_ready, warm = g_n_warm, helper = g_helper_alive;
    long ahead = g_faulted_ahead;
    pthread_mutex_unlock(&g_lock);
    return Py_BuildValue("{s:l,s:i,s:i,s:O,s:l,s:O}", "mapped", __atomic_load_n(&g_mapped, __ATOMIC_RELAXED),
                         "ready", ready, "warm", warm, "helper", helper ? Py_True : Py_False, "faulted_ahead", ahead,
                         "populate", __atomic_load_n(&g_populate, __ATOMIC_RELAXED) ? Py_True : Py_False);
}

static PyObject *sp_warm_row_chunks(PyObject *m, PyObject *arg) {
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    Py_BEGIN_ALLOW_THREADS
    pp_chunk_warm((int)(n < PP_CHUNK_READY ? n : PP_CHUNK_READY));
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *sp_row_chunk_functions(PyObject *m, PyObject *unused) {
    return Py_BuildValue("(NNn)", PyLong_FromVoidPtr((void *)(uintptr_t)&pp_chunk_new),
                         PyLong_FromVoidPtr((void *)(uintptr_t)&pp_chunk_free), (Py_ssize_t)PP_CHUNK_BYTES);
}

PyMethodDef pp_row_chunks_methods[] = {
    {"row_chunk_functions", sp_row_chunk_functions, METH_NOARGS,
     "(pp_chunk_new, pp_chunk_free, chunk bytes): C addresses, for C code that records rows (the torch observer)."},
    {"warm_row_chunks", sp_warm_row_chunks, METH_O,
     "warm_row_chunks(n): n chunks (at most 4 held) faulted in now, for the first chunks of the buffers a "
     "recording begins (a profile's start); those not taken are unmapped when recording ends."},
    {"row_chunks_stats", sp_row_chunks_stats, METH_NOARGS,
     "The row chunks: mapped (now, the pool's included), ready (faulted in ahead, in the pool), warm (faulted "
     "in at a start, for first chunks), helper "
     "(running), faulted_ahead (handed out from the pool so far), populate (MADV_POPULATE_WRITE works)."},
    {NULL, NULL, 0, NULL},
};
