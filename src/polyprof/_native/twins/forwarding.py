"""A plain Python function's parameters as source, for a wrapper that takes and forwards exactly them.

On CPython 3.11 a wrapper ``def w(*a, **kw): return fn(*a, **kw)`` costs about 1,000 instructions a
call more than ``fn()`` itself (the packing and a ``CALL_FUNCTION_EX``, which leaves the interpreter
loop), while ``def w(x, y=d[0]): return fn(x, y)`` costs about 270: the call is an ordinary one. Hot
wrappers (the pure-Python ``@record_function``) are compiled from source with the signature found here::

    shape = signature_source(fn)   # None: not a plain function, or one with *args / **kwargs
    if shape is not None:
        source = f"def wrapper({shape.params}):\\n    return fn({shape.call})"
        # compiled where `defaults` and `kwdefaults` are shape.defaults and shape.kwdefaults

A default is passed on as the object the function had when the wrapper was made (a later assignment to
``fn.__defaults__`` is not seen by the wrapper).
"""

from __future__ import annotations

import inspect
import types
from typing import Any


class SignatureSource:
    """``params``: the parameter list as source (defaults as ``defaults[i]`` and ``kwdefaults['name']``);
    ``call``: the arguments that pass each parameter on; ``names``: the parameters' names; ``defaults``
    and ``kwdefaults``: the values to compile ``params`` with."""

    __slots__ = ("params", "call", "names", "defaults", "kwdefaults")

    def __init__(
        self, params: str, call: str, names: frozenset[str], defaults: tuple[Any, ...], kwdefaults: dict[str, Any]
    ) -> None:
        self.params, self.call, self.names = params, call, names
        self.defaults, self.kwdefaults = defaults, kwdefaults


def signature_source(fn: Any, defaults: str = "defaults", kwdefaults: str = "kwdefaults") -> SignatureSource | None:
    """The signature of `fn` as source, where `fn` is a plain Python function (``def`` or ``lambda``)
    without ``*args`` or ``**kwargs``; None otherwise (the caller then forwards ``*a, **kw``). The
    defaults are read from the names given, where the source is compiled."""
    if type(fn) is not types.FunctionType:  # a builtin, a partial, a callable object: its own rules
        return None
    code = fn.__code__
    if code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS):
        return None
    n_positional, n_keyword = code.co_argcount, code.co_kwonlyargcount
    names = code.co_varnames[: n_positional + n_keyword]
    default_values = fn.__defaults__ or ()
    kwdefault_values = fn.__kwdefaults__ or {}
    first_default = n_positional - len(default_values)
    params: list[str] = []
    for at, name in enumerate(names[:n_positional]):
        params.append(f"{name}={defaults}[{at - first_default}]" if at >= first_default else name)
        if at == code.co_posonlyargcount - 1:
            params.append("/")
    if n_keyword:
        params.append("*")
        params.extend(f"{name}={kwdefaults}[{name!r}]" if name in kwdefault_values else name for name in names[n_positional:])
    call = [*names[:n_positional], *(f"{name}={name}" for name in names[n_positional:])]
    return SignatureSource(", ".join(params), ", ".join(call), frozenset(names), tuple(default_values), dict(kwdefault_values))
