"""The report's charts as Plotly figure specs (plain dicts, drawn by plotly.js in the page): built from
the analyses' tables, with the data cut down to what a chart can show (bins, top rows, points)."""

from __future__ import annotations

from typing import Any

import numpy as np

from polyprof.analysis.overview import Overview

MAX_POINTS = 2000  # per counter line
PARTS = (("compute_ns", "computation", "#4c78a8"), ("communication_ns", "communication", "#f58518"),
         ("memory_ns", "memory (copies, fills)", "#54a24b"), ("other_ns", "other device work", "#b279a2"),
         ("host_only_ns", "host-side only", "#e45756"), ("idle_ns", "idle", "#bab0ac"))


def _layout(title: str, **extra: Any) -> dict[str, Any]:
    return {"title": {"text": title, "x": 0}, "margin": {"l": 60, "r": 20, "t": 40, "b": 50}, "height": 360,
            "legend": {"orientation": "h", "y": -0.2}, **extra}


def step_bars(ov: Overview) -> dict[str, Any] | None:
    """Mean step time per rank and device, stacked by what filled it."""
    steps = ov.steps.dicts()
    if not steps:
        return None
    keys = sorted({(s["rank"], s["device"]) for s in steps})
    labels = [f"rank {r} · {d}" if len(ov.ranks) > 1 else d for r, d in keys]
    data = []
    for col, name, color in PARTS:
        means = [float(np.mean([s[col] for s in steps if (s["rank"], s["device"]) == k])) / 1e6 for k in keys]
        data.append({"type": "bar", "name": name, "x": labels, "y": means, "marker": {"color": color}})
    return {"data": data, "layout": _layout("Mean step time (ms) by what filled it", barmode="stack", yaxis={"title": "ms"})}


def kernel_bars(ov: Overview, top: int = 15) -> dict[str, Any] | None:
    rows = sorted(ov.kernels.dicts(), key=lambda r: -r["total_ns"])[:top]
    if not rows:
        return None
    names = [f"{r['kernel'][:60]} ({r['device'][:24]})" for r in rows][::-1]
    return {"data": [{"type": "bar", "orientation": "h", "y": names, "x": [r["total_ns"] / 1e6 for r in rows][::-1],
                      "marker": {"color": "#4c78a8"}, "name": "total"}],
            "layout": _layout(f"Top {len(rows)} kernels, copies and fills by total time (ms)",
                              height=max(300, 26 * len(rows) + 80), margin={"l": 360, "r": 20, "t": 40, "b": 40})}


def utilisation_strip(ov: Overview) -> dict[str, Any] | None:
    edges, shares = ov.utilisation
    if not shares:
        return None
    t0 = int(edges[0]) if len(edges) else 0
    x = [(int(e) - t0) / 1e6 for e in edges]
    return {"data": [{"type": "heatmap", "x": x, "y": [name[:40] for name in shares], "z": [list(np.round(v, 3)) for v in shares.values()],
                      "zmin": 0, "zmax": 1, "colorscale": "Blues", "reversescale": True,
                      "colorbar": {"title": "busy"}}],
            "layout": _layout("Device utilisation over time (ms from the first device work)",
                              height=140 + 40 * len(shares), xaxis={"title": "ms"}, margin={"l": 300, "r": 20, "t": 40, "b": 50})}


def latency_histogram(ov: Overview, bins: int = 50) -> dict[str, Any] | None:
    if not ov.launch_samples:
        return None
    data = []
    for name, lat in ov.launch_samples.items():
        counts, edges = np.histogram(lat / 1e3, bins=bins)
        centers = (edges[:-1] + edges[1:]) / 2
        data.append({"type": "bar", "name": name, "x": centers.round(3).tolist(), "y": counts.tolist(), "opacity": 0.75})
    return {"data": data, "layout": _layout("Launch latency (us, launch call start to device start)", barmode="overlay",
                                            xaxis={"title": "us"}, yaxis={"title": "launches"})}


def counter_lines(ov: Overview) -> dict[str, Any] | None:
    if not ov.counter_series:
        return None
    data = []
    t0 = min(int(ts[0]) for ts, _ in ov.counter_series.values())
    for name, (ts, values) in ov.counter_series.items():
        step = max(1, len(ts) // MAX_POINTS)
        data.append({"type": "scatter", "mode": "lines", "name": name, "x": ((ts[::step] - t0) / 1e6).round(3).tolist(),
                     "y": values[::step].tolist(), "line": {"shape": "hv"}})
    return {"data": data, "layout": _layout("Counters over time (ms from the first sample)", xaxis={"title": "ms"})}


def rank_bars(ov: Overview) -> dict[str, Any] | None:
    view = ov.rank_view
    if view is None or not view.steps:
        return None
    data = []
    for rank in sorted({r for s in view.steps for r in s.busy_ns}):
        data.append({"type": "bar", "name": f"rank {rank}", "x": [f"step {s.step}" for s in view.steps],
                     "y": [s.busy_ns.get(rank, 0) / 1e6 for s in view.steps]})
    return {"data": data, "layout": _layout("Busy time per step and rank (ms; step less collectives)", barmode="group")}
