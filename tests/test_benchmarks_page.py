"""BENCHMARKS.md is made from benchmarks/figures.json (issue #66): the page is the data rendered, short
enough to read, one table per section, and every figure names a command that exists."""

import json
import os
import re
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(__file__), "..")
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import render  # noqa: E402

FIGURES = render.load()


def test_the_pages_are_figures_json_rendered():
    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "render.py"), "--check"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_the_page_is_one_table_per_section_and_at_most_120_lines():
    page = render.benchmarks_page(FIGURES)
    assert len(page.splitlines()) <= 120
    headers = [line for line in page.splitlines() if line.startswith("| figure |")]
    assert len(headers) == len(FIGURES["sections"]) == len(re.findall(r"^## ", page, re.M))


def test_every_figure_has_each_column_and_a_command_that_exists():
    for section in FIGURES["sections"]:
        for figure in section["figures"]:
            assert set(figure) == set(render.COLUMNS), figure["figure"]
            assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", figure["date"]), figure
            if figure["command"] in ("the same runs", "the same run"):  # (the row above it says which)
                continue
            paths = re.findall(r"`(?:bash )?([\w./-]+\.(?:py|sh))", figure["command"])
            assert paths, f"{figure['figure']}: its command names no script ({figure['command']})"
            for path in paths:
                if not path.startswith("../"):  # (the peer suite lives beside the checkout)
                    assert os.path.exists(os.path.join(ROOT, path)), f"{figure['figure']}: {path} is not in the repository"


def test_report_writes_the_run_where_figures_are_read_from(tmp_path, monkeypatch):
    import _common

    monkeypatch.setenv("POLYPROF_BENCH_RESULTS", str(tmp_path))
    monkeypatch.setattr(sys, "argv", ["benchmarks/x.py", "--repeats", "3"])
    _common.report("x", {"ratio": 0.5})
    run = json.loads((tmp_path / "x.json").read_text())
    assert run["ratio"] == 0.5 and run["command"] == "benchmarks/x.py --repeats 3" and run["machine"]
