"""The report's HTML: one self-contained file (plotly.js, the styles and the table script inside).

Tables sort when a header is clicked (numbers by their value, not their text) and filter as you type;
each shows its first `MAX_ROWS` rows (the largest, as the analyses order them) and says how many there
were.
"""

from __future__ import annotations

import html
import json
import math
from typing import Any

from polyprof.analysis.table import Table

MAX_ROWS = 500

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#222;background:#fafafa}
header{background:#24292f;color:#fff;padding:14px 24px}header h1{margin:0;font-size:20px}header p{margin:4px 0 0;color:#c9d1d9}
nav{padding:8px 24px;background:#eef1f4;position:sticky;top:0;z-index:5}nav a{margin-right:14px;color:#0b5cad;text-decoration:none}
main{padding:0 24px 40px;max-width:1400px}section{margin-top:28px}h2{border-bottom:1px solid #ddd;padding-bottom:4px}
.findings li{margin:4px 0}.chart{background:#fff;border:1px solid #e3e3e3;margin:10px 0}
table{border-collapse:collapse;background:#fff;font-size:13px;margin:6px 0}th,td{border:1px solid #e1e4e8;padding:3px 8px;text-align:left}
th{background:#f3f4f6;cursor:pointer;user-select:none;white-space:nowrap}th[aria-sort=ascending]:after{content:" ▲"}
th[aria-sort=descending]:after{content:" ▼"}td.n{text-align:right;font-variant-numeric:tabular-nums}
.filter{margin:6px 0;padding:4px 8px;width:320px}.note{color:#666;font-size:12px}.wrap{overflow-x:auto}
"""

SCRIPT = """
function sortTable(th){const table=th.closest('table');const body=table.tBodies[0];const i=[...th.parentNode.children].indexOf(th);
const dir=th.getAttribute('aria-sort')==='descending'?'ascending':'descending';
th.parentNode.querySelectorAll('th').forEach(h=>h.removeAttribute('aria-sort'));th.setAttribute('aria-sort',dir);
const key=r=>{const c=r.children[i];const v=c.dataset.v;return v!==undefined?parseFloat(v):c.textContent.toLowerCase();};
const rows=[...body.rows];rows.sort((a,b)=>{const x=key(a),y=key(b);const s=x<y?-1:x>y?1:0;return dir==='ascending'?s:-s;});
rows.forEach(r=>body.appendChild(r));}
function filterTable(input){const q=input.value.toLowerCase();const body=document.getElementById(input.dataset.table).tBodies[0];
let shown=0;[...body.rows].forEach(r=>{const ok=!q||r.textContent.toLowerCase().includes(q);r.style.display=ok?'':'none';shown+=ok;});
input.nextElementSibling.textContent=shown+' shown';}
document.addEventListener('DOMContentLoaded',()=>{
document.querySelectorAll('table.sortable th').forEach(th=>th.addEventListener('click',()=>sortTable(th)));
document.querySelectorAll('input.filter').forEach(f=>f.addEventListener('input',()=>filterTable(f)));
document.querySelectorAll('div.chart').forEach(div=>{const spec=JSON.parse(document.getElementById(div.dataset.spec).textContent);
Plotly.newPlot(div,spec.data,spec.layout,{displaylogo:false,responsive:true});});});
"""


def _cell(column: str, value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return f"<td>{html.escape(str(value if value is not None else ''))}</td>"
    if isinstance(value, (int, float)) and not (isinstance(value, float) and math.isnan(value)):
        if column.endswith("_ns"):
            v = float(value)
            text = f"{v / 1e6:,.3f} ms" if abs(v) >= 1e6 else f"{v / 1e3:,.2f} us"
        elif column.endswith("share"):
            text = f"{float(value):.1%}"
        elif isinstance(value, float):
            text = f"{value:,.3g}"
        else:
            text = f"{value:,}"
        return f'<td class="n" data-v="{float(value)!r}">{text}</td>'
    return f"<td>{html.escape(str(value))}</td>"


def table_html(table: Table, table_id: str, filterable: bool = True) -> str:
    if not table.rows:
        return '<p class="note">Nothing to show.</p>'
    head = "".join(f"<th>{html.escape(c.replace('_ns', '').replace('_', ' '))}</th>" for c in table.columns)
    body = "".join("<tr>" + "".join(_cell(c, v) for c, v in zip(table.columns, row, strict=True)) + "</tr>"
                   for row in table.rows[:MAX_ROWS])
    more = f'<p class="note">The first {MAX_ROWS} of {len(table.rows)} rows.</p>' if len(table.rows) > MAX_ROWS else ""
    box = (f'<input class="filter" placeholder="filter…" data-table="{table_id}"><span class="note"></span>'
           if filterable and len(table.rows) > 10 else "")
    return f'{box}<div class="wrap"><table class="sortable" id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>{more}'


class Page:
    """Sections appended in order; `html(plotly_js)` is the whole file."""

    def __init__(self, title: str, subtitle: str) -> None:
        self.title, self.subtitle = title, subtitle
        self.sections: list[tuple[str, str, str]] = []  # (id, heading, body)
        self._charts = 0
        self._tables = 0

    def chart(self, spec: dict[str, Any] | None) -> str:
        if spec is None:
            return ""
        self._charts += 1
        data = json.dumps(spec, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
        return (f'<script type="application/json" id="spec{self._charts}">{data}</script>'
                f'<div class="chart" data-spec="spec{self._charts}"></div>')

    def table(self, table: Table) -> str:
        self._tables += 1
        return table_html(table, f"t{self._tables}")

    def section(self, section_id: str, heading: str, *parts: str) -> None:
        self.sections.append((section_id, heading, "".join(parts)))

    def html(self, plotly_js: str) -> str:
        nav = "".join(f'<a href="#{i}">{html.escape(h)}</a>' for i, h, _ in self.sections)
        body = "".join(f'<section id="{i}"><h2>{html.escape(h)}</h2>{b}</section>' for i, h, b in self.sections)
        return (
            f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(self.title)}</title>'
            f'<meta name="viewport" content="width=device-width,initial-scale=1"><style>{STYLE}</style>'
            f"<script>{plotly_js}</script><script>{SCRIPT}</script></head><body>"
            f"<header><h1>{html.escape(self.title)}</h1><p>{html.escape(self.subtitle)}</p></header>"
            f"<nav>{nav}</nav><main>{body}</main></body></html>"
        )
