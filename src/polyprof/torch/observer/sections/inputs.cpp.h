// A section of observer.cpp (operator inputs (record_shapes): shapes, strides, scalars and lists as records), included once into it, inside its anonymous namespace: one translation unit.
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
