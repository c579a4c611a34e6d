// A section of observer.cpp (the C ABI read with ctypes: start, stop, take, the columns, and the bridge for record_function), included once into it, inside its extern "C" block: one translation unit.

int polyprof_observer_abi() { return kAbiVersion; }

// What polyprof's C extension lends the observer (0 where it is not built): its row chunks' allocator
// (pp_chunk_new / pp_chunk_free, used only if its chunks are this store's size), and its TSC clock's
// rate and refresh interval (read only here) with the function that takes a (TSC, clock_gettime) pair
// (pp_tsc_sample). Once, before the first recording; returns -1 after it.
int polyprof_observer_use_runtime(void* chunk_new, void* chunk_free, int64_t chunk_bytes, const uint64_t* tsc_mult,
                                  const uint64_t* tsc_refresh, void* tsc_sample) {
  if (g_handle != 0 || g_chunks_used) return -1;
  bool chunks = chunk_new != nullptr && chunk_free != nullptr && chunk_bytes == int64_t(OpStore::kChunkBytes);
  g_chunk_new = chunks ? reinterpret_cast<ChunkNewFn>(chunk_new) : nullptr;
  g_chunk_free = g_chunk_new != nullptr ? reinterpret_cast<ChunkFreeFn>(chunk_free) : nullptr;
  bool tsc = tsc_mult != nullptr && tsc_refresh != nullptr && tsc_sample != nullptr;
  g_tsc_mult = tsc ? tsc_mult : nullptr;
  g_tsc_refresh = tsc ? tsc_refresh : nullptr;
  g_tsc_sample = tsc ? reinterpret_cast<TscSampleFn>(tsc_sample) : nullptr;
  return 0;
}

const char* polyprof_observer_error() { return g_error.c_str(); }

// How stop and take see which callbacks are inside a buffer (once a recording has started): "membarrier"
// (the callbacks' mark is a plain store) or "fence" (each callback pays a full fence).
const char* polyprof_observer_barrier() { return g_membarrier ? "membarrier" : "fence"; }

// Starts recording the calling thread's operators (and those of threads that inherit its
// RecordFunction state, such as autograd's; with kAllThreads, every thread's). `options` is a sum of
// the k* flags above. Returns 0, or -1 with polyprof_observer_error().
int polyprof_observer_start(int options) {
  try {
    if (g_handle != 0) {
      g_error = "the observer is already recording (one polyprof torch session at a time)";
      return -1;
    }
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      g_buffers.clear();
      g_taken.clear();
    }
    g_options = options;
    bool needs_inputs = (options & (kRecordShapes | kWithFlops)) != 0;
    decide_membarrier();
    listen_for_deregistrations();
    g_generation.fetch_add(1);
    g_recording.store(true, std::memory_order_seq_cst);
    auto callback = at::RecordFunctionCallback(on_start, on_end).needsInputs(needs_inputs);
    g_handle = (options & kAllThreads) ? at::addGlobalCallback(callback) : at::addThreadLocalCallback(callback);
    if (ProfilerStateBase::get(/*global=*/false) == nullptr) {
      ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO, (options & kRecordShapes) != 0,
                            (options & kProfileMemory) != 0, false, (options & kWithFlops) != 0,
                            (options & kWithModules) != 0);
      auto state = std::make_shared<PolyprofState>(config);
      g_state = state.get();
      ProfilerStateBase::push(std::move(state));
    }
    return 0;
  } catch (const std::exception& e) {
    g_recording.store(false);
    g_error = e.what();
    return -1;
  }
}

// In a forked child (a DataLoader worker): recording off, and nothing else. The callbacks stay (each
// op then costs a flag's load); no lock is taken, as a thread of the parent may have held one at the fork.
void polyprof_observer_quiet_in_child() { g_recording.store(false, std::memory_order_relaxed); }

// Stops recording; must run on the thread that started. Returns the number of operators recorded.
int64_t polyprof_observer_stop() {
  g_recording.store(false, std::memory_order_seq_cst);
  if (g_handle != 0) {
    try {
      at::removeCallback(g_handle);
    } catch (...) {
    }
    g_handle = 0;
  }
  if (g_state != nullptr) {
    try {
      if (ProfilerStateBase::get(/*global=*/false) == g_state) ProfilerStateBase::pop(/*global=*/false);
    } catch (...) {
    }
    g_state = nullptr;
  }
  wait_until_idle();
  std::lock_guard<std::mutex> lock(g_mutex);
  g_taken.clear();
  for (auto& b : g_buffers) {
    if (!b->any_handed) {
      g_taken.push_back(b);
      continue;
    }
    try {  // (some of its rows were handed over while it had an operator open: the rest, open ones too)
      auto rest = std::make_shared<ThreadBuffer>();
      rest->tid = b->tid;
      copy_completed(*b, *rest, true);
      rest->mem.swap(b->mem);
      g_taken.push_back(std::move(rest));
    } catch (...) {  // no memory: this thread's rest is lost, the others' read
    }
  }
  int64_t n = 0;
  for (auto& b : g_taken) n += int64_t(b->ops.size());
  return n;
}

// While recording (from any thread, one caller at a time): hands over what the threads have completed.
// Tries for up to `patience_us` to find each buffer's thread between operators (no operator open, no
// callback running); a thread that stays inside one keeps its buffer until a later take or stop.
// Returns the number of operators taken; read them with the functions below, then
// polyprof_observer_release.
int64_t polyprof_observer_take(int64_t patience_us) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_taken.clear();
  if (!g_recording.load(std::memory_order_seq_cst)) return 0;
  int64_t n = 0;
  visit_claimed(patience_us, [&n](ThreadBuffer& b) {
    if (b.inside.load(std::memory_order_acquire) != 0) return false;
    bool no_async = b.async_open.load(std::memory_order_acquire) == 0;
    bool between_ops = b.open.empty() && no_async;
    if (between_ops && !b.any_handed) {
      if (!b.ops.empty() || !b.mem.empty()) {
        try {
          g_taken.reserve(g_taken.size() + 1);  // nothing throws once the contents are moved
          auto out = std::make_shared<ThreadBuffer>();
          move_contents(b, *out);
          n += int64_t(out->ops.size());
          g_taken.push_back(std::move(out));
        } catch (...) {  // no memory for the hand-over: the buffer keeps its ops for a later take or stop
        }
      }
      return true;
    }
    if (!no_async) return false;  // (an async operator's end finds its row by index: nothing moves then)
    // inside an operator, or after such a take: what is complete is copied out (the rows stay)
    try {
      g_taken.reserve(g_taken.size() + 1);
      auto out = std::make_shared<ThreadBuffer>();
      out->tid = b.tid;
      size_t copied = copy_completed(b, *out, false);
      out->mem.swap(b.mem);
      n += int64_t(copied);
      if (copied || !out->mem.empty()) g_taken.push_back(std::move(out));
      if (between_ops) empty_contents(b);  // all of it handed over now
    } catch (...) {  // no memory: what was not marked stays for a later take or stop
    }
    return between_ops;
  });
  return n;
}

// While recording: the operators open now on every thread (a dump's view of what a hang is stuck in),
// as lines "tid\x1fstart\x1fname\n" written into `out` (at most `cap` bytes); returns the bytes the whole
// list takes (call again with more room when it is more than `cap`). A thread is read only between
// its callbacks (claimed as take claims it, for up to `patience_us`); one that stays inside is left out.
int64_t polyprof_observer_open_ops(char* out, int64_t cap, int64_t patience_us) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_recording.load(std::memory_order_seq_cst)) return 0;
  std::string text;
  visit_claimed(patience_us, [&text](ThreadBuffer& b) {
    if (b.inside.load(std::memory_order_acquire) != 0) return false;
    for (const OpenOp& open : b.open) {
      const Op& op = *open.row;
      OpFields f = unpack(b, op);
      if (f.name < 0 || size_t(f.name) >= b.names.size()) continue;
      text += std::to_string(b.tid) + '\x1f' + std::to_string(op.start) + '\x1f' + b.names[size_t(f.name)] + '\n';
    }
    return true;
  });
  if (int64_t(text.size()) <= cap) std::memcpy(out, text.data(), text.size());
  return int64_t(text.size());
}

// Frees what the last take handed over.
void polyprof_observer_release() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_taken.clear();
}

// Bytes needed by polyprof_observer_names.
int64_t polyprof_observer_names_size() {
  std::lock_guard<std::mutex> lock(g_mutex);
  int64_t size = 0;
  for (auto& b : g_taken)
    for (auto& s : b->names) size += int64_t(s.size()) + 1;
  return size;
}

// Every thread's names, NUL-terminated, thread after thread; name ids in polyprof_observer_fill are
// indices into this list.
void polyprof_observer_names(char* out) {
  std::lock_guard<std::mutex> lock(g_mutex);
  for (auto& b : g_taken) {
    for (auto& s : b->names) {
      std::memcpy(out, s.c_str(), s.size() + 1);
      out += s.size() + 1;
    }
  }
}

// Fills one array per field, operators thread after thread, each thread's in start order.
// end is 0 for an operator still open at stop; overload is -1 where none was recorded.
void polyprof_observer_fill(int64_t* start, int64_t* end, int64_t* tid, int64_t* seq, int64_t* fwd_tid,
                            int64_t* rf_tid, int32_t* name, uint8_t* scope, uint64_t* handle,
                            int32_t* overload, int32_t* modules) {
  std::lock_guard<std::mutex> lock(g_mutex);
  int64_t i = 0;
  int32_t name_base = 0;
  for (auto& b : g_taken) {
    size_t frames_at = 0;  // the next flagged op's entry: they are in op order
    for (const Op& op : b->ops) {
      OpFields f = unpack(*b, op);
      start[i] = op.start;
      end[i] = op_end(*b, op);
      tid[i] = b->tid;
      seq[i] = f.seq;
      fwd_tid[i] = f.fwd_tid;
      rf_tid[i] = f.rf_tid;
      name[i] = name_base + f.name;
      scope[i] = f.scope;
      handle[i] = f.handle;
      overload[i] = f.overload >= 0 ? name_base + f.overload : -1;
      bool framed = (op.name_scope & kHasFrames) && frames_at < b->frames.size();
      modules[i] = framed ? b->frames[frames_at++] : -1;
      ++i;
    }
    name_base += int32_t(b->names.size());
  }
}

// Args of every operator as JSON fragments, seven per op in fill order, each followed by a NUL byte
// (JSON text never holds a raw one): Sequence number, Fwd thread id, Concrete Inputs, Input type,
// Input Strides, Input Dims, and the extra args (an object body: kwargs, flops, Module Hierarchy). An
// empty fragment means torch writes no such key. The text stays valid until the next call or
// polyprof_observer_reset.
const char* polyprof_observer_arg_fragments(int64_t* size) {
  static std::string out;
  out.clear();
  std::lock_guard<std::mutex> lock(g_mutex);
  for (auto& b : g_taken) {
    ShapeStore::Cursor shapes_at;  // the next op's record: they are in op order
    for (const Op& packed : b->ops) {
      OpFields op = unpack(*b, packed);
      if (op.seq >= 0) append_int(out, op.seq);
      out.push_back('\0');
      if (op.seq >= 0) append_int(out, op.fwd_tid);
      out.push_back('\0');
      if (packed.name_scope & kHasShapes) {
        append_shape_fragments(out, *b, shapes_at);
      } else {
        out.append(4, '\0');
      }
      if (op.extra >= 0) out += b->extra.c_str() + op.extra;
      out.push_back('\0');
    }
  }
  *size = int64_t(out.size());
  return out.data();
}

// The extra args of the operators that have any (kwargs, flops, Module Hierarchy, collective args), for
// a read-out without record_shapes: "index\0body\0" per such operator, index in fill order. The text
// stays valid until the next call or polyprof_observer_reset.
const char* polyprof_observer_extras(int64_t* size) {
  static std::string out;
  out.clear();
  std::lock_guard<std::mutex> lock(g_mutex);
  int64_t i = 0;
  for (auto& b : g_taken) {
    for (const Op& packed : b->ops) {
      int64_t extra = packed.rare ? b->rare[packed.rare - 1].extra : -1;
      if (extra >= 0) {
        append_int(out, i);
        out.push_back('\0');
        out += b->extra.c_str() + extra;
        out.push_back('\0');
      }
      ++i;
    }
  }
  *size = int64_t(out.size());
  return out.data();
}

// The hierarchy table (see hierarchy_id): each id's JSON string value followed by a NUL byte. The text
// stays valid until the next call.
const char* polyprof_observer_hierarchies(int64_t* size) {
  static std::string out;
  out.clear();
  std::lock_guard<std::mutex> lock(g_hierarchy_mutex);
  for (const std::string& entry : g_hierarchies) {
    out += entry;
    out.push_back('\0');
  }
  *size = int64_t(out.size());
  return out.data();
}

// How many allocator reports were recorded (profile_memory), over every thread.
int64_t polyprof_observer_memory_count() {
  std::lock_guard<std::mutex> lock(g_mutex);
  int64_t n = 0;
  for (auto& b : g_taken) n += int64_t(b->mem.size());
  return n;
}

// The allocator reports: 8 int64 per report (ts, ptr, bytes, total allocated, total reserved, device
// type, device index, thread id), thread after thread. ptr 0 marks an out-of-memory report.
void polyprof_observer_memory_fill(int64_t* out) {
  std::lock_guard<std::mutex> lock(g_mutex);
  for (auto& b : g_taken) {
    for (const Mem& m : b->mem) {
      out[0] = m.ts;
      out[1] = m.ptr;
      out[2] = m.bytes;
      out[3] = m.total_allocated;
      out[4] = m.total_reserved;
      out[5] = m.device_type;
      out[6] = m.device_index;
      out[7] = b->tid;
      out += 8;
    }
  }
}

// Frees what was recorded.
void polyprof_observer_reset() {
  std::lock_guard<std::mutex> lock(g_mutex);
  for (auto& b : g_buffers) {  // threads keep a reference to their buffer until they next record
    b->ops.clear();
    std::vector<Rare>().swap(b->rare);
    b->shapes.clear();
    std::vector<int32_t>().swap(b->frames);
    std::vector<c10::IValue>().swap(b->values);
    std::string().swap(b->extra);
    std::vector<Mem>().swap(b->mem);
  }
  g_buffers.clear();
  g_taken.clear();
  g_generation.fetch_add(1);
}

// -- the bridge for polyprof's record_function ---------------------------------------------------------

// Whether a torch-side consumer other than polyprof's observer listens to RecordFunctions on this
// thread: the callbacks a user-scope RecordFunction would run now (torch's own lookup, thread-local
// and global: torch.profiler, an ExecutionTraceObserver, emit_nvtx...), less polyprof's observer and
// torch's collector when polyprof itself started it. ~6 ns when nobody listens.
int polyprof_torch_consumers() {
  auto step = at::getStepCallbacksUnlessEmpty(at::RecordScope::USER_SCOPE);
  if (!step.has_value()) return 0;
  for (const auto& cb : step->callbacks_) {
    if (cb.start_ == on_start) continue;
    bool own = false;
    for (auto fn : g_collector_callbacks) own = own || fn == cb.start_;
    if (!own) return 1;
  }
  return 0;
}

// Tells the bridge that the callbacks torch's collector registered on this thread are polyprof's own
// (its collector path), so that polyprof's record_function does not route through them; 0 forgets them.
void polyprof_note_collector_state(int on) {
  g_collector_callbacks.clear();
  if (!on) return;
  auto step = at::getStepCallbacksUnlessEmpty(at::RecordScope::USER_SCOPE);
  if (!step.has_value()) return;
  for (const auto& cb : step->callbacks_) {
    if (cb.start_ != on_start) g_collector_callbacks.push_back(cb.start_);
  }
}

// Opens a torch RecordFunction (user scope) named `name`, with `args` as its one string input when
// given (as torch.profiler.record_function does). Returns it (nullptr when nobody listens) and its
// handle in *handle (torch's "Record function id": 0 unless a consumer asked for ids).
void* polyprof_rf_enter(const char* name, const char* args, uint64_t* handle) {
  *handle = 0;
  try {
    auto* rf = new at::RecordFunction(at::RecordScope::USER_SCOPE);
    if (!rf->isActive()) {
      delete rf;
      return nullptr;
    }
    t_state.skip_next = true;
    if (rf->needsInputs() && args != nullptr) {
      c10::IValue input{std::string(args)};
      rf->before(name, c10::ArrayRef<const c10::IValue>(&input, 1));
    } else {
      rf->before(name);
    }
    t_state.skip_next = false;
    *handle = rf->handle();
    return rf;
  } catch (...) {
    t_state.skip_next = false;
    return nullptr;
  }
}

// Ends and frees a RecordFunction from polyprof_rf_enter.
void polyprof_rf_exit(void* rf) {
  try {
    delete static_cast<at::RecordFunction*>(rf);  // ends it
  } catch (...) {
  }
}

// The crash dump's part (polyprof's C recorder calls it from its fatal-signal handler after its own
// rows, with `put`, which writes into the crash file through the recorder's buffer; _native/csrc/recorder.c
// gives the file's layout): every thread's ops not yet taken, reading the buffers as they are (no lock:
// the crashing thread may hold g_mutex; no allocation). Per buffer: 2, tid, ops, names, then ops x
// (start, end or 0 while open, name id or -1) and names x (uint32 length, bytes), all little-endian
// int64 but the lengths.
void polyprof_observer_crash_rows(void (*put)(const void* bytes, size_t n)) {
  auto i64 = [put](int64_t v) { put(&v, sizeof v); };
  size_t count = g_buffers.size();
  for (size_t i = 0; i < count && i < g_buffers.size(); i++) {
    const ThreadBuffer* b = g_buffers[i].get();
    if (b == nullptr || b->claimed.load(std::memory_order_relaxed)) continue;  // (a take is moving it)
    size_t ops = b->ops.size(), names = b->names.size(), unhanded = 0;
    for (size_t k = b->handed_at; k < ops; k++) unhanded += (b->ops[k].name_scope & kHandedOver) == 0;
    i64(2), i64(b->tid), i64(int64_t(unhanded)), i64(int64_t(names));
    for (size_t k = b->handed_at; k < ops; k++) {
      const Op& op = b->ops[k];
      if (op.name_scope & kHandedOver) continue;  // (a take has it: it is in the spill)
      uint32_t name = op.name_scope >> 8;
      int64_t id = name == kNameRare ? (op.rare && op.rare <= b->rare.size() ? b->rare[op.rare - 1].name : -1)
                                     : int64_t(name);
      int64_t end = op.dur == kStillOpen ? 0
                    : op.dur == kFarEnd   ? (op.rare && op.rare <= b->rare.size() ? b->rare[op.rare - 1].end : op.start)
                                          : op.start + int64_t(op.dur);
      i64(op.start), i64(end), i64(id >= 0 && size_t(id) < names ? id : -1);
    }
    for (size_t k = 0; k < names; k++) {
      uint32_t len = uint32_t(std::min<size_t>(b->names[k].size(), 4096));
      put(&len, sizeof len);
      put(b->names[k].data(), len);
    }
  }
}
