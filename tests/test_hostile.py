"""What another user of the machine, or a tampered file, can try (issue #51): each case ends in a clean
error, a refused request, or a trace that holds what it should. Cases that need a second user act as
``nobody`` through setpriv (tests/other_user.py) in a sticky folder, as /tmp is."""

import json
import os
import subprocess
import sys
import time

from other_user import NOBODY, as_other_user, needs_other_user, sticky_folder

PYTHON = sys.executable


def polyprof(*args, env=None, cwd=None, timeout=120):
    return subprocess.run([PYTHON, "-m", "polyprof", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "POLYPROF_BACKENDS": "", **(env or {})}, cwd=cwd)  # fmt: skip


@needs_other_user
def test_a_spill_another_user_planted_is_neither_adopted_nor_offered(tmp_path):
    shared = sticky_folder(tmp_path / "shared")
    planted = shared / ".t.json.spill"
    as_other_user("sh", "-c", f"printf 'not a spill of yours' > {planted}")
    script = tmp_path / "s.py"
    script.write_text("import polyprof\nwith polyprof.record_function('work'):\n    pass\n")
    r = polyprof("run", "--activities", "cpu", "--no-summary", "-o", str(shared / "t.json"), str(script))
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
    check = ("from polyprof.export.paths import check_output_path\n"
             "import sys\n"
             "for p in sys.argv[1:]:\n"
             "    try:\n"
             "        check_output_path(p); print('accepted', p)\n"
             "    except Exception as e:\n"
             "        print(type(e).__name__, e)\n")  # fmt: skip
    os.chmod(tmp_path, 0o755)
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
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--", PYTHON, "-c",
         "import time\nfor _ in range(600): time.sleep(0.05)"],
        env={**os.environ, "POLYPROF_ON_DEMAND": "1", "XDG_RUNTIME_DIR": str(runtime), "POLYPROF_BACKENDS": ""},
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        sock = runtime / "polyprof" / f"{target.pid}.sock"
        deadline = time.monotonic() + 60
        while not sock.exists():
            assert time.monotonic() < deadline and target.poll() is None, "the target never listened"
            time.sleep(0.05)
        r = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--", PYTHON, "-m",
                            "polyprof", "capture", str(target.pid), "--duration", "0.3", "-o", str(theirs), "--no-summary"],
                           env={**os.environ, "XDG_RUNTIME_DIR": str(runtime)}, capture_output=True, text=True,
                           timeout=60)  # fmt: skip
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

    from polyprof.clock import epoch_offset, host_ns
    from polyprof.engine.merge import merge
    from polyprof.export import write_trace
    from polyprof.io import load_trace
    from polyprof.model import HOST_TIME_LIMIT_NS, ActivityKind, BackendStatus
    from polyprof.sink import Sink

    sink = Sink("probe")
    host, thread = sink.host_device(), sink.host_thread(1)
    now = host_ns()
    kept = sink.activities({"kind": [int(ActivityKind.USER_ANNOTATION)] * 4, "name": ["fine", "huge end", "huge start", "edge"],
                            "device": [host] * 4, "resource": [thread] * 4,
                            "start": np.array([now, now, -(2**63), now], dtype=np.int64),
                            "end": np.array([now + 10, 2**63 - 1, now, HOST_TIME_LIMIT_NS], dtype=np.int64)})  # fmt: skip
    assert not sink.counter("c", 1.0, ts=2**63 - 1) and sink.counter("c", 1.0, ts=now)
    status = BackendStatus("probe")
    part = sink.seal(status)
    assert kept == 2 and status.rejected == 3 and "timestamp beyond" in " ".join(status.rejected_reasons)
    epoch = epoch_offset().offset_ns
    trace = merge([part], window=(now, HOST_TIME_LIMIT_NS), epoch_offset_ns=epoch, base_time_ns=0, metadata={})
    for name in ("t.json", "t.pftrace"):
        back = load_trace(write_trace(trace, str(tmp_path / name)))
        assert {"fine", "edge"} <= {a.name for a in back.activities}
