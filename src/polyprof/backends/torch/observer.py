"""The observer moved to :mod:`polyprof.torch.observer`; ``python -m polyprof.backends.torch.observer``,
the command set-up scripts were told to run, still builds it."""

if __name__ == "__main__":
    import runpy

    runpy.run_module("polyprof.torch.observer", run_name="__main__", alter_sys=True)
