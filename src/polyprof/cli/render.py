"""Rich tables for the CLI."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from polyprof.analysis import SummaryRow
from polyprof.model import Trace


def format_ns(ns: float) -> str:
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if abs(ns) >= scale:
            return f"{ns / scale:.3f} {unit}"
    return f"{ns:.0f} ns"


def summary_table(rows: list[SummaryRow], title: str) -> Table:
    """One section per (device, kind), its names ordered by total time."""
    table = Table(title=title, title_justify="left")
    table.add_column("Name", overflow="fold", ratio=1)
    for col in ("Calls", "Total", "Mean", "Min", "Max", "% of kind"):
        table.add_column(col, justify="right", no_wrap=True)
    last_group = None
    for r in rows:
        group = (r.device, r.kind)
        if group != last_group:
            if last_group is not None:
                table.add_section()
            table.add_row(f"[bold]{escape(r.device)} · {r.kind}[/bold]", "", "", "", "", "", "")
            last_group = group
        table.add_row(
            f"  {escape(r.name)}",
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
        detail = st.reason or "; ".join(st.errors) or ""
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
        lines.append(line)
    return lines


def print_summary(trace: Trace, console: Console, top: int, title: str) -> None:
    from polyprof.analysis import summarize

    rows = summarize(trace, top=top)
    if rows:
        console.print(summary_table(rows, title))
    else:
        console.print(f"{title}: no activities recorded")
    for line in backend_status_lines(trace):
        console.print(f"  backend {line}", highlight=False, markup=False)  # reasons hold [extras]
