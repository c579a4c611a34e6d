"""polyprof's integration with PyTorch, apart from the ``torch`` backend that records with it: what the
engine, the front ends (``polyprof run``, the flight recorder, on-demand capture, polyprof behind
torch.profiler) and the backend share, importable without a backend::

    import_hook      # run a callback when the program imports torch (nothing imported before)
    steps            # training steps counted from optimizers and profile.step(); a start synced by step
    job_store        # torchrun's TCPStore, reached without torch.distributed's process group
    observer/        # the C++ operator observer, built once per torch, and its library's loader
    bridge           # polyprof.record_function as a torch RecordFunction when a torch consumer listens

None of these imports torch at import time.
"""
