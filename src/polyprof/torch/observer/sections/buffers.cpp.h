// A section of observer.cpp (the buffered op rows, shapes and allocator reports, and a thread's buffer), included once into it, inside its anonymous namespace: one translation unit.

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
