/*
 * A test double of PTI-sdk's View API (libpti_view), compiled by the tests with the system C compiler.
 *
 * It exports the entry points polyprof-xpu calls, lays records out as PTI 1.x does (v1 or v2 records,
 * chosen by the version it reports: FAKE_PTI_VERSION, else FAKE_PTI_DEFAULT_VERSION at compile time, else
 * "1.2.0"), hands completed buffers to the
 * buffer-completed callback from a thread of its own, keeps per-thread external correlation stacks,
 * and stamps times with CLOCK_REALTIME like PTI's default. Test-only functions (fakePti*) emit the
 * records a GPU would produce for a kernel launch, a copy, a fill, a sync, overhead.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct { uint32_t major, minor, patch; } pti_version;
typedef void (*requested_fn)(unsigned char **, size_t *);
typedef void (*completed_fn)(unsigned char *, size_t, size_t);

enum { K_KERNEL = 1, K_DRIVER = 3, K_OVERHEAD = 5, K_RUNTIME = 6, K_EXTERNAL = 7, K_COPY = 8, K_FILL = 9,
       K_P2P = 10, K_SYNC = 11, K_COMMS = 12, K_MAX = 13 };

/* Record layouts (PTI 1.x). v2 records append device handle and engine fields. */
#define TIMES uint64_t append, start, end, submit
typedef struct { uint32_t kind; void *queue, *ctx; const char *name, *src_file; uint64_t line, kernel_id;
                 uint32_t corr, tid; char pci[16]; uint8_t uuid[16]; TIMES;
                 uint64_t sycl_task_begin, sycl_enqk_begin, sycl_node_id, sycl_queue_id; uint32_t sycl_invocation_id; } kernel_v1;
typedef struct { kernel_v1 v1; void *device; uint32_t engine_ordinal, engine_index; } kernel_v2;
typedef struct { uint32_t kind, memcpy_type, mem_src, mem_dst; void *queue, *ctx; const char *name; char pci[16];
                 uint8_t uuid[16]; uint64_t mem_op_id; uint32_t corr, tid; TIMES; uint64_t bytes, sycl_queue_id; } copy_v1;
typedef struct { copy_v1 v1; void *device; uint32_t engine_ordinal, engine_index; } copy_v2;
typedef struct { uint32_t kind, mem_type; void *queue, *ctx; const char *name; char pci[16]; uint8_t uuid[16];
                 uint64_t mem_op_id; uint32_t corr, tid; TIMES; uint64_t bytes, value, sycl_queue_id; } fill_v1;
typedef struct { fill_v1 v1; void *device; uint32_t engine_ordinal, engine_index; } fill_v2;
typedef struct { uint32_t kind; uint64_t start, end; uint32_t group, api_id, pid, tid, corr, rc; } api_rec;
typedef struct { uint32_t kind; uint32_t corr; uint64_t external_id; uint32_t external_kind; } external_rec;
typedef struct { uint32_t kind, synch_type; void *ctx, *queue, *event; uint64_t start, end;
                 uint32_t tid, corr, n_wait, rc, api_id, group; } sync_rec;
typedef struct { uint32_t kind; uint64_t start, end; uint32_t tid, api_id; uint64_t count, duration; uint32_t okind; } overhead_rec;

static pti_version g_version = {1, 2, 0};
static int g_v2 = 1;
static requested_fn g_requested;
static completed_fn g_completed;
static int g_enabled[K_MAX];
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned char *g_buf;
static size_t g_size, g_used;
static uint64_t g_dropped, g_next_corr = 100, g_next_op = 1;
static int g_late_ms;
static __thread uint64_t t_stack[6][64];
static __thread int t_depth[6];

static uint64_t now_ns(void) { struct timespec ts; clock_gettime(CLOCK_REALTIME, &ts); return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec; }
static uint32_t my_tid(void) { return (uint32_t)gettid(); }

#ifndef FAKE_PTI_DEFAULT_VERSION
#define FAKE_PTI_DEFAULT_VERSION "1.2.0"
#endif

static void init_version(void) {
  const char *v = getenv("FAKE_PTI_VERSION");
  sscanf(v ? v : FAKE_PTI_DEFAULT_VERSION, "%u.%u.%u", &g_version.major, &g_version.minor, &g_version.patch);
  g_v2 = g_version.major >= 1 || (g_version.major == 0 && g_version.minor > 17);
}

static size_t record_size(uint32_t kind) {
  switch (kind) {
    case K_KERNEL: return g_v2 ? sizeof(kernel_v2) : sizeof(kernel_v1);
    case K_COPY: return g_v2 ? sizeof(copy_v2) : sizeof(copy_v1);
    case K_FILL: return g_v2 ? sizeof(fill_v2) : sizeof(fill_v1);
    case K_RUNTIME: case K_DRIVER: return sizeof(api_rec);
    case K_EXTERNAL: return sizeof(external_rec);
    case K_SYNC: return sizeof(sync_rec);
    case K_OVERHEAD: return sizeof(overhead_rec);
    default: return 0;
  }
}

typedef struct { unsigned char *buf; size_t size, used; int delay_ms; } delivery;

static void *deliver_thread(void *arg) {
  delivery *d = arg;
  if (d->delay_ms) usleep(d->delay_ms * 1000);
  g_completed(d->buf, d->size, d->used);
  free(d);
  return NULL;
}

/* Hand the current buffer to the completed callback on a thread of our own; caller holds g_lock. */
static void deliver_locked(int wait, int delay_ms) {
  if (!g_buf) return;
  delivery *d = malloc(sizeof *d);
  d->buf = g_buf; d->size = g_size; d->used = g_used; d->delay_ms = delay_ms;
  g_buf = NULL; g_size = g_used = 0;
  pthread_t t;
  pthread_create(&t, NULL, deliver_thread, d);
  if (wait) pthread_join(t, NULL); else pthread_detach(t);
}

static void *reserve_locked(uint32_t kind) {
  size_t need = record_size(kind);
  if (!g_enabled[kind] || !g_requested) return NULL;
  if (g_buf && g_used + need > g_size) deliver_locked(1, 0);
  if (!g_buf) {
    g_requested(&g_buf, &g_size);
    g_used = 0;
    if (!g_buf || g_size < need) { g_buf = NULL; g_dropped++; return NULL; }
  }
  void *rec = g_buf + g_used;
  memset(rec, 0, need);
  g_used += need;
  *(uint32_t *)rec = kind;
  return rec;
}

/* ---- the PTI View API ------------------------------------------------------------------------ */
pti_version ptiVersion(void) { init_version(); return g_version; }

const char *ptiResultTypeToString(int r) {
  switch (r) {
    case 0: return "PTI_SUCCESS"; case 1: return "PTI_STATUS_END_OF_BUFFER";
    case 2: return "PTI_ERROR_NOT_IMPLEMENTED"; case 3: return "PTI_ERROR_BAD_ARGUMENT";
    case 51: return "PTI_ERROR_TRACING_NOT_INITIALIZED"; default: return "PTI_ERROR_INTERNAL";
  }
}

int ptiViewGPULocalAvailable(void) {
  const char *u = getenv("FAKE_PTI_UNAVAILABLE");
  return u ? atoi(u) : 0;
}

int ptiViewSetCallbacks(requested_fn r, completed_fn c) { g_requested = r; g_completed = c; return 0; }

int ptiViewEnable(uint32_t kind) {
  if (ptiViewGPULocalAvailable()) return ptiViewGPULocalAvailable();
  if (kind >= K_MAX) return 3;
  if (kind == K_COMMS) return 2;  /* as on machines without oneCCL */
  if (!g_requested) return 4;
  g_enabled[kind] = 1;
  return 0;
}

int ptiViewDisable(uint32_t kind) { if (kind < K_MAX) g_enabled[kind] = 0; return 0; }

int ptiFlushAllViews(void) {
  pthread_mutex_lock(&g_lock);
  if (g_late_ms && g_buf && g_used) {
    /* deliver the last buffer later, after the caller has stopped: a callback that fires after stop */
    deliver_locked(0, g_late_ms);
  } else {
    deliver_locked(1, 0);
  }
  pthread_mutex_unlock(&g_lock);
  return 0;
}

int ptiViewGetNextRecord(uint8_t *buf, size_t valid, void **record) {
  unsigned char *next = *record ? (unsigned char *)*record + record_size(*(uint32_t *)*record) : buf;
  if (next >= buf + valid || next + sizeof(uint32_t) > buf + valid) return 1;
  *record = next;
  return 0;
}

int ptiViewPushExternalCorrelationId(uint32_t kind, uint64_t id) {
  if (kind >= 6 || t_depth[kind] >= 64) return 3;
  t_stack[kind][t_depth[kind]++] = id;
  return 0;
}

int ptiViewPopExternalCorrelationId(uint32_t kind, uint64_t *id) {
  if (kind >= 6 || t_depth[kind] == 0) return 5;
  uint64_t v = t_stack[kind][--t_depth[kind]];
  if (id) *id = v;
  return 0;
}

uint64_t ptiViewGetTimestamp(void) { return now_ns(); }

int ptiViewGetApiIdName(uint32_t group, uint32_t id, const char **name) {
  static const char *sycl[] = {"", "urEnqueueKernelLaunch", "urEnqueueUSMMemcpy", "urEnqueueUSMFill", "urQueueFinish"};
  static const char *l0[] = {"", "zeCommandListAppendLaunchKernel", "zeCommandListAppendMemoryCopy",
                             "zeCommandListAppendMemoryFill", "zeEventHostSynchronize"};
  if (id >= 5 || id == 0) return 7;
  *name = group == 3 ? sycl[id] : l0[id];
  return 0;
}

int ptiViewEnableRuntimeApiClass(uint32_t enable, uint32_t cls, uint32_t group) { return 0; }

/* ---- test controls --------------------------------------------------------------------------- */
static const char *PCI[2] = {"0000:3a:00.0", "0000:9a:00.0"};

static void device_ids(int device, char pci[16], uint8_t uuid[16]) {
  strncpy(pci, PCI[device & 1], 16);
  for (int i = 0; i < 16; i++) uuid[i] = (uint8_t)(0xa0 + device * 16 + i);
}

/* Runtime call (SYCL) + driver call (L0) + external correlation records for the top of each stack. */
static uint32_t emit_calls_locked(uint32_t api_id, uint64_t *t_end) {
  uint32_t corr = (uint32_t)g_next_corr++;
  uint64_t t0 = now_ns();
  api_rec *r = reserve_locked(K_RUNTIME);
  if (r) { r->start = t0; r->end = t0 + 4000; r->group = 3; r->api_id = api_id; r->pid = getpid(); r->tid = my_tid(); r->corr = corr; }
  api_rec *d = reserve_locked(K_DRIVER);
  if (d) { d->start = t0 + 1000; d->end = t0 + 3000; d->group = 1; d->api_id = api_id; d->pid = getpid(); d->tid = my_tid(); d->corr = corr; }
  for (uint32_t kind = 2; kind <= 3; kind++) {
    if (t_depth[kind] == 0) continue;
    external_rec *e = reserve_locked(K_EXTERNAL);
    if (e) { e->corr = corr; e->external_id = t_stack[kind][t_depth[kind] - 1]; e->external_kind = kind; }
  }
  *t_end = t0 + 4000;
  return corr;
}

uint32_t fakePtiEmitKernel(const char *name, uint64_t sycl_queue, int device, uint64_t duration) {
  pthread_mutex_lock(&g_lock);
  uint64_t t;
  uint32_t corr = emit_calls_locked(1, &t);
  kernel_v1 *k = reserve_locked(K_KERNEL);
  if (k) {
    k->queue = (void *)(uintptr_t)(0x1000 + sycl_queue); k->ctx = (void *)0xc0; k->name = name;
    k->kernel_id = g_next_op++; k->corr = corr; k->tid = my_tid(); device_ids(device, k->pci, k->uuid);
    k->append = t + 500; k->submit = t + 1500; k->start = t + 8000; k->end = t + 8000 + duration;
    k->sycl_task_begin = t - 2000; k->sycl_queue_id = sycl_queue;
    if (g_v2) { ((kernel_v2 *)k)->device = (void *)0xd0; ((kernel_v2 *)k)->engine_ordinal = 0; ((kernel_v2 *)k)->engine_index = 2; }
  }
  pthread_mutex_unlock(&g_lock);
  return corr;
}

uint32_t fakePtiEmitCopy(uint32_t memcpy_type, uint32_t src, uint32_t dst, uint64_t bytes, uint64_t sycl_queue, int device) {
  pthread_mutex_lock(&g_lock);
  uint64_t t;
  uint32_t corr = emit_calls_locked(2, &t);
  copy_v1 *c = reserve_locked(K_COPY);
  if (c) {
    c->memcpy_type = memcpy_type; c->mem_src = src; c->mem_dst = dst; c->queue = (void *)(uintptr_t)(0x1000 + sycl_queue);
    c->ctx = (void *)0xc0; c->name = "zeCommandListAppendMemoryCopy"; device_ids(device, c->pci, c->uuid);
    c->mem_op_id = g_next_op++; c->corr = corr; c->tid = my_tid(); c->append = t + 500; c->submit = t + 1500;
    c->start = t + 6000; c->end = t + 6000 + bytes / 10; c->bytes = bytes; c->sycl_queue_id = sycl_queue;
    if (g_v2) { ((copy_v2 *)c)->engine_ordinal = 1; ((copy_v2 *)c)->engine_index = 0; }
  }
  pthread_mutex_unlock(&g_lock);
  return corr;
}

uint32_t fakePtiEmitFill(uint64_t bytes, uint64_t value, uint64_t sycl_queue, int device) {
  pthread_mutex_lock(&g_lock);
  uint64_t t;
  uint32_t corr = emit_calls_locked(3, &t);
  fill_v1 *f = reserve_locked(K_FILL);
  if (f) {
    f->mem_type = 2; f->queue = (void *)(uintptr_t)(0x1000 + sycl_queue); f->ctx = (void *)0xc0;
    f->name = "zeCommandListAppendMemoryFill"; device_ids(device, f->pci, f->uuid); f->mem_op_id = g_next_op++;
    f->corr = corr; f->tid = my_tid(); f->append = t + 500; f->submit = t + 1500; f->start = t + 5000;
    f->end = t + 7000; f->bytes = bytes; f->value = value; f->sycl_queue_id = sycl_queue;
  }
  pthread_mutex_unlock(&g_lock);
  return corr;
}

void fakePtiEmitSync(void) {
  pthread_mutex_lock(&g_lock);
  sync_rec *s = reserve_locked(K_SYNC);
  if (s) { uint64_t t = now_ns(); s->synch_type = 4; s->start = t; s->end = t + 2500; s->tid = my_tid();
           s->corr = (uint32_t)g_next_corr++; s->api_id = 4; s->group = 1; }
  pthread_mutex_unlock(&g_lock);
}

void fakePtiEmitOverhead(void) {
  pthread_mutex_lock(&g_lock);
  overhead_rec *o = reserve_locked(K_OVERHEAD);
  if (o) { uint64_t t = now_ns(); o->start = t; o->end = t + 900; o->tid = my_tid(); o->count = 3; o->duration = 700; o->okind = 3; }
  pthread_mutex_unlock(&g_lock);
}

void fakePtiSetLateDelivery(int ms) { g_late_ms = ms; }
size_t fakePtiRecordSize(uint32_t kind) { init_version(); return record_size(kind); }
uint64_t fakePtiDroppedRecords(void) { return g_dropped; }
int fakePtiStackDepth(uint32_t kind) { return kind < 6 ? t_depth[kind] : -1; }
