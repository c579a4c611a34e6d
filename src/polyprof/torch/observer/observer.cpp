// polyprof's PyTorch operator observer: a RecordFunction callback pair that appends each operator to a
// per-thread columnar buffer, read out in bulk after stop through a small C ABI (loaded with ctypes).
//
// Built on first use against the installed torch by polyprof/torch/observer/builder.py, so it
// always matches that torch's headers and C++ ABI. No pybind11, no Python objects on the hot path.
//
// Besides the operators it serves what torch-side code expects of "a profiler is on":
//   * while recording it pushes a profiler state of type KINETO on the starting thread, so that
//     torch._C._autograd._profiler_type() reports KINETO, _RecordFunctionFast and kwargs-carrying
//     ranges are recorded, and (with profile_memory) the allocator reports to it ([memory] rows);
//   * polyprof_rf_enter/exit open a torch RecordFunction for a polyprof record_function when another
//     torch-side consumer (torch's profiler, an ExecutionTraceObserver) is listening
//     (polyprof_torch_consumers); the observer itself does not record those, polyprof's host backend
//     does, with the RecordFunction's handle.
//
// Threading: callbacks run on the threads that run operators. Each thread appends to its own buffer; the
// only shared state touched per operator is the `recording` flag (and, read only, the TSC clock's
// rate). Stop clears the flag, then waits until no callback is inside a buffer (each buffer's `inside`
// mark, see Busy), so reading afterwards is race-free. While recording, polyprof_observer_take hands
// over what threads have completed: it claims the buffers, and moves the contents out of those whose
// thread is outside any callback and has no operator open (a callback that starts meanwhile waits the
// few microseconds the hand-over takes).
// Everything read out (names, fill, fragments, memory) is the set last taken: by take, or by stop.

#include <Python.h>  // with_modules in eager mode: the Python frames of the thread that runs an op
#include <frameobject.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>
#include <c10/core/Allocator.h>
#include <c10/core/ScalarType.h>
#include <torch/csrc/jit/runtime/interpreter.h>
#include <torch/csrc/profiler/orchestration/observer.h>
#include <torch/csrc/profiler/util.h>

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <time.h>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace {

constexpr int kAbiVersion = 11;

// Options of polyprof_observer_start (bit flags).
constexpr int kRecordShapes = 1;
constexpr int kProfileMemory = 2;
constexpr int kWithFlops = 4;
constexpr int kWithModules = 8;
constexpr int kAllThreads = 16;
constexpr int kOverloadNames = 32;
constexpr int kTopLevelOnly = 64;  // only ops no other op of the thread is open around, annotations and collectives

// Input encodings in ThreadBuffer::shapes (record_shapes): one head per input, tag | payload << 8, and
// for tensors the sizes (and strides) after it.
enum InputTag : int64_t {
  kNone = 0,         // None: type ""
  kOther = 1,        // device, string, generator...: type ""
  kTensor = 2,       // payload dtype | ndim << 8; sizes..., strides...
  kTensorNoShape = 3,  // nested/sparse/symbolic tensors: payload dtype
  kUndefinedTensor = 4,
  kScalar = 5,       // payload: index into ThreadBuffer::values (a complex or symbolic scalar)
  kScalarList = 6,   // (read out only: what kIntList, kDoubleList and kBoolList are)
  kTensorList = 7,   // payload: count; then one tensor encoding per element
  kTensorContiguous = 8,  // as kTensor, its strides the contiguous ones of its sizes: sizes only
  kInt = 9,          // a Scalar int, its value after the head
  kDouble = 10,      // a Scalar double, its bits after the head
  kBool = 11,        // a Scalar bool, its value after the head
  kIntList = 12,     // payload: count; the ints after the head
  kDoubleList = 13,  // payload: count; the doubles' bits after the head
  kBoolList = 14,    // payload: count; the bools after the head
};
// Scalars and lists of them are kept in the record (kInt... kBoolList), not as IValues: keeping the
// c10::List torch boxed an int[] argument into held its memory past the op (so that malloc could not
// hand the same block to the next op) and cost an atomic reference count per op.

inline int64_t input_head(int64_t tag, int64_t payload) { return tag | payload << 8; }

// What on_start learns of an operator, before it is buffered (packed into an Op, and a Rare if needed).
struct OpFields {
  int64_t seq = -1;
  int64_t fwd_tid = 0;
  int64_t rf_tid = 0;
  int64_t shapes = -1;  // on_start: where its record starts in ThreadBuffer::shapes (-1: none); kept as
                        // the kHasShapes flag only, the records being in op order
  int64_t extra = -1;   // offset into ThreadBuffer::extra (kwargs, flops, module hierarchy), -1 if none
  uint64_t handle = 0;  // the RecordFunction's handle (torch's "Record function id"; 0 unless ids are on)
  int32_t name = 0;
  int32_t overload = -1;  // name id of the overload name, -1 if none or not asked for
  int32_t modules = -1;   // with_modules (eager): id of its Module Hierarchy in the hierarchy table, -1 if none
  uint8_t scope = 0;
};

// An operator as buffered: 24 bytes. What an op without args rarely has (a forward thread other than
// its buffer's usual one, another RecordFunction thread id, shapes, extra args, a handle, an overload, a
// sequence number past int32, a duration past ~4.3 s, a name id past 2^24) is in ThreadBuffer::rare;
// its eager Module Hierarchy (with_modules) is in ThreadBuffer::frames.
constexpr uint32_t kStillOpen = 0xFFFFFFFFu;  // dur while the op runs
constexpr uint32_t kFarEnd = 0xFFFFFFFEu;     // dur: the end is in its Rare
constexpr int32_t kSeqRare = INT32_MIN;       // seq: in its Rare
constexpr uint32_t kNameRare = 0xFFFFFFu;     // name bits: in its Rare
constexpr uint32_t kFwdCommon = 0x10;         // name_scope flag: fwd_tid is the buffer's usual one
constexpr uint32_t kHasShapes = 0x20;         // name_scope flag: the op's inputs are the buffer's next
                                              // shapes record (records are in op order: no offset kept)
constexpr uint32_t kHasFrames = 0x40;         // name_scope flag: its Module Hierarchy id is the
                                              // buffer's next entry in ThreadBuffer::frames (op order)
constexpr uint32_t kHandedOver = 0x80;       // name_scope flag: copied out by a take while its thread had
                                              // an operator open (the row stays: open rows point past it)
struct Op {
  int64_t start = 0;
  uint32_t dur = kStillOpen;
  uint32_t name_scope = 0;  // name << 8 | flags (0xF0) | scope (0x0F)
  int32_t seq = -1;
  uint32_t rare = 0;        // 1 + index into ThreadBuffer::rare; 0: none
};
static_assert(sizeof(Op) == 24, "an operator row is 24 bytes");

struct Rare {
  int64_t seq, fwd_tid, rf_tid, extra, end;
  uint64_t handle;
  int32_t name, overload;
};

// Memory for op rows from polyprof's C extension (row_chunks.c: 192 KiB chunks, faulted in ahead by
// its helper thread while recording), set once by polyprof_observer_use_runtime before the first
// recording; without it (no C extension) chunks come from operator new.
using ChunkNewFn = void* (*)(int ahead);
using ChunkFreeFn = void (*)(void* chunk);
ChunkNewFn g_chunk_new = nullptr;
ChunkFreeFn g_chunk_free = nullptr;
std::atomic<bool> g_chunks_used{false};  // a chunk was allocated: the allocator stays as it is

// The ops of a thread in chunks of 8,192 (192 KiB: one of row_chunks.c's chunks, page-aligned, given
// back when freed), so that an op costs its 24 bytes and nothing more (a std::deque's 512-byte blocks
// cost more with malloc's headers), and an op's index stays valid while more are added (async ops end by
// index). A store's first chunk faults in as it fills (a thread that runs few ops keeps little
// resident); the next come faulted in ahead where the pool has them.
class OpStore {
 public:
  static constexpr size_t kChunk = 8192;
  static constexpr size_t kChunkBytes = kChunk * sizeof(Op);
  OpStore() = default;
  OpStore(const OpStore&) = delete;
  OpStore& operator=(const OpStore&) = delete;
  ~OpStore() { clear(); }
  size_t size() const { return chunks_.size() * kChunk - size_t(end_ - next_); }  // (0 before the first chunk)
  bool empty() const { return size() == 0; }
  Op& operator[](size_t i) { return chunks_[i / kChunk][i % kChunk]; }
  const Op& operator[](size_t i) const { return chunks_[i / kChunk][i % kChunk]; }
  Op& back() { return (*this)[size() - 1]; }
  Op& push_back(const Op& op) {
    if (next_ == end_) grow();
    Op* slot = next_++;
    new (slot) Op(op);
    __builtin_prefetch(slot + 8, 1, 3);  // the pool's chunks were faulted in on another core
    return *slot;
  }
  void swap(OpStore& other) {
    chunks_.swap(other.chunks_);
    std::swap(next_, other.next_);
    std::swap(end_, other.end_);
  }
  void clear() {
    for (Op* chunk : chunks_) {
      if (g_chunk_free != nullptr) g_chunk_free(chunk);
      else ::operator delete(chunk);
    }
    std::vector<Op*>().swap(chunks_);
    next_ = end_ = nullptr;
  }
  struct const_iterator {
    const OpStore* store;
    size_t i;
    const Op& operator*() const { return (*store)[i]; }
    const_iterator& operator++() {
      ++i;
      return *this;
    }
    bool operator!=(const const_iterator& other) const { return i != other.i; }
  };
  const_iterator begin() const { return {this, 0}; }
  const_iterator end() const { return {this, size()}; }

 private:
  void grow() {
    g_chunks_used.store(true, std::memory_order_relaxed);
    chunks_.reserve(chunks_.size() + 1);  // (a throw here leaves nothing allocated)
    void* chunk = g_chunk_new != nullptr ? g_chunk_new(!chunks_.empty()) : ::operator new(kChunkBytes);
    if (chunk == nullptr) throw std::bad_alloc();
    chunks_.push_back(static_cast<Op*>(chunk));
    next_ = static_cast<Op*>(chunk);
    end_ = next_ + kChunk;
  }
  std::vector<Op*> chunks_;
  Op* next_ = nullptr;  // the next row's place in the last chunk
  Op* end_ = nullptr;   // the last chunk's end
};

// A thread's shapes records (record_shapes), in op order, in chunks from the same allocator as the op
// rows (faulted in ahead, never copied to grow: a vector doubling faulted its new pages in and moved
// every record, ~10 % of an op's time with shapes). A record never spans chunks; one bigger than a
// chunk (an op with thousands of inputs) gets a chunk of its own size.
class ShapeStore {
 public:
  static constexpr size_t kInts = OpStore::kChunkBytes / sizeof(int64_t);
  struct Cursor {
    size_t chunk = 0, pos = 0;
  };
  ShapeStore() = default;
  ShapeStore(const ShapeStore&) = delete;
  ShapeStore& operator=(const ShapeStore&) = delete;
  ~ShapeStore() { clear(); }

  // Room for `need` ints after the last record; commit() says how many were written.
  int64_t* reserve(size_t need) {
    if (room_ == nullptr || size_t(limit_ - room_) < need) grow(need);
    return room_;
  }
  // The room left after the last record, [room(), limit()) (both nullptr before the first chunk).
  int64_t* room() const { return room_; }
  const int64_t* limit() const { return limit_; }
  void commit(int64_t* end) { room_ = end; }
  // The record at `c` (records are read in the order they were written; an empty chunk, left by a
  // record that threw, is passed over); advance with advance().
  const int64_t* at(Cursor& c) const {
    while (c.pos >= filled(c.chunk)) c.chunk++, c.pos = 0;
    return chunks_[c.chunk].data + c.pos;
  }
  void advance(Cursor& c, const int64_t* end) const { c.pos = size_t(end - chunks_[c.chunk].data); }
  // Where `c` is, without passing to the next record's chunk (after advance: the end of the record read).
  const int64_t* position(const Cursor& c) const { return chunks_[c.chunk].data + c.pos; }
  void swap(ShapeStore& other) {
    chunks_.swap(other.chunks_);
    std::swap(room_, other.room_);
    std::swap(limit_, other.limit_);
  }
  void clear() {
    for (Chunk& c : chunks_) release(c);
    std::vector<Chunk>().swap(chunks_);
    room_ = limit_ = nullptr;
  }

 private:
  struct Chunk {
    int64_t* data;
    size_t cap, filled;  // filled: kept up to date for all but the last chunk (room_ says its own)
  };
  size_t filled(size_t chunk) const {
    return chunk + 1 == chunks_.size() ? size_t(room_ - chunks_[chunk].data) : chunks_[chunk].filled;
  }
  void grow(size_t need) {
    chunks_.reserve(chunks_.size() + 1);  // (a throw here leaves nothing allocated)
    size_t cap = std::max(need, kInts);
    void* data;
    g_chunks_used.store(true, std::memory_order_relaxed);  // the allocator stays as release() expects
    if (cap == kInts && g_chunk_new != nullptr) {
      data = g_chunk_new(!chunks_.empty());
      if (data == nullptr) throw std::bad_alloc();
    } else {
      data = ::operator new(cap * sizeof(int64_t));
    }
    if (!chunks_.empty()) chunks_.back().filled = size_t(room_ - chunks_.back().data);
    chunks_.push_back(Chunk{static_cast<int64_t*>(data), cap, 0});
    room_ = static_cast<int64_t*>(data);
    limit_ = room_ + cap;
  }
  static void release(Chunk& c) {
    if (c.cap == kInts && g_chunk_free != nullptr) g_chunk_free(c.data);
    else ::operator delete(c.data);
  }
  std::vector<Chunk> chunks_;
  int64_t* room_ = nullptr;   // after the last record, in the last chunk
  int64_t* limit_ = nullptr;  // the last chunk's end
};

// One allocator report: positive bytes allocate, negative free.
struct Mem {
  int64_t ts;
  int64_t ptr;
  int64_t bytes;
  int64_t total_allocated;
  int64_t total_reserved;
  int64_t device_type;
  int64_t device_index;
};

// A name's id by the address torch handed it at: a two-way cache in front of ThreadBuffer::name_ids
// (direct-mapped, two of a model's few op names sharing a slot took turns evicting each other: in some
// processes one op in five went the slow way, copying its operator name). A range named by a string
// (a Python record_function) may hand a later, different name at a freed name's address, so such a hit
// is verified by content; an operator's name lives in its schema, which no other name can share while
// the operator is registered, so a slot marked with the schema epoch (see SchemaEpoch) needs no check
// while the epoch holds.
struct NameSlot {
  const char* ptr;
  int32_t id;
  uint64_t schema_epoch;  // 0: verify by content
};
constexpr size_t kNameSlots = 256;  // 128 sets of two

inline size_t name_set(const char* name) {  // the first of its set's two slots
  uint64_t a = uint64_t(uintptr_t(name)) * 0x9E3779B97F4A7C15ull;  // every address bit moves the top ones
  return size_t(a >> 57) * 2;
}

struct OpenOp {
  Op* row;          // in ops (its chunk never moves)
  const void* key;  // its RecordFunction, to pair start and end
  bool function;    // an operator (not a user annotation): what top-level-only counts as "inside"
};

struct ThreadBuffer {
  int64_t tid = 0;
  OpStore ops;
  std::vector<Rare> rare;
  int64_t rf_common = 0, fwd_common = 0;  // the RecordFunction thread id and forward thread id most ops have
  bool rf_set = false, fwd_set = false;
  std::vector<OpenOp> open;  // innermost last
  int open_functions = 0;    // of them, operators (see OpenOp::function)
  std::vector<std::string> names;
  std::unordered_map<std::string, int32_t> name_ids;
  NameSlot name_by_ptr[kNameSlots] = {};  // cache of name_ids by the name's address (see NameSlot)
  ShapeStore shapes;
  std::vector<int32_t> frames;  // the Module Hierarchy id of each op flagged kHasFrames, in op order
  std::vector<c10::IValue> values;
  std::string extra;  // NUL-terminated JSON object bodies ("key": value, ...)
  std::vector<Mem> mem;
  std::atomic<int> inside{0};         // callbacks of its thread inside it (written by that thread only)
  std::atomic<bool> claimed{false};   // take is moving its contents out (written by take only)
  std::atomic<int> async_open{0};  // async operators started here and not yet ended (they hold indices)
  // Rows copied out while an operator was open (kHandedOver): those before `handed_at` all are, and
  // `shapes_at`, `frames_at` are where that row's shapes record and hierarchy entry are (see copy_completed)
  bool any_handed = false;
  size_t handed_at = 0, frames_at = 0;
  ShapeStore::Cursor shapes_at;
};

// Moves what `from` recorded into `to` (same thread id), leaving `from` empty for its thread.
void move_contents(ThreadBuffer& from, ThreadBuffer& to) {
  to.tid = from.tid;
  to.ops.swap(from.ops);
  to.rare.swap(from.rare);
  to.rf_common = from.rf_common, to.fwd_common = from.fwd_common;
  to.rf_set = from.rf_set, to.fwd_set = from.fwd_set;
  to.names.swap(from.names);
  to.name_ids.swap(from.name_ids);
  std::swap(to.name_by_ptr, from.name_by_ptr);
  to.shapes.swap(from.shapes);
  to.frames.swap(from.frames);
  to.values.swap(from.values);
  to.extra.swap(from.extra);
  to.mem.swap(from.mem);
}

// `b` emptied, as a new buffer of its thread (everything it held freed).
void empty_contents(ThreadBuffer& b) {
  ThreadBuffer gone;
  move_contents(b, gone);
  std::vector<Rare>().swap(b.rare);  // (move_contents swaps: `gone` had none)
  b.any_handed = false;
  b.handed_at = b.frames_at = 0;
  b.shapes_at = ShapeStore::Cursor{};
}

// An op's fields packed into its 24-byte row (and a Rare when it needs one; `async` ops always get one,
// so that ending them on another thread never grows this buffer's vectors).
Op pack(ThreadBuffer* b, const OpFields& f, bool async) {
  Op op;
  op.seq = f.seq >= -1 && f.seq <= INT32_MAX ? int32_t(f.seq) : kSeqRare;
  if (!b->rf_set) b->rf_common = f.rf_tid, b->rf_set = true;
  if (f.fwd_tid != 0 && !b->fwd_set) b->fwd_common = f.fwd_tid, b->fwd_set = true;
  bool fwd_common = f.fwd_tid != 0 && f.fwd_tid == b->fwd_common;
  bool name_rare = uint32_t(f.name) >= kNameRare;
  op.name_scope = (name_rare ? kNameRare : uint32_t(f.name)) << 8 | (fwd_common ? kFwdCommon : 0) |
                  (f.shapes >= 0 ? kHasShapes : 0) | (f.scope & 0x0F);
  bool rare = async || name_rare || op.seq == kSeqRare || (f.fwd_tid != 0 && !fwd_common) ||
              f.rf_tid != b->rf_common || f.extra >= 0 || f.handle != 0 || f.overload >= 0;
  if (rare) {
    b->rare.push_back(Rare{f.seq, f.fwd_tid, f.rf_tid, f.extra, 0, f.handle, f.name, f.overload});
    op.rare = uint32_t(b->rare.size());
  }
  return op;
}

OpFields unpack(const ThreadBuffer& b, const Op& op) {
  OpFields f;
  uint32_t name = op.name_scope >> 8;
  f.scope = uint8_t(op.name_scope & 0x0F);  // (modules: in the frames, read in op order)
  f.seq = op.seq;
  f.fwd_tid = (op.name_scope & kFwdCommon) ? b.fwd_common : 0;
  f.rf_tid = b.rf_common;
  f.name = int32_t(name);
  if (op.rare) {
    const Rare& r = b.rare[op.rare - 1];
    f.seq = r.seq, f.fwd_tid = r.fwd_tid, f.rf_tid = r.rf_tid, f.extra = r.extra;
    f.handle = r.handle, f.name = r.name, f.overload = r.overload;
  }
  return f;
}

// 0 for an op still open
int64_t op_end(const ThreadBuffer& b, const Op& op) {
  if (op.dur == kStillOpen) return 0;
  if (op.dur == kFarEnd) return op.rare ? b.rare[op.rare - 1].end : op.start;
  return op.start + int64_t(op.dur);
}

__attribute__((noinline)) void set_far_end(ThreadBuffer& b, Op& op, int64_t t) {
  if (op.rare == 0) {  // only on the op's own thread (async ops have theirs already)
    b.rare.push_back(Rare{op.seq, (op.name_scope & kFwdCommon) ? b.fwd_common : 0, b.rf_common, -1, 0, 0,
                          int32_t(op.name_scope >> 8), -1});
    op.rare = uint32_t(b.rare.size());
  }
  b.rare[op.rare - 1].end = t;
  op.dur = kFarEnd;
}

inline void set_end(ThreadBuffer& b, Op& op, int64_t t) {
  uint64_t d = uint64_t(t - op.start);
  if (__builtin_expect(d < kFarEnd, 1)) op.dur = uint32_t(d);
  else set_far_end(b, op, t);  // a negative duration too
}

struct AsyncContext : at::ObserverContext {
  std::shared_ptr<ThreadBuffer> buffer;
  int64_t index = 0;
};

std::mutex g_mutex;
std::vector<std::shared_ptr<ThreadBuffer>> g_buffers;
std::vector<std::shared_ptr<ThreadBuffer>> g_taken;  // what the read-out functions read
std::atomic<bool> g_recording{false};
std::atomic<uint64_t> g_generation{0};
int g_options = 0;
at::CallbackHandle g_handle = 0;
std::string g_error;

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

// -- operator inputs (record_shapes) ------------------------------------------------------------------

// Whether a tensor has sizes and strides to record (strided, not nested, not symbolic).
inline __attribute__((always_inline)) bool plain_tensor(const at::Tensor& t) {
  return t.layout() == c10::kStrided && !t.is_nested() && !t.unsafeGetTensorImpl()->has_symbolic_sizes_strides();
}

size_t tensor_ints(const at::Tensor& t) {  // at most
  return t.defined() ? 1 + 2 * size_t(t.dim()) : 1;
}

// A tensor's part of a shapes record at p, if it fits before `limit` (else nullptr): its head (tag,
// scalar type, rank), its sizes, and its strides unless they are exactly the contiguous strides of its
// sizes (as at::Tensor::contiguous() makes them; not is_contiguous(), which lets a size-1 dimension
// have any stride). One pass copies the sizes and compares the strides.
inline __attribute__((always_inline)) int64_t* write_tensor(int64_t* p, const int64_t* limit, const at::Tensor& t) {
  if (p >= limit) return nullptr;
  if (!t.defined()) {
    *p++ = kUndefinedTensor;
    return p;
  }
  int64_t st = int64_t(t.scalar_type());
  if (!plain_tensor(t)) {
    *p++ = input_head(kTensorNoShape, st);
    return p;
  }
  c10::IntArrayRef sizes = t.sizes(), strides = t.strides();
  const int64_t* size = sizes.data();
  const int64_t* stride = strides.data();
  size_t ndim = sizes.size();
  if (size_t(limit - p) < 1 + 2 * ndim) return nullptr;
  int64_t* head = p++;
  uint64_t expected = 1;  // (unsigned: huge expanded sizes wrap the product instead of overflowing)
  bool contiguous = true;
  for (size_t d = ndim; d-- > 0;) {
    p[d] = size[d];
    contiguous &= uint64_t(stride[d]) == expected;
    expected *= uint64_t(std::max<int64_t>(size[d], 1));
  }
  p += ndim;
  *head = input_head(contiguous ? kTensorContiguous : kTensor, st | int64_t(ndim) << 8);
  if (contiguous) return p;
  for (size_t d = 0; d < ndim; ++d) p[d] = stride[d];
  return p + ndim;
}

// The most words an input can take in a record.
size_t input_ints(const c10::IValue& v) {
  if (v.isTensor()) return tensor_ints(v.toTensor());
  if (v.isList()) {  // a tensor list's tensors, or the values of a list of scalars
    auto elements = v.toListRef();
    size_t n = 1 + elements.size();
    if (!elements.empty() && (elements[0].isInt() || elements[0].isDouble() || elements[0].isBool())) return n;
    for (const c10::IValue& e : elements) n += e.isTensor() ? tensor_ints(e.toTensor()) - 1 : 0;
    return n;
  }
  return 2;
}

// A list input's part of a record at p, if it fits before `limit` (else nullptr). Each is*List() asks
// the list's element type out of line (isTensorList() with a shared_ptr's two atomics), so its first
// element picks the one to ask; an empty list asks them in turn.
int64_t* write_list(int64_t* p, const int64_t* limit, const c10::IValue& v) {
  auto elements = v.toListRef();
  size_t n = elements.size();
  const c10::IValue* first = n != 0 ? &elements[0] : nullptr;
  if ((first == nullptr || first->isTensor()) && v.isTensorList()) {
    if (p >= limit) return nullptr;
    *p++ = input_head(kTensorList, int64_t(n));
    for (const c10::IValue& e : elements) {
      p = write_tensor(p, limit, e.toTensor());
      if (p == nullptr) return nullptr;
    }
    return p;
  }
  if (size_t(limit - p) < 1 + n) return nullptr;
  if ((first == nullptr || first->isInt()) && v.isIntList()) {
    *p++ = input_head(kIntList, int64_t(n));
    for (const c10::IValue& e : elements) *p++ = e.toInt();
  } else if ((first == nullptr || first->isDouble()) && v.isDoubleList()) {
    *p++ = input_head(kDoubleList, int64_t(n));
    for (const c10::IValue& e : elements) {
      double d = e.toDouble();
      std::memcpy(p++, &d, sizeof d);
    }
  } else if ((first == nullptr || first->isBool()) && v.isBoolList()) {
    *p++ = input_head(kBoolList, int64_t(n));
    for (const c10::IValue& e : elements) *p++ = e.toBool();
  } else {
    *p++ = kOther;
  }
  return p;
}

// Writes the record of `inputs` at p, in one pass, if it fits before `limit`; returns its end, or
// nullptr (then what it wrote is not kept, and the caller drops the scalars it kept in
// ThreadBuffer::values).
int64_t* write_inputs(ThreadBuffer* b, c10::ArrayRef<c10::IValue> inputs, int64_t* p, const int64_t* limit) {
  if (p == nullptr || p >= limit) return nullptr;
  *p++ = int64_t(inputs.size());
  for (const c10::IValue& v : inputs) {
    if (v.isTensor()) {
      p = write_tensor(p, limit, v.toTensor());
    } else if (v.isList()) {
      p = write_list(p, limit, v);
    } else if (limit - p < 2) {
      p = nullptr;
    } else if (v.isNone()) {
      *p++ = kNone;
    } else if (v.isInt()) {
      *p++ = kInt;
      *p++ = v.toInt();
    } else if (v.isDouble()) {
      *p++ = kDouble;
      double d = v.toDouble();
      std::memcpy(p++, &d, sizeof d);
    } else if (v.isBool()) {
      *p++ = kBool;
      *p++ = v.toBool();
    } else if (v.isScalar()) {  // complex, symbolic: kept whole
      *p++ = input_head(kScalar, int64_t(b->values.size()));
      b->values.push_back(v);
    } else {
      *p++ = kOther;
    }
    if (p == nullptr) return nullptr;
  }
  return p;
}

// An op's shapes record, appended to ThreadBuffer::shapes: written in one pass where the current
// chunk has room for it (nearly always), sized first and written into a new chunk where not. Nothing
// is committed until the record is whole, so a throw leaves no partial record (at worst an empty
// chunk, which readers pass over). `values_at`: ThreadBuffer::values' size before.
void encode_inputs(ThreadBuffer* b, const at::RecordFunction& fn, OpFields& op, size_t values_at) {
  auto inputs = fn.inputs();
  if (inputs.empty()) return;  // torch writes no shape args for ops without inputs
  int64_t* end = write_inputs(b, inputs, b->shapes.room(), b->shapes.limit());
  if (end == nullptr) {
    b->values.resize(values_at);
    size_t need = 1;
    for (const c10::IValue& v : inputs) need += input_ints(v);
    int64_t* p = b->shapes.reserve(need);
    end = write_inputs(b, inputs, p, p + need);
    if (end == nullptr) throw std::logic_error("a shapes record outgrew its size");  // (the op: no shapes)
  }
  op.shapes = 0;  // (the records are read back in op order: the flag is all the op keeps)
  b->shapes.commit(end);
}

void append_json_string(std::string& out, const std::string& s) {
  out.push_back('"');
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(char(c));
    } else if (c < 0x20) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\u%04x", c);
      out += esc;
    } else {
      out.push_back(char(c));
    }
  }
  out.push_back('"');
}

void append_int(std::string& out, int64_t v) {
  char buf[24];  // to_chars, not snprintf: a read-out with shapes writes ~10 ints an op
  out.append(buf, size_t(std::to_chars(buf, buf + sizeof buf, v).ptr - buf));
}

// A keyword argument's value as Kineto writes it into the trace: strings lose newlines, backslashes
// become '/', and a string holding a double quote is written as "None"; returns false for the types
// Kineto skips (None, non-string lists, tensors...).
bool append_kwarg_value(std::string& out, const std::string& key, const c10::IValue& v) {
  auto sanitized = [](const std::string& s, std::string& into) {
    if (s.find('"') != std::string::npos) {
      into += "\"None\"";
      return;
    }
    std::string clean;
    for (char c : s) {
      if (c == '\n') continue;
      clean.push_back(c == '\\' ? '/' : c);
    }
    append_json_string(into, clean);
  };
  if (key == "stream" && !v.isInt()) return false;
  if (v.isInt()) {
    append_int(out, v.toInt());
  } else if (v.isDouble()) {
    char buf[32];
    int len = std::snprintf(buf, sizeof buf, "%g", v.toDouble());
    out.append(buf, size_t(len));
  } else if (v.isBool()) {
    out += v.toBool() ? "true" : "false";
  } else if (v.isString()) {
    sanitized(v.toStringRef(), out);
  } else if (v.isList()) {
    auto list = v.toListRef();
    for (const c10::IValue& item : list) {
      if (!item.isString()) return false;
    }
    out.push_back('[');
    bool first = true;
    for (const c10::IValue& item : list) {
      if (!first) out += ", ";
      first = false;
      sanitized(item.toStringRef(), out);
    }
    out.push_back(']');
  } else {
    return false;
  }
  return true;
}

// with_modules in eager mode, from the Python frames of this thread (a thread with no Python state, such
// as the autograd engine's workers, has none; torch's bindings release the GIL before they dispatch an
// op, so the callback takes it back for the walk, on this thread only: its frames cannot change while it
// is in here) (no TorchScript hierarchy): the frames that are methods of nn.Module
// instances, outermost first, written as TorchScript writes its hierarchy, one "name(Class)::method."
// per frame: the outermost module is TOP, a module called from another by the attribute path it has
// there ("0", "encoder.layer"), a method of the module just named SELF, a module its caller does not
// hold UNNAMED. torch.nn.Module's own call machinery (module.py) is not a level.
static PyObject* module_type() {
  static PyObject* type = nullptr;  // torch.nn.Module, looked up once (with the GIL)
  static bool tried = false;
  if (!tried) {
    tried = true;
    PyObject* nn = PyImport_ImportModule("torch.nn");
    if (nn != nullptr) {
      type = PyObject_GetAttrString(nn, "Module");
      Py_DECREF(nn);
    }
    PyErr_Clear();
  }
  return type;
}

// The nn.Module a frame runs a method of (its first argument), a new reference, or nullptr.
static PyObject* frame_module(PyFrameObject* f, PyCodeObject* code) {
  PyObject* type = module_type();
  if (type == nullptr || code->co_argcount == 0) return nullptr;
  const char* file = PyUnicode_AsUTF8(code->co_filename);
  if (file == nullptr || std::strstr(file, "torch/nn/modules/module.py") != nullptr) {
    PyErr_Clear();
    return nullptr;
  }
#if PY_VERSION_HEX >= 0x030B0000
  PyObject* first = PyTuple_GET_ITEM(code->co_localsplusnames, 0);  // arguments come first
#else
  PyObject* first = PyTuple_GET_ITEM(code->co_varnames, 0);
#endif
#if PY_VERSION_HEX >= 0x030C0000
  PyObject* self = PyFrame_GetVar(f, first);
#else
#if PY_VERSION_HEX >= 0x030B0000
  PyObject* locals = PyFrame_GetLocals(f);
#else
  PyObject* locals = PyObject_GetAttrString(reinterpret_cast<PyObject*>(f), "f_locals");
#endif
  PyObject* self = locals != nullptr ? PyObject_GetItem(locals, first) : nullptr;
  Py_XDECREF(locals);
#endif
  if (self == nullptr || PyObject_IsInstance(self, type) != 1) {
    Py_XDECREF(self);
    PyErr_Clear();
    return nullptr;
  }
  return self;
}

// The attribute path under which `parent` holds `child` among its submodules ("fc", "0.attn"), or "".
static std::string submodule_path(PyObject* parent, PyObject* child) {
  std::string path;
  PyObject* named = PyObject_CallMethod(parent, "named_modules", nullptr);
  PyObject* it = named != nullptr ? PyObject_GetIter(named) : nullptr;
  PyObject* item;
  while (it != nullptr && (item = PyIter_Next(it)) != nullptr) {
    if (PyTuple_Check(item) && PyTuple_GET_SIZE(item) == 2 && PyTuple_GET_ITEM(item, 1) == child) {
      const char* name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(item, 0));
      if (name != nullptr && *name) path = name;
      Py_DECREF(item);
      break;
    }
    Py_DECREF(item);
  }
  Py_XDECREF(it);
  Py_XDECREF(named);
  PyErr_Clear();
  return path;
}

struct ModuleFrame {
  PyObject* module;  // new reference
  PyCodeObject* code;  // borrowed from the walk
};

static std::string module_hierarchy(const std::vector<ModuleFrame>& outermost_first) {
  std::string out;
  PyObject* caller = nullptr;
  for (const auto& level : outermost_first) {
    std::string name = caller == nullptr ? "TOP" : level.module == caller ? "SELF" : submodule_path(caller, level.module);
    const char* method = PyUnicode_AsUTF8(level.code->co_name);
    if (method == nullptr) PyErr_Clear();
    out += name.empty() ? "UNNAMED" : name;
    out += "(";
    out += Py_TYPE(level.module)->tp_name;
    out += ")::";
    out += method != nullptr ? method : "?";
    out += ".";
    caller = level.module;
  }
  return out;
}

// The hierarchy table: each distinct eager Module Hierarchy of the process once, as a JSON string value,
// by id. Ops carry ids, so an op costs 4 bytes for it, not a copy of its text, and the trace's args share
// one value per hierarchy. Ids stay valid for the process's life (a table of at most kMaxHierarchies
// entries; past it ops get none).
constexpr size_t kMaxHierarchies = 1 << 20;
std::mutex g_hierarchy_mutex;
std::vector<std::string> g_hierarchies;  // JSON string values
std::unordered_map<std::string, int32_t> g_hierarchy_ids;

int32_t hierarchy_id(std::string&& entry) {
  std::lock_guard<std::mutex> lock(g_hierarchy_mutex);
  auto found = g_hierarchy_ids.find(entry);
  if (found != g_hierarchy_ids.end()) return found->second;
  if (g_hierarchies.size() >= kMaxHierarchies) return -1;
  int32_t id = int32_t(g_hierarchies.size());
  g_hierarchies.push_back(entry);
  g_hierarchy_ids.emplace(std::move(entry), id);
  return id;
}

// The hierarchy-table id of the nn.Modules running this thread's Python frames (eager with_modules), or
// -1 when none does. An op's modules are nearly always ones seen before (a loop over the same layers):
// each distinct sequence of (code, module) is formatted and looked up once per thread, then found by its
// hash.
int32_t eager_module_hierarchy() {
  if (!Py_IsInitialized() || PyGILState_GetThisThreadState() == nullptr) return -1;
  thread_local std::unordered_map<uint64_t, int32_t> cache;
  uint64_t hash = 1469598103934665603ull;
  std::vector<ModuleFrame> modules_innermost_first;
  std::vector<PyFrameObject*> walked;  // references held until the walk's end, so that codes outlive it
  PyGILState_STATE gil = PyGILState_Ensure();
  PyFrameObject* f = PyEval_GetFrame();  // borrowed
  Py_XINCREF(f);
  while (f != nullptr && walked.size() < 128) {
    walked.push_back(f);
    PyCodeObject* code = PyFrame_GetCode(f);
    PyObject* module = frame_module(f, code);
    if (module != nullptr) {  // the same code runs under many modules (a Sequential's layers): they count
      modules_innermost_first.push_back({module, code});
      hash = (hash ^ uint64_t(reinterpret_cast<uintptr_t>(code))) * 1099511628211ull;
      hash = (hash ^ uint64_t(reinterpret_cast<uintptr_t>(module))) * 1099511628211ull;
    }
    Py_DECREF(code);  // (the frame, held, keeps it)
    f = PyFrame_GetBack(f);
  }
  Py_XDECREF(f);
  int32_t id = -1;
  if (!modules_innermost_first.empty()) {
    auto hit = cache.find(hash);
    if (hit != cache.end()) {
      id = hit->second;
    } else {
      std::string entry;
      append_json_string(entry, module_hierarchy({modules_innermost_first.rbegin(), modules_innermost_first.rend()}));
      id = hierarchy_id(std::move(entry));
      if (cache.size() > 65536) cache.clear();
      cache.emplace(hash, id);
    }
  }
  for (const auto& level : modules_innermost_first) Py_DECREF(level.module);
  for (PyFrameObject* frame : walked) Py_DECREF(frame);
  PyGILState_Release(gil);
  return id;
}

// A c10d Work's own span: ProcessGroupGloo (and UCC, MPI) name their work "backend:collective" and hand
// its tensors to the RecordFunction whatever the options; NCCL writes record_param_comms instead.
bool is_collective_work(const at::RecordFunction& fn) {
  if (fn.scope() != at::RecordScope::USER_SCOPE || fn.isNcclMeta()) return false;
  const char* name = fn.name();
  return std::strncmp(name, "gloo:", 5) == 0 || std::strncmp(name, "ucc:", 4) == 0 || std::strncmp(name, "mpi:", 4) == 0;
}

// Kineto's record_param_comms args a Work span can tell: the collective's name (Kineto's spelling),
// the elements its tensors hold and their dtype. The group's come from the job's distributedInfo.
void encode_collective(std::string& body, const at::RecordFunction& fn) {
  std::string collective = std::strchr(fn.name(), ':') + 1;
  if (collective == "all_reduce") collective = "allreduce";
  else if (collective == "all_gather") collective = "allgather";
  int64_t nelems = 0;
  std::string dtype;
  for (const auto& v : fn.inputs()) {
    if (!v.isTensor()) continue;
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) continue;
    nelems += t.numel();
    if (dtype.empty()) dtype = c10::toString(t.scalar_type());
  }
  if (!body.empty()) body += ", ";
  body += "\"Collective name\": ";
  append_json_string(body, collective);
  body += ", \"In msg nelems\": ";
  append_int(body, nelems);
  if (!dtype.empty()) {
    body += ", \"dtype\": ";
    append_json_string(body, dtype);
  }
}

// Whether an op may have extra args to write (see encode_extra); `collective` is is_collective_work(fn).
// An operator's (from_schema) have none with record_shapes alone: the dispatcher passes no kwargs.
bool wants_extra(const at::RecordFunction& fn, bool from_schema, bool collective) {
  if (g_options & (kWithFlops | kWithModules)) return true;
  if ((g_options & kRecordShapes) && fn.needsInputs() && !from_schema) return true;  // its kwargs
  return collective || fn.isNcclMeta();
}

// The per-op args the observer formats beyond shapes: kwargs (with record_shapes), flops (with_flops),
// the module hierarchy (with_modules: TorchScript's here, the eager one as an id). Written as one
// NUL-terminated JSON object body. Not inlined, so that on_start's common path stays small.
__attribute__((noinline)) void encode_extra(ThreadBuffer* b, const at::RecordFunction& fn, OpFields& op,
                                            bool from_schema, bool collective) {
  std::string body;
  bool jit_modules = false;
  if (g_options & kWithModules) {
    auto hierarchy = torch::jit::currentModuleHierarchy();
    if (!hierarchy.empty()) {
      std::string joined;
      for (const auto& level : hierarchy) {
        joined += level;
        joined += ".";
      }
      if (!body.empty()) body += ", ";
      body += "\"Module Hierarchy\": ";
      append_json_string(body, joined);
      jit_modules = true;
    }
  }
  bool eager_modules = (g_options & kWithModules) && !jit_modules;
  if (eager_modules) op.modules = eager_module_hierarchy();
  if ((g_options & kRecordShapes) && fn.needsInputs() && !from_schema) {  // (kwinputs() copies a map)
    for (const auto& kv : fn.kwinputs()) {
      std::string value;
      if (!append_kwarg_value(value, kv.first, kv.second)) continue;
      if (!body.empty()) body += ", ";
      append_json_string(body, kv.first);
      body += ": ";
      body += value;
    }
  }
  if ((g_options & kWithFlops) && fn.needsInputs()) {
    auto extra_args = torch::profiler::impl::saveExtraArgs(fn);
    if (!extra_args.empty()) {
      uint64_t flops = torch::profiler::impl::computeFlops(std::string(fn.name()), extra_args);
      if (flops > 0) {
        if (!body.empty()) body += ", ";
        body += "\"flops\": ";
        append_int(body, int64_t(flops));
      }
    }
  }
  if (collective) encode_collective(body, fn);
  if (fn.isNcclMeta()) {  // record_param_comms: Kineto's collective args, already JSON values
    for (const auto& kv : torch::profiler::impl::saveNcclMeta(fn)) {
      if (kv.second.empty()) continue;
      if (!body.empty()) body += ", ";
      append_json_string(body, kv.first);
      body += ": ";
      body += kv.second;
    }
  }
  if (body.empty()) return;
  op.extra = int64_t(b->extra.size());
  b->extra += body;
  b->extra.push_back('\0');
}

// -- the callbacks -----------------------------------------------------------------------------------

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  ThreadState& ts = thread_state();
  if (ts.skip_next) {  // polyprof's own record_function: its host backend records it
    ts.skip_next = false;
    return nullptr;
  }
  if (!g_recording.load(std::memory_order_relaxed)) return nullptr;
  ThreadBuffer* b = thread_buffer(ts);
  Busy busy(b);
  if (!g_recording.load(std::memory_order_relaxed)) return nullptr;  // read after the mark (see Busy)
  // top-level only: an op inside another op is left out (its end finds no open row), but for annotations
  // and collectives (record_param_comms, gloo:* work spans), which a flight recorder keeps
  bool function = fn.scope() != at::RecordScope::USER_SCOPE && !fn.isNcclMeta();
  bool top_only = (g_options & kTopLevelOnly) != 0;
  if (top_only && function && b->open_functions > 0) return nullptr;
  OpFields op;
  bool from_schema = false;
  op.name = intern_op(b, fn, &from_schema);
  op.seq = fn.seqNr();
  op.fwd_tid = int64_t(fn.forwardThreadId());
  op.rf_tid = int64_t(fn.threadId());
  op.scope = uint8_t(fn.scope());
  op.handle = fn.handle();
  if (g_options & kOverloadNames) {
    auto op_name = fn.operator_name();
    if (op_name.has_value()) op.overload = intern(b, op_name->overload_name.c_str());
  }
  if ((g_options & kRecordShapes) && fn.needsInputs()) {
    size_t values_at = b->values.size();
    try {
      encode_inputs(b, fn, op, values_at);
    } catch (...) {  // an input this torch cannot describe: the op is kept without shapes
      op.shapes = -1;
      b->values.resize(values_at);
    }
  }
  bool collective = is_collective_work(fn);
  if (wants_extra(fn, from_schema, collective)) {
    try {
      encode_extra(b, fn, op, from_schema, collective);
    } catch (...) {
      op.extra = -1;
    }
  }
  bool async = fn.isAsync();
  Op& row = b->ops.push_back(pack(b, op, async));
  if (op.modules >= 0) {
    try {
      b->frames.push_back(op.modules);
      row.name_scope |= kHasFrames;
    } catch (...) {  // kept without its hierarchy
    }
  }
  row.start = now_ns(ts);
  if (async) {  // may end on another thread
    b->async_open.fetch_add(1, std::memory_order_relaxed);
    auto ctx = std::make_unique<AsyncContext>();
    ctx->buffer = t_owner;
    ctx->index = int64_t(b->ops.size()) - 1;  // the row just pushed
    return ctx;
  }
  b->open.push_back(OpenOp{&row, &fn, function});
  if (function) b->open_functions++;
  return nullptr;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext* ctx) {
  ThreadState& ts = thread_state();
  int64_t t = now_ns(ts);
  if (!g_recording.load(std::memory_order_relaxed)) return;
  ThreadBuffer* b = thread_buffer(ts);
  Busy busy(b);
  if (!g_recording.load(std::memory_order_relaxed)) return;
  if (ctx != nullptr) {
    auto* async = static_cast<AsyncContext*>(ctx);
    set_end(*async->buffer, async->buffer->ops[async->index], t);  // its Rare exists: no allocation here
    async->buffer->async_open.fetch_sub(1, std::memory_order_release);
    return;
  }
  auto& open = b->open;
  // The innermost, nearly always: popped here, which callgrind puts ~15 instructions an op below the
  // search's erase() of the same last element.
  if (!open.empty() && open.back().key == &fn) {
    set_end(*b, *open.back().row, t);
    if (open.back().function) b->open_functions--;
    open.pop_back();
    return;
  }
  for (size_t i = open.size(); i-- > 0;) {
    if (open[i].key == &fn) {
      set_end(*b, *open[i].row, t);
      if (open[i].function) b->open_functions--;
      open.erase(open.begin() + long(i));
      return;
    }
  }
}

void wait_until_idle() {
  heavy_barrier();  // the recording flag, cleared, before the marks are read (see Busy)
  std::lock_guard<std::mutex> lock(g_mutex);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (auto& b : g_buffers) {
    while (b->inside.load(std::memory_order_acquire) != 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::yield();
    }
  }
}

// One input of an op as encoded in ThreadBuffer::shapes.
struct Input {
  int64_t tag = kNone;
  int64_t st = -1;  // scalar type of a tensor, -1 otherwise
  int64_t ndim = 0;
  const int64_t* sizes = nullptr;
  const int64_t* strides = nullptr;  // nullptr for a kTensorContiguous: computed from its sizes
  int64_t value = -1;  // index into ThreadBuffer::values for a kScalar
  int64_t kept = kNone;  // kInt... kBoolList: a scalar or list of them kept in the record
  int64_t count = 0;     // how many values of it
  const int64_t* values = nullptr;
  std::vector<Input> elements;  // a tensor list's tensors
};

double as_double(const int64_t* bits) {
  double d;
  std::memcpy(&d, bits, sizeof d);
  return d;
}

// The IValue a double or list of doubles kept in a record was: torch formats Concrete Inputs from it
// (its printing of doubles, "2." or "1.5", is kept as it is; kept ints and bools: append_kept_ints).
c10::IValue kept_double_value(const Input& in) {
  const int64_t* v = in.values;
  if (in.kept == kDouble) return c10::IValue(as_double(v));
  c10::List<double> list;
  list.reserve(size_t(in.count));
  for (int64_t i = 0; i < in.count; ++i) list.push_back(as_double(v + i));
  return c10::IValue(std::move(list));
}

const int64_t* decode_tensor(const int64_t* p, int64_t head, Input& in) {
  int64_t tag = head & 0xFF, payload = head >> 8;
  in.tag = tag == kTensorContiguous ? kTensor : tag;
  if (tag == kTensor || tag == kTensorContiguous || tag == kTensorNoShape) in.st = payload & 0xFF;
  if (tag == kTensor || tag == kTensorContiguous) {
    in.ndim = payload >> 8;
    in.sizes = p;
    p += in.ndim;
    if (tag == kTensor) {
      in.strides = p;
      p += in.ndim;
    }
  }
  return p;
}

// The inputs of the shapes record at `at` into `inputs` (reused: its storage outlives the call), `at`
// moved on to the next record.
void decode_inputs(const ThreadBuffer& b, ShapeStore::Cursor& at, std::vector<Input>& inputs) {
  const int64_t* p = b.shapes.at(at);
  int64_t n = *p++;
  inputs.clear();
  inputs.resize(static_cast<size_t>(n));
  for (auto& in : inputs) {
    int64_t head = *p++;
    int64_t tag = head & 0xFF;
    if (tag == kScalar) {
      in.tag = tag;
      in.value = head >> 8;
    } else if (tag >= kInt && tag <= kBoolList) {
      bool list = tag >= kIntList;
      in.tag = list ? kScalarList : kScalar;
      in.kept = tag;
      in.count = list ? head >> 8 : 1;
      in.values = p;
      p += in.count;
    } else if (tag == kTensorList) {
      in.tag = tag;
      in.elements.resize(size_t(head >> 8));
      for (auto& e : in.elements) {
        int64_t element = *p++;
        p = decode_tensor(p, element, e);
      }
    } else {
      p = decode_tensor(p, head, in);
    }
  }
  b.shapes.advance(at, p);
}

// torch's name of a scalar type ("float", "c10::BFloat16"...), computed once per type
const std::string& type_name(int64_t st) {
  static std::unordered_map<int64_t, std::string> names;
  auto hit = names.find(st);
  if (hit != names.end()) return hit->second;
  std::string name(c10::scalarTypeToTypeMeta(c10::ScalarType(st)).name());
  return names.emplace(st, std::move(name)).first->second;
}

void append_ints(std::string& out, const int64_t* v, int64_t n) {
  out.push_back('[');
  for (int64_t k = 0; k < n; ++k) {
    if (k) out += ", ";
    append_int(out, v[k]);
  }
  out.push_back(']');
}

// A tensor's strides; those of a contiguous one computed from its sizes (see write_tensor).
void append_strides(std::string& out, const Input& in) {
  if (in.strides != nullptr || in.ndim == 0) {
    append_ints(out, in.strides, in.ndim);
    return;
  }
  int64_t local[16];
  std::vector<int64_t> many(in.ndim > 16 ? size_t(in.ndim) : 0);
  int64_t* strides = in.ndim > 16 ? many.data() : local;
  int64_t stride = 1;
  for (int64_t d = in.ndim; d-- > 0;) {
    strides[d] = stride;
    stride *= std::max<int64_t>(in.sizes[d], 1);
  }
  append_ints(out, strides, in.ndim);
}

// A kept int, bool or list of them as a JSON string, written as torch prints its IValue ("3", "True",
// "[0, 1]", "[True, False]") without building one: the ostream path costs a List allocation and a
// stream round trip for each.
void append_kept_ints(std::string& out, const Input& in) {
  bool list = in.kept == kIntList || in.kept == kBoolList;
  bool bools = in.kept == kBool || in.kept == kBoolList;
  out.push_back('"');
  if (list) out.push_back('[');
  for (int64_t i = 0; i < in.count; ++i) {
    if (i) out += ", ";
    if (bools) out += in.values[i] != 0 ? "True" : "False";
    else append_int(out, in.values[i]);
  }
  if (list) out.push_back(']');
  out.push_back('"');
}

// torch.profiler's record_shapes args for one op, as four JSON values appended to `out`, each
// followed by a NUL byte: Concrete Inputs, Input type, Input Strides, Input Dims. A tensor list is one
// input: "TensorList" in Input type, the list of its tensors' sizes (strides) in Input Dims (Strides).
// Appends the shapes record at `at` as four fragments, moving `at` on to the next record.
void append_shape_fragments(std::string& out, const ThreadBuffer& b, ShapeStore::Cursor& at) {
  static std::ostringstream os;  // reused: constructing one per value costs more than formatting it
  static std::vector<Input> inputs;  // reused likewise (the read-out holds g_mutex)
  decode_inputs(b, at, inputs);
  auto list = [&out](auto&& item) {
    out.push_back('[');
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (i) out += ", ";
      item(inputs[i]);
    }
    out.push_back(']');
    out.push_back('\0');
  };
  list([&](const Input& in) {
    if (in.kept != kNone && in.kept != kDouble && in.kept != kDoubleList) {
      append_kept_ints(out, in);
    } else if (in.value >= 0 || in.kept != kNone) {
      os.str(std::string());
      os.clear();
      if (in.value >= 0) os << b.values[size_t(in.value)];
      else os << kept_double_value(in);  // the branch above took kept ints and bools
      append_json_string(out, os.str());
    } else {
      out += "\"\"";
    }
  });
  list([&](const Input& in) {
    if (in.st >= 0) {
      append_json_string(out, type_name(in.st));
    } else if (in.tag == kScalar) {
      out += "\"Scalar\"";
    } else if (in.tag == kScalarList) {
      out += "\"ScalarList\"";
    } else if (in.tag == kTensorList) {
      out += "\"TensorList\"";
    } else {
      out += "\"\"";
    }
  });
  for (int which = 0; which < 2; ++which) {  // strides, then dims
    list([&](const Input& in) {
      if (in.tag == kTensorList) {
        out.push_back('[');
        for (size_t k = 0; k < in.elements.size(); ++k) {
          if (k) out += ", ";
          const Input& e = in.elements[k];
          if (which == 0) append_strides(out, e);
          else append_ints(out, e.sizes, e.ndim);
        }
        out.push_back(']');
      } else if (which == 0) {
        append_strides(out, in);
      } else {
        append_ints(out, in.sizes, in.ndim);
      }
    });
  }
}

// Copies into `to` (a new buffer of the same thread) the operators of `from` that no take has handed
// over: those completed before its first open one, or with `include_open` (at stop) all of them, each
// with its name, shapes record, values, extra args and hierarchy entry; the completed ones copied are
// marked kHandedOver in `from`, whose rows keep their places (its open operators point into them) until
// it is emptied. A thread that stays inside an operator (a rank waiting in DDP's backward under a
// record_function) so still hands over what it completed before; what it completes inside that
// operator goes with it. Returns the number of operators copied.
size_t copy_completed(ThreadBuffer& from, ThreadBuffer& to, bool include_open) {
  std::vector<int32_t> name_map(from.names.size(), -1);
  auto name_in_to = [&](int32_t id) -> int32_t {
    if (id < 0 || size_t(id) >= from.names.size()) return id;
    if (name_map[size_t(id)] < 0) {
      name_map[size_t(id)] = int32_t(to.names.size());
      to.names.push_back(from.names[size_t(id)]);
    }
    return name_map[size_t(id)];
  };
  if (to.values.empty()) to.values = from.values;  // (shapes records index them: the same indices)
  ShapeStore::Cursor shapes_at = from.shapes_at;
  size_t frames_at = from.frames_at, copied = 0, count = from.ops.size();
  bool prefix = true;  // every row so far is handed over: the next take starts after them
  std::vector<Input> scratch;
  for (size_t k = from.handed_at; k < count; k++) {
    Op& row = from.ops[k];
    const int64_t* record = nullptr;
    size_t record_ints = 0;
    if (row.name_scope & kHasShapes) {
      record = from.shapes.at(shapes_at);
      decode_inputs(from, shapes_at, scratch);
      record_ints = size_t(from.shapes.position(shapes_at) - record);
    }
    bool open = row.dur == kStillOpen;
    if (open && !include_open) break;  // (what follows an open op is inside it: its rows go with it, as
                                       // an evaluate_function range and the node it runs must)
    int32_t frame = -1;
    if ((row.name_scope & kHasFrames) && frames_at < from.frames.size()) frame = from.frames[frames_at++];
    if (!(row.name_scope & kHandedOver) && (!open || include_open)) {
      OpFields f = unpack(from, row);
      f.name = name_in_to(f.name);
      f.overload = name_in_to(f.overload);
      if (f.extra >= 0) {
        int64_t at = int64_t(to.extra.size());
        to.extra += from.extra.c_str() + f.extra;
        to.extra.push_back('\0');
        f.extra = at;
      }
      if (record != nullptr) {
        int64_t* into = to.shapes.reserve(record_ints);
        std::memcpy(into, record, record_ints * sizeof(int64_t));
        to.shapes.commit(into + record_ints);
        f.shapes = 0;
      }
      Op& copy = to.ops.push_back(pack(&to, f, false));
      copy.start = row.start;
      if (!open) set_end(to, copy, op_end(from, row));
      if (frame >= 0) {
        to.frames.push_back(frame);
        copy.name_scope |= kHasFrames;
      }
      if (!open) row.name_scope |= kHandedOver;
      copied++;
    }
    if (prefix && (row.name_scope & kHandedOver)) {
      from.handed_at = k + 1, from.shapes_at = shapes_at, from.frames_at = frames_at;
    } else {
      prefix = false;
    }
  }
  from.any_handed = from.any_handed || copied > 0;
  return copied;
}

// While recording (g_mutex held): calls `visit(buffer)` on every thread's buffer while it is claimed
// (its thread's callbacks then stay out of it, see Busy), again every 20 us for up to `patience_us` on
// those where `visit` returns false (their thread was inside a callback or an operator).
template <typename Visit>
void visit_claimed(int64_t patience_us, Visit visit) {
  std::vector<ThreadBuffer*> pending;
  for (auto& b : g_buffers) pending.push_back(b.get());
  auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(patience_us);
  while (!pending.empty()) {
    std::vector<ThreadBuffer*> again;
    for (ThreadBuffer* b : pending) b->claimed.store(true, std::memory_order_relaxed);
    heavy_barrier();  // the claims before the marks are read (see Busy)
    for (ThreadBuffer* b : pending) {
      bool visited = visit(*b);
      b->claimed.store(false, std::memory_order_release);
      if (!visited) again.push_back(b);
    }
    pending.swap(again);
    if (pending.empty() || std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

}  // namespace

extern "C" {

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
// rows, with `put`, which writes into the crash file through the recorder's buffer; csrc/recorder.c
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

}  // extern "C"
