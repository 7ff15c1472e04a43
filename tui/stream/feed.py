"""Feeds: where the TUI's records come from, read on the app's event loop into an ``Analysis``.

A feed owns an ``Analysis`` and a clock. ``run()`` is the body of one asyncio
worker: it reads live probe sockets (``LiveFeed``), a TCP endpoint through an
SSH tunnel (``TcpFeed``) or recording files (``ReplayFeed``) and calls
``analysis.ingest`` per record; it never touches a widget. The app asks the analysis
for a view on its own timer, using ``feed.now()`` so that a replay is judged at
its own (virtual) time rather than the wall clock.

Each stream keeps a ``StreamStatus`` (connecting, live, exited, lost, error)
so the header can say "job exited" and keep the last data on screen, and the
live feed rescans the socket directory so a restarted rank is re-attached.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfmon_analysis.analysis import Analysis
from probe import paths
from tui.errors import UserError
from tui.stream import discovery
from tui.stream.requests import Askable, Target
from tui.stream.sources import LiveStream, LoadedRecording, StreamError, viewer_hello

READ_CHUNK = 1 << 16
RESCAN_SECONDS = 1.0        # how often a live feed looks for restarted or new ranks
CONNECT_TIMEOUT = 2.0
REPLAY_TICK = 0.05          # replay clock resolution
INGEST_SLICE = 4000         # records ingested before yielding to the UI (big recordings)
ANSWER_LIMIT_S = 30.0       # follow(seconds): the longest wait for every source's first answer before counting
ANSWER_POLL_S = 0.05
SPEEDS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 64.0)


@dataclass
class StreamStatus:
    """What the viewer knows about one stream, for the header and the ranks pane."""

    stream_id: str
    label: str                      # "rank 0" once the hello is in, else the socket/file name
    state: str = "connecting"       # connecting | live | exited | lost | error | replay | done
    message: str | None = None      # one line when state is error/lost
    records: int = 0
    rank: int | None = None


@dataclass
class Feed:
    """Common state of every feed; subclasses implement ``run``."""

    analysis: Analysis
    description: str = ""
    streams: dict[str, StreamStatus] = field(default_factory=dict)
    paused: bool = False            # replay: the clock stops; live: only the display freezes (app side)
    tap: Callable[[str, dict[str, Any]], None] | None = None   # sees every record after the analysis (perfmon record)
    _first_data: asyncio.Event | None = None
    _all_ended: asyncio.Event | None = None

    is_replay = False

    def now(self) -> float:
        """The time the view is computed at."""
        return time.time()

    def clock(self) -> float | None:
        """The viewer's monotonic clock for live feeds (``Analysis.view(clock=...)``); None for replay."""
        return None if self.is_replay else time.monotonic()

    async def run(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    async def aclose(self) -> None:
        """Release what the feed started outside this process (relays); the app awaits it on quit."""

    def follow(self, stream_ids: set[str] | None) -> None:
        """The streams whose every record the viewer needs now (the panes' rank; None: all). Only a
        feed through relays, which otherwise summarises each rank, does anything with it."""

    def request_target(self, stream_id: str) -> Askable | str:
        """Where to send a request to the probe behind ``stream_id`` (``tui.stream.requests``),
        or why this feed cannot (a recording has no probe to ask)."""
        return "a recording cannot be asked: attach to the live job (perfmon attach JOB)"

    @property
    def first_data(self) -> asyncio.Event:
        """Set when the first records are in: the app draws its first full screen then."""
        if self._first_data is None:
            self._first_data = asyncio.Event()
        return self._first_data

    def ingest(self, stream_id: str, records: Iterable[dict[str, Any]]) -> None:
        status = self.streams[stream_id]
        n = 0
        received = self.clock()
        for rec in records:
            self.analysis.ingest(stream_id, rec, received)
            if self.tap is not None:
                self.tap(stream_id, rec)
            n += 1
            if rec["k"] == "hello":
                status.rank = rec.get("rank") if isinstance(rec.get("rank"), int) else None
                if status.rank is not None:
                    status.label = f"rank {status.rank}"
            elif rec["k"] == "bye" and status.state in ("live", "connecting"):
                status.state = "exited"
        if n:
            status.records += n
            self.first_data.set()

    def stream_finished(self) -> None:
        """A stream reached its end (bye, EOF, error); wakes ``wait_ended`` once all have."""
        if self.ended and self._all_ended is not None:
            self._all_ended.set()

    async def wait_ended(self) -> None:
        """Until every stream has finished (a replay: until its end)."""
        if self._all_ended is None:
            self._all_ended = asyncio.Event()
        if not self.ended:
            await self._all_ended.wait()

    @property
    def ended(self) -> bool:
        """Every stream has finished (exited, lost, failed, or the replay reached its end)."""
        return bool(self.streams) and all(s.state in ("exited", "lost", "error", "done") for s in self.streams.values())

    @property
    def answered(self) -> bool:
        """Every source has answered (its first record) or failed: a watch of ``seconds`` counts from here."""
        return bool(self.streams) and all(s.state != "connecting" for s in self.streams.values())

    @property
    def flowing(self) -> bool:
        """Records are still coming (the header shows its state as good news)."""
        return not self.ended

    def state_line(self) -> str:
        """Short status for the header: 'live', 'job exited', 'replay 2x 40%'..."""
        states = [s.state for s in self.streams.values()]
        if not states:
            return "waiting for the job's probe"
        if all(s == "connecting" for s in states):
            return "connecting"
        if all(s == "exited" for s in states):
            return "job exited"
        if self.ended:
            lost = sum(s in ("lost", "error") for s in states)
            return f"job gone ({lost} stream{'s' * (lost != 1)} lost)" if lost else "job exited"
        gone = sum(s in ("exited", "lost", "error") for s in states)
        return f"live, {gone} of {len(states)} ranks gone" if gone else "live"


# -- live Unix sockets -----------------------------------------------------------------------

class LiveFeed(Feed):
    """Every rank of one job on this node, re-attaching ranks that restart."""

    def __init__(self, analysis: Analysis, job: str | None, endpoints: list[discovery.Endpoint],
                 rescan: bool = True) -> None:
        super().__init__(analysis, description=f"live {job or ''}".strip())
        self.job = job
        self._initial = list(endpoints)
        self._rescan = rescan and job is not None
        self._tasks: dict[str, asyncio.Task] = {}

    async def run(self) -> None:
        for ep in self._initial:
            self._start(ep.socket)
        try:
            while True:
                await asyncio.sleep(RESCAN_SECONDS)
                if self._rescan:
                    await self._rescan_once()
        finally:
            for task in self._tasks.values():
                task.cancel()

    async def _rescan_once(self) -> None:
        try:
            found = await asyncio.to_thread(discovery.list_endpoints)
        except (UserError, OSError) as exc:
            self.analysis.add_problem(f"cannot rescan sockets: {exc}")
            return
        for ep in discovery.jobs(found).get(self.job or "", []):
            if ep.socket not in self._tasks:
                self._start(ep.socket)

    def _start(self, path: str) -> None:
        self.streams[path] = StreamStatus(path, Path(path).name.removesuffix(paths.SOCKET_SUFFIX))
        self._tasks[path] = asyncio.ensure_future(self._read(path))

    def request_target(self, stream_id: str) -> Askable | str:
        return Target(path=stream_id, label=self.streams[stream_id].label if stream_id in self.streams else stream_id)

    async def _read(self, path: str) -> None:
        status = self.streams[path]
        stream = LiveStream(path)
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(path), CONNECT_TIMEOUT)
        except (OSError, asyncio.TimeoutError) as exc:
            status.state = "lost" if isinstance(exc, (ConnectionRefusedError, FileNotFoundError)) else "error"
            status.message = (f"{path}: permission denied (a job of another user?)"
                              if isinstance(exc, PermissionError)
                              else f"{path}: cannot connect: {getattr(exc, 'strerror', None) or exc or 'timeout'}")
            self.analysis.add_problem(status.message)
            self.stream_finished()
            return
        name = paths.parse_name(Path(path).name)
        if name is not None:
            self.analysis.expect(path, name.rank, name.job, name.pid, name.restart, self.clock())
        await _pump(self, status, stream, reader, writer, viewer_hello())


# -- TCP through an SSH tunnel ---------------------------------------------------------------

class TcpFeed(Feed):
    """One probe's TCP listener (``PERFMON_TCP``), authenticated with its token."""

    def __init__(self, analysis: Analysis, host: str, port: int, token: str) -> None:
        super().__init__(analysis, description=f"tcp {host}:{port}")
        self.host, self.port, self.token = host, port, token

    def request_target(self, stream_id: str) -> Askable | str:
        return Target(host=self.host, port=self.port, token=self.token)

    async def run(self) -> None:
        sid = f"{self.host}:{self.port}"
        status = self.streams[sid] = StreamStatus(sid, sid)
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(self.host, self.port), CONNECT_TIMEOUT)
        except (OSError, asyncio.TimeoutError) as exc:
            status.state = "error"
            status.message = f"cannot connect to {sid}: {getattr(exc, 'strerror', None) or exc or 'timeout'}"
            self.analysis.add_problem(status.message)
            self.stream_finished()
            return
        await _pump(self, status, LiveStream(sid), reader, writer, viewer_hello(self.token))
        if status.records == 0 and status.state == "lost":
            status.state = "error"
            status.message = f"{sid} closed the connection: wrong token, or not a perfmon probe"
            self.analysis.add_problem(status.message)
        self.stream_finished()


async def _pump(feed: Feed, status: StreamStatus, stream: LiveStream, reader: asyncio.StreamReader,
                writer: asyncio.StreamWriter, hello: bytes) -> None:
    """Send our hello, then decode frames into the model until EOF, bye or a protocol error.

    Cancelled (the viewer stops following: ``follow``'s deadline, the app quitting), the stream
    is left as it was: the job did not end because we stopped reading it."""
    cancelled = False
    try:
        writer.write(hello)
        await writer.drain()
        status.state = "live"
        while True:
            data = await reader.read(READ_CHUNK)
            if not data:
                if status.state == "live":
                    status.state = "lost"
                    status.message = "probe went away without saying bye (killed?)"
                return
            feed.ingest(status.stream_id, stream.feed(data))
            if stream.ended:
                status.state = "exited"
                return
    except StreamError as exc:
        status.state = "error"
        status.message = str(exc)
        feed.analysis.add_problem(status.message)
    except (OSError, asyncio.IncompleteReadError) as exc:
        status.state = "lost"
        status.message = f"connection lost: {getattr(exc, 'strerror', None) or exc}"
    except asyncio.CancelledError:
        cancelled = True
        raise
    finally:
        writer.close()
        if not cancelled:
            feed.analysis.end_stream(status.stream_id)
            if not isinstance(feed, TcpFeed):     # TcpFeed reads a silent close as a bad token first
                feed.stream_finished()


def follow(feed: Feed, seconds: float | None = None) -> None:
    """Run ``feed`` without a UI until every stream ends or ``seconds`` pass (``perfmon record``,
    ``report`` and the headless demo read through the same reader as the TUI). The seconds count from
    the moment every source has answered or failed (``Feed.answered``), at most ``ANSWER_LIMIT_S`` after
    the start: relays started over ssh take seconds to come up, and that time is not the job's.

    Raises ``StreamError`` with the first stream's one-line error (wrong version, bad frame,
    permission), after the other streams' records are in."""
    asyncio.run(_follow(feed, seconds))
    errors = [s.message for s in feed.streams.values() if s.state == "error" and s.message]
    if errors:
        raise StreamError(errors[0])


async def _follow(feed: Feed, seconds: float | None) -> None:
    task = asyncio.ensure_future(feed.run())
    try:
        if seconds is not None:
            deadline = time.monotonic() + ANSWER_LIMIT_S
            while not (feed.answered or feed.ended) and time.monotonic() < deadline and not task.done():
                await asyncio.sleep(ANSWER_POLL_S)
        await asyncio.wait_for(feed.wait_ended(), seconds)
    except asyncio.TimeoutError:
        pass
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


# -- recordings ------------------------------------------------------------------------------

class ReplayFeed(Feed):
    """Plays recordings back on a virtual clock that can pause, change speed or jump to the end.

    ``speed=None`` ingests everything at once and fixes the clock at the last
    record (snapshot tests, screenshots): the screen is then a pure function of the files.
    ``verdicts``: an instant replay judges the window at that many evenly spaced instants on
    the way, so the run's history (the trends screen) holds the verdict's changes.
    """

    is_replay = True

    def __init__(self, analysis: Analysis, recordings: list[LoadedRecording], speed: float | None = 1.0,
                 monotonic: Callable[[], float] = time.monotonic, verdicts: int = 0) -> None:
        super().__init__(analysis, description=f"replay of {_replay_name(recordings)}")
        merged: list[tuple[float, int, str, dict[str, Any]]] = []
        for rec_file in recordings:
            sid = str(rec_file.path)
            self.streams[sid] = StreamStatus(sid, rec_file.path.name.removesuffix(paths.RECORD_SUFFIX), state="replay")
            if rec_file.problem:
                analysis.add_problem(rec_file.problem)
            for rec in rec_file.records:
                merged.append((float(rec["t"]), len(merged), sid, rec))
        merged.sort(key=lambda item: (item[0], item[1]))
        self._records = merged
        self._next = 0
        self.start_t = merged[0][0] if merged else 0.0
        self.end_t = merged[-1][0] if merged else 0.0
        self.instant = speed is None
        self.speed = 1.0 if speed is None else float(speed)
        self._position = self.end_t if self.instant else self.start_t
        self._monotonic = monotonic
        self._last_tick: float | None = None
        self._verdicts = verdicts

    def now(self) -> float:
        return self._position

    @property
    def progress(self) -> float:
        span = self.end_t - self.start_t
        return 1.0 if span <= 0 else min(1.0, (self._position - self.start_t) / span)

    @property
    def flowing(self) -> bool:
        return self._next < len(self._records) and not self.paused

    def state_line(self) -> str:
        if self._next >= len(self._records):
            return "replay finished"
        state = "paused" if self.paused else "playing"
        return f"replay {state} {self.speed:g}x {self.progress:.0%}"

    def faster(self) -> None:
        self.speed = next((s for s in SPEEDS if s > self.speed), SPEEDS[-1])

    def slower(self) -> None:
        self.speed = next((s for s in reversed(SPEEDS) if s < self.speed), SPEEDS[0])

    def to_end(self) -> None:
        self._position = self.end_t

    async def run(self) -> None:
        if self.instant:
            every = (self.end_t - self.start_t) / self._verdicts if self._verdicts > 0 else 0.0
            for k in range(1, self._verdicts if every > 0 else 0):
                await self._ingest_until(self.start_t + every * k)
                self.analysis.snapshot(self.start_t + every * k)      # a one-off verdict, noted in the history
            await self._ingest_until(self.end_t)
        else:
            self._last_tick = self._monotonic()
            while self._next < len(self._records):
                await asyncio.sleep(REPLAY_TICK)
                tick = self._monotonic()
                if not self.paused:
                    self._position = min(self.end_t, self._position + (tick - self._last_tick) * self.speed)
                self._last_tick = tick
                await self._ingest_until(self._position)
        for status in self.streams.values():
            status.state = "done"
            self.analysis.end_stream(status.stream_id)
        self.first_data.set()

    async def _ingest_until(self, t: float) -> None:
        records = self._records
        i = self._next
        sliced = 0
        while i < len(records) and records[i][0] <= t:
            _, _, sid, rec = records[i]
            self.ingest(sid, (rec,))
            i += 1
            sliced += 1
            if sliced >= INGEST_SLICE:
                self._next = i
                sliced = 0
                await asyncio.sleep(0)
        self._next = i


def _replay_name(recordings: list[LoadedRecording]) -> str:
    if not recordings:
        return "nothing"
    parents = {r.path.parent for r in recordings}
    return str(next(iter(parents))) if len(recordings) > 1 and len(parents) == 1 else str(recordings[0].path)
