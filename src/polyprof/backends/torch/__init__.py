"""The ``torch`` backend: PyTorch operators (aten ops, autograd nodes, torch record_function ranges)
recorded through PyTorch's RecordFunction callbacks, at the C++ level.

* Two recorders. By default polyprof's own observer (:mod:`.observer`, C++ built once against the
  installed torch) appends each op to per-thread columns that are read in bulk after stop; it serves
  ``record_shapes``, ``profile_memory``, ``with_flops``, ``with_modules`` and the experimental
  ``profile_all_threads``, ``capture_overload_names`` and ``with_stack`` (whose Python calls the
  python backend records, as torch's Python tracer does; torch's collector only with ``profile_memory``
  too, whose memory timeline walks torch's own tree). When the observer
  cannot be built (no C++ compiler; the backend warns and says how to fix it) or
  ``POLYPROF_TORCH_OBSERVER=0``, torch's own collector is used in CPU-only mode (:mod:`.collector`),
  which is slower to stop. The backend status's ``details.recorder`` says which ran, and why.
* Activity group CPU, available when torch is installed. torch is not imported to find that out, and a
  session does not import it either: it starts recording when the program has imported torch, or at
  the moment the program imports it (:mod:`.import_hook`), so ``polyprof run train.py`` captures the
  script's ops.
* Only ``ProfilerActivity.CPU`` is asked of torch, so torch's own device tracers are not enabled by
  this backend; polyprof's device plugins own those.
* What each op carries is what torch.profiler writes: ``External id``, ``Record function id``,
  ``Sequence number``, ``Fwd thread id``, ``Input Dims``/``Input type``/``Input Strides``/``Concrete
  Inputs`` and keyword arguments with record_shapes, ``flops`` with
  with_flops, ``Module Hierarchy`` with with_modules (TorchScript's, and the same text for eager
  modules from the Python frames), forward->backward ``fwdbwd`` flows,
  ``[memory]`` instant events with profile_memory.
* Device work launched by an op gets the op's id as ``External id`` by time containment of its launch
  on the same thread (the engine does this for every backend), since torch offers Python no hook to
  push correlation ids per op.
* Both record the ops of the thread that starts the profile and of threads that inherit its
  RecordFunction state (autograd's), as torch.profiler does.
* :mod:`.bridge` makes ``polyprof.record_function`` a torch RecordFunction too whenever a torch-side
  consumer listens.

Uses private torch APIs (``torch._C._autograd._enable_profiler`` and friends), guarded; checked on the
installed torch (2.13) and written against the 2.4+ signatures.
"""
