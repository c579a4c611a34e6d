// A section of observer.cpp (the RecordFunction callbacks: an op's start and end, memory reports), included once into it, inside its anonymous namespace: one translation unit.
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
