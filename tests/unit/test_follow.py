"""``feed.follow``: the one reader run without a UI (``perfmon record``, ``report``, the headless
demo). It stops at the deadline without calling the job ended, returns as soon as every stream
ends, and turns a stream's protocol problem into one ``StreamError`` line."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

import probe
from perfmon_analysis.analysis import Analysis
from probe import wire
from tui.stream import feed as feed_module
from tui.stream.discovery import Endpoint, resolve_live
from tui.stream.feed import Feed, LiveFeed, StreamStatus, follow
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


class _LateFeed(Feed):
    """A source that answers ``after`` seconds into the watch (a relay that ssh takes that long to
    start), or never; it notes when it answered."""

    def __init__(self, after: float | None) -> None:
        super().__init__(Analysis())
        self.after = after
        self.answered_at: float | None = None
        self.streams["relay"] = StreamStatus("relay", "relay")

    async def run(self) -> None:
        if self.after is not None:
            await asyncio.sleep(self.after)
            self.streams["relay"].state = "live"
            self.answered_at = time.monotonic()
        await asyncio.Event().wait()


def test_the_watch_counts_from_the_sources_answer_not_from_the_start():
    feed = _LateFeed(after=0.4)
    t0 = time.monotonic()
    follow(feed, seconds=0.3)
    done = time.monotonic()
    assert feed.answered_at is not None and feed.answered_at - t0 >= 0.4
    assert done - feed.answered_at >= 0.3      # the whole watch after the answer: 0.7 s or more in all


def test_a_source_that_never_answers_is_waited_for_at_most_the_answer_limit(monkeypatch):
    monkeypatch.setattr(feed_module, "ANSWER_LIMIT_S", 0.2)
    feed = _LateFeed(after=None)
    t0 = time.monotonic()
    follow(feed, seconds=0.1)
    took = time.monotonic() - t0
    assert feed.answered_at is None and 0.3 <= took < 5.0     # the limit, then the watch; not forever


def test_hosts_have_answered_once_every_relay_said_hello_or_failed():
    from tui.stream.remote import RelayFeed

    feed = RelayFeed(Analysis(), "job", ["n01", "n02", "n03"], "true {host}")
    assert not feed.answered
    states = {"n01": "live", "n02": "error", "n03": "restarting"}
    for host, state in states.items():
        feed.relays[host].state = state
    assert not feed.answered                   # n03's relay is being started again
    feed.relays["n03"].state = "exited"
    assert feed.answered and not feed.streams  # no rank yet: the hosts, not the ranks, answer
