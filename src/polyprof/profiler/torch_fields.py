"""The ``tag`` and ``extra_fields`` of each node of torch's event tree, for a polyprof trace: objects of
torch's own ``_ExtraFields_*`` classes (subclassed, so that ``isinstance`` holds in torch's analyses and
in users' code), filled from the trace's rows. :mod:`polyprof.profiler.torch_view` builds the tree::

    fields = TreeFields(trace.attachments.get(PYTHON_CALLS))   # the python backend's calls, if any
    fields.fill(node)                                          # node.tag, node.extra_fields
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

from polyprof.model import ActivityKind
from polyprof.torch.attachments import PY_C_CALL, PY_CALL

#: the names of the allocator's rows (``[memory]`` events, torch's out-of-memory one)
MEMORY_NAMES = ("[memory]", "[OutOfMemory]")


def concrete_value(text: Any) -> Any:
    """One "Concrete Inputs" string as torch's KinetoEvent.concrete_inputs() gives it: '' -> None,
    '[4, 3]' -> [4, 3], '6' -> 6, 'False' -> False, '1.' -> 1.0."""
    if not isinstance(text, str):
        return text
    if text == "":
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        try:
            return float(text)
        except ValueError:
            return text


class TreeFields:
    """tag and extra_fields of each node, as torch's tree has them (Python calls from the python
    backend's :class:`~polyprof.backends.python_calls.PythonCallTable` when the trace has one)."""

    def __init__(self, calls: Any) -> None:
        from torch._C._profiler import _EventType

        self.types = _EventType
        self.calls = calls
        self.py_call, self.py_c_call = python_fields()
        self.op, self.allocation = op_fields()

    def is_op(self, node: Any) -> bool:
        return node.tag == self.types.TorchOp

    def fill(self, node: Any) -> None:
        e = node.event
        if e._kind != int(ActivityKind.PYTHON_FUNCTION):
            if e._name in MEMORY_NAMES:
                node.tag, node.extra_fields = self.types.Allocation, self.allocation.of(e)
            elif e._kind in (int(ActivityKind.CPU_OP), int(ActivityKind.USER_ANNOTATION)):
                node.tag, node.extra_fields = self.types.TorchOp, self.op.of(e)
            else:
                node.tag = self.types.Kineto
            return
        python_id = e.python_id()
        calls = self.calls
        kind = calls.kind(python_id) if calls is not None and 0 < python_id <= len(calls) else (
            PY_C_CALL if e._name.startswith("<built-in") else PY_CALL)
        if kind == PY_C_CALL:
            node.tag = self.types.PyCCall
            node.extra_fields = self.py_c_call.of(calls.caller(python_id) if calls is not None else None)
            return
        node.tag = self.types.PyCall
        callsite = calls.callsite(python_id) if calls is not None else None
        node.extra_fields = self.py_call.of(
            callsite or _site_from_name(e._name),
            calls.caller(python_id) if calls is not None else None,
            calls.module(python_id) if calls is not None else None,
        )


def _site_from_name(name: str) -> Any:
    """A callsite from torch's "file.py(12): function" name (a trace read back has no call table)."""
    from polyprof.torch.attachments import Site

    head, _, function = name.partition("): ")
    file, _, line = head.rpartition("(")
    return Site(file, function, int(line) if line.isdigit() else 0)


_PYTHON_FIELDS: tuple[Any, Any] | None = None


def python_fields() -> tuple[Any, Any]:
    """The classes of a Python call's ``extra_fields``: subclasses of torch's ``_ExtraFields_PyCall``
    and ``_ExtraFields_PyCCall``, so that ``isinstance`` checks in torch's own analyses and in user code
    hold. Their instances are made without torch's constructor (which torch does not expose) and carry
    their fields in slots of their own, never reading the base's: ``callsite``, ``caller`` (file_name,
    function_name, line_number), ``module`` (cls_name, id, self_ptr, cls_ptr, parameters) and
    ``optimizer`` (None: polyprof does not single optimizer calls out)."""
    global _PYTHON_FIELDS
    if _PYTHON_FIELDS is None:
        from torch._C._profiler import _ExtraFields_PyCall, _ExtraFields_PyCCall

        class PyCallFields(_ExtraFields_PyCall):
            __slots__ = ("callsite", "caller", "module", "optimizer")

            @classmethod
            def of(cls, callsite: Any, caller: Any, module: Any) -> Any:
                fields = cls.__new__(cls)
                fields.callsite = callsite
                fields.caller = caller if caller is not None else callsite  # torch: a top frame is its own caller
                fields.module = _ModuleInfo(*module) if module is not None else None
                fields.optimizer = None
                return fields

            def __repr__(self) -> str:
                return f"<polyprof PyCall fields {self.callsite}>"

        class PyCCallFields(_ExtraFields_PyCCall):
            __slots__ = ("caller",)

            @classmethod
            def of(cls, caller: Any) -> Any:
                fields = cls.__new__(cls)
                fields.caller = caller
                return fields

            def __repr__(self) -> str:
                return f"<polyprof PyCCall fields called from {self.caller}>"

        _PYTHON_FIELDS = (PyCallFields, PyCCallFields)
    return _PYTHON_FIELDS


_OP_FIELDS: tuple[Any, Any] | None = None


def op_fields() -> tuple[Any, Any]:
    """The classes of an operator's and an allocation's ``extra_fields``: subclasses of torch's
    ``_ExtraFields_TorchOp`` and ``_ExtraFields_Allocation``, made as :func:`python_fields` makes its own.
    An op's: ``name``, ``scope`` (torch's RecordScope), ``sequence_number``, ``allow_tf32_cublas`` (False:
    not recorded) and ``inputs`` (with ``record_shapes``, as torch gives them: a ``_TensorMetadata``
    subclass for a tensor, a list of them for a tensor list, the value of a scalar, None for the rest;
    a tensor's ``device`` is the CPU, its pointers and ids None, and a tensor list's dtypes None: the
    trace does not record them). An
    allocation's: ``ptr``, ``alloc_size``,
    ``total_allocated``, ``total_reserved``, ``device``, and ``id``/``allocation_id`` None, as torch
    leaves them until its memory profiler numbers the tensors."""
    global _OP_FIELDS
    if _OP_FIELDS is None:
        import torch

        _OP_FIELDS = (_torch_op_fields(_op_inputs(_tensor_fields(torch))), _allocation_fields(torch))
    return _OP_FIELDS


def _tensor_fields(torch: Any) -> Any:
    """The class of a tensor input's metadata (torch's ``_TensorMetadata``), made from the trace's shape,
    strides and type name."""
    from torch._C._profiler import _TensorMetadata

    class TensorFields(_TensorMetadata):
        __slots__ = ("sizes", "strides", "dtype", "dim", "layout", "device", "impl_ptr", "storage_data_ptr",
                     "id", "allocation_id")

        @classmethod
        def of(cls, sizes: list, strides: Any, dtype_name: str) -> Any:
            fields = cls.__new__(cls)
            fields.sizes, fields.dim = list(sizes), len(sizes)
            fields.strides = list(strides) if isinstance(strides, list) else []
            fields.dtype = getattr(torch, _DTYPES.get(dtype_name, ""), None)
            fields.layout, fields.device = torch.strided, torch.device("cpu")
            fields.impl_ptr = fields.storage_data_ptr = fields.id = fields.allocation_id = None
            return fields

        def __repr__(self) -> str:
            return f"<polyprof TensorMetadata {self.sizes} {self.dtype}>"

    return TensorFields


def _op_inputs(tensor_fields: Any) -> Callable[[Any], list]:
    """`event`'s inputs as torch gives them, read from its recorded shapes, types and concrete values."""

    def inputs(event: Any) -> list:
        args = event._args
        dims, types = args.get("Input Dims"), args.get("Input type")
        if not isinstance(dims, list) or not isinstance(types, list):
            return []
        strides, values = args.get("Input Strides") or [], args.get("Concrete Inputs") or []
        out: list = []
        for i, (shape, kind) in enumerate(zip(dims, types, strict=False)):
            stride = strides[i] if i < len(strides) else []
            if kind == "TensorList" and isinstance(shape, list):
                out.append([tensor_fields.of(s, stride[j] if j < len(stride) else [], "")
                            for j, s in enumerate(shape)])
            elif kind in _DTYPES:
                out.append(tensor_fields.of(shape if isinstance(shape, list) else [], stride, kind))
            elif kind == "Scalar":
                out.append(concrete_value(values[i] if i < len(values) else ""))
            else:
                out.append(None)
        return out

    return inputs


def _torch_op_fields(inputs: Callable[[Any], list]) -> Any:
    from torch._C._profiler import RecordScope, _ExtraFields_TorchOp

    class TorchOpFields(_ExtraFields_TorchOp):
        __slots__ = ("name", "scope", "sequence_number", "allow_tf32_cublas", "inputs")

        @classmethod
        def of(cls, event: Any) -> Any:
            fields = cls.__new__(cls)
            fields.name = event._name
            annotation = event._kind == int(ActivityKind.USER_ANNOTATION)
            fields.scope = RecordScope.USER_SCOPE if annotation else RecordScope.FUNCTION
            fields.sequence_number = event.sequence_nr()
            fields.allow_tf32_cublas = False
            fields.inputs = inputs(event)
            return fields

        def __repr__(self) -> str:
            return f"<polyprof TorchOp fields {self.name!r}>"

    return TorchOpFields


def _allocation_fields(torch: Any) -> Any:
    from torch._C._profiler import _ExtraFields_Allocation

    class AllocationFields(_ExtraFields_Allocation):
        __slots__ = ("ptr", "id", "allocation_id", "alloc_size", "total_allocated", "total_reserved", "device")

        @classmethod
        def of(cls, event: Any) -> Any:
            args = event._args
            fields = cls.__new__(cls)
            fields.ptr = int(args.get("Addr", 0))
            fields.id = fields.allocation_id = None
            fields.alloc_size = int(args.get("Bytes", 0))
            fields.total_allocated = int(args.get("Total Allocated", 0))
            fields.total_reserved = int(args.get("Total Reserved", 0))
            fields.device = _allocation_device(torch, args)
            return fields

        def __repr__(self) -> str:
            return f"<polyprof Allocation fields {self.alloc_size} B at {self.ptr:#x}>"

    return AllocationFields


#: Kineto's "Input type" of a tensor (c10's type names) -> torch's dtype attribute
_DTYPES = {
    "float": "float32", "double": "float64", "c10::Half": "float16", "c10::BFloat16": "bfloat16",
    "long int": "int64", "int": "int32", "short int": "int16", "signed char": "int8", "unsigned char": "uint8",
    "bool": "bool", "c10::complex<float>": "complex64", "c10::complex<double>": "complex128",
}


def _allocation_device(torch: Any, args: dict) -> Any:
    """The torch.device of a [memory] row (Kineto's "Device Type" is c10's DeviceType number)."""
    index = int(args.get("Device Id", -1))
    try:
        kind = str(torch._C._autograd.DeviceType(int(args.get("Device Type", 0)))).rpartition(".")[2].lower()
        return torch.device(kind, index) if index >= 0 and kind != "cpu" else torch.device(kind)
    except (TypeError, ValueError, RuntimeError):
        return torch.device("cpu")


class _ModuleInfo:
    """torch's ``_NNModuleInfo`` fields of an ``nn.Module: X_n`` call (``parameters`` is not recorded)."""

    __slots__ = ("cls_name", "id", "self_ptr", "cls_ptr", "parameters")

    def __init__(self, cls_name: str, ident: int, self_ptr: int, cls_ptr: int) -> None:
        self.cls_name, self.id, self.self_ptr, self.cls_ptr = cls_name, ident, self_ptr, cls_ptr
        self.parameters: list = []
