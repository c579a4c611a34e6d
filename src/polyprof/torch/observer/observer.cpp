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

// The sections, in this order (each uses what those before it define)
namespace {
#include "sections/buffers.cpp.h"
#include "sections/threads.cpp.h"
#include "sections/inputs.cpp.h"
#include "sections/callbacks.cpp.h"
}  // namespace

extern "C" {
#include "sections/c_abi.cpp.h"
}  // extern "C"
