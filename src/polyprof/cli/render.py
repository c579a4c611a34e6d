"""Rich tables for the CLI, and what every text from a trace goes through before a terminal shows it."""

from __future__ import annotations

import re
import statistics
import sys
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from polyprof.analysis import SummaryRow
from polyprof.model import Trace

#: C0 and C1 controls (ESC among them), and the invisible and bidirectional format characters
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")


def printable(text: Any) -> str:
    """`text` as a terminal may show it: control and format characters written as escapes (``\\x1b``,
    ``\\u202e``), so that a name read from a trace or spill cannot retitle, clear or reorder the user's
    terminal (``ESC]0;...``, ``ESC[2J``)."""
    text = str(text)
    if not _UNPRINTABLE.search(text):
        return text
    return _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def markup_safe(text: Any) -> str:
    """`text` for a rich markup string: printable, and its [brackets] escaped."""
    return escape(printable(text))


def format_ns(ns: float) -> str:
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if abs(ns) >= scale:
            return f"{ns / scale:.3f} {unit}"
    return f"{ns:.0f} ns"


def summary_table(rows: list[SummaryRow], title: str) -> Table:
    """One section per (device, kind), its names ordered by total time."""
    table = Table(title=printable(title), title_justify="left")
    table.add_column("Name", overflow="fold", ratio=1)
    for col in ("Calls", "Total", "Mean", "Min", "Max", "% of kind"):
        table.add_column(col, justify="right", no_wrap=True)
    last_group = None
    for r in rows:
        group = (r.device, r.kind)
        if group != last_group:
            if last_group is not None:
                table.add_section()
            table.add_row(f"[bold]{markup_safe(r.device)} · {r.kind}[/bold]", "", "", "", "", "", "")
            last_group = group
        table.add_row(
            f"  {markup_safe(r.name)}",
            str(r.count),
            format_ns(r.total_ns),
            format_ns(r.mean_ns),
            format_ns(r.min_ns),
            format_ns(r.max_ns),
            f"{100 * r.share:.1f}",
        )
    return table


def backend_status_lines(trace: Trace) -> list[str]:
    lines = []
    for name, st in trace.backends.items():
        detail = st.reason or "; ".join(st.errors) or "; ".join(st.warnings)
        extra = []
        if st.rejected:
            extra.append(f"{st.rejected} rows rejected")
        for what, n in st.dropped.items():
            extra.append(f"{n} {what} dropped")
        line = f"{name}: {st.state}, {st.activities} activities"
        if extra:
            line += " (" + ", ".join(extra) + ")"
        if detail:
            line += f" - {detail}"
        lines.append(printable(line))
    return lines


def print_summary(trace: Trace, console: Console, top: int, title: str) -> None:
    from polyprof.analysis import summarize

    rows = summarize(trace, top=top)
    if rows:
        console.print(summary_table(rows, title))
    else:
        console.print(f"{markup_safe(title)}: no activities recorded")
    for line in backend_status_lines(trace):
        console.print(f"  backend {line}", highlight=False, markup=False)  # reasons hold [extras]


def print_rank_view(view: object, console: Console) -> None:
    """The rank view of a job (polyprof.analysis.ranks.RankView): per rank, per step, the slowest."""
    ranks = Table(title="polyprof summary: ranks", title_justify="left")
    for col in ("Rank", "Steps", "Mean step", "In collectives", "Waited", "Trace"):
        ranks.add_column(col, justify="left" if col == "Trace" else "right", overflow="fold")
    for r in view.ranks:  # type: ignore[attr-defined]
        ranks.add_row(str(r.rank), str(r.steps), format_ns(r.mean_step_ns), format_ns(r.collective_ns),
                      format_ns(r.waited_ns), markup_safe(r.source))
    console.print(ranks)
    if not view.steps:  # type: ignore[attr-defined]
        console.print("no ProfilerStep#N spans: call prof.step() once per step to compare ranks by step")
        return
    steps = Table(title="polyprof summary: steps", title_justify="left")
    steps.add_column("Step", justify="right")
    rank_ids = [r.rank for r in view.ranks]  # type: ignore[attr-defined]
    for rank in rank_ids:
        steps.add_column(f"rank {rank}", justify="right")
    steps.add_column("Slowest", justify="right")
    steps.add_column("Busy above median", justify="right")
    for s in view.steps:  # type: ignore[attr-defined]
        cells = [f"{format_ns(s.times_ns[r])} ({format_ns(s.busy_ns[r])} busy)" if r in s.times_ns else "-" for r in rank_ids]
        steps.add_row(str(s.step), *cells, f"rank {s.slowest}", format_ns(s.behind_ns))
    console.print(steps)
    slowest = view.slowest_rank  # type: ignore[attr-defined]
    lagging = [s for s in view.steps if s.slowest == slowest]  # type: ignore[attr-defined]
    waited = sorted(view.ranks, key=lambda r: -r.waited_ns)  # type: ignore[attr-defined]
    console.print(
        f"slowest rank: {slowest} (slowest in {len(lagging)} of {len(view.steps)} steps, "  # type: ignore[attr-defined]
        f"{format_ns(statistics.fmean(s.behind_ns for s in lagging))} busier than the median on average); "
        f"waited longest in collectives: rank {waited[0].rank} ({format_ns(waited[0].waited_ns)} more than the least)",
        highlight=False,
    )


def analysis_table(table: object, title: str | None = None, limit: int = 30) -> Table:
    """A polyprof.analysis Table as a rich table: times formatted, shares as percentages."""
    cols = table.columns  # type: ignore[attr-defined]
    out = Table(title=title or table.title, title_justify="left")  # type: ignore[attr-defined]
    for c in cols:
        out.add_column(c.replace("_ns", "").replace("_", " "), justify="left" if c in ("device", "kernel", "op", "name",
                       "stream", "cause", "kind", "backend", "state", "worst", "input_dims", "counter") else "right",
                       overflow="fold")
    for row in table.rows[:limit]:  # type: ignore[attr-defined]
        cells = []
        for c, v in zip(cols, row, strict=True):
            if isinstance(v, (int, float)) and not isinstance(v, bool) and c.endswith("_ns"):
                cells.append(format_ns(v))
            elif isinstance(v, float) and c.endswith("share"):
                cells.append(f"{v:.1%}")
            elif isinstance(v, float):
                cells.append(f"{v:.4g}")
            else:
                cells.append(markup_safe(v))
        out.add_row(*cells)
    if len(table.rows) > limit:  # type: ignore[attr-defined]
        out.caption = f"the first {limit} of {len(table.rows)} rows"  # type: ignore[attr-defined]
    return out


EXIT_BAD_INPUT = 2


def new_console(stderr: bool = False, piped_width: int = 120) -> Console:
    """A console for the CLI's output; piped or captured, `piped_width` columns wide (not squeezed into 80)."""
    console = Console(stderr=stderr, highlight=False)
    if not console.is_terminal:
        console = Console(stderr=stderr, highlight=False, width=piped_width)
    return console


def fail(message: str) -> None:
    click.echo(f"polyprof: error: {printable(message)}", err=True)  # one line, never wrapped
    sys.exit(EXIT_BAD_INPUT)
