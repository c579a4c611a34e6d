"""BENCHMARKS.md and docs/benchmark-notes.md, made from benchmarks/figures.json.

    .venv/bin/python benchmarks/render.py            # write both pages
    .venv/bin/python benchmarks/render.py --check    # exit 1 if either differs from figures.json's

figures.json holds the current figures, by section: each row (figure, polyprof, competitor, ratio,
target, machine, command, date), the section's one-line notes, and its longer notes (``detail``, on
the notes page). A figure is changed there, from the runs its command made (each run's results:
``benchmarks/results/NAME.json``, written by ``_common.report``), and the pages rendered again; a
test holds the pages to the file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
COLUMNS = ("figure", "polyprof", "competitor", "ratio", "target", "machine", "command", "date")
PAGE, NOTES = os.path.join(ROOT, "BENCHMARKS.md"), os.path.join(ROOT, "docs", "benchmark-notes.md")


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def benchmarks_page(figures: dict) -> str:
    """The figures page: the intro, then per section one table, its notes below it."""
    out = ["# Benchmarks", "", *figures["intro"]]
    for section in figures["sections"]:
        out += ["", f"## {section['title']}", "", _row(list(COLUMNS)), _row(["---"] * len(COLUMNS))]
        out += [_row([figure[c] for c in COLUMNS]) for figure in section["figures"]]
        if section["notes"]:
            out += ["", *(f"- {note}" for note in section["notes"])]
    return "\n".join(out) + "\n"


def notes_page(figures: dict) -> str:
    """The longer notes of the sections that have them: how a figure's time splits, what was tried."""
    out = ["# Benchmark notes", "",
           "What the figures on the [benchmarks page](benchmarks.md) leave out: where the time goes, what was "
           "tried and not kept. Made from `benchmarks/figures.json` by `benchmarks/render.py`."]
    for section in figures["sections"]:
        if section.get("detail"):
            out += ["", f"## {section['title']}", ""]
            out += "\n\n".join(section["detail"]).split("\n")
    return "\n".join(out) + "\n"


def pages(figures: dict) -> dict[str, str]:
    return {PAGE: benchmarks_page(figures), NOTES: notes_page(figures)}


def load(path: str = os.path.join(HERE, "figures.json")) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a page differs from figures.json's")
    args = parser.parse_args()
    stale = []
    for path, text in pages(load()).items():
        current = open(path, encoding="utf-8").read() if os.path.exists(path) else None
        if current == text:
            continue
        stale.append(os.path.relpath(path, ROOT))
        if not args.check:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
    if args.check and stale:
        print(f"{', '.join(stale)} differ from benchmarks/figures.json: run benchmarks/render.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
