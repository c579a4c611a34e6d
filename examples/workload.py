"""The bundled example workload: a small numerical pipeline annotated with polyprof.

Run it under the profiler (`polyprof run examples/workload.py`) or on its own. It uses only numpy
and threads, so it runs anywhere; device plugins that are installed add their own rows.
"""

import sys
import threading

import numpy as np

import polyprof


@polyprof.record_function("load batch")
def load_batch(rng: np.random.Generator, size: int) -> np.ndarray:
    return rng.standard_normal((size, size))


@polyprof.record_function("matmul chain")
def matmul_chain(a: np.ndarray, depth: int) -> np.ndarray:
    out = a
    for i in range(depth):
        with polyprof.record_function(f"layer {i}"):
            out = np.tanh(out @ a)
    return out


def background_io(stop: threading.Event) -> None:
    n = 0
    while not stop.is_set():
        with polyprof.record_function("background poll"):
            stop.wait(0.002)
        n += 1
        polyprof.counter("background polls", n)


def main(steps: int = 8, size: int = 192) -> float:
    rng = np.random.default_rng(0)
    stop = threading.Event()
    worker = threading.Thread(target=background_io, args=(stop,), name="io-worker")
    worker.start()
    total = 0.0
    try:
        for step in range(steps):
            with polyprof.record_function(f"step {step}"):
                batch = load_batch(rng, size)
                result = matmul_chain(batch, depth=4)
                with polyprof.record_function("reduce"):
                    total += float(np.abs(result).mean())
            polyprof.instant("step done", {"step": step})
    finally:
        stop.set()
        worker.join()
    return total


if __name__ == "__main__":
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    print(f"workload result: {main(steps):.6f}")
