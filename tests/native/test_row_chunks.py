"""The recorder's rows live in 192 KiB chunks that a helper thread faults in ahead while recording
(row_chunks.c): the helper runs only while recording, the pool is unmapped when recording ends, every
chunk is unmapped when its buffer goes, and a process forked while recording records on."""

from __future__ import annotations

import gc
import os
import sys
import time

import pytest

import polyprof
import polyprof._native

fast = polyprof._native.extension
pytestmark = pytest.mark.skipif(fast is None, reason="needs polyprof's C extension (built by setup.sh)")
ROWS_PER_CHUNK = 8192


def _wait_for(condition, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def test_chunks_come_faulted_in_while_recording_and_all_go_back_after():
    gc.collect()
    before = fast.row_chunks_stats()
    assert not before["helper"] and before["ready"] == 0
    with polyprof.profile(["cpu"]) as p:
        for _ in range(ROWS_PER_CHUNK):
            polyprof.instant("x")
        assert not fast.row_chunks_stats()["helper"]  # a recording within one chunk a thread starts none
        polyprof.instant("x")  # the buffer's second chunk, none faulted in for it: the helper starts
        assert _wait_for(lambda: fast.row_chunks_stats()["ready"] == 1)
        time.sleep(0.05)
        assert fast.row_chunks_stats()["ready"] == 1  # one chunk ahead, to begin with
        for taken in range(1, 6):  # a chunk's worth at a time, so that the helper keeps up
            for _ in range(ROWS_PER_CHUNK):
                polyprof.instant("x")
            # each chunk a buffer takes from the pool grows it by one, up to four
            assert _wait_for(lambda n=min(4, 1 + taken): fast.row_chunks_stats()["ready"] == n)
        during = fast.row_chunks_stats()
    after_stop = fast.row_chunks_stats()
    # the buffer's first chunk faulted in as it filled, its second was mapped fresh (the pool was
    # empty), the next five came from the pool
    assert during["faulted_ahead"] - before["faulted_ahead"] >= 5
    assert during["helper"] and not after_stop["helper"] and after_stop["ready"] == 0
    events = [e for e in p.trace.activities if e.name == "x"]
    assert len(events) == 6 * ROWS_PER_CHUNK + 1
    assert all(a.start <= b.start for a, b in zip(events, events[1:], strict=False))
    del p, events
    gc.collect()
    assert fast.row_chunks_stats()["mapped"] == before["mapped"]  # every chunk unmapped


def test_a_process_forked_while_recording_records_on_in_both():
    with polyprof.profile(["cpu"]) as p:
        for _ in range(ROWS_PER_CHUNK + 1):
            polyprof.instant("before")
        child = os.fork()
        if child == 0:  # the child: no helper came with it; its chunks are mapped as they are needed
            code = 1
            try:
                for _ in range(3 * ROWS_PER_CHUNK):
                    polyprof.instant("child")
                stats = fast.row_chunks_stats()
                code = 0 if stats["ready"] <= 4 and stats["mapped"] >= 3 else 2
            finally:
                os._exit(code)
        for _ in range(3 * ROWS_PER_CHUNK):
            polyprof.instant("parent")
        _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    names = [e.name for e in p.trace.activities if e.name in ("before", "parent", "child")]
    assert names.count("before") == ROWS_PER_CHUNK + 1 and names.count("parent") == 3 * ROWS_PER_CHUNK
    assert "child" not in names


@pytest.mark.skipif(sys.platform != "linux", reason="the C extension is built on Linux only")
def test_the_helper_takes_no_signal():
    with polyprof.profile(["cpu"]):
        for _ in range(ROWS_PER_CHUNK + 1):  # into a second chunk: the helper starts
            polyprof.instant("x")
        assert _wait_for(lambda: fast.row_chunks_stats()["helper"])
        threads = os.listdir(f"/proc/{os.getpid()}/task")
        blocked = []
        for tid in threads:
            with open(f"/proc/{os.getpid()}/task/{tid}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            blocked.append(int(fields["SigBlk"].strip(), 16))
    # one thread (the helper) blocks every signal (SIGKILL and SIGSTOP cannot be, whatever the mask says)
    assert any((mask | 1 << 8 | 1 << 18) & 0x7FFFFFFF == 0x7FFFFFFF for mask in blocked), [hex(m) for m in blocked]


def test_chunks_freed_while_recording_are_reused_and_unmapped_when_it_ends():
    """A buffer handed over and dropped while recording gives its chunk to the pool (its pages are
    faulted in already); the pool is unmapped when recording ends, though no helper ever ran."""
    gc.collect()
    before = fast.row_chunks_stats()
    with polyprof.profile(["cpu"]):
        polyprof.instant("x")
        taken = fast.thread_buffer().take()  # as a flush does
        del taken
        during = fast.row_chunks_stats()
        assert during["ready"] == 1 and not during["helper"]
    after = fast.row_chunks_stats()
    assert after["ready"] == 0 and after["mapped"] == before["mapped"]


def _record_one_instant_on_a_new_thread() -> None:
    import threading

    t = threading.Thread(target=polyprof.instant, args=("one",))
    t.start()
    t.join()


def _faults_recording_a_chunk_on_a_new_thread(chunks: int = 1) -> int:
    """Page faults that a fresh thread takes while recording `chunks` chunks' worth of instants."""
    import resource
    import threading

    faults = []

    def record() -> None:
        polyprof.instant("first")  # the thread's buffer and its first chunk
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        for _ in range(chunks * ROWS_PER_CHUNK - 100):
            polyprof.instant("x")
        faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)

    t = threading.Thread(target=record)
    t.start()
    t.join()
    return faults[0]


def test_chunks_warmed_at_a_start_are_the_first_chunks_buffers_take_and_unused_ones_go_back():
    gc.collect()
    before = fast.row_chunks_stats()
    with polyprof.profile(["cpu"]) as p:
        for _ in range(fast.row_chunks_stats()["warm"]):  # those the start warmed (the torch observer's)
            _record_one_instant_on_a_new_thread()
        cold = _faults_recording_a_chunk_on_a_new_thread()
        fast.warm_row_chunks(4)  # more than the torch observer's start asks for with record_shapes
        assert fast.row_chunks_stats()["warm"] == 4
        faulted_in = _faults_recording_a_chunk_on_a_new_thread()
        assert fast.row_chunks_stats()["warm"] == 3  # the new thread's buffer took one
        # another's first chunk, and its second while the pool is empty (its helper only starting)
        two_faulted_in = _faults_recording_a_chunk_on_a_new_thread(chunks=2)
        assert fast.row_chunks_stats()["warm"] == 1
    # a chunk's worth of rows is 48 pages: cold, each faults in as it is first written
    assert cold >= 40 and faulted_in <= 5 and two_faulted_in <= 8, (cold, faulted_in, two_faulted_in)
    assert fast.row_chunks_stats()["warm"] == 0  # the one nobody took is unmapped at the end
    assert sum(1 for e in p.trace.activities if e.name == "x") == 4 * ROWS_PER_CHUNK - 300
    del p
    gc.collect()
    assert fast.row_chunks_stats()["mapped"] == before["mapped"]


def test_a_recording_the_warm_chunks_hold_starts_no_helper():
    """The helper starts only when a buffer past its first chunk finds none faulted in: a recording
    that the chunks warmed at its start hold (a short window) never pays for a pool it would drop."""
    with polyprof.profile(["cpu"]):
        for _ in range(fast.row_chunks_stats()["warm"]):  # those the start warmed (the torch observer's)
            _record_one_instant_on_a_new_thread()
        fast.warm_row_chunks(2)
        _faults_recording_a_chunk_on_a_new_thread(chunks=2)  # its first and second chunks: both warm
        assert not fast.row_chunks_stats()["helper"]
        _faults_recording_a_chunk_on_a_new_thread(chunks=2)  # its second finds none: the helper starts
        assert fast.row_chunks_stats()["helper"]
