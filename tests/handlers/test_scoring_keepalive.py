"""The one read of multiprocessing's internals (``scoring.drop_keepalive``): a worker
closes its copy of the fork server's keep-alive pipe where CPython keeps it, and
changes nothing where it finds no such attribute. The end-to-end proof that no
process outlives a SIGKILLed server is tests/handlers/test_scoring.py's."""

from __future__ import annotations

import os
from multiprocessing import forkserver
from types import SimpleNamespace

from rollserve.handlers.scoring import drop_keepalive


def test_the_copy_of_the_pipe_is_closed_and_cleared():
    read_end, write_end = os.pipe()
    try:
        server = SimpleNamespace(_forkserver_alive_fd=write_end)
        assert drop_keepalive(server) == "closed"
        assert server._forkserver_alive_fd is None
        assert os.read(read_end, 1) == b""  # no writer left: the fork server would see EOF
    finally:
        os.close(read_end)


def test_a_spawn_worker_has_none_to_close():
    server = SimpleNamespace(_forkserver_alive_fd=None)
    assert drop_keepalive(server) == "none"
    assert server._forkserver_alive_fd is None


def test_another_layout_is_left_alone():
    read_end, write_end = os.pipe()
    try:
        renamed = SimpleNamespace(alive_fd=write_end)
        assert drop_keepalive(renamed) == "unknown"
        assert drop_keepalive(None) == "unknown"
        assert renamed.alive_fd == write_end
        os.write(write_end, b"x")  # still open
        assert os.read(read_end, 1) == b"x"
    finally:
        os.close(read_end)
        os.close(write_end)


def test_this_python_keeps_the_pipe_where_drop_keepalive_reads_it():
    # An upgrade that moves it fails here, not silently in a killed server's leftovers.
    assert hasattr(forkserver._forkserver, "_forkserver_alive_fd"), (
        "multiprocessing.forkserver no longer has _forkserver._forkserver_alive_fd: "
        "rollserve.handlers.scoring.drop_keepalive needs this Python's equivalent"
    )
