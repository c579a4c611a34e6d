"""Python calls as torch.profiler's ``with_stack`` records them: names, ids and the call tree's fields.

The python backend records in *torch style* when a profile asks for ``with_stack`` (see
``_native/csrc/pytrace.c``): every call, C functions included, on the threads that exist when recording starts.
This module turns those rows into what torch.profiler shows for them:

* names: ``torch/nn/modules/linear.py(124): forward`` (the file with the longest ``sys.path`` /
  site-packages prefix taken off, as ``torch.profiler.python_tracer._prefix_regex`` lists them; the
  line where the call began: the function's first line for a fresh call, the current line for a frame
  open at the start or a resumed generator), ``<built-in method add of type object at 0x...>`` (the C
  function's repr), ``nn.Module: Linear_0`` (a call of ``nn.Module.__call__``: the module's class and
  its index among that class's instances, in start order);
* the trace args torch writes on ``python_function`` events: ``Python id`` (1, 2, ... in start order),
  ``Python parent id`` (the enclosing call's id, null at the top) and ``Python module id``;
* a :class:`PythonCallTable` attached to the trace (``trace.attachments[PYTHON_CALLS]``) with each
  call's callsite, caller and module, which ``prof.profiler.kineto_results.experimental_event_tree()``
  hands out as torch's ``PyCall`` / ``PyCCall`` fields::

      calls = trace.attachments[PYTHON_CALLS]
      calls.kind(python_id), calls.callsite(python_id), calls.caller(python_id), calls.module(python_id)
"""

from __future__ import annotations

import os
import site
import sys
from typing import Any, NamedTuple

import numpy as np

from polyprof.model import ActivityKind, ArgColumns, CodedStrings
from polyprof.torch.attachments import PY_C_CALL, PY_CALL, PY_MODULE_CALL, Site


class Module(NamedTuple):
    """The module an ``nn.Module: X_n`` call called: torch's ``_NNModuleInfo`` fields."""

    cls_name: str
    id: int
    self_ptr: int
    cls_ptr: int


class PythonCallTable:
    """Each recorded call's kind, callsite, caller and module, by its ``Python id`` (1-based)."""

    def __init__(self, kinds: np.ndarray, callsites: np.ndarray, callers: np.ndarray, sites: list[Site],
                 modules: dict[int, Module]) -> None:
        self._kinds, self._callsites, self._callers, self._sites, self._modules = kinds, callsites, callers, sites, modules

    def __len__(self) -> int:
        return len(self._kinds)

    def _index(self, python_id: int) -> int:
        if not 1 <= python_id <= len(self._kinds):
            raise KeyError(python_id)
        return python_id - 1

    def kind(self, python_id: int) -> int:
        """PY_CALL, PY_C_CALL or PY_MODULE_CALL."""
        return int(self._kinds[self._index(python_id)])

    def callsite(self, python_id: int) -> Site | None:
        """The called function's file, name and line (None for a C function)."""
        i = int(self._callsites[self._index(python_id)])
        return self._sites[i] if i >= 0 else None

    def caller(self, python_id: int) -> Site | None:
        """The calling frame's file, name and line (None at the top of a thread)."""
        i = int(self._callers[self._index(python_id)])
        return self._sites[i] if i >= 0 else None

    def module(self, python_id: int) -> Module | None:
        return self._modules.get(python_id)


def path_prefixes() -> list[str]:
    """The prefixes taken off file names, longest-sorted as torch.profiler's Python tracer takes them."""
    try:
        from torch.profiler.python_tracer import _prefix_regex

        return list(_prefix_regex())
    except Exception:  # torch absent or changed: the same folders, found the same way
        raw = [*site.getsitepackages(), *sys.path, site.getuserbase(), site.getusersitepackages()]
        return [p + os.sep for p in sorted({os.path.abspath(p) for p in raw if isinstance(p, str)}, reverse=True)]


class _Namer:
    """File names trimmed once each, lines read once per (code, offset)."""

    def __init__(self) -> None:
        self.prefixes = path_prefixes()
        self.files: dict[str, str] = {}
        self.lines: dict[Any, dict[int, int]] = {}

    def file(self, name: str) -> str:
        out = self.files.get(name)
        if out is None:
            out = next((name[len(p):] for p in self.prefixes if name.startswith(p)), name)
            self.files[name] = out
        return out

    def line(self, code: Any, lasti: int) -> int:
        if lasti < 0:
            return int(code.co_firstlineno)
        table = self.lines.get(code)
        if table is None:
            table = self.lines[code] = {}
        line = table.get(lasti)
        if line is None:
            line = next((ln for start, end, ln in code.co_lines() if start <= lasti < end and ln is not None),
                        code.co_firstlineno)
            table[lasti] = line
        return int(line)

    def site(self, code: Any, lasti: int) -> Site:
        return Site(self.file(code.co_filename), code.co_name, self.line(code, lasti))


def collect_torch_style(buffers: list[tuple], sink: Any, host: int, keep: Any) -> PythonCallTable | None:
    """Hand every thread's rows (``TraceBuffer.take()`` tuples, torch style) to `sink` as torch.profiler's
    ``python_function`` events; returns the table to attach. `keep(obj, label) -> bool` filters rows
    (the backend's include/exclude); ids are numbered before it, so a kept row's parent may be absent."""
    threads = [b for b in buffers if len(b[2])]
    if not threads:
        return None
    c, by_id, ordinals = _thread_columns(threads, sink)
    n = len(c["start"])
    ids = np.arange(1, n + 1, dtype=np.int64)
    id_of_ordinal = np.zeros(ordinals + 1, dtype=np.int64)
    id_of_ordinal[c["ordinal"]] = ids
    parent_ids = np.where(c["parent"] >= 0, id_of_ordinal[np.maximum(c["parent"], 0)], 0)

    namer = _Namer()
    module_code = module_call_code()
    if module_code is not None:
        by_id[id(module_code)] = module_code
    kinds = c["kind"]
    modules, module_ids = _modules(c["target"], kinds, by_id)
    # one label per distinct (object, offset): a module call's object is its module, so it has its own
    pairs, inverse = _unique_pairs(c["target"], np.where(kinds == PY_CALL, c["lasti"], -2))
    labels = [_label(by_id.get(ptr), kind, lasti, namer, modules.get(ptr)) for (ptr, lasti), kind in
              zip(pairs, kinds[_first_of(inverse, len(pairs))].tolist(), strict=True)]
    sites = _Sites(by_id, namer)
    label_sites = np.array([sites.of(ptr, lasti) for ptr, lasti in pairs], dtype=np.int32)
    callsites = np.where(kinds == PY_CALL, label_sites[inverse], -1).astype(np.int32)
    if module_code is not None:
        callsites[kinds == PY_MODULE_CALL] = sites.of(id(module_code), -1)
    caller_pairs, caller_inverse = _unique_pairs(c["caller"], c["caller_lasti"])
    callers = np.array([sites.of(ptr, lasti) for ptr, lasti in caller_pairs], dtype=np.int32)[caller_inverse]

    keep_rows = np.ones(n, dtype=bool)
    if keep is not None:
        wanted = np.array([keep(by_id.get(ptr), label) for (ptr, _), label in zip(pairs, labels, strict=True)], dtype=bool)
        keep_rows = wanted[inverse]
    columns = {
        "kind": np.full(n, int(ActivityKind.PYTHON_FUNCTION)),
        "cat": CodedStrings(np.zeros(n, dtype=np.int64), ["python_function"]),
        "name": CodedStrings(inverse, labels),
        "device": np.full(n, host),
        "resource": c["row"],
        "start": c["start"],
        "end": c["end"],
    }
    is_module = kinds == PY_MODULE_CALL
    _hand_over(sink, columns, keep_rows, ids, parent_ids, module_ids, is_module)
    table_modules = {int(i) + 1: modules[int(ptr)] for i, ptr in zip(np.flatnonzero(is_module).tolist(),
                                                                      c["target"][is_module].tolist(), strict=True)}
    return PythonCallTable(kinds.copy(), callsites, callers, sites.sites, table_modules)


def _thread_columns(threads: list[tuple], sink: Any) -> tuple[dict[str, np.ndarray], dict[int, Any], int]:
    """Every thread's calls as columns in start order (as torch numbers them), the tracer's objects by
    address, and how many ordinals the threads used (each thread's are offset past the previous')."""
    by_id: dict[int, Any] = {}
    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("target", "start", "end", "kind", "lasti", "caller",
                                                         "caller_lasti", "ordinal", "parent", "row")}
    base = 0
    for tid, name, code, start, end, _depth, is_c, objects, _s, _d, calls in threads:
        by_id.update(objects)  # the tracer's: address -> object
        lasti, caller, caller_lasti, ordinal, parent = calls
        n = len(code) // 8
        ordinal = np.frombuffer(ordinal, np.int32).astype(np.int64)
        parent = np.frombuffer(parent, np.int32).astype(np.int64)
        cols["target"].append(np.frombuffer(code, np.int64))
        cols["start"].append(np.frombuffer(start, np.int64))
        cols["end"].append(np.frombuffer(end, np.int64))
        cols["kind"].append(np.frombuffer(is_c, np.int8))
        cols["lasti"].append(np.frombuffer(lasti, np.int32))
        cols["caller"].append(np.frombuffer(caller, np.int64))
        cols["caller_lasti"].append(np.frombuffer(caller_lasti, np.int32))
        cols["ordinal"].append(ordinal + base)
        cols["parent"].append(np.where(parent >= 0, parent + base, -1))
        cols["row"].append(np.full(n, sink.host_thread(int(tid), name), dtype=np.int64))
        base += int(ordinal.max()) + 1 if n else 0
    c = {k: np.concatenate(v) for k, v in cols.items()}
    order = np.lexsort((c["ordinal"], c["start"]))
    return {k: v[order] for k, v in c.items()}, by_id, base


class _Sites:
    """Source sites numbered as first asked for; an object without source (a C function) has none (-1)."""

    def __init__(self, by_id: dict[int, Any], namer: _Namer) -> None:
        self.by_id, self.namer = by_id, namer
        self.sites: list[Site] = []
        self.index: dict[tuple[int, int], int] = {}

    def of(self, ptr: int, lasti: int) -> int:
        key = (ptr, lasti)
        i = self.index.get(key)
        if i is None:
            obj = self.by_id.get(ptr)
            i = self.index[key] = len(self.sites) if hasattr(obj, "co_filename") else -1
            if i >= 0:
                self.sites.append(self.namer.site(obj, lasti))
        return i


def _hand_over(sink: Any, columns: dict[str, Any], keep_rows: np.ndarray, ids: np.ndarray, parent_ids: np.ndarray,
               module_ids: np.ndarray, is_module: np.ndarray) -> None:
    """The kept rows to `sink` with torch's args: "Python parent id" (null at the top), "Python id",
    and "Python module id" on module calls."""
    for rows, keys, values in (
        (keep_rows & (parent_ids == 0), ("Python parent id", "Python id"), (None, ids)),
        (keep_rows & (parent_ids > 0) & ~is_module, ("Python parent id", "Python id"), (parent_ids, ids)),
        (keep_rows & (parent_ids > 0) & is_module, ("Python parent id", "Python id", "Python module id"),
         (parent_ids, ids, module_ids)),
    ):
        chosen = np.flatnonzero(rows)
        if not len(chosen):
            continue
        args = tuple(np.full(len(chosen), None, dtype=object) if v is None else v[chosen] for v in values)
        sink.activities({k: _rows(v, chosen) for k, v in columns.items()}, None, ArgColumns(keys, args))


def _modules(targets: np.ndarray, kinds: np.ndarray, by_id: dict[int, Any]) -> tuple[dict[int, Module], np.ndarray]:
    """Each called module's info (its class's name and its index among that class's modules, in the
    order their first calls started, as torch numbers them), and each row's module index (-1: none)."""
    modules: dict[int, Module] = {}
    per_class: dict[int, int] = {}
    index = np.full(len(targets), -1, dtype=np.int64)
    rows = np.flatnonzero(kinds == PY_MODULE_CALL)
    for row, ptr in zip(rows.tolist(), targets[rows].tolist(), strict=True):
        module = modules.get(ptr)
        if module is None:
            cls = type(by_id.get(ptr))
            module = modules[ptr] = Module(cls.__name__, per_class.setdefault(id(cls), 0), ptr, id(cls))
            per_class[id(cls)] += 1
        index[row] = module.id
    return modules, index


def _unique_pairs(a: np.ndarray, b: np.ndarray) -> tuple[list[tuple[int, int]], np.ndarray]:
    """The distinct (a, b) pairs (as Python ints) and each row's index among them."""
    if not len(a):
        return [], np.zeros(0, dtype=np.int64)
    order = np.lexsort((b, a))  # (np.unique(axis=0) sorts rows as bytes: several times slower)
    sa, sb = a[order], b[order]
    new = np.ones(len(a), dtype=bool)
    new[1:] = (sa[1:] != sa[:-1]) | (sb[1:] != sb[:-1])
    inverse = np.empty(len(a), dtype=np.int64)
    inverse[order] = np.cumsum(new) - 1
    return list(zip(sa[new].tolist(), sb[new].tolist(), strict=True)), inverse


def _first_of(inverse: np.ndarray, count: int) -> np.ndarray:
    """For each of `count` groups, a row in it."""
    first = np.empty(count, dtype=np.int64)
    first[inverse[::-1]] = np.arange(len(inverse) - 1, -1, -1)
    return first


def _rows(column: Any, rows: np.ndarray) -> Any:
    if isinstance(column, CodedStrings):
        return CodedStrings(column.codes[rows], column.table)
    return column[rows]


def _label(obj: Any, kind: int, lasti: int, namer: _Namer, module: Module | None) -> str:
    if kind == PY_MODULE_CALL and module is not None:
        return f"nn.Module: {module.cls_name}_{module.id}"
    if kind == PY_C_CALL:
        return obj if isinstance(obj, str) else "<built-in function>"
    if obj is None:
        return "<unknown>"
    return f"{namer.file(obj.co_filename)}({namer.line(obj, lasti)}): {obj.co_name}"


def module_call_code() -> Any:
    """``nn.Module.__call__``'s code when torch is imported (its calls are named by their module), else None."""
    torch = sys.modules.get("torch")
    try:
        return torch.nn.Module.__call__.__code__ if torch is not None else None
    except AttributeError:  # torch half-imported
        return None
