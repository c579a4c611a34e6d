"""``python -m polyprof.torch.observer [--force]``: build (or find) the observer for the installed
torch and print where it is."""

from __future__ import annotations

import sys
import time


def main(argv: list[str]) -> int:
    try:
        import torch
    except ImportError:
        print("polyprof torch observer: torch is not installed; nothing to build")
        return 0
    from polyprof.torch.observer import Observer
    from polyprof.torch.observer.builder import BuildError, build

    t0 = time.perf_counter()
    try:
        path = build(torch, force="--force" in argv)
        Observer(str(path))
    except (BuildError, OSError) as exc:
        print(f"polyprof torch observer: not built: {exc}", file=sys.stderr)
        return 1
    print(f"polyprof torch observer for torch {torch.__version__}: {path} ({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
