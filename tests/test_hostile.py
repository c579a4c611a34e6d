"""What another user of the machine, or a tampered file, can try (issue #51): each case ends in a clean
error, a refused request, or a trace that holds what it should. Cases that need a second user act as
``nobody`` through setpriv (tests/other_user.py) in a sticky folder, as /tmp is."""

import json
import os
import subprocess
import sys
import time

from other_user import NOBODY, as_other_user, needs_other_user, skip_unless_other_user_runs, sticky_folder

PYTHON = sys.executable


def run_cli(*args, env=None, cwd=None, timeout=120):
    return subprocess.run([PYTHON, "-m", "polyprof", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "POLYPROF_BACKENDS": "", **(env or {})}, cwd=cwd)


@needs_other_user
def test_a_spill_another_user_planted_is_neither_adopted_nor_offered(tmp_path):
    shared = sticky_folder(tmp_path / "shared")
    planted = shared / ".t.json.spill"
    as_other_user("sh", "-c", f"printf 'not a spill of yours' > {planted}")
    script = tmp_path / "s.py"
    script.write_text("import polyprof\nwith polyprof.record_function('work'):\n    pass\n")
    r = run_cli("run", "--activities", "cpu", "--no-summary", "-o", str(shared / "t.json"), str(script))
    assert r.returncode == 0, r.stderr
    assert "was killed" not in r.stderr and "polyprof recover" not in r.stderr
    assert "not a file of yours (owner uid 65534)" in r.stderr
    assert not list(shared.glob("*.left")), "nothing of another user's is renamed into a file of ours"
    assert "work" in {e.get("name") for e in json.loads((shared / "t.json").read_text())["traceEvents"]}


@needs_other_user
def test_an_output_another_user_owns_in_a_sticky_folder_is_refused_before_recording(tmp_path):
    """The capture's path is checked as the final rename will be: another user's file (or link) in a
    sticky folder cannot be replaced by a user other than its owner, so the capture is refused before
    anything records, and nothing is left in the shared folder (a user other than root runs it)."""
    shared = sticky_folder(tmp_path / "shared")
    theirs = shared / "cap.json"
    theirs.write_text("root's file, writable by all")
    os.chmod(theirs, 0o666)
    (shared / "link.json").symlink_to(theirs)
    check = ("from polyprof.formats.common.paths import check_output_path\n"
             "import sys\n"
             "for p in sys.argv[1:]:\n"
             "    try:\n"
             "        check_output_path(p); print('accepted', p)\n"
             "    except Exception as e:\n"
             "        print(type(e).__name__, e)\n")
    os.chmod(tmp_path, 0o755)
    skip_unless_other_user_runs(PYTHON)
    r = as_other_user(PYTHON, "-c", check, str(theirs), str(shared / "link.json"), str(shared / "new.json"))
    lines = r.stdout.splitlines()
    assert lines[0].startswith("OutputPathError") and "a file of another user's (uid 0)" in lines[0], lines
    assert lines[1].startswith("OutputPathError") and "a link of another user's" in lines[1], lines
    assert lines[2] == f"accepted {shared / 'new.json'}"
    runtime = tmp_path / "run"
    runtime.mkdir()
    os.chown(runtime, NOBODY, NOBODY)
    os.chmod(runtime, 0o700)
    target = subprocess.Popen(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--", PYTHON, "-m", "timeit",
         "-n", "1", "-r", "1", "import time\nfor _ in range(600): time.sleep(0.05)"],  # (a module: listens as it starts)
        env={**os.environ, "POLYPROF_ON_DEMAND": "1", "XDG_RUNTIME_DIR": str(runtime), "POLYPROF_BACKENDS": ""},
        stderr=subprocess.PIPE, text=True,
    )
    try:
        sock = runtime / "polyprof" / f"{target.pid}.sock"
        deadline = time.monotonic() + 60
        while not sock.exists():
            assert time.monotonic() < deadline and target.poll() is None, "the target never listened"
            time.sleep(0.05)
        r = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--", PYTHON, "-m",
                            "polyprof", "capture", str(target.pid), "--duration", "0.3", "-o", str(theirs), "--no-summary"],
                           env={**os.environ, "XDG_RUNTIME_DIR": str(runtime)}, capture_output=True, text=True,
                           timeout=60)
        assert r.returncode != 0 and "another user's" in r.stderr, r.stderr
    finally:
        target.kill()
        _, err = target.communicate(timeout=30)
    assert sorted(p.name for p in shared.iterdir()) == ["cap.json", "link.json"], "nothing left behind"
    assert theirs.read_text() == "root's file, writable by all"
    assert "Traceback" not in err


def test_every_row_the_sink_keeps_reads_back(tmp_path):
    """One bound on time: a row the Sink keeps is written and read back; one beyond it is rejected and
    counted (before, end = 2**63 - 1 was kept, and the reader refused the file)."""
    import numpy as np

    from polyprof.formats import load_trace, write_trace
    from polyprof.merge import merge
    from polyprof.model import HOST_TIME_LIMIT_NS, ActivityKind, BackendStatus
    from polyprof.plugin.clock import epoch_offset, host_ns
    from polyprof.plugin.sink import Sink

    sink = Sink("probe")
    host, thread = sink.host_device(), sink.host_thread(1)
    now = host_ns()
    kept = sink.activities({"kind": [int(ActivityKind.USER_ANNOTATION)] * 4, "name": ["fine", "huge end", "huge start", "edge"],
                            "device": [host] * 4, "resource": [thread] * 4,
                            "start": np.array([now, now, -(2**63), now], dtype=np.int64),
                            "end": np.array([now + 10, 2**63 - 1, now, HOST_TIME_LIMIT_NS], dtype=np.int64)})
    assert not sink.counter("c", 1.0, ts=2**63 - 1) and sink.counter("c", 1.0, ts=now)
    status = BackendStatus("probe")
    part = sink.seal(status)
    assert kept == 2 and status.rejected == 3 and "timestamp beyond" in " ".join(status.rejected_reasons)
    epoch = epoch_offset().offset_ns
    trace = merge([part], window=(now, HOST_TIME_LIMIT_NS), epoch_offset_ns=epoch, base_time_ns=0, metadata={})
    for name in ("t.json", "t.pftrace"):
        back = load_trace(write_trace(trace, str(tmp_path / name)))
        assert {"fine", "edge"} <= {a.name for a in back.activities}


LIMITED = """
import resource, subprocess, sys
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
sys.argv = ["polyprof", *sys.argv[1:]]
from polyprof.cli.main import main
main()
"""


def test_reading_allocates_what_the_file_holds_not_the_limit(tmp_path):
    """Under a 4 GiB address-space limit, a small trace and a small spill read (the 8 GiB read limit was
    allocated up front), and a gzip bomb is refused at the limit without inflating it all."""
    import gzip

    import polyprof

    spill = tmp_path / ".t.json.spill"
    with polyprof.profile(["cpu"], spill=str(spill)) as prof:
        with polyprof.record_function("work"):
            pass
    kept = tmp_path / "kept.spill"
    kept.write_bytes(spill.read_bytes())  # (the spill goes once a trace is written)
    prof.export_perfetto(str(tmp_path / "t.pftrace"))
    for args in (["summary", str(tmp_path / "t.pftrace")], ["recover", str(kept), "-o", str(tmp_path / "r.json")]):
        r = subprocess.run([PYTHON, "-c", LIMITED, *args], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "POLYPROF_BACKENDS": ""})
        assert r.returncode == 0 and "MemoryError" not in r.stderr, r.stderr[-2000:]
    bomb = tmp_path / "bomb.json.gz"
    with gzip.open(bomb, "wb") as f:
        for _ in range(400):
            f.write(b" " * (1 << 20))
    assert bomb.stat().st_size < 1 << 20
    measure = ("import sys\nfrom polyprof.formats import load_trace\nfrom polyprof.errors import TraceFormatError\n"
               "try:\n    load_trace(sys.argv[1], max_bytes=64 << 20)\nexcept TraceFormatError as e:\n    print(e)\n"
               "print(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:')))")
    # (VmHWM: this process's own peak; getrusage's ru_maxrss keeps the parent's across fork and exec)
    r = subprocess.run([PYTHON, "-c", measure, str(bomb)], capture_output=True, text=True, timeout=120)
    said, peak_kb = r.stdout.splitlines()
    assert "inflates to over 67,108,864 bytes" in said
    assert int(peak_kb) < 400 << 10, f"peak RSS {int(peak_kb) >> 10} MiB reading a bomb refused at 64 MiB"


HOSTILE_NAME = "aten::mm\x1b]0;owned\x07\x1b[2J\u202eevil"


def test_names_from_a_trace_reach_the_terminal_escaped(tmp_path):
    """A trace's names can carry terminal escapes (retitle, clear) and bidirectional controls: summary
    and recover print them escaped."""
    import polyprof

    spill = tmp_path / ".t.json.spill"
    with polyprof.profile(["cpu"], spill=str(spill)) as prof:
        for _ in range(3):
            with polyprof.record_function(HOSTILE_NAME):
                pass
    kept = tmp_path / "kept.spill"
    kept.write_bytes(spill.read_bytes())
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    for args in (["summary", str(tmp_path / "t.json")], ["recover", str(kept), "-o", str(tmp_path / "r.json")]):
        r = run_cli(*args)
        assert r.returncode == 0, r.stderr
        shown = r.stdout + r.stderr
        assert "\x1b" not in shown and "\x07" not in shown and "\u202e" not in shown
    assert "aten::mm\\x1b]0;owned\\x07\\x1b[2J\\u202eevil" in run_cli("summary", str(tmp_path / "t.json")).stdout


def _spill_chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    from polyprof.formats.spill.file import _CHUNK_HEAD, FILE_MAGIC

    out, at = [], len(FILE_MAGIC)
    while at + _CHUNK_HEAD.size <= len(data):
        _magic, kind, size, _crc = _CHUNK_HEAD.unpack_from(data, at)
        out.append((kind, data[at + _CHUNK_HEAD.size : at + _CHUNK_HEAD.size + size]))
        at += _CHUNK_HEAD.size + size
    return out


def _spill_of(chunks: list[tuple[bytes, bytes]]) -> bytes:
    import zlib

    from polyprof.formats.spill.file import _CHUNK_HEAD, CHUNK_MAGIC, FILE_MAGIC

    return FILE_MAGIC + b"".join(_CHUNK_HEAD.pack(CHUNK_MAGIC, k, len(p), zlib.crc32(p)) + p for k, p in chunks)


#: values a tampered field gets: wrong types, indexes out of range, negative counts, odd dtypes
ODD_VALUES = (5, -1, "soon", None, [], {}, [5], 2**40, 1.5, True, "<f8", ["<i4", -1], ["<i8", 10**9], ["|O", 3])


def _tamper(chunks: list[tuple[bytes, bytes]], rng) -> list[tuple[bytes, bytes]]:
    """One field of one chunk changed (its checksum recomputed, as a tamperer would)."""
    import json
    import struct

    chunks = list(chunks)
    i = rng.randrange(len(chunks))
    kind, payload = chunks[i]
    if kind == b"P":
        (size,) = struct.unpack_from("<Q", payload)
        head, arrays = json.loads(payload[8 : 8 + size]), bytearray(payload[8 + size :])
        if arrays and rng.random() < 0.3:  # raw column bytes: an index or a time made huge or negative
            at = rng.randrange(0, max(1, len(arrays) - 4))
            arrays[at : at + 4] = struct.pack("<i", rng.choice([2**31 - 1, -5, 99]))
        else:
            target, key = head, rng.choice(sorted(head))
            while isinstance(target[key], (dict, list)) and target[key] and rng.random() < 0.7:
                target = target[key]
                key = rng.choice(sorted(target)) if isinstance(target, dict) else rng.randrange(len(target))
            target[key] = rng.choice(ODD_VALUES)
        header = json.dumps(head).encode()
        payload = struct.pack("<Q", len(header)) + header + bytes(arrays)
    elif kind in (b"H", b"W"):
        doc = json.loads(payload)
        if isinstance(doc, dict) and doc and rng.random() < 0.85:
            doc[rng.choice(sorted(doc))] = rng.choice(ODD_VALUES)
        else:
            doc = rng.choice(ODD_VALUES)
        payload = json.dumps(doc).encode()
    else:
        payload = bytes([rng.randrange(256)]) * rng.randrange(1, 8)
    chunks[i] = (kind, payload)
    return chunks


def test_recover_names_what_a_tampered_spill_could_not_give_and_never_raises_raw(tmp_path):
    """Spills whose chunks were changed and their checksums recomputed (a seeded fuzz): each recovers
    (what could not be used left out and named) or is a one-line TraceFormatError; never a raw
    IndexError, ValueError or TypeError, and what is recovered is written and read back."""
    import random

    import polyprof
    from polyprof.errors import TraceFormatError
    from polyprof.formats import load_trace, write_trace
    from polyprof.formats.spill.recover import recover_trace

    spill = tmp_path / ".t.json.spill"
    with polyprof.profile(["cpu", "counters"], spill=str(spill), flush_interval_s=0.05,
                          backend_options={"counters": {"interval_ms": 10}}) as prof:
        for i in range(50):
            with polyprof.record_function(f"step {i}", args={"i": i, "tag": "x"}):
                time.sleep(0.004)
    original = spill.read_bytes()
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    chunks = _spill_chunks(original)
    assert {k for k, _ in chunks} >= {b"H", b"W", b"P"}
    rng = random.Random(51)
    outcomes = {"recovered": 0, "named what it left out": 0, "refused": 0}
    for n in range(300):
        path = tmp_path / f"tampered{n}.spill"
        path.write_bytes(_spill_of(_tamper(chunks, rng)))
        try:
            trace = recover_trace(str(path))
        except TraceFormatError as exc:
            assert "\n" not in str(exc)
            outcomes["refused"] += 1
            continue
        outcomes["recovered"] += 1
        if trace.metadata["polyprof"]["partial"]["dropped"]:
            outcomes["named what it left out"] += 1
        load_trace(write_trace(trace, str(tmp_path / "back.json")))
    assert outcomes["recovered"] > 150 and outcomes["named what it left out"] > 50, outcomes
    r = run_cli("recover", str(tmp_path / "tampered0.spill"), "-o", str(tmp_path / "cli.json"))
    assert "Traceback" not in r.stderr and r.returncode in (0, 2), r.stderr


def test_rows_a_backend_hands_over_after_its_collect_are_counted_once(tmp_path):
    """A backend's own thread that goes on emitting after its collect returned: the warning, the trace
    and the file say the same count (the trace's status is a snapshot taken at the merge)."""
    import threading
    import warnings

    import polyprof
    from polyprof.engine.registry import Registry
    from polyprof.errors import PolyprofWarning
    from polyprof.model import ActivityKind
    from polyprof.plugin.backend import API_VERSION, Availability

    keep_going = threading.Event()
    late = [0]  # rows the thread handed over after the sink was sealed

    class Session:
        def __init__(self, ctx):
            self.ctx = ctx

        def prepare(self): pass  # noqa: E704
        def start(self): pass  # noqa: E704
        def stop(self): pass  # noqa: E704
        def close(self): pass  # noqa: E704

        def collect(self, sink):
            host, t = sink.host_device(), sink.host_thread(1)
            ws = self.ctx.window_start

            def emit():  # e.g. a vendor callback thread that the backend did not stop
                while not keep_going.is_set():
                    closed = sink.closed
                    sink.activity(ActivityKind.RUNTIME, "late", device=host, resource=t, start=ws, end=ws + 1)
                    late[0] += closed

            threading.Thread(target=emit, daemon=True).start()
            time.sleep(0.05)

    class Late:
        name, api_version, activities = "late", API_VERSION, frozenset({"LATE"})

        def probe(self):
            return Availability.yes(devices=["x"])

        def create_session(self, config, ctx):
            return Session(ctx)

    registry = Registry(use_env=False)
    registry.register(Late())
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with polyprof.profile(["late"], registry=registry) as prof:
                pass
        said = [str(w.message) for w in caught if issubclass(w.category, PolyprofWarning) and "late" in str(w.message)]
        count = lambda dropped: dropped.get("rows after collect returned", 0)  # noqa: E731
        in_trace = count(prof.trace.backends["late"].dropped)
        time.sleep(0.1)  # the thread goes on: the trace's count does not move
        assert late[0] > in_trace, "rows kept coming after the trace was made"
        assert count(prof.trace.backends["late"].dropped) == in_trace
        prof.export_chrome_trace(str(tmp_path / "t.json"))
        written = json.loads((tmp_path / "t.json").read_text())["polyprof"]["backends"]["late"]
        assert count(written.get("dropped", {})) == in_trace
        assert bool(said) == (in_trace > 0) and (not said or f"dropped {in_trace} rows after collect returned" in said[0])
    finally:
        keep_going.set()
