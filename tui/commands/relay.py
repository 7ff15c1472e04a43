"""``perfmon relay --stdio JOB``: this node's ranks of a job as one stream on stdout, for a viewer
on another machine that started it through SSH (or any ``--via`` transport).

Started on demand by the viewer, no daemon, no root: it follows every local rank of the job with
the viewer's own reader (``tui.stream.feed.LiveFeed``, which also finds ranks that start or restart
later), and writes the relay's hello and then each record, tagged with ``src`` (the rank's socket
name, so the viewer keeps the streams apart), as wire frames. It exits when its viewer goes away
(stdin closes, or stdout breaks). A node without the job, or a bad argument, is one line on stderr
and a non-zero exit, which the viewer shows beside that host.
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
            asyncio.get_running_loop().add_reader(stdin_fd, _on_stdin, stdin_fd, gone)
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


def _on_stdin(fd: int, gone: asyncio.Future) -> None:
    """The viewer writes nothing; readable stdin means it closed (EOF)."""
    try:
        data = os.read(fd, 4096)
    except OSError:
        data = b""
    if not data and not gone.done():
        gone.set_result(None)


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
