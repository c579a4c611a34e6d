"""Analyses of a trace: summaries of where time went, and rank views of a distributed job."""

from polyprof.analysis.ranks import RankRow, RankView, StepRow, rank_view
from polyprof.analysis.summary import SummaryRow, summarize

__all__ = ["RankRow", "RankView", "StepRow", "SummaryRow", "rank_view", "summarize"]
