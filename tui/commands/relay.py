"""``perfmon relay --stdio JOB``: this node's ranks of a job as one stream on stdout, for a viewer
on another machine that started it through SSH (or any ``--via`` transport).

Started on demand by the viewer, no daemon, no root: it follows every local rank of the job with
the viewer's own reader (``tui.stream.feed.LiveFeed``, which also finds ranks that start or restart
later), and writes the relay's hello and then each record, tagged with ``src`` (the rank's socket
name, so the viewer keeps the streams apart), as wire frames. It exits when its viewer goes away
(stdin closes, or stdout breaks). A node without the job, or a bad argument, is one line on stderr
and a non-zero exit, which the viewer shows beside that host.

The viewer may write ``request`` records on stdin, each naming a rank by its ``src``: the relay
asks that rank's probe on this node (``tui.stream.requests.ask``, keeping the viewer's request id)
and writes the ``answer`` back, tagged with the same ``src``; the result record then comes with the
rank's stream like any other.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, BinaryIO

from probe import paths, wire
from tui.errors import UserError
from tui.model.runmodel import RunModel
from tui.stream import discovery

FLUSH_S = 0.05
GONE_S = 3.0        # the job's ranks on this node all ended this long ago: the relay ends too
REQUEST_S = 30.0    # for a rank to answer a forwarded request


class StdoutRelay:
    """Frames for the viewer, written in one go per tick (a relay with 64 ranks writes often)."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.encoder = wire.Encoder()
        self.pending = bytearray()
        self.broken = False

    def send(self, record: dict[str, Any]) -> None:
        self.pending += self.encoder.frame(record)

    def forward(self, stream_id: str, record: dict[str, Any]) -> None:
        self.send({**record, "src": Path(stream_id).name.removesuffix(paths.SOCKET_SUFFIX)})

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


async def serve(job: str, out: StdoutRelay, stdin_fd: int | None) -> None:
    """Follow the job's local ranks until the viewer goes away."""
    from tui.stream.feed import LiveFeed

    endpoints = discovery.resolve_live(job)
    feed = LiveFeed(RunModel(), endpoints[0].job, endpoints, rescan=True)
    feed.tap = out.forward
    out.send(hello(endpoints[0].job))
    task = asyncio.ensure_future(feed.run())
    gone = asyncio.get_running_loop().create_future()
    if stdin_fd is not None:
        try:
            asyncio.get_running_loop().add_reader(stdin_fd, _on_stdin, stdin_fd, gone,
                                                  wire.FrameDecoder(wire.VIEWER_MAX_FRAME), out)
        except (OSError, ValueError):   # a file (</dev/null) cannot be watched: a broken stdout ends us then
            stdin_fd = None
    ended_since: float | None = None
    try:
        while not gone.done() and not out.broken:
            out.flush()
            await asyncio.sleep(FLUSH_S)
            if feed.ended:      # every local rank is gone; wait a little for restarted ones
                ended_since = ended_since or time.monotonic()
                if time.monotonic() - ended_since > GONE_S:
                    break
            else:
                ended_since = None
    finally:
        if stdin_fd is not None:
            asyncio.get_running_loop().remove_reader(stdin_fd)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        out.flush()


def _on_stdin(fd: int, gone: asyncio.Future, decoder: wire.FrameDecoder, out: StdoutRelay) -> None:
    """The viewer's requests; EOF means it went away (a frame it cannot send right ends it too)."""
    try:
        data = os.read(fd, 4096)
    except OSError:
        data = b""
    try:
        records = list(decoder.feed(data)) if data else None
    except wire.ProtocolError:
        records = None
    if records is None:
        if not gone.done():
            gone.set_result(None)
        return
    for rec in records:
        if rec["k"] == "request":
            asyncio.ensure_future(_forward(rec, out))


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
    """``perfmon relay --stdio JOB``."""
    if not args.stdio:
        raise UserError("relay: only --stdio is supported (start it through ssh: perfmon attach --hosts ...)")
    out = StdoutRelay(sys.stdout.buffer)
    stdin_fd = sys.stdin.fileno() if not sys.stdin.isatty() else None
    try:
        asyncio.run(serve(args.job, out, stdin_fd))
    except KeyboardInterrupt:
        pass
    return 0
