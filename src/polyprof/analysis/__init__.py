"""Analyses of a trace: summaries of where time went."""

from polyprof.analysis.summary import SummaryRow, summarize

__all__ = ["SummaryRow", "summarize"]
