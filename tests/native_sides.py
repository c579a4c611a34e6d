"""Helpers for tests that run polyprof's native door one side or the other."""


def use_python_side(monkeypatch) -> None:
    """Within a test, every name of polyprof's native door as it is without the extension (the
    accelerators decline and the callers' reference paths run), whether or not the extension is built.
    The recorder is left as it was chosen at import (its type is polyprof.record_function itself)."""
    import polyprof._native as native
    from polyprof._native import python as python_side

    for name in native.SIDE_NAMES:
        if name not in native.RECORDER_NAMES:
            monkeypatch.setattr(native, name, getattr(python_side, name))
