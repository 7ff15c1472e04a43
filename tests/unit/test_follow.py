"""``feed.follow``: the one reader run without a UI (``perfmon record``, ``report``, the headless
demo). It stops at the deadline without calling the job ended, returns as soon as every stream
ends, and turns a stream's protocol problem into one ``StreamError`` line."""

from __future__ import annotations

import socket
import threading
import time

import pytest

import probe
from perfmon_analysis.analysis import Analysis
from probe import wire
from tui.stream.discovery import Endpoint, resolve_live
from tui.stream.feed import LiveFeed, follow
from tui.stream.sources import StreamError


def _feed(analysis: Analysis, target: str) -> LiveFeed:
    endpoints = resolve_live(target)
    return LiveFeed(analysis, endpoints[0].job, endpoints, rescan=False)


def test_deadline_stops_reading_without_ending_the_job_and_the_tap_sees_every_record():
    mon = probe.start(job="follow-live")
    try:
        for _ in mon.loader(range(20)):
            with mon.step():
                pass
        analysis = Analysis()
        feed = _feed(analysis, "follow-live")
        seen: list[str] = []
        feed.tap = lambda stream, rec: seen.append(rec["k"])
        t0 = time.monotonic()
        follow(feed, seconds=0.5)
        assert time.monotonic() - t0 >= 0.5
        view = analysis.view()
        assert not view.ended and view.metrics.steps == 20
        assert seen[0] == "hello" and seen.count("step") == 20
        assert feed.streams[str(mon.socket_path)].state == "live"
    finally:
        mon.close()


def test_returns_when_every_stream_has_ended():
    mon = probe.start(job="follow-end")
    with mon.step():
        pass
    analysis = Analysis()
    feed = _feed(analysis, "follow-end")
    closer = threading.Timer(0.2, mon.close)
    closer.start()
    t0 = time.monotonic()
    follow(feed, seconds=30)
    closer.join()
    assert time.monotonic() - t0 < 10
    assert analysis.view().ended and feed.ended


def test_a_probe_of_another_major_version_is_one_stream_error(tmp_path):
    path = tmp_path / "old.0.1.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)

    def serve() -> None:
        conn, _ = listener.accept()
        conn.sendall(wire.encode({"k": "hello", "t": time.time(), "proto": [9, 0], "rank": 0}))
        conn.recv(4096)
        conn.close()

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    feed = LiveFeed(Analysis(), "old", [Endpoint("old", 0, 0, 0, str(path), 0.0)], rescan=False)
    try:
        with pytest.raises(StreamError) as err:
            follow(feed, seconds=10)
        assert "\n" not in str(err.value) and "9" in str(err.value)
    finally:
        listener.close()
        server.join(5)


def test_each_attach_gets_the_backfill_as_it_is_then():
    """The backfill batch is joined once per sender tick and shared by that tick's connects; a
    viewer attaching after more steps must still get them."""
    mon = probe.start(job="follow-again")
    try:
        for more, total in ((5, 5), (7, 12)):
            for _ in range(more):
                with mon.step():
                    pass
            analysis = Analysis()
            follow(_feed(analysis, "follow-again"), seconds=0.3)
            assert analysis.view().metrics.steps == total
    finally:
        mon.close()
