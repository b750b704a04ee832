"""run_lock.held_here: whether this process holds a model directory's lock,
read from the lock file as either form of it names its holder."""

import json

from keras_identity.training import run_lock


def test_held_here_reads_the_holder_of_either_form_of_the_lock(tmp_path):
    assert not run_lock.held_here(str(tmp_path))  # no lock
    lock = run_lock.RunLock(str(tmp_path)).acquire()  # a disk's: a line naming the holder
    try:
        assert run_lock.held_here(str(tmp_path))
    finally:
        lock.release()
    path = tmp_path / run_lock.LOCK_FILE
    # A bucket's lease, written here by hand: its "holder".
    path.write_text(json.dumps({"holder": run_lock._holder(), "token": "t", "renewed": 0}))
    assert run_lock.held_here(str(tmp_path))
    path.write_text(json.dumps({"holder": "pid 1 on elsewhere", "token": "t", "renewed": 0}))
    assert not run_lock.held_here(str(tmp_path))
    path.write_text("pid 1 on elsewhere\n")
    assert not run_lock.held_here(str(tmp_path))
    path.write_bytes(b"\xff\xfe")  # not text
    assert not run_lock.held_here(str(tmp_path))
