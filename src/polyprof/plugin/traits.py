"""The optional facts a backend and its sessions declare, in one checked object each, instead of loose
attributes the engine looks for.

::

    from polyprof.plugin import BackendTraits, SessionTraits

    class MyBackend:
        name, api_version, activities = "mydev", API_VERSION, frozenset({"MYDEV"})
        traits = BackendTraits(facilities=frozenset({CUPTI}))   # a one-user vendor facility

    class MySession(SessionBase):
        traits = SessionTraits(thread_affine=True)             # stop on the thread that started it

A backend or session without ``traits`` has every default. ``contract_problems`` (and so
``register_backend``, the entry-point registry and the conformance kit) refuses a ``traits`` that is
not one of these objects, and a trait given as a loose attribute (``in_process = True``) with the fix;
``polyprof backends`` shows each backend's traits.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any


@dataclass(frozen=True)
class BackendTraits:
    """What a backend may declare beyond the contract's required attributes.

    - ``in_process``: polyprof calls its probe and create_session directly, not on a guard thread
      (for backends that start no vendor library: a guard thread would show in tools that sample
      every thread).
    - ``on_by_default``: part of "every group available" (``activities=None``); False leaves it out
      unless its group is named (the python call tracer).
    - ``facilities``: vendor facilities it takes that allow one user per process (``CUPTI``), shown by
      ``polyprof backends``; who holds one is ``ctx.facility_holder``.
    - ``context_scoped_spans``: its spans are scoped by a context (an asyncio task), not by a thread, so
      spans on one thread may overlap; the merge then does not nest them by thread.
    """

    in_process: bool = False
    on_by_default: bool = True
    facilities: frozenset[str] = field(default_factory=frozenset)
    context_scoped_spans: bool = False

    def problems(self) -> list[str]:
        out = [f"traits.{f.name} must be True or False, got {getattr(self, f.name)!r}"
               for f in fields(self) if f.type == "bool" and not isinstance(getattr(self, f.name), bool)]
        if not isinstance(self.facilities, frozenset) or not all(isinstance(f, str) and f for f in self.facilities):
            out.append(f"traits.facilities must be a frozenset of names, got {self.facilities!r}")
        return out

    def described(self) -> list[str]:
        """The traits that differ from the defaults, in words (``polyprof backends``)."""
        words = []
        if self.in_process:
            words.append("in process")
        if not self.on_by_default:
            words.append("only when named")
        if self.facilities:
            words.append("takes " + ", ".join(sorted(self.facilities)))
        if self.context_scoped_spans:
            words.append("context-scoped spans")
        return words


@dataclass(frozen=True)
class SessionTraits:
    """What a session may declare.

    - ``thread_affine``: ``stop`` runs on the thread that started the profile, without a time limit
      (torch's profiler must be stopped there).
    - ``in_process``: its calls run on the calling thread, without a guard thread.
    """

    thread_affine: bool = False
    in_process: bool = False

    def problems(self) -> list[str]:
        return [f"traits.{f.name} must be True or False, got {getattr(self, f.name)!r}"
                for f in fields(self) if not isinstance(getattr(self, f.name), bool)]


def _problems(obj: Any, kind: type) -> list[str]:
    """What is wrong with what `obj` declares as `kind` (BackendTraits or SessionTraits): a trait given as
    a loose attribute, a ``traits`` of another type, or a value of the wrong type."""
    loose = [
        f"{f.name!r} is given as an attribute: declare it as traits = {kind.__name__}({f.name}={getattr(obj, f.name)!r})"
        for f in fields(kind)
        if any(f.name in vars(k) for k in type(obj).__mro__) or f.name in getattr(obj, "__dict__", {})
    ]
    traits = getattr(obj, "traits", None)
    if traits is None:
        return loose
    if not isinstance(traits, kind):
        return [*loose, f"traits must be a polyprof.plugin.{kind.__name__}, got {type(traits).__name__}"]
    return [*loose, *traits.problems()]


def backend_trait_problems(backend: Any) -> list[str]:
    """What is wrong with what `backend` declares (empty when nothing is)."""
    return _problems(backend, BackendTraits)


def session_trait_problems(session: Any) -> list[str]:
    """What is wrong with what `session` declares (empty when nothing is)."""
    return _problems(session, SessionTraits)


def backend_traits(backend: Any) -> BackendTraits:
    """The traits `backend` declared (the defaults where it declared none); checked at registration."""
    traits = getattr(backend, "traits", None)
    return traits if isinstance(traits, BackendTraits) else BackendTraits()


def session_traits(session: Any) -> SessionTraits:
    traits = getattr(session, "traits", None)
    return traits if isinstance(traits, SessionTraits) else SessionTraits()
