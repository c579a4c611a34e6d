"""Converting one rank's trace into the store, against `load_trace` of the same file: wall time and
peak RSS, each in a child process of its own.

    .venv/bin/python benchmarks/store_convert.py [--gb 0.25,1.0] [--format json|pftrace|spill|spill.pftrace]

The trace is convert_large.py's: what torch.profiler writes for a CUDA training step (aten ops with
shapes, launches with ac2g flows to kernels on two streams); with `--format pftrace`, that JSON of
`--gb` converted to polyprof's Perfetto protobuf (`polyprof convert`, not timed); with `--format spill`,
that JSON's rows written as the spill a killed run leaves (100 hand-overs of a host and a device backend;
not timed), where `recover_trace` stands for `load_trace`; `--format spill.pftrace`, the same as the
spill of a `.pftrace` output (Perfetto packets). Three children per size: `load_trace` of the
file; `polyprof store FILE -o OUT` (a large rank streams into the store in
bounded memory); and
the loaded conversion the store used before it streamed (`rank_tables` of the loaded trace), for its
memory. Targets (issue #53): the store's time at most `load_trace`'s, its memory bounded whatever the
trace's size.
"""

from __future__ import annotations

import argparse
import os
import shutil

from _common import report, run_polyprof_measured, run_python_measured, scratch_folder
from convert_large import write_kineto_json

LOAD = "import polyprof\npolyprof.load_trace(sys.argv[1])\n"
LOADED_CONVERSION = (
    "import polyprof\nfrom polyprof.formats.store.files import write_rank\nfrom polyprof.formats.store.rank_tables import rank_tables\n"
    "write_rank(rank_tables(polyprof.load_trace(sys.argv[1])), sys.argv[2])\n"
)


#: the JSON as the spill of a run killed before it wrote its trace: 100 hand-overs, each the host
#: backend's rows and the device backend's (launches and device work) that ended by then
SPILL_OF = """import numpy as np, polyprof
from polyprof.formats.spill.file import SpillWriter
from polyprof.formats.spill.perfetto import PerfettoSpill
from polyprof.model import ActivityKind, BackendStatus, CollectedPart
t = polyprof.load_trace(sys.argv[1])
a = t.activities
device_side = (a["kind"] == int(ActivityKind.RUNTIME)) | (a["device"] != 0)
flush = np.searchsorted(np.linspace(int(a["start"].min()), int(a["end"].max()), 101)[1:], a["end"])
w = (PerfettoSpill if sys.argv[2].endswith(".pftrace") else SpillWriter).create(sys.argv[2], {"version": "benchmark", "pid": 1, "epoch_offset_ns": t.epoch_offset_ns,
                                     "activities": ["cpu", "cuda"], "flush_interval_s": 1.0, "metadata": t.metadata})
w.append_window({"window_start": int(t.window[0]), "backends": ["torch", "cuda"], "flushing": ["torch", "cuda"]})
for i in range(100):
    w.append_parts([CollectedPart(name, BackendStatus(name), a.take(np.flatnonzero(mine & (flush == i))),
                                  devices=tuple(t.devices), resources=tuple(t.resources))
                    for name, mine in (("torch", ~device_side), ("cuda", device_side))])
w.close(clean=False)
"""
#: a spill is read as `polyprof recover` reads it
RECOVER = "from polyprof.formats.spill.recover import recover_trace\nrecover_trace(sys.argv[1])\n"
#: recover_trace of a Perfetto spill through the reference reader (its path before the packet scanner)
RECOVER_BY_READER = ("from polyprof.formats.perfetto import scan\nscan.scan_torn = lambda *a: None\n" + RECOVER)
RECOVERED_CONVERSION = LOADED_CONVERSION.replace("polyprof.load_trace(", "recover_trace(").replace(
    "import polyprof\n", "from polyprof.formats.spill.recover import recover_trace\n")


def measure(gb: float, folder: str, fmt: str, reader: bool = False) -> dict:
    src = os.path.join(folder, f"rank0-{gb}.json")
    events = write_kineto_json(src, int(gb * 1e9))
    if fmt == "pftrace":
        run_polyprof_measured(["convert", src, src[: -len(".json")] + ".pftrace", "-q"])
    elif fmt in ("spill", "spill.pftrace"):
        run_python_measured(SPILL_OF, [src, src[: -len(".json")] + "." + fmt])
    if fmt != "json":
        os.remove(src)
        src = src[: -len(".json")] + "." + fmt
    size = os.path.getsize(src)
    load, loaded_conversion = (RECOVER, RECOVERED_CONVERSION) if "spill" in fmt else (LOAD, LOADED_CONVERSION)
    load_s, load_peak, _ = run_python_measured(load, [src])
    store_s, store_peak, _ = run_polyprof_measured(["store", src, "-o", os.path.join(folder, "job.polyprof"), "-q"])
    loaded_s, loaded_peak, _ = run_python_measured(loaded_conversion, [src, os.path.join(folder, "loaded")])
    by_reader = run_python_measured(RECOVER_BY_READER, [src]) if reader and fmt == "spill.pftrace" else None
    for done in (src, os.path.join(folder, "job.polyprof"), os.path.join(folder, "loaded")):
        shutil.rmtree(done, ignore_errors=True) if os.path.isdir(done) else os.remove(done)
    mb = lambda b: round(b / 2**20)  # noqa: E731
    return {"input_bytes": size, "events": events,
            "load_trace": {"seconds": round(load_s, 2), "peak_mb": mb(load_peak)},
            "store_streamed": {"seconds": round(store_s, 2), "peak_mb": mb(store_peak)},
            "store_loaded": {"seconds": round(loaded_s, 2), "peak_mb": mb(loaded_peak)},
            **({"recover_by_reference_reader": {"seconds": round(by_reader[0], 2), "peak_mb": mb(by_reader[1])}}
               if by_reader else {}),
            "time_over_load_trace": round(store_s / load_s, 2),
            "peak_over_load_trace": round(store_peak / load_peak, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--gb", default="0.25,1.0", help="Trace sizes in GB (of the JSON), comma-separated.")
    ap.add_argument("--format", choices=["json", "pftrace", "spill", "spill.pftrace"], default="json",
                    help="The rank's file format.")
    ap.add_argument("--reader", action="store_true",
                    help="With --format spill.pftrace: also recover through the reference reader (slow).")
    args = ap.parse_args()
    folder = scratch_folder()
    report("store_convert", {"format": args.format,
                             "sizes": [measure(float(gb), folder, args.format, args.reader) for gb in args.gb.split(",")],
                             "target_time_over_load_trace_max": 1.0})


if __name__ == "__main__":
    main()
