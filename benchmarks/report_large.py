"""`polyprof report` of a large trace: build time, file size, and load time in headless Chromium.

    .venv/bin/python benchmarks/report_large.py [--events 1000000]

The synthetic trace of export_throughput.py (host ops, kernels, copies, flows); the build is
`write_report` on the loaded trace (analyses, charts, HTML); the load time is the browser's own
`loadEventEnd` (navigation timing), which includes plotly.js parsing and every chart drawn in
DOMContentLoaded. Target (issue #18): under 10 MB.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from _common import report
from export_throughput import synthetic_trace

from polyprof.report import write_report

CHROMIUM = "/usr/bin/chromium"


def load_ms(path: str) -> float | None:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    if not os.path.exists(CHROMIUM):
        return None
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        samples = []
        for _ in range(3):
            page = browser.new_page()
            page.goto("file://" + path)
            page.wait_for_load_state("load")
            samples.append(page.evaluate("performance.getEntriesByType('navigation')[0].loadEventEnd"))
            page.close()
        browser.close()
    return min(samples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=1_000_000)
    args = ap.parse_args()
    trace = synthetic_trace(args.events, seed=7)
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "report.html")
        t0 = time.perf_counter()
        write_report([trace], out)
        build = time.perf_counter() - t0
        size = os.path.getsize(out)
        loaded = load_ms(out)
    report("report_large", {
        "events": args.events,
        "build_s": round(build, 2),
        "size_bytes": size,
        "chromium_load_ms": None if loaded is None else round(loaded),
        "targets": {"size_bytes_max": 10_000_000},
        "meets_targets": size < 10_000_000,
    })


if __name__ == "__main__":
    main()
