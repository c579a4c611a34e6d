// A section of observer.cpp (a thread's state, the ops' clock, names by address, who is inside a buffer, the profiler state torch sees), included once into it, inside its anonymous namespace: one translation unit.
// What a callback reads of its thread, in one plain struct: a C++ thread_local with a constructor or
// destructor is reached through a guard and a wrapper, and each variable of a shared library through
// its own __tls_get_addr call; this is one lookup per callback.
struct ThreadState {
  ThreadBuffer* buffer;  // t_owner's
  uint64_t generation;   // the recording `buffer` belongs to (g_generation when it was made)
  uint64_t anchor_tsc;   // the ops' clock: this thread's last (TSC, clock_gettime) pair, see now_ns
  int64_t anchor_ns;
  int64_t last_ns;
  bool skip_next;  // set by polyprof_rf_enter around the RecordFunction it opens: left to polyprof
};
thread_local ThreadState t_state;
thread_local std::shared_ptr<ThreadBuffer> t_owner;  // keeps t_state.buffer alive

// t_state, looked up once: the compiler would otherwise look it up again (a __tls_get_addr call)
// after each call it cannot see into rather than keep its address.
inline ThreadState& thread_state() {
  ThreadState* ts = &t_state;
  asm("" : "+r"(ts));
  return *ts;
}

inline int64_t gettime_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);  // the clock of Python's time.perf_counter_ns on Linux
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// The ops' clock: CLOCK_MONOTONIC, read through the TSC where polyprof's recorder does (its clock,
// module.c): one rdtsc scaled by the recorder's rate (ns per tick, 32.32 fixed point), from a
// (TSC, clock_gettime) pair this thread takes again every millisecond of ticks, so that no state is
// shared between the threads that run ops but the rate, which only the recorder writes.
const uint64_t* g_tsc_mult = nullptr;     // the recorder's rate, 0 until measured
const uint64_t* g_tsc_refresh = nullptr;  // its millisecond in ticks
using TscSampleFn = int (*)(uint64_t* tsc, long long* ns);
TscSampleFn g_tsc_sample = nullptr;       // the recorder's (TSC, clock_gettime) pair (pp_tsc_sample)

__attribute__((noinline)) int64_t tsc_pair_ns(ThreadState& ts) {  // this thread's anchor taken again
  uint64_t tsc;
  long long ns;
  if (g_tsc_sample(&tsc, &ns)) ts.anchor_tsc = tsc, ts.anchor_ns = ns;
  int64_t now = ts.anchor_ns < ts.last_ns ? ts.last_ns : ts.anchor_ns;
  return ts.last_ns = now;
}

inline int64_t now_ns(ThreadState& ts) {
#if defined(__x86_64__)
  if (g_tsc_mult != nullptr) {
    uint64_t mult = __atomic_load_n(g_tsc_mult, __ATOMIC_RELAXED);
    uint64_t refresh = __atomic_load_n(g_tsc_refresh, __ATOMIC_RELAXED);
    if (mult != 0 && refresh != 0) {
      uint64_t d = __rdtsc() - ts.anchor_tsc;
      if (d >= refresh) return tsc_pair_ns(ts);
      int64_t ns = ts.anchor_ns + int64_t((static_cast<unsigned __int128>(d) * mult) >> 32);
      if (ns < ts.last_ns) ns = ts.last_ns;
      return ts.last_ns = ns;
    }
  }
#endif
  return gettime_ns();
}

inline int64_t now_ns() { return now_ns(t_state); }

__attribute__((noinline)) ThreadBuffer* new_thread_buffer(ThreadState& ts, uint64_t gen) {
  auto b = std::make_shared<ThreadBuffer>();
  b->tid = int64_t(syscall(SYS_gettid));
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_buffers.push_back(b);
  }
  t_owner = std::move(b);
  ts.buffer = t_owner.get();
  ts.generation = gen;
  return ts.buffer;
}

// The calling thread's buffer for the current recording.
inline ThreadBuffer* thread_buffer(ThreadState& ts) {
  uint64_t gen = g_generation.load(std::memory_order_relaxed);
  if (ts.generation != gen) return new_thread_buffer(ts, gen);  // (0, a new thread's, is never a recording's)
  return ts.buffer;
}

inline ThreadBuffer* thread_buffer() { return thread_buffer(t_state); }

// Operators' names (see NameSlot) are trusted by address until an operator is deregistered: that
// frees its schema, and so its name's memory, and moves the epoch on, which every slot marked before
// then no longer matches. (Deregistration runs the listeners before it frees anything.)
std::atomic<uint64_t> g_schema_epoch{1};

struct SchemaEpoch : c10::OpRegistrationListener {
  void onOperatorRegistered(const c10::OperatorHandle&) override {}
  void onOperatorDeregistered(const c10::OperatorHandle&) override {
    g_schema_epoch.fetch_add(1, std::memory_order_acq_rel);
  }
};

void listen_for_deregistrations() {  // once; the listener stays for the process, as this library does
  static auto* handle = new c10::RegistrationHandleRAII(
      c10::Dispatcher::singleton().addRegistrationListener(std::make_unique<SchemaEpoch>()));
  (void)handle;
}

int32_t intern_slow(ThreadBuffer* b, const char* name, uint64_t schema_epoch = 0);
int32_t intern_op_slow(ThreadBuffer* b, const at::RecordFunction& fn, const char* name, bool* from_schema);

// The slot cached for a name's address, or nullptr.
inline const NameSlot* cached_name(const ThreadBuffer* b, const char* name) {
  const NameSlot* set = &b->name_by_ptr[name_set(name)];
  if (set[0].ptr == name) return &set[0];
  return set[1].ptr == name ? &set[1] : nullptr;
}

// Whether `slot` holds `name` as a name checked by content (not one trusted by its schema).
inline bool same_text(const ThreadBuffer* b, const NameSlot& slot, const char* name) {
  return slot.ptr == name && slot.schema_epoch == 0 && std::strcmp(b->names[size_t(slot.id)].c_str(), name) == 0;
}

inline int32_t intern(ThreadBuffer* b, const char* name) {
  if (name == nullptr) name = "";
  const NameSlot* slot = cached_name(b, name);
  return slot != nullptr && same_text(b, *slot, name) ? slot->id : intern_slow(b, name);
}

// An op's name id; *from_schema says whether the RecordFunction is an operator's (named by its schema,
// so without keyword inputs: the dispatcher passes none) rather than a range named by a string.
inline int32_t intern_op(ThreadBuffer* b, const at::RecordFunction& fn, bool* from_schema) {
  const char* name = fn.name();
  if (name == nullptr) name = "";
  const NameSlot* slot = cached_name(b, name);
  if (slot != nullptr) {
    if (slot->schema_epoch != 0 && slot->schema_epoch == g_schema_epoch.load(std::memory_order_acquire)) {
      *from_schema = true;
      return slot->id;
    }
    if (same_text(b, *slot, name)) {
      *from_schema = false;
      return slot->id;
    }
  }
  return intern_op_slow(b, fn, name, from_schema);
}

__attribute__((noinline)) int32_t intern_op_slow(ThreadBuffer* b, const at::RecordFunction& fn, const char* name,
                                                 bool* from_schema) {
  uint64_t epoch = g_schema_epoch.load(std::memory_order_acquire);
  *from_schema = fn.operator_name().has_value();
  return intern_slow(b, name, *from_schema ? epoch : 0);
}

__attribute__((noinline)) int32_t intern_slow(ThreadBuffer* b, const char* name, uint64_t schema_epoch) {
  std::string s(name);
  auto found = b->name_ids.find(s);
  int32_t id;
  if (found != b->name_ids.end()) {
    id = found->second;
  } else {
    id = int32_t(b->names.size());
    b->names.push_back(s);
    b->name_ids.emplace(std::move(s), id);
  }
  NameSlot* set = &b->name_by_ptr[name_set(name)];
  if (set[0].ptr != name) set[1] = set[0];  // the older name keeps the second slot
  set[0] = NameSlot{name, id, schema_epoch};
  return id;
}

// -- who is inside a buffer ---------------------------------------------------------------------------
// A callback marks its thread's buffer while it works in it (Busy); stop waits for marked buffers and
// take skips them. The mark must be visible before the callback reads the recording flag or the claim,
// and stop's flag (take's claim) before they read the marks: Dekker's pattern, which needs a full
// barrier on both sides. With membarrier(2) the callback's side is a plain store behind a compiler
// barrier, and stop and take have the kernel run a full barrier on every thread of the process
// (MEMBARRIER_CMD_PRIVATE_EXPEDITED, a few microseconds) between their write and their reads; two
// atomic read-modify-writes per callback were ~15 ns of an operator's ~160. Without membarrier (an
// old kernel, a seccomp filter; POLYPROF_OBSERVER_MEMBARRIER=0) callbacks pay a full fence instead.
bool g_membarrier = false;  // decided once, before the first recording registers its callbacks

void decide_membarrier() {
  static bool decided = false;
  if (decided) return;
  decided = true;
  const char* choice = std::getenv("POLYPROF_OBSERVER_MEMBARRIER");
  if (choice != nullptr && std::strcmp(choice, "0") == 0) return;
#if defined(__NR_membarrier)
  long commands = syscall(__NR_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
  g_membarrier = commands > 0 && (commands & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
                 syscall(__NR_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
#endif
}

inline void light_barrier() {
  if (g_membarrier) std::atomic_signal_fence(std::memory_order_seq_cst);
  else std::atomic_thread_fence(std::memory_order_seq_cst);
}

void heavy_barrier() {
#if defined(__NR_membarrier)
  // registered: it cannot fail (EINVAL/EPERM are for unknown or unregistered commands)
  if (g_membarrier) syscall(__NR_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0);
#endif
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

struct Busy {
  ThreadBuffer* b;
  int outer;
  explicit Busy(ThreadBuffer* buffer) : b(buffer), outer(buffer->inside.load(std::memory_order_relaxed)) {
    for (;;) {
      b->inside.store(outer + 1, std::memory_order_relaxed);
      light_barrier();
      if (!b->claimed.load(std::memory_order_acquire)) return;
      b->inside.store(outer, std::memory_order_release);  // being handed over: wait the few us it takes
      while (b->claimed.load(std::memory_order_acquire)) std::this_thread::yield();
    }
  }
  ~Busy() { b->inside.store(outer, std::memory_order_release); }
};

// -- the profiler state torch-side code sees while polyprof records ---------------------------------

using torch::profiler::impl::ActiveProfilerType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerStateBase;

struct PolyprofState : public ProfilerStateBase {
  explicit PolyprofState(ProfilerConfig config) : ProfilerStateBase(std::move(config)) {}

  ActiveProfilerType profilerType() override { return ActiveProfilerType::KINETO; }

  void reportMemoryUsage(void* ptr, int64_t alloc_size, size_t total_allocated, size_t total_reserved,
                         c10::Device device) override {
    if (!g_recording.load(std::memory_order_relaxed)) return;
    ThreadBuffer* b = thread_buffer();
    Busy busy(b);
    if (!g_recording.load(std::memory_order_relaxed)) return;
    b->mem.push_back(Mem{now_ns(), int64_t(reinterpret_cast<intptr_t>(ptr)), alloc_size,
                         int64_t(total_allocated), int64_t(total_reserved), int64_t(device.type()),
                         int64_t(device.index())});
  }

  void reportOutOfMemory(int64_t alloc_size, size_t total_allocated, size_t total_reserved,
                         c10::Device device) override {
    // an [OutOfMemory] row: ptr 0 marks it
    reportMemoryUsage(nullptr, alloc_size, total_allocated, total_reserved, device);
  }
};

ProfilerStateBase* g_state = nullptr;  // the state polyprof pushed (nullptr when none)
// the start callbacks of torch's collector while polyprof itself runs it (see polyprof_note_collector_state)
std::vector<at::RecordFunctionCallback::StartCallback> g_collector_callbacks;
