"""The columnar store (polyprof.store): what it holds of a trace, that other tools read it without
polyprof, its clock fit and blame on synthetic collectives, and the commands around it."""

import json
import os
import subprocess
import sys

import pytest

pa = pytest.importorskip("pyarrow", reason="needs pyarrow (the polyprof[store] extra)")
pytest.importorskip("duckdb", reason="needs duckdb (the polyprof[store] extra)")

import numpy as np  # noqa: E402
import pyarrow.dataset as ds  # noqa: E402

import polyprof  # noqa: E402
import polyprof._native  # noqa: E402
from polyprof import store  # noqa: E402
from polyprof.errors import ConfigError  # noqa: E402
from polyprof.formats.store.files import StoreStats, write_manifest, write_rank  # noqa: E402
from polyprof.formats.store.rank_tables import RankTables  # noqa: E402
from polyprof.formats.store.schema import MANIFEST, SCHEMA_VERSION, TABLES  # noqa: E402
from polyprof.model import ActivityKind  # noqa: E402


@pytest.fixture(scope="module")
def stepped_trace(tmp_path_factory):
    """A polyprof trace with steps, nested annotations and an instant (no torch needed)."""
    folder = tmp_path_factory.mktemp("stepped")
    path = folder / "rank0.json"
    sched = polyprof.schedule(wait=0, warmup=1, active=3, repeat=1)
    with polyprof.profile(["cpu"], schedule=sched, on_trace_ready=lambda p: p.export_chrome_trace(str(path))) as prof:
        for i in range(4):
            with polyprof.record_function("load"):
                with polyprof.record_function("decode"):
                    pass
            with polyprof.record_function("compute"):
                polyprof.instant("mark", {"i": i})
            prof.step()
    return path


def test_a_trace_in_the_store_keeps_every_row_with_its_step_and_level(stepped_trace, tmp_path):
    stats = store.write_store([stepped_trace], tmp_path / "job.polyprof")
    trace = polyprof.load_trace(str(stepped_trace))
    assert stats.ranks == [0] and stats.rows["activities"] == len(trace.activities)
    with store.open(tmp_path / "job.polyprof") as job:
        rows = job.table("select name, step, level, kind, dur_ns from activities where kind <> 'instant'").to_pylist()
        by_kind = job.table("select kind, count(*) as n, sum(dur_ns) as ns from activities group by kind").to_pylist()
    steps = {r["name"]: r["step"] for r in rows if r["name"].startswith("ProfilerStep#")}
    assert steps == {"ProfilerStep#1": 1, "ProfilerStep#2": 2, "ProfilerStep#3": 3}
    assert {r["step"] for r in rows if r["name"] == "decode"} == {1, 2, 3}
    levels = {(r["name"], r["level"]) for r in rows}
    assert {("load", 0), ("decode", 1), ("compute", 0)} <= levels, "nesting below the step, which is not counted"
    for kind in (ActivityKind.USER_ANNOTATION, ActivityKind.INSTANT):
        mask = trace.kind_mask(int(kind))
        got = next(r for r in by_kind if r["kind"] == kind.name.lower())
        assert got["n"] == int(mask.sum())
        assert got["ns"] == int((trace.activities["end"][mask] - trace.activities["start"][mask]).sum())


def test_other_tools_read_the_store_without_polyprof(stepped_trace, tmp_path):
    """Plain pyarrow (and so pandas, Polars, Spark) reads each table as a Hive-partitioned dataset."""
    store.write_store([stepped_trace], tmp_path / "job.polyprof")
    manifest = json.loads((tmp_path / "job.polyprof" / MANIFEST).read_text())
    assert manifest["schema"] == "polyprof.store" and manifest["version"] == SCHEMA_VERSION
    for name, schema in TABLES.items():
        table = ds.dataset(tmp_path / "job.polyprof" / name, format="parquet", partitioning="hive").to_table()
        assert table.column_names == [*schema.names, "rank"], name
        assert set(table.column("rank").to_pylist()) <= {0}
    code = ("import duckdb; print(duckdb.sql(\"select count(*) from read_parquet('job.polyprof/activities/*/*.parquet', "
            "hive_partitioning = true) where rank = 0\").fetchall()[0][0])")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and int(r.stdout) == len(polyprof.load_trace(str(stepped_trace)).activities), r.stderr


def test_a_torch_profiler_trace_goes_into_the_store(tmp_path):
    torch = pytest.importorskip("torch", reason="needs torch (CPU build) for a torch.profiler trace")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        torch.mm(torch.randn(8, 8), torch.randn(8, 8))
    prof.export_chrome_trace(str(tmp_path / "torch.json"))
    store.write_store([tmp_path / "torch.json"], tmp_path / "job.polyprof")
    with store.open(tmp_path / "job.polyprof") as job:
        mm = job.table("select input_dims, kind from activities where name = 'aten::mm'").to_pylist()
    assert mm and mm[0]["kind"] == "cpu_op" and json.loads(mm[0]["input_dims"]) == [[8, 8], [8, 8]]


# -- the clock fit and blame on collectives made to order -------------------------------------------


def _rank(rank, collectives, offset_ns=0, uncertainty_ns=None, work=(), stepped=True):
    """A rank's tables: `collectives` as (seq, entry, exit) on its recorded clock, `work` as (name, start,
    end) on its training thread."""
    rows = [{"process_group": "0", "group_description": "default_pg", "seq": seq, "op": "allreduce",
             "name": "ncclDevKernel_AllReduce", "on_device": True, "synchronizing": True, "group_size": 4,
             "in_nelems": 1024, "out_nelems": 1024, "dtype": "Float", "bytes": 4096, "step": seq if stepped else -1,
             "entry_ns": entry, "exit_ns": leave} for seq, entry, leave in collectives]
    acts = [{"step": 0, "kind": "cpu_op", "category": "cpu_op", "name": name, "device": "host", "device_type": "cpu",
             "resource": 1, "resource_name": "main", "training_thread": True, "level": 0, "start_ns": s, "end_ns": e,
             "dur_ns": e - s, "correlation": 0, "external_id": 0, "flow_id": 0, "flow_type": 0, "flow_start": False,
             "collective": False} for name, s, e in work]
    ranks = [{"world_size": 4, "host": f"host{rank // 2}", "source": f"rank{rank}.json", "epoch_offset_ns": 0,
              "offset_ns": offset_ns, "offset_uncertainty_ns": uncertainty_ns, "window_start_ns": 0,
              "window_end_ns": 10**12, "events": len(acts), "metadata": "{}"}]
    tables = {"collectives": rows, "activities": acts, "ranks": ranks, "counters": [], "backends": []}
    return RankTables(rank, {n: pa.Table.from_pylist(v, schema=TABLES[n]) for n, v in tables.items()})


def _write(folder, ranks):
    stats = StoreStats(str(folder))
    for tables in ranks:
        write_rank(tables, str(folder))
        stats.sources[tables.rank] = f"rank{tables.rank}.json"
    stats.ranks = sorted(stats.sources)
    write_manifest(str(folder), stats)
    return folder


def _synthetic_job(tmp_path, shift_ns=700_000, recorded_uncertainty_ns=2_000_000, stepped=True):
    """4 ranks, 20 all-reduces 10 ms apart that end within 4 µs of each other (as NCCL's kernels do);
    rank 3's recorded offset is off by `shift_ns` (its rows read `shift_ns` late) with the uncertainty
    given; rank 1 enters instance 7 last, 30 ms late, spent in "aten::mm"."""
    ms = 1_000_000
    ranks = []
    for r in range(4):
        shift = shift_ns if r == 3 else 0
        rows, work = [], []
        for seq in range(20):
            t = seq * 10 * ms
            late = 30 * ms if (r == 1 and seq == 7) else 0
            entry = t + (r * 37_000) % 200_000 + late
            leave = t + 31 * ms * (seq == 7) + 300_000 + (r * 1_000) % 4_000
            rows.append((seq, entry + shift, leave + shift))
            if late:
                work.append(("aten::mm", t + 50_000, entry))
        ranks.append(_rank(r, rows, uncertainty_ns=recorded_uncertainty_ns if r else 0, work=work, stepped=stepped))
    return _write(tmp_path / "job.polyprof", ranks)


def test_the_clock_fit_finds_an_offset_the_recording_missed(tmp_path):
    job = store.open(_synthetic_job(tmp_path))
    clock = {r["rank"]: r for r in job.analysis("clock").to_pylist()}
    assert abs(clock[3]["applied_correction_ns"] - 700_000) <= 100_000, clock[3]
    assert clock[3]["fitted_uncertainty_ns"] < 2_000_000, "more certain than the recorded offset"
    assert abs(clock[1]["applied_correction_ns"]) <= 100_000 and clock[0]["applied_correction_ns"] == 0


def test_a_fit_less_certain_than_the_recorded_offset_is_not_applied(tmp_path):
    job = store.open(_synthetic_job(tmp_path, recorded_uncertainty_ns=1_000))
    clock = {r["rank"]: r for r in job.analysis("clock").to_pylist()}
    assert clock[3]["fitted_correction_ns"] and clock[3]["applied_correction_ns"] == 0


def test_blame_names_the_late_rank_and_what_it_was_doing_on_the_fitted_clock(tmp_path):
    job = store.open(_synthetic_job(tmp_path))
    blame = job.blame().to_pylist()
    seven = [r for r in blame if r["seq"] == 7]
    assert {r["late_rank"] for r in seven} == {1} and seven[0]["step"] == 7
    top = max(seven, key=lambda r: r["cause_ns"])
    assert top["cause"] == "aten::mm" and top["cause_ns"] >= 0.9 * top["wait_ns"], seven
    assert all(r["max_wait_ns"] < 1_000_000 for r in blame if r["seq"] != 7), "rank 3's shift is not taken for lateness"


def test_a_job_without_steps_has_no_setup_and_its_waits_count_whole(tmp_path):
    """No ProfilerStep spans: every collective's step is -1, none of it is set-up, and the overview counts
    each wait a rank made the others pay."""
    job = store.open(_synthetic_job(tmp_path, stepped=False))
    blame = job.blame().to_pylist()
    assert blame and not any(r["setup"] for r in blame) and {r["step"] for r in blame} == {-1}
    caused = {r["rank"]: r["made_others_wait_ns"] for r in job.analysis("overview").to_pylist()}
    assert caused[1] == sum(r["cause_ns"] for r in blame if r["late_rank"] == 1) > 25_000_000, caused


# -- commands --------------------------------------------------------------------------------------


def _polyprof(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "polyprof", *map(str, args)], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


def test_store_sql_and_summary_commands(stepped_trace, tmp_path):
    out = tmp_path / "job.polyprof"
    r = _polyprof("store", stepped_trace, "-o", out)
    assert r.returncode == 0 and "1 rank into" in r.stderr and "\x1b[" not in r.stderr, r.stderr  # no bar when piped
    r = _polyprof("sql", out, "select name, count(*) as n from activities where name = 'decode' group by name",
                  "--format", "json")
    assert r.returncode == 0 and json.loads(r.stdout) == {"name": "decode", "n": 4 - 1}, r.stderr
    r = _polyprof("sql", out, "select count(*) as n from blame", "--format", "csv")
    assert r.returncode == 0 and r.stdout.splitlines() == ['"n"', "0"], r.stderr
    r = _polyprof("summary", out)
    assert r.returncode == 0 and "clocks" in r.stdout and "mean step" in r.stdout, r.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("sql", "{tmp}", "select 1"), "is not a polyprof store (no store.json); make one with: polyprof store"),
        (("sql", "{store}", "select nope from activities"), "the query failed: "),
        (("sql", "{store}", "select 1", "--engine", "oracle"), "unknown engine 'oracle'"),
        (("store", "{trace}", "-o", "{store}"), "exists: choose another path, or --overwrite"),
        (("store", "{ranked}", "{tmp}/again.json", "-o", "{tmp}/two"), "two traces say they are rank 0"),
        (("store", "{trace}", "{trace}", "-o", "{tmp}/two"), "is named twice"),
        (("summary", "{trace}", "--engine", "spark"), "--engine reads a store"),
    ],
)
def test_bad_input_is_one_line_that_says_what_to_do(stepped_trace, tmp_path, args, message):
    out = tmp_path / "job.polyprof"
    store.write_store([stepped_trace], out)
    doc = json.loads(stepped_trace.read_text())
    (tmp_path / "ranked.json").write_text(json.dumps({**doc, "distributedInfo": {"rank": 0, "world_size": 2}}))
    (tmp_path / "again.json").write_text(json.dumps({**doc, "distributedInfo": {"rank": 0, "world_size": 2}}))
    names = {"tmp": tmp_path, "store": out, "trace": stepped_trace, "ranked": tmp_path / "ranked.json"}
    r = _polyprof(*(a.format(**names) for a in args))
    assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "two").exists(), "a failed store leaves nothing behind"
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".polyprof-store-")]


def test_a_newer_schema_is_refused_with_the_upgrade_to_make(stepped_trace, tmp_path):
    out = tmp_path / "job.polyprof"
    store.write_store([stepped_trace], out)
    manifest = json.loads((out / MANIFEST).read_text())
    (out / MANIFEST).write_text(json.dumps({**manifest, "version": SCHEMA_VERSION + 1}))
    with pytest.raises(ConfigError, match="upgrade polyprof"):
        store.open(out)


def test_run_and_merge_write_into_a_store_by_its_suffix(stepped_trace, tmp_path):
    """``-o job.polyprof``: polyprof run adds its rank to the store (made if missing), merge makes one."""
    script = tmp_path / "work.py"
    script.write_text("import polyprof\nfor i in range(3):\n    with polyprof.record_function('unit'):\n        pass\n")
    r = _polyprof("run", "-o", tmp_path / "run.polyprof", script, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    with store.open(tmp_path / "run.polyprof") as job:
        assert job.ranks == [0] and job.table("select count(*) as n from activities where name = 'unit'").to_pylist() == [{"n": 3}]
    r = _polyprof("merge", stepped_trace, "-o", tmp_path / "merged.polyprof")
    assert r.returncode == 0, r.stderr
    assert store.open(tmp_path / "merged.polyprof").ranks == [0]


def test_ranks_adding_themselves_at_once_keep_one_manifest(stepped_trace, tmp_path):
    """Four processes add four ranks to one store at the same moment: every rank is in the manifest."""
    doc = json.loads(stepped_trace.read_text())
    paths = []
    for rank in range(4):
        path = tmp_path / f"rank{rank}.json"
        path.write_text(json.dumps({**doc, "distributedInfo": {"rank": rank, "world_size": 4}}))
        paths.append(path)
    code = ("import sys, polyprof\nfrom polyprof.formats import write_trace\n"
            "write_trace(polyprof.load_trace(sys.argv[1]), sys.argv[2])")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(p), str(tmp_path / "job.polyprof")]) for p in paths]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    with store.open(tmp_path / "job.polyprof") as job:
        assert job.ranks == [0, 1, 2, 3]
        per_rank = job.table("select rank, count(*) as n from activities group by rank order by rank").to_pylist()
    assert [r["n"] for r in per_rank] == [len(polyprof.load_trace(str(stepped_trace)).activities)] * 4
    assert json.loads((tmp_path / "job.polyprof" / MANIFEST).read_text())["rows"]["activities"] == sum(r["n"] for r in per_rank)


def test_a_spill_left_by_a_killed_run_goes_into_the_store(tmp_path):
    spill = tmp_path / "run.spill"
    with polyprof.profile(["cpu"], spill=spill):
        for _ in range(5):
            with polyprof.record_function("before the kill"):
                pass
    assert spill.exists(), "no trace was written: the spill stays, as after a kill"
    store.write_store([spill], tmp_path / "job.polyprof")
    with store.open(tmp_path / "job.polyprof") as job:
        assert job.table("select count(*) as n from activities where name = 'before the kill'").to_pylist() == [{"n": 5}]


@pytest.mark.skipif(polyprof._native.extension is None, reason="needs polyprof's C extension (built by setup.sh)")
def test_nesting_levels_in_c_are_the_python_twins():
    """Seeded intervals on three threads, nested, overlapping part-way and repeated, some skipped."""
    from polyprof._native.twins.columns import nesting_levels

    rng = np.random.default_rng(20261206)
    n = 5_000
    resource = rng.integers(0, 3, n).astype(np.int64)
    start = rng.integers(0, 100_000, n).astype(np.int64)
    end = start + rng.integers(0, 5_000, n)
    start[10:20], end[10:20] = start[0], end[0]  # ties
    skip = (rng.random(n) < 0.05).astype(np.uint8)
    order = np.lexsort((-end, start, resource)).astype(np.int64)
    theirs, ours = np.zeros(n, np.int32), np.zeros(n, np.int32)
    nesting_levels(order, resource, start, end, skip, theirs)
    polyprof._native.extension.nesting_levels(order, resource, start, end, skip, ours)
    assert (ours == theirs).all() and theirs.max() > 3


def test_store_queries_leave_duckdb_s_own_progress_bar_off():
    """DuckDB draws its bar on stdout for a query past 2 s, piped or not, beside polyprof's progress."""
    from polyprof.store.engines import DuckDBEngine

    engine = DuckDBEngine()
    assert engine.arrow("select current_setting('enable_progress_bar') as on")["on"].to_pylist() == [False]


def test_duckdb_runs_under_a_memory_limit_and_spills_to_a_folder_of_its_own(tmp_path):
    import duckdb

    from polyprof.store.engines import DEFAULT_MEMORY_LIMIT, DuckDBEngine

    def setting(con, name):
        return con.execute(f"select current_setting('{name}')").fetchone()[0]

    def as_duckdb_says(limit):
        return setting(duckdb.connect(config={"memory_limit": limit}), "memory_limit")

    path = _synthetic_job(tmp_path)
    with store.open(path) as job:
        assert setting(job.engine.con, "memory_limit") == as_duckdb_says(DEFAULT_MEMORY_LIMIT)
        scratch = job.engine.scratch
        assert os.path.isdir(scratch) and setting(job.engine.con, "temp_directory") == scratch
    assert not os.path.exists(scratch), "its spill folder goes with it"
    with store.open(path, memory_limit="1GB") as job:
        assert setting(job.engine.con, "memory_limit") == as_duckdb_says("1GB")
    with pytest.raises(ConfigError, match="a memory limit is written like"):
        DuckDBEngine("lots")


def test_the_cli_names_every_view_writes_lists_as_json_in_csv_and_honours_view_on_a_store(tmp_path):
    path = _synthetic_job(tmp_path)
    run = [sys.executable, "-m", "polyprof"]
    r = subprocess.run([*run, "sql", "--help"], capture_output=True, text=True, timeout=120)
    listed = r.stdout.replace("\n", " ")
    assert all(view in listed for view in ("blame", "overview", "rank_totals", "operators", "temporal", "launch"))
    r = subprocess.run([*run, "sql", str(path), "select list(rank order by rank) as ranks from ranks", "--format", "csv"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert r.stdout.splitlines()[1].strip('"').startswith("[0,"), r.stdout
    r = subprocess.run([*run, "summary", str(path), "--view", "steps"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "steps (" in r.stdout and "who made everyone wait" not in r.stdout, r.stdout[-2000:]
    r = subprocess.run([*run, "summary", str(path), "--memory-limit", "lots"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "a memory limit is written like" in r.stderr
