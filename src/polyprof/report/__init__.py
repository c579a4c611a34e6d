"""``polyprof report``: one self-contained HTML file a person opens and reads, for any trace (polyprof's
or torch.profiler's) or several ranks' traces.

::

    from polyprof.report import write_report
    write_report(["trace.json.gz"], "report.html")                      # or a folder of rank traces
    write_report(["after.json.gz"], "report.html", baseline="before.json.gz")   # with a diff section

Sections: what to look at (the largest findings in words), steps, devices, kernels, operators, launch
latency, idle time, ranks (several traces), counters, backends, and the diff against a baseline. Charts
are Plotly's (plotly.js inlined from the ``plotly`` package: ``pip install 'polyprof[report]'``), the
charting library Holistic Trace Analysis and torch.profiler users already read; nothing is fetched
when the file opens.
"""

from __future__ import annotations

import datetime
import html
import os
from collections.abc import Sequence
from typing import Any

from polyprof.errors import ConfigError
from polyprof.extras import install_hint

REPORT_EXTRA = install_hint("report")


def plotly_js() -> str:
    """plotly.js, from the installed ``plotly`` package (ConfigError saying how to install it)."""
    try:
        from importlib.resources import files

        js = (files("plotly") / "package_data" / "plotly.min.js").read_text(encoding="utf-8")
    except (ImportError, FileNotFoundError, ModuleNotFoundError):
        raise ConfigError(f"polyprof report draws its charts with plotly.js, from the plotly package: {REPORT_EXTRA}") from None
    return js.replace("</script", "<\\/script")


def build_report(items: Sequence[Any], baseline: Any = None, top: int = 200) -> str:
    """The report's HTML for the traces `items` (paths, folders or Traces; several = a job's ranks)."""
    from polyprof._version import __version__
    from polyprof.analysis.overview import overview
    from polyprof.analysis.ranks import load_ranks
    from polyprof.report import charts
    from polyprof.report.page import Page

    js = plotly_js()  # before the work: a missing plotly is said at once
    traces, names, ranks = load_ranks(items)
    if not traces:
        raise ConfigError("polyprof report: no traces given")
    ov = overview(traces, ranks, top=top)
    title = f"polyprof report: {os.path.basename(names[0])}" + (f" and {len(names) - 1} more ranks" if len(names) > 1 else "")
    made = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    acts = sum(len(t.activities) for t in traces)
    page = Page(title, f"{acts:,} activities in {len(traces)} trace{'s' * (len(traces) > 1)} · polyprof {__version__} · {made}")
    items_html = "".join(f"<li>{html.escape(f)}</li>" for f in ov.findings) or "<li>Nothing stands out.</li>"
    page.section("look", "What to look at", f'<ul class="findings">{items_html}</ul>')
    step_note = ('<p class="note">Each step (a <code>ProfilerStep#N</code> span) split per device: computation, then '
                 "communication and memory work not hidden under it, other device work, host-side only (the device has "
                 "nothing to do while the step's thread runs host code), and idle (neither runs).</p>")
    page.section("steps", "Steps", step_note, page.chart(charts.step_bars(ov)), page.table(ov.steps))
    page.section("devices", "Devices", page.chart(charts.utilisation_strip(ov)), page.table(ov.kernel_types),
                 page.table(ov.temporal), page.table(ov.overlap))
    page.section("kernels", "Kernels", page.chart(charts.kernel_bars(ov)), page.table(ov.kernels))
    page.section("ops", "Operators", '<p class="note">Self and total host time; device time of the work each op launched '
                 "(through External id), and with the ops nested in it (device total).</p>", page.table(ov.operators))
    page.section("launch", "Launch latency", page.chart(charts.latency_histogram(ov)), page.table(ov.launch))
    page.section("idle", "Idle time", '<p class="note">Gaps between consecutive device rows on each stream: host wait '
                 "(the launch call came after the previous row ended), kernel wait (under 30 us), other.</p>", page.table(ov.idle))
    if ov.rank_view is not None:
        from polyprof.analysis.table import Table

        rv = ov.rank_view
        ranks_table = Table.of(("rank", "steps", "mean_step_ns", "collective_ns", "waited_ns"),
                               [(r.rank, r.steps, r.mean_step_ns, r.collective_ns, r.waited_ns) for r in rv.ranks])
        steps_table = Table.of(("step", "slowest_rank", "behind_ns"), [(s.step, s.slowest, s.behind_ns) for s in rv.steps])
        page.section("ranks", "Ranks", page.chart(charts.rank_bars(ov)), page.table(ranks_table), page.table(steps_table))
        page.section("blame", "Who made everyone wait", *_blame_parts(page, traces, ranks))
    page.section("counters", "Counters", page.chart(charts.counter_lines(ov)), page.table(ov.counters))
    page.section("backends", "Backends", page.table(ov.backends))
    if baseline is not None:
        from polyprof.analysis.diff import diff

        before, _, _ = load_ranks([baseline])
        d = diff(before[0], traces[0])
        head = ""
        if d.step_ns:
            b, a = d.step_ns
            head = f"<p>Mean step: {b / 1e6:.3f} ms before, {a / 1e6:.3f} ms now ({(a - b) / (b or 1):+.1%}).</p>"
        page.section("diff", "Diff against the baseline", head, page.table(d.operators), page.table(d.kernels))
    return page.html(js)


def _blame_parts(page: Any, traces: Sequence[Any], ranks: Sequence[int]) -> list[str]:
    """The blame section: per instance, the last rank into each synchronizing collective and what it
    was doing while the others waited (needs pyarrow and duckdb; a note says so when they are missing)."""
    note = ('<p class="note">For each collective every rank must enter before any leaves (all-reduce, all-gather, '
            "...), the last rank in is blamed for the wait each other rank paid; the cause is what that rank's "
            "training thread was doing meanwhile, on the job's clock.</p>")
    from polyprof.extras import install_hint, missing

    if missing("store"):
        return [note, f"<p>Install pyarrow and duckdb (<code>{install_hint('store')}</code>) to see it.</p>"]
    from polyprof.analysis.table import Table
    from polyprof.store.query import Store

    result = Store.of_traces(traces, ranks).blame()
    return [note, page.table(Table.of_arrow(result, "who made everyone wait"))]


def write_report(items: Sequence[Any], output: str | os.PathLike, baseline: Any = None) -> str:
    """Write the report of `items` to `output` (atomically); returns its absolute path."""
    from polyprof.formats.common.paths import check_output_path, trace_output

    output = check_output_path(output)
    text = build_report(items, baseline=baseline).encode("utf-8")
    with trace_output(output) as out:
        out.write(text)
    return output
