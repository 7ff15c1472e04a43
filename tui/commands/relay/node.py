"""``perfmon relay --stdio JOB``: this node's ranks of a job as one stream on stdout, for a viewer
on another machine that started it through SSH (or any ``--via`` transport). ``--tcp [HOST:]PORT``
serves the same stream to one viewer that connects with the token instead (``attach --hosts ...
--relay-port PORT``), for clusters where the viewer cannot start a command on the nodes.

Started on demand by the viewer, no daemon, no root: it follows every local rank of the job with
the viewer's own reader (``tui.stream.feed.LiveFeed``, which also finds ranks that start or restart
later) into its own ``Analysis``, and writes the relay's hello and then records tagged with ``src``
(the rank's socket name, so the viewer keeps the streams apart), as wire frames. It exits when
its viewer goes away (stdin closes, or stdout breaks). A node without the job, or a bad argument,
is one line on stderr and a non-zero exit, which the viewer shows beside that host.

What it sends depends on the viewer's hello on stdin (wire 1.2, ``probe.wire``): for a 1.2 viewer,
each rank's window ``summary`` once a second, and step, memory and comm records only for
the ranks the viewer ``subscribe``s to (a newly subscribed rank's buffered records first); every
other kind (hello, samples, events, stalls, results, bye) for every rank. That keeps the stream
of a node of 64 ranks at a few hundred records a second whatever their step rate. A viewer that
sends no hello within ``HELLO_WAIT_S`` (perfmon 1.1) gets every record of every rank.

The viewer may also write ``request`` records, each naming a rank by its ``src``: the relay asks
that rank's probe on this node (``tui.stream.requests.ask``, keeping the viewer's request id) and
writes the ``answer`` back, tagged with the same ``src``; the result comes with the rank's stream.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import os
import secrets
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from probe import paths, wire
from tui.errors import UserError
from tui.stream import discovery

if TYPE_CHECKING:
    from perfmon_analysis.analysis import Analysis

FLUSH_S = 0.05
SUMMARY_S = 1.0     # a rank's summary at most this often (wire 1.2: <= 4 Hz; 1 Hz keeps a 1,024-rank viewer light)
HELLO_WAIT_S = 1.0  # for the viewer's hello on stdin; none: a 1.1 viewer, sent everything
GONE_S = 3.0        # the job's ranks on this node all ended this long ago: the relay ends too
REQUEST_S = 30.0    # for a rank to answer a forwarded request
AUTH_S = 5.0        # for a TCP viewer's hello with the token
TOKEN_SUFFIX = ".relay-token"
FULL_ONLY = frozenset({"step", "memory", "comm"})   # kinds a summary stands for


@functools.lru_cache(maxsize=4096)
def src_of(stream_id: str) -> str:
    """A rank's name on the node stream: its socket's name without the suffix."""
    return Path(stream_id).name.removesuffix(paths.SOCKET_SUFFIX)


class StdoutRelay:
    """Frames for the viewer, written in one go per tick (a relay with 64 ranks writes often).

    ``summaries``: the viewer reads wire 1.2, so ranks outside ``subscribed`` (None: all) are sent
    as summaries rather than step by step."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.encoder = wire.Encoder()
        self.pending = bytearray()
        self.broken = False
        self.summaries = False
        self.subscribed: set[str] | None = set()
        self.window: tuple[int, float] | None = None
        self._sent: dict[str, int] = {}      # src -> model version of its last summary
        self._warming: set[str] = set()      # srcs whose last summary had no window yet

    def send(self, record: dict[str, Any]) -> None:
        self.pending += self.encoder.frame(record)

    def forward(self, stream_id: str, record: dict[str, Any]) -> None:
        src = src_of(stream_id)
        if self.summaries and record["k"] in FULL_ONLY and not self.follows(src):
            return
        self.send({**record, "src": src})

    def follows(self, src: str) -> bool:
        return self.subscribed is None or src in self.subscribed

    def subscribe(self, srcs: list[Any], analysis: Analysis, streams: list[str]) -> None:
        """A viewer's ``subscribe``: ranks newly followed in full get their buffered records now."""
        wanted = None if "*" in srcs else {s for s in srcs if isinstance(s, str)}
        for sid in streams:
            src = src_of(sid)
            if (wanted is None or src in wanted) and not self.follows(src):
                for rec in analysis.buffered(sid):
                    self.send({**rec, "src": src})
            self._sent.pop(src, None)      # its next summary, when unsubscribed again, is sent at once
        self.subscribed = wanted

    def summarize(self, analysis: Analysis, streams: list[str], warming_only: bool = False) -> None:
        """A summary of each rank not followed in full that changed since its last one.

        ``warming_only``: only the ranks not summarised yet or still warming up. The relay asks for
        those on every flush, so a rank's first summary with a step time reaches the viewer as soon
        as the rank has one, not up to a second later (the first full screen waits for it)."""
        now = time.time()
        for sid in streams:
            src = src_of(sid)
            if self.follows(src) or (warming_only and src in self._sent and src not in self._warming):
                continue
            got = analysis.summary(sid, now, self._sent.get(src, -1))
            if got is not None:
                self._sent[src] = got[0]
                self.send({**got[1], "src": src})
                if got[1]["stats"].get("warming_up", True):
                    self._warming.add(src)
                else:
                    self._warming.discard(src)

    def flush(self) -> None:
        if not self.pending or self.broken:
            return
        try:
            self.out.write(self.pending)
            self.out.flush()
        except (BrokenPipeError, OSError):
            self.broken = True
        self.pending.clear()


def hello(job: str) -> dict[str, Any]:
    return {"k": "hello", "t": time.time(), "proto": list(wire.PROTO), "role": "relay", "job": job,
            "host": socket.gethostname(), "pid": os.getpid()}


class ViewerInput:
    """What the viewer writes on the relay's stdin: its hello, subscriptions and requests."""

    def __init__(self, out: StdoutRelay) -> None:
        self.out = out
        self.decoder = wire.FrameDecoder(wire.VIEWER_MAX_FRAME)
        loop = asyncio.get_running_loop()
        self.greeted = loop.create_future()      # the viewer's hello came (or it never will)
        self.gone = loop.create_future()         # stdin closed: the viewer went away
        self.analysis: Analysis | None = None
        self.streams: list[str] = []
        self._early: list[dict[str, Any]] = []   # a subscription before the ranks are followed

    def on_readable(self, fd: int) -> None:
        try:
            data = os.read(fd, 1 << 16)
        except OSError:
            data = b""
        try:
            records = list(self.decoder.feed(data)) if data else None
        except wire.ProtocolError:
            records = None
        if records is None:
            for fut in (self.gone, self.greeted):
                if not fut.done():
                    fut.set_result(None)
            return
        for rec in records:
            self.take(rec)

    def take(self, rec: dict[str, Any]) -> None:
        kind = rec["k"]
        if kind == "hello" and not self.greeted.done():
            proto = rec.get("proto")
            minor = proto[1] if isinstance(proto, (list, tuple)) and len(proto) > 1 else 0
            self.out.summaries = isinstance(minor, int) and minor >= wire.KIND_MINOR["summary"]
            self.greeted.set_result(None)
        elif kind == "subscribe":
            window = rec.get("window")
            if isinstance(window, list) and len(window) == 2 and all(isinstance(x, (int, float)) for x in window):
                self.out.window = (int(window[0]), float(window[1]))
                if self.analysis is not None:
                    self.analysis.set_window(*self.out.window)
            if self.analysis is None:
                self._early = [rec]
            else:
                self.out.subscribe(rec["srcs"], self.analysis, self.streams)
        elif kind == "request":
            asyncio.ensure_future(_forward(rec, self.out))

    def attach(self, analysis: Analysis, streams: list[str]) -> None:
        """The ranks are followed now: apply a subscription that came before."""
        self.analysis, self.streams = analysis, streams
        for rec in self._early:
            self.take(rec)
        self._early = []


async def serve(job: str, out: StdoutRelay, stdin_fd: int | None, greeting: dict[str, Any] | None = None) -> None:
    """Follow the job's local ranks until the viewer goes away (``greeting``: its hello, when the
    TCP listener has read it already)."""
    from perfmon_analysis.analysis import Analysis
    from tui.stream.feed import LiveFeed

    endpoints = discovery.resolve_live(job)
    out.send(hello(endpoints[0].job))
    out.flush()
    loop = asyncio.get_running_loop()
    viewer = ViewerInput(out)
    if greeting is not None:
        viewer.take(greeting)
    if stdin_fd is not None:
        try:
            loop.add_reader(stdin_fd, viewer.on_readable, stdin_fd)
        except (OSError, ValueError):   # a file (</dev/null) cannot be watched: a broken stdout ends us then
            stdin_fd = None
    if stdin_fd is not None:
        await asyncio.wait([viewer.greeted], timeout=HELLO_WAIT_S)
    analysis = Analysis() if out.window is None else Analysis(window_steps=out.window[0],
                                                               window_seconds=out.window[1])
    feed = LiveFeed(analysis, endpoints[0].job, endpoints, rescan=True)
    feed.tap = out.forward
    streams = list(feed.streams)             # the feed's own dict's keys, kept current below
    viewer.attach(analysis, streams)
    task = asyncio.ensure_future(feed.run())
    ended_since: float | None = None
    next_summary = 0.0
    try:
        while not viewer.gone.done() and not out.broken:
            if out.summaries:
                streams[:] = list(feed.streams)
                every = time.monotonic() >= next_summary
                out.summarize(analysis, streams, warming_only=not every)
                if every:
                    next_summary = time.monotonic() + SUMMARY_S
            out.flush()
            await asyncio.sleep(FLUSH_S)
            streams[:] = list(feed.streams)
            if feed.ended:      # every local rank is gone; wait a little for restarted ones
                ended_since = ended_since or time.monotonic()
                if time.monotonic() - ended_since > GONE_S:
                    break
            else:
                ended_since = None
    finally:
        if stdin_fd is not None:
            loop.remove_reader(stdin_fd)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        if out.summaries:
            out.summarize(analysis, list(feed.streams))     # the last word on each rank
        out.flush()


async def _forward(rec: dict[str, Any], out: StdoutRelay) -> None:
    """Ask the rank ``rec["src"]`` names on this node; write its answer (or why not) back."""
    from tui.stream.requests import Target, ask

    src = rec.get("src")
    answer: dict[str, Any] = {"k": "answer", "t": time.time(), "id": rec["id"], "op": rec["op"], "src": src}
    name = paths.parse_name(f"{src}{paths.SOCKET_SUFFIX}") if isinstance(src, str) and "/" not in src else None
    if name is None:
        answer.update(ok=False, reason=f"no rank {src!r} on {socket.gethostname()}")
    else:
        params = {k: v for k, v in rec.items() if k not in ("k", "t", "id", "op", "src")}
        target = Target(path=str(paths.socket_dir() / f"{src}{paths.SOCKET_SUFFIX}"), label=f"rank {name.rank}")
        try:
            await asyncio.to_thread(ask, target, rec["op"], params, REQUEST_S, None, None, rec["id"])
            answer["ok"] = True
        except UserError as exc:
            answer.update(ok=False, reason=str(exc))
    out.send(answer)


def main(args: Any) -> int:
    """``perfmon relay --stdio JOB`` or ``perfmon relay --tcp [HOST:]PORT JOB``."""
    if args.tcp:
        return serve_tcp(args.job, args.tcp)
    if not args.stdio:
        raise UserError("give --stdio (started through ssh: perfmon attach --hosts ...) or --tcp [HOST:]PORT")
    out = StdoutRelay(sys.stdout.buffer)
    stdin_fd = sys.stdin.fileno() if not sys.stdin.isatty() else None
    try:
        asyncio.run(serve(args.job, out, stdin_fd))
    except KeyboardInterrupt:
        pass
    return 0


def serve_tcp(job: str, spec: str) -> int:
    """Listen on ``spec``; serve the first viewer whose hello carries the token, until it goes away.

    The token is ``$PERFMON_TOKEN`` (one secret for every node's relay), else a new one written to
    a 0600 file in the socket directory for the time the relay waits."""
    discovery.resolve_live(job)                 # no such job here: one line, before listening
    host, _, port_text = spec.rpartition(":")
    if not port_text.isdigit() or int(port_text) > 65535:
        raise UserError(f"--tcp {spec!r}: expected [HOST:]PORT (PORT 0: any free port)")
    addr = (host.strip("[]") or "127.0.0.1", int(port_text))
    try:
        listener = socket.create_server(addr)
    except OSError as exc:
        raise UserError(f"cannot listen on {addr[0]}:{addr[1]}: {exc.strerror or exc}") from None
    port = listener.getsockname()[1]
    token = os.environ.get("PERFMON_TOKEN") or secrets.token_hex(16)
    token_file = None if os.environ.get("PERFMON_TOKEN") else _write_token(job, port, token)
    where = f"in {token_file}" if token_file else "from PERFMON_TOKEN"
    print(f"perfmon relay: {job} on {addr[0]}:{port}, token {where}", file=sys.stderr, flush=True)
    try:
        conn, greeting = _accept(listener, token)
    except KeyboardInterrupt:
        return 0
    finally:
        listener.close()
        if token_file is not None:
            token_file.unlink(missing_ok=True)
    try:
        asyncio.run(serve(job, StdoutRelay(conn.makefile("wb")), conn.fileno(), greeting))
    except KeyboardInterrupt:
        pass
    finally:
        conn.close()
    return 0


def _write_token(job: str, port: int, token: str) -> Path:
    path = paths.socket_dir() / f"relay.{paths.safe_job(job)}.{port}{TOKEN_SUFFIX}"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError as exc:
        raise UserError(f"cannot write the relay's token to {path}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return path


def _accept(listener: socket.socket, token: str) -> tuple[socket.socket, dict[str, Any]]:
    """The first connection whose hello has the token and our major version; others get closed
    with one line on stderr."""
    while True:
        conn, peer = listener.accept()
        conn.settimeout(AUTH_S)
        decoder = wire.FrameDecoder(wire.VIEWER_MAX_FRAME)
        records: list[dict[str, Any]] = []
        problem = None
        try:
            while not records:
                data = conn.recv(4096)
                if not data:
                    raise ConnectionError("closed before its hello")
                records = list(decoder.feed(data))
            hello_rec = records[0]
            if hello_rec["k"] != "hello" or not hmac.compare_digest(str(hello_rec.get("token", "")), token):
                problem = "wrong token"
            else:
                wire.check_compatible(hello_rec.get("proto"), we_are="probe")
        except (OSError, ConnectionError, wire.ProtocolError) as exc:
            problem = str(exc).replace("probe", "relay") or type(exc).__name__
        if problem is None:
            conn.settimeout(None)
            return conn, hello_rec
        print(f"perfmon relay: refused a viewer from {peer[0]}: {problem}", file=sys.stderr, flush=True)
        conn.close()
