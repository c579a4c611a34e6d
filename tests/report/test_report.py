"""``polyprof report`` opened in a real browser: headless Chromium (Debian's), driven by Playwright.

The demo's trace (real OpenCL work on PoCL, torch ops) and a 1 M-event trace: no console errors, every
section there, a table sorts when its header is clicked and filters as one types, the charts rendered
(non-empty SVG), a screenshot saved beside the report."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SECTIONS = ("look", "steps", "devices", "kernels", "ops", "launch", "idle", "counters", "backends")

pytest.importorskip("plotly", reason="needs plotly for the report's charts (polyprof[report])")
sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright to drive Chromium (polyprof[test])")
pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="needs Debian's chromium (scripts/setup.sh --test installs it as root)")


def _open(report: Path, shot: Path):
    """Load the report; (errors, load ms, page) with the page left open in a `with` of the caller's."""
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run", "--disable-quic"])
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 900})
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: errors.append(f"fetched {r.url}") if not r.url.startswith(("file:", "data:", "blob:")) else None)
            page.goto(report.as_uri())
            page.wait_for_load_state("load")
            load_ms = page.evaluate("performance.getEntriesByType('navigation')[0].loadEventEnd")
            present = page.evaluate(f"{json.dumps(SECTIONS)}.filter(id => document.getElementById(id))")
            svg = page.evaluate("[...document.querySelectorAll('div.chart .main-svg')].filter(s => s.querySelectorAll('path,rect').length).length")
            # the operator table: click "total" (descending), then again (ascending)
            table = page.locator("#ops table.sortable").first
            header = table.locator("th", has_text="total").first
            col = table.locator("th").all_inner_texts().index(header.inner_text())
            values = lambda: page.evaluate(  # noqa: E731
                "([t, i]) => [...document.querySelectorAll('#ops table.sortable')][0].tBodies[0].rows.length && "
                "[...[...document.querySelectorAll('#ops table.sortable')][0].tBodies[0].rows].map(r => parseFloat(r.children[i].dataset.v))",
                [0, col])
            header.click()
            down = values()
            header.click()
            up = values()
            rows_before = table.locator("tbody tr:visible").count()
            page.locator("#ops input.filter").fill("aten::")
            rows_after = table.locator("tbody tr:visible").count()
            page.screenshot(path=str(shot), full_page=True)
            return errors, load_ms, present, svg, down, up, (rows_before, rows_after)
        finally:
            browser.close()


def _check(report: Path, shot: Path):
    errors, load_ms, present, svg, down, up, (before, after) = _open(report, shot)
    assert errors == [], errors
    assert present == list(SECTIONS), "every section is there"
    assert svg >= 3, "the charts drew"
    assert down == sorted(down, reverse=True) and up == sorted(up) and len(up) > 1, "the table sorts on a click"
    assert 0 < after < before, "the filter leaves only the aten:: ops"
    assert shot.stat().st_size > 10_000
    return load_ms


def test_the_demo_traces_report_in_chromium(tmp_path):
    pytest.importorskip("pyopencl", reason="needs pyopencl and PoCL for device rows (polyprof-opencl[test])")
    pytest.importorskip("torch", reason="needs torch for the workload's aten ops")
    trace, report = tmp_path / "workload.json.gz", tmp_path / "report.html"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-m", "polyprof", "run", "--no-summary", "-o", str(trace), str(ROOT / "examples" / "workload.py")],
                   check=True, env=env, capture_output=True, timeout=300)
    r = subprocess.run([sys.executable, "-m", "polyprof", "report", str(trace), "-o", str(report)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == str(report), r.stderr
    html = report.read_text()
    assert "<script src=" not in html and "https://" not in html.split("<script>", 1)[0], "nothing fetched: all inline"
    assert "Memcpy HtoD" in html and "scale_add" in html and "aten::linear" in html
    _check(report, tmp_path / "report.png")


def test_a_million_event_report_stays_small_and_opens(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from export_throughput import synthetic_trace

    from polyprof.report import write_report

    report = tmp_path / "big.html"
    write_report([synthetic_trace(1_000_000, seed=3)], report)
    assert report.stat().st_size < 10e6, "a file a person can e-mail"
    _check(report, tmp_path / "big.png")


def test_report_without_plotly_says_how_to_get_it(tmp_path, monkeypatch):
    import importlib.resources

    from polyprof.errors import ConfigError
    from polyprof.report import build_report

    def missing(package):
        raise ModuleNotFoundError(package)

    monkeypatch.setattr(importlib.resources, "files", missing)
    with pytest.raises(ConfigError, match=r"pip install 'polyprof\[report\]'"):
        build_report([])


def test_a_jobs_report_has_its_ranks(tmp_path):
    """Two ranks' traces (rank 1 made slow): the report gets a Ranks section naming the straggler."""
    from test_analysis import one_step

    from polyprof.report import build_report

    fast, slow = one_step(), one_step()
    slow.activities.columns["end"][0] = 400 * 1000  # rank 1's step takes 4x as long, all of it busy host code
    slow.activities.columns["end"][1] = 390 * 1000
    fast.metadata["distributedInfo"], slow.metadata["distributedInfo"] = {"rank": 0}, {"rank": 1}
    html = build_report([fast, slow])
    assert '<section id="ranks">' in html and "Rank 1 is the slowest in 1 of 1 steps" in html
