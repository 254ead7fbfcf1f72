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
    return PipeReader(fd, lambda data, quiet: got.append(data), ended.set, lambda fn, *a: fn(*a), name="test-reader")


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
    reader = PipeReader(r, lambda data, quiet: got.append(data), ended.set, lambda fn, *a: fn(*a),
                        name="dagctx-in-a-long-connection-id")
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


class _Beside:
    """Something ``feed`` asks the reader to poll beside the input (as the server does with the
    database path's watch): a pipe, readable while something is queued in it."""

    def __init__(self) -> None:
        self.r, self.w = os.pipe()

    def fileno(self) -> int:
        return self.r


def _thread_ticks(reader: PipeReader) -> int:
    with open(f"/proc/self/task/{reader.thread.native_id}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def _wait_for(cond) -> None:
    for _ in range(1000):
        if cond():
            return
        time.sleep(0.005)
    raise AssertionError("the reader did not get there")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread CPU times in /proc are Linux's")
def test_what_feed_names_is_polled_beside_the_input_and_its_silence_is_told_to_the_next_feed() -> None:
    r, w = os.pipe()
    beside = _Beside()
    seen: list[tuple[bytes, object]] = []

    def feed(data: bytes, quiet: object) -> object:
        seen.append((data, quiet))
        return beside

    ended = threading.Event()
    reader = PipeReader(r, feed, ended.set, lambda fn, *a: fn(*a), name="test-reader")
    reader.start()
    try:
        os.write(w, b"1")
        _wait_for(lambda: len(seen) == 1)
        assert seen[0] == (b"1", None)  # nothing was polled beside it yet
        os.write(w, b"2")
        _wait_for(lambda: len(seen) == 2)
        assert seen[1] == (b"2", beside)  # the input alone woke the thread: nothing queued beside
        os.write(beside.w, b"q")  # something queued beside, no input: the thread wakes once
        time.sleep(0.05)
        before = _thread_ticks(reader)
        time.sleep(0.3)
        assert _thread_ticks(reader) - before <= 5  # it stopped polling it: no spinning on it
        assert len(seen) == 2  # and nothing was fed
        os.write(w, b"3")
        _wait_for(lambda: len(seen) == 3)
        assert seen[2] == (b"3", None)  # not polled since something was queued: no word
        os.read(beside.r, 1)  # emptied, as whoever asks the watch does
        os.write(w, b"4")  # (polled beside the input again since the read of "3")
        _wait_for(lambda: len(seen) == 4)
        assert seen[3] == (b"4", None)  # the poll after "3" found "q" still there
        os.write(w, b"5")
        _wait_for(lambda: len(seen) == 5)
        assert seen[4] == (b"5", beside)
        os.close(beside.r)  # closed while polled (its number invalid): polled no more, no spinning
        os.write(w, b"6")
        _wait_for(lambda: len(seen) == 6)
        time.sleep(0.05)
        before = _thread_ticks(reader)
        time.sleep(0.3)
        assert _thread_ticks(reader) - before <= 5
        os.write(w, b"7")
        _wait_for(lambda: len(seen) == 7)
        assert [d for d, _ in seen] == [b"1", b"2", b"3", b"4", b"5", b"6", b"7"]
    finally:
        os.close(w)
        assert ended.wait(10)
        os.close(beside.w)
