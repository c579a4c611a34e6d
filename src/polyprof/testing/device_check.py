"""The harness every device plugin's ``scripts/device-check.py`` runs on, where the hardware is: each part
in a process of its own with a time limit (one vendor tool's state cannot leak into the next part, and a
hang is a failure reported, not a lost machine), a time budget for the whole check, and the report
rewritten after every part with the raw results beside it, so that a check cut short still says what it
saw::

    from polyprof.testing.device_check import DeviceCheck

    check = DeviceCheck("polyprof-acme device check", report=verdicts, report_name="acme-device-check-report.md")

    @check.part
    def a_polyprof(trace_path):          # in a process of its own: a JSON-able dict (trace_path: where
        ...                              # it may write a trace)

    check.code_part("env", "import json; print(json.dumps({...}))")   # or a program of its own, run with -c

    if __name__ == "__main__":
        check.main()    # --parts a,b   --out report.md ($OUT/<report_name> by default)   --budget-s 300

A part's result is its dict, or ``{"error": text}`` where it raised, exited non-zero, printed no result
or ran out of time. ``report(results)`` (the plugin's) turns the results into markdown lines.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

#: a part's time limit unless the check says otherwise
PART_TIMEOUT_S = 180.0
#: a part is not started with less than this left of the check's budget
LEAST_TO_START_S = 10.0


def json_default(value: Any) -> Any:
    """What json.dumps cannot write itself: a Counter as its dict, anything else as its text."""
    return dict(value) if isinstance(value, Counter) else str(value)


class DeviceCheck:
    """A device check's parts (in the order they are declared), how to run them and its report."""

    def __init__(self, title: str, report: Callable[[dict[str, dict]], list[str]], report_name: str,
                 timeout_s: float = PART_TIMEOUT_S) -> None:
        self.title, self.report, self.report_name, self.timeout_s = title, report, report_name, timeout_s
        self.parts: dict[str, Callable[[str], dict] | str] = {}
        self.script: str | None = None  # the file whose --part runs a function part (main() sets it)

    def part(self, fn: Callable[[str], dict]) -> Callable[[str], dict]:
        """Declare `fn` a part, named as it is: run as ``SCRIPT --part NAME --trace PATH``."""
        self.parts[fn.__name__] = fn
        return fn

    def code_part(self, name: str, code: str) -> None:
        """Declare a part that is a program of its own (run with ``python -c``), printing its result as
        JSON on its last line."""
        self.parts[name] = code

    def run_part(self, name: str, folder: str, timeout_s: float | None = None) -> dict:
        """Run one part in its own process: its result, or ``{"error": ...}``; ``part_seconds`` added."""
        limit = self.timeout_s if timeout_s is None else timeout_s
        part = self.parts[name]
        if isinstance(part, str):
            command = [sys.executable, "-c", part]
        else:
            if self.script is None:
                raise RuntimeError("a function part is run through its script: set DeviceCheck.script (main() does)")
            command = [sys.executable, os.path.abspath(self.script), "--part", name,
                       "--trace", os.path.join(folder, f"{name}.json")]
        started = time.perf_counter()
        try:
            r = subprocess.run(command, capture_output=True, text=True, timeout=limit)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {limit:.0f} s"}
        if r.returncode != 0 or not r.stdout.strip():
            return {"error": (r.stderr or r.stdout or f"exit status {r.returncode}, no output")[-2500:]}
        try:
            result = json.loads(r.stdout.strip().splitlines()[-1])
        except ValueError:
            return {"error": f"no JSON result on the last line: {r.stdout[-1000:]} {r.stderr[-1000:]}"}
        if not isinstance(result, dict):
            return {"error": f"a part's result is a JSON object, got {type(result).__name__}"}
        result["part_seconds"] = round(time.perf_counter() - started, 1)
        return result

    def run(self, names: list[str], folder: str, budget_s: float | None = None,
            on_result: Callable[[dict[str, dict]], None] | None = None) -> dict[str, dict]:
        """Run `names` one after another; a part that would start with less than :data:`LEAST_TO_START_S`
        of the budget left is reported as not run. `on_result(results so far)` after each part."""
        unknown = [n for n in names if n not in self.parts]
        if unknown:
            raise SystemExit(f"unknown parts: {', '.join(unknown)} (the parts: {', '.join(self.parts)})")
        deadline = time.monotonic() + budget_s if budget_s else None
        results: dict[str, dict] = {}
        for name in names:
            left = self.timeout_s if deadline is None else min(self.timeout_s, deadline - time.monotonic())
            if deadline is not None and left < min(LEAST_TO_START_S, self.timeout_s):
                results[name] = {"error": "not run: the check's time budget (--budget-s) was spent"}
            else:
                results[name] = self.run_part(name, folder, left)
            print(f"[device-check] {name}: {'failed' if 'error' in results[name] else 'ok'}", file=sys.stderr, flush=True)
            if on_result is not None:
                on_result(results)
        return results

    def markdown(self, results: dict[str, dict], seconds: float | None = None) -> str:
        """The report: the title, the plugin's lines, then every part's raw result."""
        took = f" ({time.strftime('%Y-%m-%d %H:%M')}, {seconds:.0f} s)" if seconds is not None else ""
        lines = [f"# {self.title}{took}", "", *self.report(results)]
        raw = json.dumps(results, indent=1, default=json_default)
        lines += ["", "<details><summary>raw</summary>", "", "```json", raw, "```", "</details>"]
        return "\n".join(lines) + "\n"

    def main(self, argv: list[str] | None = None, script: str | None = None,
             add_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
             finished: Callable[[argparse.Namespace, str, dict[str, dict]], None] | None = None) -> None:
        """The check's command line: every part (or ``--parts``), the report printed and written to
        ``--out`` (else ``$OUT/<report_name>`` where ``$OUT`` is set) after every part; ``--part NAME``
        runs one function part in this process and prints its result (what :meth:`run_part` calls).
        `add_arguments` and `finished(args, folder, results)` are the plugin's own options and last step."""
        import __main__

        self.script = script or getattr(__main__, "__file__", None)
        ap = argparse.ArgumentParser(description=getattr(__main__, "__doc__", None),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
        ap.add_argument("--part", help="run one part in this process and print its result as JSON")
        ap.add_argument("--trace", help="where --part writes its trace")
        ap.add_argument("--parts", help=f"comma-separated parts to run (default: all: {', '.join(self.parts)})")
        ap.add_argument("--out", help="also write the report here")
        ap.add_argument("--budget-s", type=float, default=None,
                        help="start no part after this many seconds (the report is rewritten after every part)")
        if add_arguments is not None:
            add_arguments(ap)
        args = ap.parse_args(argv)
        if args.part:
            part = self.parts[args.part]
            if isinstance(part, str):
                raise SystemExit(f"{args.part} is a program of its own: run the check with --parts {args.part}")
            print(json.dumps(part(args.trace or os.devnull), default=json_default))
            return
        target = args.out or (os.path.join(os.environ["OUT"], self.report_name) if os.environ.get("OUT") else None)
        folder = tempfile.mkdtemp(prefix="polyprof-device-check-")
        started = time.monotonic()

        def write(results: dict[str, dict]) -> None:
            if target:
                with open(target, "w") as f:
                    f.write(self.markdown(results, time.monotonic() - started))

        names = args.parts.split(",") if args.parts else list(self.parts)
        results = self.run(names, folder, args.budget_s, on_result=write)
        print(self.markdown(results, time.monotonic() - started))
        if finished is not None:
            finished(args, folder, results)
