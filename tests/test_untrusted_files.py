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
