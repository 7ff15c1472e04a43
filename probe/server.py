"""The sender thread: turns queued items into frames, serves viewers, writes the recording.

Everything that can block or cost more than a deque append happens here, never on the training
thread. Each viewer has its own bounded outbound queue; a slow viewer loses its oldest frames
(counted, then announced with a ``drops`` record) and one unwritable for ``STALL_SECONDS`` is dropped.

Frames travel in batches: the frames of one tick are joined once into chunks of at most
``CHUNK_BYTES`` and those ``bytes`` are shared by every viewer's queue; the backfill keeps step
frames as chunks too. A viewer's queue or a connect's backfill is then a few large allocations
instead of thousands of small ones, so the sender holds the GIL for less and the memory of a queue
goes back to the allocator whole when the viewer leaves (a storm of stalled viewers each holding
thousands of small frames would leave the job's RSS tens of MB higher). Chunks, not whole ticks: a
queue drops at the grain of what it holds, never the batch in flight, so a stalled viewer loses the
oldest steps, not the newest.
"""

from __future__ import annotations

import bisect
import collections
import hmac
import itertools
import os
import selectors
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from probe import requests, wire
from probe.recording import RecordingWriter

MAX_VIEWERS = 8
VIEWER_QUEUE_BYTES = 4 << 20
STALL_SECONDS = 10.0
HELLO_DEADLINE = 2.0          # TCP viewers must authenticate within this
BACKFILL_STEPS = 2000          # at least this many recent steps, at most one chunk's more
BACKFILL_EVENTS = 100
TICK = 0.05                   # sender wake-up period: latency of the live stream
MAX_ITEMS_PER_TICK = 20_000   # keeps one tick bounded even after a burst
CHUNK_BYTES = 256 << 10       # frames are joined into batches of at most this (one larger frame alone)

_PEERCRED = struct.Struct("3i")


class Viewer:
    """One attached viewer connection and its outbound queue."""

    __slots__ = ("sock", "out", "out_frames", "out_bytes", "head_sent", "dropped", "dropped_total",
                 "last_progress", "decoder", "authed", "accepted", "tcp", "minor", "requests")

    def __init__(self, sock: socket.socket, *, tcp: bool) -> None:
        self.sock = sock
        self.out: collections.deque[bytes] = collections.deque()          # batches of whole frames
        self.out_frames: collections.deque[tuple[int, int]] = collections.deque()   # (frames, drops announced)
        self.out_bytes = 0
        self.head_sent = 0            # bytes of out[0] already sent
        self.dropped = 0              # frames dropped since the last drops record
        self.dropped_total = 0
        self.last_progress = time.monotonic()
        self.decoder = wire.FrameDecoder(max_frame=wire.VIEWER_MAX_FRAME)
        self.tcp = tcp
        self.authed = not tcp
        self.accepted = time.monotonic()
        self.minor = 0                # protocol minor from the viewer's hello: which kinds it reads
        self.requests: collections.deque[float] = collections.deque(maxlen=requests.RATE)   # when its last ones came

    def enqueue(self, batch: bytes, frames: int = 1, announces: int = 0) -> None:
        """Queue a batch of ``frames`` whole frames, dropping the oldest batches (never the one in
        flight) to fit. Every frame of a dropped batch is counted, and a dropped ``drops`` record
        (``announces`` > 0) hands its count on to the next one, so no loss goes unannounced."""
        if not self.out:
            self.last_progress = time.monotonic()
        self.out.append(batch)
        self.out_frames.append((frames, announces))
        self.out_bytes += len(batch)
        while self.out_bytes > VIEWER_QUEUE_BYTES and len(self.out) > 1:
            victim_index = 1 if self.head_sent else 0
            victim = self.out[victim_index]
            lost, announced = self.out_frames[victim_index]
            del self.out[victim_index]
            del self.out_frames[victim_index]
            self.out_bytes -= len(victim)
            self.dropped += lost + announced
            self.dropped_total += lost

    def sent_head(self) -> None:
        """The batch at the head went out whole."""
        head = self.out.popleft()
        self.out_frames.popleft()
        self.out_bytes -= len(head)
        self.head_sent = 0


class Sender(threading.Thread):
    """Background thread owning every socket and file of the probe."""

    def __init__(self, *, queue: collections.deque[Any], build: Callable[[Any], dict | None], hello: dict,
                 listener: socket.socket | None, tcp_listener: socket.socket | None = None,
                 tcp_token: str | None = None, recorder: RecordingWriter | None = None,
                 on_error: Callable[[str, BaseException], None] | None = None,
                 on_request: Callable[[dict], str | None] | None = None) -> None:
        super().__init__(name="perfmon-sender", daemon=True)
        self.queue = queue
        self.build = build
        self.encoder = wire.Encoder()
        self.hello_frame = self.encoder.frame(hello)
        self.listener = listener
        self.tcp_listener = tcp_listener
        self.tcp_token = tcp_token
        self.recorder = recorder
        self.on_error = on_error or (lambda where, exc: None)
        self.on_request = on_request
        self.taps: list[Callable[[dict], None]] = []     # in-process readers of every record (add_tap)
        self.viewers: dict[int, Viewer] = {}
        self.backfill_steps: collections.deque[tuple[bytes, int]] = collections.deque()  # (chunk, steps)
        self.backfill_count = 0
        self.backfill_events: collections.deque[bytes] = collections.deque(maxlen=BACKFILL_EVENTS)
        self.latest: dict[str, bytes] = {}
        self.stalled: tuple[bytes, int] | None = None   # the newest stall frame while stuck, and its minor
        self.results: dict[str, tuple[bytes, int]] = {}   # latest profile/capture/layout: to each viewer at hello
        self._backfill_batch: list[tuple[bytes, int]] | None = None   # joined once per tick, shared by its connects
        self.stop_event = threading.Event()
        self.stopped = threading.Event()
        self.frames_out = 0
        self.bytes_sent = 0            # to all viewers since start (probe.cost)
        self.recorder_failed = False
        self.last_step = -1   # steps are numbered from 0
        self.buffer_lost = 0
        self.sel = selectors.DefaultSelector()
        for lst in (listener, tcp_listener):
            if lst is not None:
                lst.setblocking(False)
                self.sel.register(lst, selectors.EVENT_READ, None)
        if recorder is not None:
            self._record([self.hello_frame])

    # -- thread body ------------------------------------------------------------------------
    def run(self) -> None:
        try:
            while not self.stop_event.is_set():
                self._tick(TICK)
            self._finish()
        except BaseException as exc:  # the probe must never take the process down
            self.on_error("sender", exc)
        finally:
            self.stopped.set()

    def _tick(self, timeout: float) -> None:
        for key, mask in self.sel.select(timeout):
            if key.data is None:
                self._accept(key.fileobj)  # type: ignore[arg-type]
            else:
                viewer: Viewer = key.data
                if mask & selectors.EVENT_READ:
                    self._read(viewer)
                if mask & selectors.EVENT_WRITE and viewer.sock.fileno() in self.viewers:
                    self._flush(viewer)
        self._drain()
        now = time.monotonic()
        for viewer in list(self.viewers.values()):
            if viewer.out:
                self._flush(viewer)
            if viewer.out and now - viewer.last_progress > STALL_SECONDS:
                self._close(viewer)
            elif not viewer.authed and now - viewer.accepted > HELLO_DEADLINE:
                self._close(viewer)

    def _finish(self) -> None:
        """Final drain, ``bye`` to everyone, a bounded attempt to flush, then close all."""
        self._drain()
        bye = self.encoder.frame({"k": "bye", "t": time.time()})
        self._fan_out([bye])
        self._record([bye])
        deadline = time.monotonic() + 1.0
        while any(v.out for v in self.viewers.values()) and time.monotonic() < deadline:
            for viewer in list(self.viewers.values()):
                self._flush(viewer)
            time.sleep(0.01)
        for viewer in list(self.viewers.values()):
            self._close(viewer)
        self.close_listeners()
        if self.recorder is not None:
            try:
                self.recorder.close()
            except OSError:
                pass

    # -- records ----------------------------------------------------------------------------
    def _drain(self) -> None:
        frames: list[bytes] = []
        steps: list[bytes] = []
        versioned: list[tuple[bytes, int]] = []   # 1.x kinds, only for viewers that read them
        q = self.queue
        for _ in range(MAX_ITEMS_PER_TICK):
            try:
                item = q.popleft()
            except IndexError:
                break
            try:
                rec = self.build(item)
                if rec is None:
                    continue
                frame = self.encoder.frame(rec)
            except Exception as exc:
                self.on_error("encode", exc)
                continue
            if self.taps:
                self._tap(rec)
            kind = rec["k"]
            minor = wire.KIND_MINOR.get(kind, 0)
            if minor:
                versioned.append((frame, minor))
                self.stalled = (frame, minor) if kind == "stall" else None if kind == "resumed" else self.stalled
                if kind in ("profile", "capture", "layout"):
                    self.results[kind] = (frame, minor)
                continue
            if kind == "step":
                self._check_gap(rec["step"], frames)
                steps.append(frame)
            elif kind in ("event", "drops"):
                self.backfill_events.append(frame)
            elif kind in ("comm", "memory", "sample"):
                self.latest[kind] = frame
            frames.append(frame)
        if steps:
            self._keep_steps(steps)
        if frames:
            self._backfill_batch = None
            self.frames_out += len(frames)
            self._fan_out(frames)
            self._record(frames)
        for frame, minor in versioned:
            for viewer in self.viewers.values():
                if viewer.authed and viewer.minor >= minor:
                    viewer.enqueue(frame)
            self._record([frame])

    def add_tap(self, tap: Callable[[dict], None]) -> None:
        """Any thread: ``tap`` gets the hello now, then every record (``_tap``, on this thread)."""
        try:
            tap(wire.decode_body(self.hello_frame[wire.HEADER.size:]))
        except Exception as exc:
            self.on_error("tap", exc)
            return
        self.taps = self.taps + [tap]

    def _tap(self, rec: dict) -> None:
        for tap in self.taps:
            try:
                tap(rec)
            except Exception as exc:           # a broken reader must not cost the stream
                self.taps = [t for t in self.taps if t is not tap]
                self.on_error("tap", exc)

    def _keep_steps(self, steps: list[bytes]) -> None:
        """Backfill: the newest BACKFILL_STEPS steps at least, kept as chunks."""
        self.backfill_steps.extend(chunks(steps))
        self.backfill_count += len(steps)
        while self.backfill_count - self.backfill_steps[0][1] >= BACKFILL_STEPS:
            self.backfill_count -= self.backfill_steps.popleft()[1]

    def _check_gap(self, step: int, frames: list[bytes]) -> None:
        """Steps are numbered; a gap means the hot-path buffer overflowed before we drained it."""
        lost = step - self.last_step - 1
        self.last_step = step
        if lost > 0:
            self.buffer_lost += lost
            frames.append(self.encoder.frame({
                "k": "drops", "t": time.time(), "count": lost, "total": self.buffer_lost,
                "reason": "probe buffer full: the sender fell behind the training loop"}))

    def _fan_out(self, frames: list[bytes]) -> None:
        batches = chunks(frames)
        for viewer in self.viewers.values():
            if not viewer.authed:
                continue
            for batch, count in batches:
                viewer.enqueue(batch, count)
            if viewer.dropped:
                count, viewer.dropped = viewer.dropped, 0
                viewer.enqueue(self.encoder.frame({
                    "k": "drops", "t": time.time(), "count": count, "total": viewer.dropped_total,
                    "reason": "viewer too slow: oldest records dropped from its 4 MiB queue"}), 1, announces=count)

    def _record(self, frames: Iterable[bytes]) -> None:
        if self.recorder is None or self.recorder_failed:
            return
        try:
            self.recorder.write(b"".join(RecordingWriter.wrap(f) for f in frames))
        except OSError as exc:
            self.recorder_failed = True
            self.on_error("recorder", exc)

    # -- viewers ----------------------------------------------------------------------------
    def _accept(self, listener: socket.socket) -> None:
        try:
            sock, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self.on_error("accept", exc)
            return
        tcp = listener is self.tcp_listener
        if not tcp and not _peer_is_us(sock):
            sock.close()
            return
        sock.setblocking(False)
        if len(self.viewers) >= MAX_VIEWERS:
            try:
                sock.send(self.hello_frame + self.encoder.frame({
                    "k": "event", "t": time.time(), "name": "error",
                    "message": f"too many viewers ({MAX_VIEWERS} already attached)"}), _MSG_FLAGS)
            except OSError:
                pass
            sock.close()
            return
        viewer = Viewer(sock, tcp=tcp)
        self.viewers[sock.fileno()] = viewer
        self.sel.register(sock, selectors.EVENT_READ, viewer)
        if viewer.authed:
            self._backfill(viewer)

    def _backfill(self, viewer: Viewer) -> None:
        """hello, recent events, recent steps, the latest sample/memory/comm: one batch, joined
        once per tick however many viewers connect in it (a connect storm costs a send each)."""
        if self._backfill_batch is None:
            self._backfill_batch = [*chunks([self.hello_frame, *self.backfill_events]), *self.backfill_steps,
                                    *chunks(list(self.latest.values()))]
        for batch, count in self._backfill_batch:
            viewer.enqueue(batch, count)
        self._flush(viewer)

    def _read(self, viewer: Viewer) -> None:
        try:
            data = viewer.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(viewer)
            return
        if not data:
            self._close(viewer)
            return
        try:
            for rec in viewer.decoder.feed(data):
                if rec["k"] == "request":
                    if viewer.authed and viewer.minor >= wire.KIND_MINOR["request"]:
                        self._request(viewer, rec)
                    continue
                if rec["k"] != "hello":
                    continue
                wire.check_compatible(rec.get("proto"), we_are="probe")
                viewer.minor = _minor(rec.get("proto"))
                if not viewer.authed:
                    token = rec.get("token")
                    if self.tcp_token and isinstance(token, str) and \
                            hmac.compare_digest(token.encode(), self.tcp_token.encode()):
                        viewer.authed = True
                        self._backfill(viewer)
                    else:
                        self._close(viewer)
                        return
                for latest in (*self.results.values(), self.stalled):   # a viewer arriving now sees them at once
                    if latest is not None and viewer.minor >= latest[1]:
                        viewer.enqueue(latest[0])
        except wire.ProtocolMismatch as exc:
            _say(str(exc))
            self._close(viewer)
        except wire.ProtocolError:
            self._close(viewer)

    def _request(self, viewer: Viewer, rec: dict) -> None:
        """Answer a viewer's request: accepted, or refused with the reason (probe.requests)."""
        now = time.monotonic()
        if len(viewer.requests) == requests.RATE and now - viewer.requests[0] < requests.RATE_SECONDS:
            reason: str | None = f"too many requests (at most {requests.RATE} in {requests.RATE_SECONDS:.0f} s)"
        else:
            viewer.requests.append(now)
            try:
                reason = self.on_request(rec) if self.on_request is not None else "this probe takes no requests"
            except Exception as exc:
                self.on_error("request", exc)
                reason = f"the request failed in the probe: {exc!r}"[:200]
        answer = {"k": "answer", "t": time.time(), "id": rec.get("id"), "op": rec.get("op"), "ok": reason is None}
        if reason is not None:
            answer["reason"] = reason
        viewer.enqueue(self.encoder.frame(answer))
        self._flush(viewer)

    def _flush(self, viewer: Viewer) -> None:
        sock = viewer.sock
        while viewer.out:
            head = viewer.out[0]
            try:
                n = sock.send(memoryview(head)[viewer.head_sent:], _MSG_FLAGS)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self._close(viewer)
                return
            viewer.last_progress = time.monotonic()
            viewer.head_sent += n
            self.bytes_sent += n
            if viewer.head_sent >= len(head):
                viewer.sent_head()
        self._watch_writable(viewer)

    def _watch_writable(self, viewer: Viewer) -> None:
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if viewer.out else 0)
        try:
            if self.sel.get_key(viewer.sock).events != events:
                self.sel.modify(viewer.sock, events, viewer)
        except (KeyError, ValueError):
            pass

    def _close(self, viewer: Viewer) -> None:
        fd = viewer.sock.fileno()
        if fd in self.viewers:
            del self.viewers[fd]
            try:
                self.sel.unregister(viewer.sock)
            except (KeyError, ValueError):
                pass
        try:
            viewer.sock.close()
        except OSError:
            pass

    def close_listeners(self) -> None:
        """The listeners, then the selector (its epoll fd: a process the probe leaves goes on)."""
        for lst in (self.listener, self.tcp_listener):
            if lst is not None:
                lst.close()
        self.sel.close()

    def abandon(self) -> None:
        """Forked child: close every inherited fd without sending or writing anything."""
        for viewer in list(self.viewers.values()):
            try:
                viewer.sock.close()
            except OSError:
                pass
        self.viewers.clear()
        for lst in (self.listener, self.tcp_listener):
            if lst is not None:
                try:
                    lst.close()
                except OSError:
                    pass
        try:
            self.sel.close()
        except (OSError, RuntimeError):
            pass
        if self.recorder is not None:
            self.recorder.abandon()


_MSG_FLAGS = getattr(socket, "MSG_NOSIGNAL", 0)


def chunks(frames: list[bytes]) -> list[tuple[bytes, int]]:
    """``frames`` joined in order into (batch, frame count) of at most CHUNK_BYTES; a larger frame alone."""
    if len(frames) <= 1:
        return [(frames[0], 1)] if frames else []
    ends = list(itertools.accumulate(map(len, frames)))
    out: list[tuple[bytes, int]] = []
    start, sent = 0, 0
    while start < len(frames):
        stop = bisect.bisect_right(ends, sent + CHUNK_BYTES, lo=start + 1)
        out.append((b"".join(frames[start:stop]), stop - start))
        start, sent = stop, ends[stop - 1]
    return out


def _minor(proto: Any) -> int:
    try:
        return max(0, int(proto[1]))
    except (TypeError, ValueError, IndexError, KeyError):
        return 0


def _peer_is_us(sock: socket.socket) -> bool:
    """SO_PEERCRED: only the same user (or root) may read a job's stream."""
    try:
        _pid, uid, _gid = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    except (OSError, AttributeError):
        return False
    return uid in (os.getuid(), 0)


def _say(message: str) -> None:
    try:
        sys.stderr.write(f"perfmon: {message}\n")
    except (OSError, ValueError):
        pass
