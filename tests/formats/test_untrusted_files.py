"""Files polyprof writes at names it chose (crash and stack files, spills) are never written through a
name planted in a shared folder: a symlink there is replaced, its target left alone (issue #64)."""

import faulthandler
import os

import pytest

from polyprof.flight.recorder import FlightRecorder
from polyprof.formats.common.paths import new_private_file


def test_a_new_private_file_replaces_a_planted_link_and_leaves_its_target_alone(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    planted = tmp_path / "name.txt"
    planted.symlink_to(victim)
    with os.fdopen(new_private_file(str(planted)), "w") as f:
        f.write("ours\n")
    assert victim.read_text() == "precious\n"
    assert not planted.is_symlink() and planted.read_text() == "ours\n"
    assert oct(planted.stat().st_mode & 0o777) == oct(0o600)


@pytest.mark.skipif(os.getuid() != 0, reason="needs root, to plant a file as another user")
def test_another_users_file_in_a_sticky_folder_is_left_as_it_was(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    theirs = shared / "name.txt"
    theirs.write_text("theirs\n")
    os.chown(theirs, 1000, 1000)
    pid = os.fork()
    if pid == 0:  # as uid 1001 (not root: root may remove anything), make the name anew
        try:
            os.setgid(1001)
            os.setuid(1001)
            new_private_file(str(theirs))
            os._exit(1)
        except OSError:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "refused with an OSError"
    assert theirs.read_text() == "theirs\n"


def test_the_flight_recorders_stack_files_do_not_follow_planted_links(tmp_path):
    victims = {}
    for kind in ("hang", "crash"):
        victim = tmp_path / f"victim-{kind}.txt"
        victim.write_text("precious\n")
        (tmp_path / f"flight-{kind}-pid{os.getpid()}-stacks.txt").symlink_to(victim)
        victims[kind] = victim
    recorder = FlightRecorder(5, out_dir=tmp_path, activities=["cpu"], job=False, capturable=False, signals=())
    was_on = faulthandler.is_enabled()  # (pytest's: the recorder leaves a program's own faulthandler alone)
    faulthandler.disable()
    recorder.start()
    try:
        for kind, victim in victims.items():
            assert victim.read_text() == "precious\n", kind
            stacks = tmp_path / f"flight-{kind}-pid{os.getpid()}-stacks.txt"
            assert not stacks.is_symlink(), kind
    finally:
        recorder.stop()
        if was_on:
            faulthandler.enable()
    assert all(v.read_text() == "precious\n" for v in victims.values())


def _crash_file(rng) -> bytes:
    """A crash file in the recorder's layout (csrc/recorder.c, "The crash dump"): two threads of rows
    and names, an open span, a thread of torch operators, the end marker."""
    import struct

    from polyprof._native import INSTANT, SPAN
    from polyprof.formats.spill.crash import MAGIC

    def i64(*values):
        return b"".join(struct.pack("<q", v) for v in values)

    def text(s):
        raw = s.encode()
        return struct.pack("<I", len(raw)) + raw

    out = MAGIC + i64(10_000_000)
    for tid in (101, 102):
        rows = [(SPAN if i % 2 else INSTANT, 1000 * i, 1000 * i + 500, i + 1, 0, i % 3) for i in range(8)]
        out += i64(1, tid, len(rows), 3, 1) + i64(*(v for row in rows for v in row))
        out += b"".join(text(f"name {k}") for k in range(3)) + i64(9000, 99, 0) + text("open span")
    ops = [(2000 * i, 2000 * i + 900 if i < 4 else 0, i % 2) for i in range(5)]
    out += i64(2, 103, len(ops), 2) + i64(*(v for op in ops for v in op)) + text("aten::mm") + text("aten::add")
    return out + i64(0)


def test_recover_never_raises_raw_on_a_seeded_fuzz_of_crash_files(tmp_path):
    """600 damaged crash files beside a real spill (bits flipped, bytes changed, cut short, grown): each
    recovers, leaving out and naming what it could not use, or is a one-line TraceFormatError."""
    import random
    import shutil
    import time
    import warnings

    import polyprof
    from polyprof.errors import TraceFormatError
    from polyprof.formats.spill.crash import read_crash
    from polyprof.formats.spill.recover import recover_trace

    spill = tmp_path / ".t.json.spill"
    with polyprof.profile(["cpu"], spill=str(spill), flush_interval_s=0.05) as prof:
        for i in range(10):
            with polyprof.record_function(f"step {i}"):
                time.sleep(0.002)
    prof.stop()
    rng = random.Random(64)
    whole = _crash_file(rng)
    assert read_crash(whole).whole and read_crash(whole).rows == 2 * 9 + 5
    outcomes = {"recovered": 0, "rows left out": 0, "refused": 0}
    for n in range(600):
        data = bytearray(whole)
        for _ in range(rng.randint(1, 6)):
            how = rng.random()
            at = rng.randrange(len(data))
            if how < 0.5:
                data[at] ^= 1 << rng.randrange(8)
            elif how < 0.8:
                data[at] = rng.randrange(256)
            elif how < 0.9:
                del data[at:]
                if not data:
                    data = bytearray(whole[:9])
            else:
                data[at:at] = rng.randbytes(rng.randint(1, 64))
        target = tmp_path / f"c{n}.spill"
        shutil.copy(spill, target)
        (tmp_path / f"c{n}.spill.crash").write_bytes(bytes(data))
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            try:
                recover_trace(str(target))
            except TraceFormatError as exc:
                assert "\n" not in str(exc)
                outcomes["refused"] += 1
                continue
        outcomes["recovered"] += 1
        outcomes["rows left out"] += any("were left out" in str(w.message) for w in said)
    assert outcomes["recovered"] > 400 and outcomes["rows left out"] > 20, outcomes


def test_recover_does_not_wait_on_a_fifo_nor_read_a_link_or_another_users_crash_file(tmp_path):
    import time
    import warnings

    import polyprof
    from polyprof.formats.spill.recover import recover_trace

    spill = tmp_path / ".t.json.spill"
    with polyprof.profile(["cpu"], spill=str(spill), flush_interval_s=0.05) as prof:
        with polyprof.record_function("step"):
            time.sleep(0.01)
    prof.stop()
    crash = tmp_path / ".t.json.spill.crash"
    cases = {"fifo": lambda: os.mkfifo(crash), "link": lambda: crash.symlink_to("/dev/zero")}
    if os.getuid() == 0:
        cases["another user's"] = lambda: (crash.write_bytes(_crash_file(None)), os.chown(crash, 1000, 1000))
    for name, plant in cases.items():
        plant()
        started = time.monotonic()
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            trace = recover_trace(str(spill))
        assert time.monotonic() - started < 10, name
        assert any(f"{crash} not read" in str(w.message) for w in said), (name, [str(w.message) for w in said])
        assert "crash" not in trace.metadata["polyprof"]["partial"], name
        crash.unlink()


def _rank_trace(tmp_path, rank: int = 0):
    import time

    import polyprof

    with polyprof.profile(["cpu"]) as prof:
        with polyprof.record_function("step"):
            time.sleep(0.001)
    return prof.trace


def test_a_store_is_written_only_into_a_folder_of_yours_never_through_a_link(tmp_path):
    pytest.importorskip("duckdb", reason="needs the store extra (pyarrow, duckdb)")
    from polyprof.errors import ConfigError
    from polyprof.formats.store.files import add_rank

    trace = _rank_trace(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "link.polyprof").symlink_to(elsewhere)
    with pytest.raises(ConfigError, match="is a link"):
        add_rank(trace, tmp_path / "link.polyprof")
    store = tmp_path / "job.polyprof"
    store.mkdir()
    (store / "activities").mkdir()
    (store / "activities" / "rank=0").symlink_to(elsewhere)  # planted inside a store of yours
    with pytest.raises(ConfigError, match="is a link"):
        add_rank(trace, store)
    assert list(elsewhere.iterdir()) == []
    shared = tmp_path / "shared.polyprof"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(ConfigError, match="may be written by others"):
        add_rank(trace, shared)
    if os.getuid() == 0:
        theirs = tmp_path / "theirs.polyprof"
        theirs.mkdir()
        os.chown(theirs, 1000, 1000)
        with pytest.raises(ConfigError, match="belongs to uid 1000"):
            add_rank(trace, theirs)


def test_queries_read_only_the_ranks_the_manifest_lists(tmp_path):
    pytest.importorskip("duckdb", reason="needs the store extra (pyarrow, duckdb)")
    import shutil

    from polyprof import store as polystore
    from polyprof.formats.store.files import add_rank

    job = tmp_path / "job.polyprof"
    add_rank(_rank_trace(tmp_path), job)
    for table in ("activities", "backends", "ranks"):  # a rank folder planted (or left by a rank killed mid-add)
        shutil.copytree(job / table / "rank=0", job / table / "rank=99")
    with polystore.open(str(job)) as opened:
        assert opened.sql("select distinct rank from activities").fetchall() == [(0,)]


def test_overwrite_replaces_only_a_store_of_yours(tmp_path):
    pytest.importorskip("duckdb", reason="needs the store extra (pyarrow, duckdb)")
    from polyprof.errors import ConfigError
    from polyprof.formats import write_trace
    from polyprof.store import write_store

    trace_file = write_trace(_rank_trace(tmp_path), str(tmp_path / "rank0.json"))
    source_tree = tmp_path / "src"
    source_tree.mkdir()
    (source_tree / "main.py").write_text("print('precious')\n")
    with pytest.raises(ConfigError, match="is not a polyprof store"):
        write_store([trace_file], str(source_tree), overwrite=True)
    assert (source_tree / "main.py").exists()
    (tmp_path / "link.polyprof").symlink_to(source_tree)
    with pytest.raises(ConfigError, match="not a store folder"):
        write_store([trace_file], str(tmp_path / "link.polyprof"), overwrite=True)
    write_store([trace_file], str(tmp_path / "job.polyprof"))
    write_store([trace_file], str(tmp_path / "job.polyprof"), overwrite=True)  # a store of yours: replaced
    assert (source_tree / "main.py").exists()


def test_polyprof_run_says_what_it_does_with_a_spill_that_is_not_yours(tmp_path):
    import subprocess
    import sys

    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / ".t.json.spill").symlink_to(victim)
    (tmp_path / "s.py").write_text("pass\n")
    r = subprocess.run([sys.executable, "-m", "polyprof", "run", "--no-summary", "-o", str(tmp_path / "t.json"),
                        str(tmp_path / "s.py")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "is not a file of yours (a link): replaced by this run's spill (a link's target is left alone)" in r.stderr
    assert victim.read_text() == "precious\n"


def test_a_store_whose_path_has_glob_characters_is_queried_as_any_other(tmp_path):
    pytest.importorskip("duckdb", reason="needs the store extra (pyarrow, duckdb)")
    from polyprof import store as polystore
    from polyprof.formats.store.files import add_rank

    job = tmp_path / "glob*[x]?.polyprof"
    add_rank(_rank_trace(tmp_path), job)
    decoy = tmp_path / "globA[x]B.polyprof"  # what the pattern would also match
    add_rank(_rank_trace(tmp_path), decoy)
    with polystore.open(str(job)) as opened:
        assert opened.sql("select count(distinct rank) from activities").fetchall() == [(1,)]
        assert opened.sql("select count(*) from ranks").fetchall() == [(1,)]
