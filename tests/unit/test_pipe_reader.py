"""The reader thread of a client's pipe (SPEC §1.4): every byte handed over in order, the
end told once, and ``close`` stops it — the thread gone, its descriptor closed by it."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

from dagctx.server.pipe_reader import PipeReader


def _reader(fd: int, got: list[bytes], ended: threading.Event) -> PipeReader:
    return PipeReader(fd, got.append, ended.set, lambda fn, *a: fn(*a), name="test-reader")


def test_every_byte_arrives_in_order_and_the_end_is_told_once() -> None:
    r, w = os.pipe()
    got: list[bytes] = []
    ended = threading.Event()
    reader = _reader(r, got, ended)
    reader.start()
    sent = [bytes([i % 251]) * (1 + i * 37 % 5000) for i in range(200)]
    for chunk in sent:
        os.write(w, chunk)
    os.close(w)
    assert ended.wait(10)
    reader.thread.join(10)
    assert not reader.thread.is_alive()
    assert b"".join(got) == b"".join(sent)
    reader.close()  # after the end: nothing to wake, nothing written anywhere


def test_close_stops_a_reader_whose_client_keeps_its_end_open() -> None:
    r, w = os.pipe()
    got: list[bytes] = []
    ended = threading.Event()
    reader = _reader(r, got, ended)
    reader.start()
    os.write(w, b"first")
    for _ in range(1000):
        if got:
            break
        threading.Event().wait(0.01)
    reader.close()
    reader.thread.join(10)
    assert not reader.thread.is_alive() and got == [b"first"]
    assert not ended.is_set()  # closed by us: the end of the client is not reported
    os.close(w)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread names in /proc are Linux's")
def test_the_reader_thread_carries_its_name_where_the_os_shows_it() -> None:
    r, w = os.pipe()
    got: list[bytes] = []
    ended = threading.Event()
    reader = PipeReader(r, got.append, ended.set, lambda fn, *a: fn(*a), name="dagctx-in-a-long-connection-id")
    reader.start()
    os.write(w, b"x")
    for _ in range(200):
        if got:
            break
        time.sleep(0.01)
    with open(f"/proc/self/task/{reader.thread.native_id}/comm") as fh:
        assert fh.read().strip() == "dagctx-in-a-lon"  # the first 15 bytes
    os.close(w)
    assert ended.wait(5)
