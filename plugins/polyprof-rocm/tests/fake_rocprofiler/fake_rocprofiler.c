/*
 * A test double of the rocprofiler-sdk entry points polyprof-rocm calls, with the records laid out as
 * the SDK's public headers define them (declared here from reading those headers), delivered to the
 * tool's buffer callback from a thread of the double's own, as the SDK does. Test controls (fake_*)
 * stand in for a HIP program: launches, copies, code objects loading.
 *
 * Build: cc -shared -fPIC -o libfake_rocprofiler.so fake_rocprofiler.c -lpthread
 * FAKE_ROCPROFILER_VERSION ("1.0.0" by default) and FAKE_ROCPROFILER_GPUS (2) are read at each call.
 */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* ---- the SDK's types (as its headers lay them out) ------------------------------------------- */
typedef struct { uint64_t handle; } handle_t;
typedef union { uint64_t value; void *ptr; } user_data_t;
typedef struct { uint64_t internal; user_data_t external; } correlation_id_t;
typedef struct { uint32_t category, kind; void *payload; } record_header_t;
typedef struct { uint32_t x, y, z; } dim3_t;
typedef struct {
    uint64_t size;
    handle_t agent_id, queue_id;
    uint64_t kernel_id, dispatch_id;
    uint32_t private_segment_size, group_segment_size;
    dim3_t workgroup_size, grid_size;
    uint8_t reserved_padding[56];
} dispatch_info_t;
typedef struct {
    uint64_t size;
    int32_t kind, operation;
    correlation_id_t correlation_id;
    uint64_t start_timestamp, end_timestamp, thread_id;
} api_record_t;
typedef struct {
    uint64_t size;
    int32_t kind, operation;
    correlation_id_t correlation_id;
    uint64_t thread_id, start_timestamp, end_timestamp;
    handle_t dst_agent_id, src_agent_id;
    uint64_t bytes;
} memory_copy_record_t;
typedef struct {
    uint64_t size;
    int32_t kind, operation;
    correlation_id_t correlation_id;
    uint64_t thread_id, start_timestamp, end_timestamp;
    dispatch_info_t dispatch_info;
} kernel_dispatch_record_t;
typedef struct {
    handle_t context_id;
    uint64_t thread_id;
    correlation_id_t correlation_id;
    int32_t kind, operation, phase;
    void *payload;
} callback_record_t;
typedef struct {
    uint64_t size, kernel_id, code_object_id;
    const char *kernel_name;
    uint64_t kernel_object;
    uint32_t kernarg_segment_size, kernarg_segment_alignment, group_segment_size, private_segment_size;
    uint32_t sgpr_count, arch_vgpr_count, accum_vgpr_count;
} kernel_symbol_t;
typedef struct {
    uint64_t size;
    handle_t id;
    int32_t type;
    uint32_t cpu_cores_count, simd_count, mem_banks_count, caches_count, io_links_count, cpu_core_id_base,
        simd_id_base, max_waves_per_simd, lds_size_in_kb, gds_size_in_kb, num_gws, wave_front_size, num_xcc,
        cu_count, array_count, num_shader_banks, simd_arrays_per_engine, cu_per_simd_array, simd_per_cu,
        max_slots_scratch_cu, gfx_target_version;
    uint16_t vendor_id, device_id;
    uint32_t location_id, domain, drm_render_minor, num_sdma_engines, num_sdma_xgmi_engines,
        num_sdma_queues_per_engine, num_cp_queues, max_engine_clk_ccompute, max_engine_clk_fcompute,
        sdma_fw_version, fw_version, capability, cu_per_engine, max_waves_per_cu, family_id, workgroup_max_size,
        grid_max_size;
    uint64_t local_mem_size, hive_id, gpu_id;
    dim3_t workgroup_max_dim, grid_max_dim;
    const void *mem_banks, *caches, *io_links;
    const char *name, *vendor_name, *product_name, *model_name;
    uint32_t node_id;
    int32_t logical_node_id, logical_node_type_id, reserved_padding0;
} agent_t;
typedef struct { const char *name; const uint32_t handle; } client_id_t;
typedef int (*tool_initialize_t)(void (*finalize)(client_id_t), void *tool_data);
typedef struct {
    size_t size;
    tool_initialize_t initialize;
    void (*finalize)(void *);
    void *tool_data;
} configure_result_t;
typedef configure_result_t *(*configure_func_t)(uint32_t, const char *, uint32_t, client_id_t *);
typedef void (*buffer_cb_t)(handle_t, handle_t, record_header_t **, size_t, void *, uint64_t);
typedef void (*tracing_cb_t)(callback_record_t, user_data_t *, void *);
typedef int (*agents_cb_t)(int, const void **, size_t, void *);

enum { KIND_HIP = 5, KIND_MEMCPY = 10, KIND_DISPATCH = 11, KIND_LAST = 16, CB_CODE_OBJECT = 10 };
enum { OK = 0, ERR = 1, ERR_CONTEXT_NOT_FOUND = 2, ERR_BUFFER_NOT_FOUND = 3, ERR_KIND_NOT_FOUND = 4, ERR_LOCKED = 15 };
#define DEVICE_CLOCK_OFFSET 1000000000000LL /* the device clock runs 1000 s ahead of CLOCK_MONOTONIC */

/* ---- the double's state ---------------------------------------------------------------------- */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_configuring, g_configured, g_contexts, g_started[8], g_kinds[8][KIND_LAST];
static buffer_cb_t g_buffer_cb;
static void *g_buffer_data;
static int g_buffer_ctx = -1;
static tracing_cb_t g_code_cb;
static int g_code_ctx = -1;
static void *g_pending[1 << 16];
static uint32_t g_pending_kind[1 << 16];
static size_t g_npending;
static uint64_t g_next_corr = 100, g_next_dispatch = 1, g_drops, g_shrink;
static __thread uint64_t t_ext[64];
static __thread int t_depth;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}
static uint64_t device_ns(void) { return now_ns() + DEVICE_CLOCK_OFFSET; }
static uint64_t gettid_(void) { return (uint64_t)syscall(SYS_gettid); }
static int gpus(void) {
    const char *v = getenv("FAKE_ROCPROFILER_GPUS");
    return v ? atoi(v) : 2;
}

int rocprofiler_get_version(uint32_t *major, uint32_t *minor, uint32_t *patch) {
    const char *v = getenv("FAKE_ROCPROFILER_VERSION");
    unsigned a = 1, b = 0, c = 0;
    if (v) sscanf(v, "%u.%u.%u", &a, &b, &c);
    *major = a, *minor = b, *patch = c;
    return OK;
}
const char *rocprofiler_get_status_string(int status) {
    switch (status) {
        case OK: return "ROCPROFILER_STATUS_SUCCESS";
        case ERR_CONTEXT_NOT_FOUND: return "ROCPROFILER_STATUS_ERROR_CONTEXT_NOT_FOUND";
        case ERR_BUFFER_NOT_FOUND: return "ROCPROFILER_STATUS_ERROR_BUFFER_NOT_FOUND";
        case ERR_KIND_NOT_FOUND: return "ROCPROFILER_STATUS_ERROR_KIND_NOT_FOUND";
        case ERR_LOCKED: return "ROCPROFILER_STATUS_ERROR_CONFIGURATION_LOCKED";
        default: return "ROCPROFILER_STATUS_ERROR";
    }
}
int rocprofiler_get_timestamp(uint64_t *ts) { *ts = device_ns(); return OK; }
int rocprofiler_get_thread_id(uint64_t *tid) { *tid = gettid_(); return OK; }
int rocprofiler_is_initialized(int *status) { *status = g_configured; return OK; }

static void client_finalize(client_id_t id) { (void)id; }

int rocprofiler_force_configure(configure_func_t configure) {
    if (g_configured) return ERR_LOCKED;
    client_id_t client = {NULL, 1};
    configure_result_t *result = configure(1, "6.4.0", 0, &client);
    if (result == NULL) return OK; /* the tool declined */
    g_configuring = 1;
    int rc = result->initialize(client_finalize, result->tool_data);
    g_configuring = 0;
    g_configured = 1;
    return rc == 0 ? OK : ERR;
}
int rocprofiler_create_context(handle_t *ctx) {
    if (!g_configuring) return ERR_LOCKED;
    ctx->handle = (uint64_t)(++g_contexts);
    return OK;
}
static int ctx_index(handle_t ctx) { return ctx.handle >= 1 && ctx.handle <= (uint64_t)g_contexts ? (int)ctx.handle : -1; }

static void deliver_code_object(uint64_t kernel_id, const char *name);
static struct { uint64_t id; char name[256]; } g_loaded[256];
static int g_nloaded;

int rocprofiler_start_context(handle_t ctx) {
    int i = ctx_index(ctx);
    if (i < 0) return ERR_CONTEXT_NOT_FOUND;
    g_started[i] = 1;
    if (i == g_code_ctx) /* code objects loaded before the context started are reported now */
        for (int k = 0; k < g_nloaded; k++) deliver_code_object(g_loaded[k].id, g_loaded[k].name);
    return OK;
}
int rocprofiler_stop_context(handle_t ctx) {
    int i = ctx_index(ctx);
    if (i < 0) return ERR_CONTEXT_NOT_FOUND;
    g_started[i] = 0;
    return OK;
}
int rocprofiler_create_buffer(handle_t ctx, size_t size, size_t watermark, int policy, buffer_cb_t cb, void *data,
                              handle_t *buffer) {
    (void)size, (void)watermark, (void)policy;
    if (!g_configuring) return ERR_LOCKED;
    if (ctx_index(ctx) < 0) return ERR_CONTEXT_NOT_FOUND;
    g_buffer_cb = cb, g_buffer_data = data, g_buffer_ctx = ctx_index(ctx);
    buffer->handle = 77;
    return OK;
}
int rocprofiler_configure_buffer_tracing_service(handle_t ctx, int kind, const int32_t *ops, size_t n, handle_t buffer) {
    (void)ops, (void)n;
    if (!g_configuring) return ERR_LOCKED;
    int i = ctx_index(ctx);
    if (i < 0) return ERR_CONTEXT_NOT_FOUND;
    if (buffer.handle != 77) return ERR_BUFFER_NOT_FOUND;
    if (kind <= 0 || kind >= KIND_LAST || kind == 14) return ERR_KIND_NOT_FOUND; /* 14: not offered here */
    g_kinds[i][kind] = 1;
    return OK;
}
int rocprofiler_configure_callback_tracing_service(handle_t ctx, int kind, const int32_t *ops, size_t n, tracing_cb_t cb,
                                                   void *data) {
    (void)ops, (void)n, (void)data;
    if (!g_configuring) return ERR_LOCKED;
    if (ctx_index(ctx) < 0) return ERR_CONTEXT_NOT_FOUND;
    if (kind != CB_CODE_OBJECT) return ERR_KIND_NOT_FOUND;
    g_code_cb = cb, g_code_ctx = ctx_index(ctx);
    return OK;
}
int rocprofiler_query_buffer_tracing_kind_operation_name(int kind, int32_t op, const char **name, uint64_t *len) {
    static const char *hip[] = {"", "hipLaunchKernel", "hipMemcpyAsync", "hipDeviceSynchronize", "hipGetDevice"};
    if (kind != KIND_HIP || op < 1 || op > 4) return ERR_KIND_NOT_FOUND;
    *name = hip[op];
    if (len) *len = strlen(hip[op]);
    return OK;
}

static agent_t g_agents[9];
int rocprofiler_query_available_agents(int version, agents_cb_t cb, size_t agent_size, void *data) {
    (void)version;
    if (agent_size < sizeof(agent_t)) return ERR;
    static const void *list[9];
    int n = gpus() < 8 ? gpus() : 8;
    memset(g_agents, 0, sizeof g_agents);
    g_agents[0] = (agent_t){.size = sizeof(agent_t), .id = {0x1000}, .type = 1, .name = "AMD EPYC", .product_name = "AMD EPYC"};
    list[0] = &g_agents[0];
    for (int i = 1; i <= n; i++) {
        agent_t *a = &g_agents[i];
        a->size = sizeof(agent_t), a->id.handle = 0x1000 + (uint64_t)i, a->type = 2, a->cu_count = 104;
        a->wave_front_size = 64, a->gfx_target_version = 90010, a->local_mem_size = 64ULL << 30;
        a->name = "gfx90a", a->product_name = "AMD Instinct MI210", a->model_name = "aldebaran";
        a->node_id = (uint32_t)i, a->logical_node_id = i, a->logical_node_type_id = i - 1;
        list[i] = a;
    }
    return cb(1, list, (size_t)n + 1, data);
}
int rocprofiler_push_external_correlation_id(handle_t ctx, uint64_t tid, user_data_t id) {
    (void)tid;
    if (ctx_index(ctx) < 0) return ERR_CONTEXT_NOT_FOUND;
    if (t_depth < 64) t_ext[t_depth] = id.value;
    t_depth++;
    return OK;
}
int rocprofiler_pop_external_correlation_id(handle_t ctx, uint64_t tid, user_data_t *id) {
    (void)tid;
    if (ctx_index(ctx) < 0) return ERR_CONTEXT_NOT_FOUND;
    if (t_depth == 0) return ERR;
    t_depth--;
    if (id) id->value = t_depth < 64 ? t_ext[t_depth] : 0;
    return OK;
}

/* ---- delivery -------------------------------------------------------------------------------- */
static void *flush_thread(void *unused) {
    (void)unused;
    pthread_mutex_lock(&g_lock);
    size_t n = g_npending;
    record_header_t *headers = calloc(n ? n : 1, sizeof(record_header_t));
    record_header_t **ptrs = calloc(n ? n : 1, sizeof(record_header_t *));
    for (size_t i = 0; i < n; i++) {
        headers[i].category = 1, headers[i].kind = g_pending_kind[i], headers[i].payload = g_pending[i];
        ptrs[i] = &headers[i];
    }
    uint64_t drops = g_drops;
    g_npending = 0, g_drops = 0;
    pthread_mutex_unlock(&g_lock);
    if (g_buffer_cb && (n || drops)) {
        handle_t ctx = {(uint64_t)g_buffer_ctx}, buf = {77};
        g_buffer_cb(ctx, buf, ptrs, n, g_buffer_data, drops);
    }
    for (size_t i = 0; i < n; i++) free(headers[i].payload);
    free(headers);
    free(ptrs);
    return NULL;
}
int rocprofiler_flush_buffer(handle_t buffer) {
    if (buffer.handle != 77) return ERR_BUFFER_NOT_FOUND;
    pthread_t t;
    pthread_create(&t, NULL, flush_thread, NULL); /* the SDK's own thread calls the tool back */
    pthread_join(t, NULL);
    return OK;
}

static int tracing(int kind) { return g_buffer_ctx >= 0 && g_started[g_buffer_ctx] && g_kinds[g_buffer_ctx][kind]; }
static void add(int kind, void *record, size_t size) {
    *(uint64_t *)record = size > g_shrink ? size - g_shrink : size; /* the record's own size field */
    pthread_mutex_lock(&g_lock);
    if (g_npending < (1 << 16)) {
        g_pending[g_npending] = record, g_pending_kind[g_npending++] = (uint32_t)kind;
    } else {
        g_drops++;
        free(record);
    }
    pthread_mutex_unlock(&g_lock);
}
static correlation_id_t next_corr(void) {
    correlation_id_t c;
    c.internal = __atomic_fetch_add(&g_next_corr, 1, __ATOMIC_SEQ_CST);
    c.external.value = t_depth > 0 && t_depth <= 64 ? t_ext[t_depth - 1] : 0;
    return c;
}
static void api_call(int op, correlation_id_t corr, uint64_t start, uint64_t end) {
    if (!tracing(KIND_HIP)) return;
    api_record_t *r = calloc(1, sizeof *r);
    r->kind = KIND_HIP, r->operation = op, r->correlation_id = corr;
    r->start_timestamp = start, r->end_timestamp = end, r->thread_id = gettid_();
    add(KIND_HIP, r, sizeof *r);
}

static void deliver_code_object(uint64_t kernel_id, const char *name) {
    if (g_code_cb == NULL || !g_started[g_code_ctx]) return;
    kernel_symbol_t sym = {sizeof(kernel_symbol_t), kernel_id, 1, name, 0xabc0 + kernel_id, 16, 16, 0, 0, 8, 32, 0};
    callback_record_t rec = {{(uint64_t)g_code_ctx}, gettid_(), {0, {0}}, CB_CODE_OBJECT, 2, 1, &sym};
    user_data_t user = {0};
    g_code_cb(rec, &user, NULL);
}

/* ---- test controls --------------------------------------------------------------------------- */
void fake_load_kernel(uint64_t kernel_id, const char *name) {
    if (g_nloaded < 256) {
        g_loaded[g_nloaded].id = kernel_id;
        snprintf(g_loaded[g_nloaded].name, sizeof g_loaded[0].name, "%s", name);
        g_nloaded++;
    }
    deliver_code_object(kernel_id, name);
}
/* hipLaunchKernel on this thread: a runtime call and, 2 us after it, the kernel on GPU `gpu`. */
uint64_t fake_hip_launch(int gpu, uint64_t queue, uint64_t kernel_id, uint64_t duration_ns) {
    correlation_id_t corr = next_corr();
    uint64_t t0 = device_ns();
    api_call(1, corr, t0, t0 + 1500);
    if (tracing(KIND_DISPATCH)) {
        kernel_dispatch_record_t *r = calloc(1, sizeof *r);
        r->kind = KIND_DISPATCH, r->operation = 2, r->correlation_id = corr, r->thread_id = gettid_();
        r->start_timestamp = t0 + 2000, r->end_timestamp = t0 + 2000 + duration_ns;
        dispatch_info_t *d = &r->dispatch_info;
        d->size = sizeof *d, d->agent_id.handle = 0x1001 + (uint64_t)gpu, d->queue_id.handle = queue;
        d->kernel_id = kernel_id, d->dispatch_id = g_next_dispatch++, d->group_segment_size = 4096;
        d->workgroup_size = (dim3_t){256, 1, 1}, d->grid_size = (dim3_t){1024, 2, 1};
        add(KIND_DISPATCH, r, sizeof *r);
    }
    return corr.internal;
}
/* hipMemcpyAsync: direction 2 = host to device, 3 = device to host. */
uint64_t fake_hip_memcpy(int gpu, int direction, uint64_t bytes) {
    correlation_id_t corr = next_corr();
    uint64_t t0 = device_ns();
    api_call(2, corr, t0, t0 + 1000);
    if (tracing(KIND_MEMCPY)) {
        memory_copy_record_t *r = calloc(1, sizeof *r);
        r->kind = KIND_MEMCPY, r->operation = direction, r->correlation_id = corr, r->thread_id = gettid_();
        r->start_timestamp = t0 + 1500, r->end_timestamp = t0 + 1500 + bytes / 10;
        uint64_t gpu_agent = 0x1001 + (uint64_t)gpu;
        r->dst_agent_id.handle = direction == 3 ? 0x1000 : gpu_agent;
        r->src_agent_id.handle = direction == 3 ? gpu_agent : 0x1000;
        r->bytes = bytes;
        add(KIND_MEMCPY, r, sizeof *r);
    }
    return corr.internal;
}
/* A HIP call without device work: 3 = hipDeviceSynchronize, 4 = hipGetDevice. */
uint64_t fake_hip_call(int op) {
    correlation_id_t corr = next_corr();
    uint64_t t0 = device_ns();
    api_call(op, corr, t0, t0 + 500);
    return corr.internal;
}
void fake_drop(uint64_t n) { g_drops += n; }
void fake_shrink_records(uint64_t bytes) { g_shrink = bytes; }
size_t fake_record_size(int which) {
    switch (which) {
        case 0: return sizeof(api_record_t);
        case 1: return sizeof(memory_copy_record_t);
        case 2: return sizeof(kernel_dispatch_record_t);
        case 3: return sizeof(callback_record_t);
        case 4: return sizeof(kernel_symbol_t);
        case 5: return sizeof(agent_t);
        case 6: return sizeof(record_header_t);
        default: return 0;
    }
}
