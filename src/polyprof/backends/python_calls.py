"""Python calls as torch.profiler's ``with_stack`` records them: names, ids and the call tree's fields.

The python backend records in *torch style* when a profile asks for ``with_stack`` (see
``csrc/pytrace.c``): every call, C functions included, on the threads that exist when recording starts.
This module turns those rows into what torch.profiler shows for them:

* names: ``torch/nn/modules/linear.py(124): forward`` (the file with the longest ``sys.path`` /
  site-packages prefix taken off, as ``torch.profiler.python_tracer._prefix_regex`` lists them; the
  line where the call began: the function's first line for a fresh call, the current line for a frame
  open at the start or a resumed generator), ``<built-in method add of type object at 0x...>`` (the C
  function's repr), ``nn.Module: Linear_0`` (a call of ``nn.Module.__call__``: the module's class and
  its index among that class's instances, in start order);
* the trace args torch writes on ``python_function`` events: ``Python id`` (1, 2, ... in start order),
  ``Python parent id`` (the enclosing call's id, null at the top) and ``Python module id``;
* a :class:`PythonCallTable` attached to the trace (``trace.attachments[ATTACHMENT]``) with each
  call's callsite, caller and module, which ``prof.profiler.kineto_results.experimental_event_tree()``
  hands out as torch's ``PyCall`` / ``PyCCall`` fields::

      calls = trace.attachments[ATTACHMENT]
      calls.kind(python_id), calls.callsite(python_id), calls.caller(python_id), calls.module(python_id)
"""

from __future__ import annotations

import os
import site
import sys
from typing import Any, NamedTuple

import numpy as np

from polyprof.model import ActivityKind, ArgColumns, CodedStrings

ATTACHMENT = "python.calls"
PY_CALL, PY_C_CALL, PY_MODULE_CALL = 0, 1, 2  # the rows' `is_c` column in torch style


class Site(NamedTuple):
    """Where a call is: torch's ``_PyFrameState`` fields."""

    file_name: str
    function_name: str
    line_number: int


class Module(NamedTuple):
    """The module an ``nn.Module: X_n`` call called: torch's ``_NNModuleInfo`` fields."""

    cls_name: str
    id: int
    self_ptr: int
    cls_ptr: int


class PythonCallTable:
    """Each recorded call's kind, callsite, caller and module, by its ``Python id`` (1-based)."""

    def __init__(self, kinds: np.ndarray, callsites: np.ndarray, callers: np.ndarray, sites: list[Site],
                 modules: dict[int, Module]) -> None:  # fmt: skip
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
                        code.co_firstlineno)  # fmt: skip
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
    by_id: dict[int, Any] = {}
    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("target", "start", "end", "kind", "lasti", "caller",
                                                         "caller_lasti", "ordinal", "parent", "row")}  # fmt: skip
    base = 0
    for tid, name, code, start, end, _depth, is_c, objects, _s, _d, calls in threads:
        by_id.update((id(o), o) for o in objects)
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
    order = np.lexsort((c["ordinal"], c["start"]))  # start order, as torch numbers them
    c = {k: v[order] for k, v in c.items()}
    n = len(order)
    ids = np.arange(1, n + 1, dtype=np.int64)
    id_of_ordinal = np.zeros(base + 1, dtype=np.int64)
    id_of_ordinal[c["ordinal"]] = ids
    parent_ids = np.where(c["parent"] >= 0, id_of_ordinal[np.maximum(c["parent"], 0)], 0)

    namer = _Namer()
    sites: list[Site] = []
    site_index: dict[tuple[int, int], int] = {}

    def site_of(ptr: int, lasti: int) -> int:
        key = (ptr, lasti)
        i = site_index.get(key)
        if i is None:
            obj = by_id.get(ptr)
            i = site_index[key] = len(sites) if obj is not None and hasattr(obj, "co_filename") else -1
            if i >= 0:
                sites.append(namer.site(obj, lasti))
        return i

    kinds = c["kind"]
    callsites = np.full(n, -1, dtype=np.int32)
    callers = np.fromiter((site_of(p, li) for p, li in zip(c["caller"].tolist(), c["caller_lasti"].tolist(), strict=True)),
                          dtype=np.int32, count=n)  # fmt: skip
    labels: list[str] = []
    label_index: dict[tuple[int, int], int] = {}
    codes = np.empty(n, dtype=np.int64)
    modules: dict[int, Module] = {}
    module_ids: dict[int, dict[int, int]] = {}  # class -> module -> its index among the class's
    module_args: dict[int, dict] = {}
    targets, lastis = c["target"].tolist(), c["lasti"].tolist()
    module_code = module_call_code()
    if module_code is not None:
        by_id[id(module_code)] = module_code
    for i, (ptr, kind, lasti) in enumerate(zip(targets, kinds.tolist(), lastis, strict=True)):
        obj = by_id.get(ptr)
        if kind == PY_MODULE_CALL:  # one label per module: its class and index among the class's modules
            cls = type(obj)
            index = module_ids.setdefault(id(cls), {}).setdefault(ptr, len(module_ids[id(cls)]))
            modules[i + 1] = Module(cls.__name__, index, ptr, id(cls))
            module_args[i] = {"Python module id": index}
            callsites[i] = site_of(id(module_code), -1)
            key: tuple[int, int] = (ptr, -2)
        else:
            key = (ptr, lasti)
            if kind == PY_CALL:
                callsites[i] = site_of(ptr, lasti)
        code = label_index.get(key)
        if code is None:
            code = label_index[key] = len(labels)
            labels.append(_label(obj, kind, lasti, namer, modules.get(i + 1)))
        codes[i] = code

    rows = np.arange(n)
    if keep is not None:
        wanted = np.array([keep(by_id.get(p), labels[k]) for p, k in zip(targets, codes.tolist(), strict=True)], dtype=bool)
        rows = np.flatnonzero(wanted)
        module_args = {int(j): module_args[int(r)] for j, r in enumerate(rows) if int(r) in module_args}
    parents = parent_ids[rows].astype(object)
    parents[parent_ids[rows] == 0] = None
    sink.activities(
        {
            "kind": np.full(len(rows), int(ActivityKind.PYTHON_FUNCTION)),
            "cat": ["python_function"] * len(rows),
            "name": CodedStrings(codes[rows], labels),
            "device": np.full(len(rows), host),
            "resource": c["row"][rows],
            "start": c["start"][rows],
            "end": c["end"][rows],
        },
        module_args or None,
        ArgColumns(("Python parent id", "Python id"), (parents, ids[rows])),
    )
    return PythonCallTable(kinds.copy(), callsites, callers, sites, modules)


def _label(obj: Any, kind: int, lasti: int, namer: _Namer, module: Module | None) -> str:
    if module is not None:
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
