"""``perfmon record TARGET -o DIR``: save a live job's streams without a TUI.

Each rank's stream goes to its own file in the same format the probe writes
with ``PERFMON_RECORD``, so ``perfmon report`` and ``perfmon attach`` read
either. Stops when every rank says ``bye`` (or disconnects), after
``--seconds``, or on Ctrl-C; the files stay readable in every case.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from perfmon_analysis.analysis import Analysis
from probe import paths, wire
from probe.recording import RecordingWriter
from tui.errors import UserError
from tui.stream.connect import remote_feed
from tui.stream.discovery import Endpoint, resolve_live
from tui.stream.feed import Feed, LiveFeed, follow
from tui.stream.sources import StreamError


def record(endpoints: list[Endpoint], out_dir: Path, seconds: float | None = None,
           feed: Feed | None = None) -> dict[str, int]:
    """Record every stream into ``out_dir`` (a job across nodes: one directory per host, from the
    ``RelayFeed``'s ``host/socket-name`` stream ids); returns records written per output file."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create {out_dir}: {exc.strerror or exc}") from None
    writers: dict[str, RecordingWriter] = {}
    counts: dict[str, int] = {}
    encoder = wire.Encoder()

    def write(source: str, rec: dict[str, Any]) -> None:
        writer = writers.get(source)
        if writer is None:
            stem = Path(source).name.removesuffix(paths.SOCKET_SUFFIX)
            where = out_dir / source.split("/", 1)[0] if remote else out_dir
            try:
                where.mkdir(exist_ok=True)
                writer = writers[source] = RecordingWriter(where / f"{stem}{paths.RECORD_SUFFIX}")
            except OSError as exc:
                raise UserError(f"cannot write to {out_dir}: {exc.strerror or exc}") from None
        writer.write(RecordingWriter.wrap(encoder.frame(rec)))
        counts[str(writer.path)] = counts.get(str(writer.path), 0) + 1

    remote = feed is not None
    feed = feed or LiveFeed(Analysis(), endpoints[0].job if endpoints else None, endpoints, rescan=False)
    feed.tap = write
    try:
        follow(feed, seconds)
    except StreamError as exc:
        raise UserError(str(exc)) from None
    except KeyboardInterrupt:
        pass
    finally:
        for writer in writers.values():
            writer.close()
    return counts


def main(args) -> int:
    remote = remote_feed(args)
    out = Path(args.output)
    if remote is not None:
        remote.follow(None)          # a recording holds every record of every rank, not summaries
        print(f"recording {args.target} on {len(remote.hosts)} host(s) to {out} (Ctrl-C to stop)", file=sys.stderr)
        counts = record([], out, args.seconds, feed=remote)
        for problem in remote.analysis.problems:
            print(f"perfmon record: {problem}", file=sys.stderr)
        for path, n in sorted(counts.items()):
            print(f"{path}: {n} records")
        return 0
    endpoints = resolve_live(args.target)
    print(f"recording {len(endpoints)} rank(s) of {endpoints[0].job} to {out} (Ctrl-C to stop)", file=sys.stderr)
    counts = record(endpoints, out, args.seconds)
    for path, n in sorted(counts.items()):
        print(f"{path}: {n} records")
    return 0
