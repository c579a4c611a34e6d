// polyprof's PyTorch operator observer: a RecordFunction callback pair that appends each operator to a
// per-thread columnar buffer, read out in bulk after stop through a small C ABI (loaded with ctypes).
//
// Built on first use against the installed torch by polyprof/backends/torch_observer/builder.py, so it
// always matches that torch's headers and C++ ABI. No pybind11, no Python objects on the hot path.
//
// Threading: callbacks run on the threads that run operators. Each thread appends to its own buffer; the
// only shared state touched per operator is the `recording` flag. Stop clears the flag, then waits until
// no callback is inside a buffer (each buffer's `busy` count), so reading afterwards is race-free.

#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>
#include <c10/core/ScalarType.h>

#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace {

constexpr int kAbiVersion = 3;

// Input encodings in ThreadBuffer::shapes (record_shapes).
enum InputTag : int64_t {
  kNone = 0,         // None: type ""
  kOther = 1,        // device, string, generator...: type ""
  kTensor = 2,       // dtype, ndim, sizes..., strides...
  kTensorNoShape = 3,  // nested/sparse/symbolic tensors: dtype only
  kUndefinedTensor = 4,
  kScalar = 5,       // index into ThreadBuffer::values
  kScalarList = 6,   // index into ThreadBuffer::values
  kTensorList = 7,
};

struct Op {
  int64_t start = 0;
  int64_t end = 0;  // 0: not ended while recording
  int64_t seq = -1;
  int64_t fwd_tid = 0;
  int64_t rf_tid = 0;
  int64_t shapes = -1;  // offset into ThreadBuffer::shapes, -1 without record_shapes
  const void* key = nullptr;  // the RecordFunction, to pair start and end
  int32_t name = 0;
  uint8_t scope = 0;
};

struct ThreadBuffer {
  int64_t tid = 0;
  std::deque<Op> ops;
  std::vector<int64_t> open;  // indices into ops, innermost last
  std::vector<std::string> names;
  std::unordered_map<std::string, int32_t> name_ids;
  std::unordered_map<const char*, int32_t> name_by_ptr;  // cache, verified by content
  std::vector<int64_t> shapes;
  std::vector<c10::IValue> values;
  std::atomic<int> busy{0};
};

struct AsyncContext : at::ObserverContext {
  std::shared_ptr<ThreadBuffer> buffer;
  int64_t index = 0;
};

std::mutex g_mutex;
std::vector<std::shared_ptr<ThreadBuffer>> g_buffers;
std::atomic<bool> g_recording{false};
std::atomic<uint64_t> g_generation{0};
bool g_shapes = false;
at::CallbackHandle g_handle = 0;
std::string g_error;

thread_local std::shared_ptr<ThreadBuffer> t_buffer;
thread_local uint64_t t_generation = 0;

inline int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);  // the clock of Python's time.perf_counter_ns on Linux
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

ThreadBuffer* thread_buffer() {
  uint64_t gen = g_generation.load(std::memory_order_relaxed);
  if (t_generation != gen || !t_buffer) {
    auto b = std::make_shared<ThreadBuffer>();
    b->tid = int64_t(syscall(SYS_gettid));
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      g_buffers.push_back(b);
    }
    t_buffer = std::move(b);
    t_generation = gen;
  }
  return t_buffer.get();
}

int32_t intern(ThreadBuffer* b, const char* name) {
  if (name == nullptr) name = "";
  auto hit = b->name_by_ptr.find(name);
  if (hit != b->name_by_ptr.end() && std::strcmp(b->names[hit->second].c_str(), name) == 0) {
    return hit->second;
  }
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
  b->name_by_ptr[name] = id;
  return id;
}

void encode_tensor(ThreadBuffer* b, const at::Tensor& t) {
  if (!t.defined()) {
    b->shapes.push_back(kUndefinedTensor);
    return;
  }
  auto* impl = t.unsafeGetTensorImpl();
  bool plain = t.layout() == c10::kStrided && !t.is_nested() && !impl->has_symbolic_sizes_strides();
  b->shapes.push_back(plain ? kTensor : kTensorNoShape);
  b->shapes.push_back(int64_t(t.scalar_type()));
  if (!plain) return;
  auto sizes = t.sizes();
  auto strides = t.strides();
  b->shapes.push_back(int64_t(sizes.size()));
  b->shapes.insert(b->shapes.end(), sizes.begin(), sizes.end());
  b->shapes.insert(b->shapes.end(), strides.begin(), strides.end());
}

void encode_inputs(ThreadBuffer* b, const at::RecordFunction& fn, Op& op) {
  auto inputs = fn.inputs();
  if (inputs.empty()) return;  // torch writes no shape args for ops without inputs
  op.shapes = int64_t(b->shapes.size());
  b->shapes.push_back(int64_t(inputs.size()));
  for (const c10::IValue& v : inputs) {
    if (v.isTensor()) {
      encode_tensor(b, v.toTensor());
    } else if (v.isNone()) {
      b->shapes.push_back(kNone);
    } else if (v.isScalar()) {
      b->shapes.push_back(kScalar);
      b->shapes.push_back(int64_t(b->values.size()));
      b->values.push_back(v);
    } else if (v.isIntList() || v.isDoubleList() || v.isBoolList()) {
      b->shapes.push_back(kScalarList);
      b->shapes.push_back(int64_t(b->values.size()));
      b->values.push_back(v);
    } else if (v.isTensorList()) {
      b->shapes.push_back(kTensorList);
    } else {
      b->shapes.push_back(kOther);
    }
  }
}

struct Busy {
  ThreadBuffer* b;
  explicit Busy(ThreadBuffer* buffer) : b(buffer) { b->busy.fetch_add(1, std::memory_order_seq_cst); }
  ~Busy() { b->busy.fetch_sub(1, std::memory_order_release); }
};

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  if (!g_recording.load(std::memory_order_relaxed)) return nullptr;
  ThreadBuffer* b = thread_buffer();
  Busy busy(b);
  if (!g_recording.load(std::memory_order_seq_cst)) return nullptr;
  Op op;
  op.key = &fn;
  op.name = intern(b, fn.name());
  op.seq = fn.seqNr();
  op.fwd_tid = int64_t(fn.forwardThreadId());
  op.rf_tid = int64_t(fn.threadId());
  op.scope = uint8_t(fn.scope());
  if (g_shapes && fn.needsInputs()) {
    try {
      encode_inputs(b, fn, op);
    } catch (...) {
      op.shapes = -1;  // an input this torch cannot describe: the op is kept without shapes
    }
  }
  int64_t index = int64_t(b->ops.size());
  op.start = now_ns();
  b->ops.push_back(op);
  if (fn.isAsync()) {  // may end on another thread
    auto ctx = std::make_unique<AsyncContext>();
    ctx->buffer = t_buffer;
    ctx->index = index;
    return ctx;
  }
  b->open.push_back(index);
  return nullptr;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext* ctx) {
  int64_t t = now_ns();
  if (!g_recording.load(std::memory_order_relaxed)) return;
  ThreadBuffer* b = thread_buffer();
  Busy busy(b);
  if (!g_recording.load(std::memory_order_seq_cst)) return;
  if (ctx != nullptr) {
    auto* async = static_cast<AsyncContext*>(ctx);
    async->buffer->ops[async->index].end = t;
    return;
  }
  auto& open = b->open;
  for (size_t i = open.size(); i-- > 0;) {  // innermost first: nearly always the last one
    Op& op = b->ops[open[i]];
    if (op.key == &fn) {
      op.end = t;
      open.erase(open.begin() + long(i));
      return;
    }
  }
}

void wait_until_idle() {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (auto& b : g_buffers) {
    while (b->busy.load(std::memory_order_acquire) != 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::yield();
    }
  }
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

// Walks one op's encoded inputs: fn(tag, scalar type, ndim, sizes, strides, value index).
template <typename Fn>
void for_each_input(const ThreadBuffer& b, int64_t offset, Fn fn) {
  const int64_t* p = b.shapes.data() + offset;
  int64_t n = *p++;
  for (int64_t i = 0; i < n; ++i) {
    int64_t tag = *p++, st = -1, ndim = 0, value = -1;
    const int64_t *sizes = nullptr, *strides = nullptr;
    if (tag == kTensor || tag == kTensorNoShape) {
      st = *p++;
      if (tag == kTensor) {
        ndim = *p++;
        sizes = p;
        strides = p + ndim;
        p += 2 * ndim;
      }
    } else if (tag == kScalar || tag == kScalarList) {
      value = *p++;
    }
    fn(i, tag, st, ndim, sizes, strides, value);
  }
}

// torch's name of a scalar type ("float", "c10::BFloat16"...), computed once per type
const std::string& type_name(int64_t st) {
  static std::unordered_map<int64_t, std::string> names;
  auto hit = names.find(st);
  if (hit != names.end()) return hit->second;
  std::string name(c10::scalarTypeToTypeMeta(c10::ScalarType(st)).name());
  return names.emplace(st, std::move(name)).first->second;
}

void append_int(std::string& out, int64_t v) {
  char buf[24];
  int len = std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(v));
  out.append(buf, size_t(len));
}

void append_ints(std::string& out, const int64_t* v, int64_t n) {
  out.push_back('[');
  for (int64_t k = 0; k < n; ++k) {
    if (k) out += ", ";
    append_int(out, v[k]);
  }
  out.push_back(']');
}

// torch.profiler's record_shapes args for one op, as four JSON values appended to `out`, each
// followed by a NUL byte: Concrete Inputs, Input type, Input Strides, Input Dims.
void append_shape_fragments(std::string& out, const ThreadBuffer& b, int64_t offset) {
  static std::ostringstream os;  // reused: constructing one per value costs more than formatting it
  out.push_back('[');
  for_each_input(b, offset, [&](int64_t i, int64_t tag, int64_t, int64_t, const int64_t*, const int64_t*,
                                int64_t value) {
    if (i) out += ", ";
    if (value >= 0) {
      os.str(std::string());
      os.clear();
      os << b.values[size_t(value)];
      append_json_string(out, os.str());
    } else {
      out += "\"\"";
    }
    (void)tag;
  });
  out.push_back(']');
  out.push_back('\0');
  out.push_back('[');
  for_each_input(b, offset, [&](int64_t i, int64_t tag, int64_t st, int64_t, const int64_t*, const int64_t*,
                                int64_t) {
    if (i) out += ", ";
    if (st >= 0) {
      append_json_string(out, type_name(st));
    } else if (tag == kScalar) {
      out += "\"Scalar\"";
    } else if (tag == kScalarList) {
      out += "\"ScalarList\"";
    } else if (tag == kTensorList) {
      out += "\"TensorList\"";
    } else {
      out += "\"\"";
    }
  });
  out.push_back(']');
  out.push_back('\0');
  for (int which = 0; which < 2; ++which) {  // strides, then dims
    out.push_back('[');
    for_each_input(b, offset, [&](int64_t i, int64_t, int64_t, int64_t ndim, const int64_t* sizes,
                                  const int64_t* strides, int64_t) {
      if (i) out += ", ";
      append_ints(out, which == 0 ? strides : sizes, ndim);
    });
    out.push_back(']');
    out.push_back('\0');
  }
}

}  // namespace

extern "C" {

int polyprof_observer_abi() { return kAbiVersion; }

const char* polyprof_observer_error() { return g_error.c_str(); }

// Starts recording the calling thread's operators (and those of threads that inherit its
// RecordFunction state, such as autograd's). Returns 0, or -1 with polyprof_observer_error().
int polyprof_observer_start(int record_shapes) {
  try {
    if (g_handle != 0) {
      g_error = "the observer is already recording (one polyprof torch session at a time)";
      return -1;
    }
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      g_buffers.clear();
    }
    g_shapes = record_shapes != 0;
    g_generation.fetch_add(1);
    g_recording.store(true, std::memory_order_seq_cst);
    g_handle = at::addThreadLocalCallback(
        at::RecordFunctionCallback(on_start, on_end).needsInputs(g_shapes));
    return 0;
  } catch (const std::exception& e) {
    g_recording.store(false);
    g_error = e.what();
    return -1;
  }
}

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
  wait_until_idle();
  std::lock_guard<std::mutex> lock(g_mutex);
  int64_t n = 0;
  for (auto& b : g_buffers) n += int64_t(b->ops.size());
  return n;
}

// Bytes needed by polyprof_observer_names.
int64_t polyprof_observer_names_size() {
  std::lock_guard<std::mutex> lock(g_mutex);
  int64_t size = 0;
  for (auto& b : g_buffers)
    for (auto& s : b->names) size += int64_t(s.size()) + 1;
  return size;
}

// Every thread's names, NUL-terminated, thread after thread; name ids in polyprof_observer_fill are
// indices into this list.
void polyprof_observer_names(char* out) {
  std::lock_guard<std::mutex> lock(g_mutex);
  for (auto& b : g_buffers) {
    for (auto& s : b->names) {
      std::memcpy(out, s.c_str(), s.size() + 1);
      out += s.size() + 1;
    }
  }
}

// Fills one array per field, operators thread after thread, each thread's in start order.
// end is 0 for an operator still open at stop.
void polyprof_observer_fill(int64_t* start, int64_t* end, int64_t* tid, int64_t* seq, int64_t* fwd_tid,
                            int64_t* rf_tid, int32_t* name, uint8_t* scope) {
  std::lock_guard<std::mutex> lock(g_mutex);
  int64_t i = 0;
  int32_t name_base = 0;
  for (auto& b : g_buffers) {
    for (const Op& op : b->ops) {
      start[i] = op.start;
      end[i] = op.end;
      tid[i] = b->tid;
      seq[i] = op.seq;
      fwd_tid[i] = op.fwd_tid;
      rf_tid[i] = op.rf_tid;
      name[i] = name_base + op.name;
      scope[i] = op.scope;
      ++i;
    }
    name_base += int32_t(b->names.size());
  }
}

// Args of every operator as JSON fragments, six per op in fill order, each followed by a NUL byte
// (JSON text never holds a raw one): Sequence number, Fwd thread id, Concrete Inputs, Input type,
// Input Strides, Input Dims. An empty fragment means torch writes no such key (no sequence number; no
// inputs, or record_shapes off). The returned text stays valid until the next call or
// polyprof_observer_reset.
const char* polyprof_observer_arg_fragments(int64_t* size) {
  static std::string out;
  out.clear();
  std::lock_guard<std::mutex> lock(g_mutex);
  for (auto& b : g_buffers) {
    for (const Op& op : b->ops) {
      if (op.seq >= 0) append_int(out, op.seq);
      out.push_back('\0');
      if (op.seq >= 0) append_int(out, op.fwd_tid);
      out.push_back('\0');
      if (op.shapes >= 0) {
        append_shape_fragments(out, *b, op.shapes);
      } else {
        out.append(4, '\0');
      }
    }
  }
  *size = int64_t(out.size());
  return out.data();
}

// Frees what was recorded.
void polyprof_observer_reset() {
  std::lock_guard<std::mutex> lock(g_mutex);
  for (auto& b : g_buffers) {  // threads keep a reference to their buffer until they next record
    std::deque<Op>().swap(b->ops);
    std::vector<int64_t>().swap(b->shapes);
    std::vector<c10::IValue>().swap(b->values);
  }
  g_buffers.clear();
  g_generation.fetch_add(1);
}

}  // extern "C"
