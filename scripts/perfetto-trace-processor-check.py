"""Load .pftrace files into Perfetto's Trace Processor and check what it made of them.

    python scripts/perfetto-trace-processor-check.py trace.pftrace [more.pftrace ...] [--bin PATH]

For anyone who has Trace Processor (it cannot be downloaded on polyprof's CI machines, so the tests
read the files with the perfetto package's protobuf classes instead). It needs `pip install perfetto`
and either network access (the package fetches its pinned trace_processor_shell) or `--bin` pointing
at a trace_processor_shell you have. For each file it prints, and exits 1 on a failed check:

- Trace Processor's import errors and data losses (its `stats` table): must be none;
- slices, instants and flows as Trace Processor counts them, against polyprof's own reader of the file;
- slices whose end is past their parent's (broken nesting): must be none.
"""

from __future__ import annotations

import argparse
import sys


def check(path: str, bin_path: str | None) -> bool:
    from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig

    from polyprof.formats import load_trace

    config = TraceProcessorConfig(bin_path=bin_path) if bin_path else TraceProcessorConfig()
    ok = True
    with TraceProcessor(trace=path, config=config) as tp:
        problems = tp.query(
            "select name, idx, value from stats where severity in ('error', 'data_loss') and value > 0"
        ).as_pandas_dataframe()
        slices = tp.query("select count(*) as n from slice where dur >= 0").as_pandas_dataframe()["n"][0]
        flows = tp.query("select count(*) as n from flow").as_pandas_dataframe()["n"][0]
        broken = tp.query(
            "select count(*) as n from slice s join slice p on s.parent_id = p.id where s.ts + s.dur > p.ts + p.dur"
        ).as_pandas_dataframe()["n"][0]
    ours = load_trace(path)
    expected_slices = len(ours.activities) + 1  # and the metadata event
    expected_flows = int((ours.activities["flow_id"] != 0).sum()) // 2
    print(f"{path}: Trace Processor: {slices} slices/instants, {flows} flows; polyprof: {expected_slices}, {expected_flows}")
    if len(problems):
        print(problems.to_string())
        ok = False
    if slices != expected_slices or flows != expected_flows or broken:
        print(f"  MISMATCH (slices whose end is past their parent's: {broken})")
        ok = False
    return ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--bin", default=None, help="a trace_processor_shell to use instead of the downloaded one")
    args = ap.parse_args()
    results = [check(path, args.bin) for path in args.traces]
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
