/* The polyprof._speedups module: process-wide ids, the clock, and every file's functions. */
#include "speedups.h"

unsigned long long pp_next_id = 1;

static PyObject *sp_next_id(PyObject *m, PyObject *unused) { return PyLong_FromUnsignedLongLong(pp_next_id++); }

static PyObject *sp_reserve_ids(PyObject *m, PyObject *arg) {
    long long n = PyLong_AsLongLong(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "reserve_ids needs a count >= 0");
        return NULL;
    }
    unsigned long long first = pp_next_id;
    pp_next_id += (unsigned long long)n;
    return PyLong_FromUnsignedLongLong(first);
}

static PyObject *sp_now_ns(PyObject *m, PyObject *unused) { return PyLong_FromLongLong(pp_now_ns()); }

static PyMethodDef module_methods[] = {
    {"next_id", sp_next_id, METH_NOARGS, "A new process-wide correlation id."},
    {"reserve_ids", sp_reserve_ids, METH_O, "reserve_ids(n): the first of n consecutive new ids."},
    {"now_ns", sp_now_ns, METH_NOARGS, "CLOCK_MONOTONIC in ns (the clock of time.perf_counter_ns on Linux)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef sp_module = {
    PyModuleDef_HEAD_INIT, "polyprof._speedups", "polyprof's C parts (see speedups.h).", -1, module_methods,
};

PyMODINIT_FUNC PyInit__speedups(void) {
    PyObject *m = PyModule_Create(&sp_module);
    if (m == NULL) return NULL;
    if (PyModule_AddFunctions(m, pp_recorder_methods) < 0 || PyModule_AddFunctions(m, pp_format_methods) < 0 ||
        PyModule_AddFunctions(m, pp_columns_methods) < 0 ||
        PyModule_AddFunctions(m, pp_perfetto_methods) < 0 || PyModule_AddFunctions(m, pp_merge_methods) < 0 ||
        PyModule_AddFunctions(m, pp_merge_packets_methods) < 0 ||
        PyModule_AddFunctions(m, pp_merge_pass_methods) < 0 ||
        PyModule_AddFunctions(m, pp_read_methods) < 0 || PyModule_AddFunctions(m, pp_read_packets_methods) < 0 ||
        PyModule_AddFunctions(m, pp_perfetto_args_methods) < 0 || PyModule_AddFunctions(m, pp_pytrace_methods) < 0 ||
        pp_recorder_add_types(m) < 0 || pp_pytrace_add_types(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
