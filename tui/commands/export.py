"""``perfmon export``: a live job's numbers for Prometheus, or recordings as a Chrome/Perfetto trace.

    perfmon export --prometheus [HOST:]PORT [JOB] [--hosts ...]   serve /metrics while the job runs
    perfmon export --trace OUT.json [--steps A:B] REC...           one track per rank, steps and events
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from tui.errors import UserError

if TYPE_CHECKING:
    from tui.export.trace import StepRange


def main(args: Any) -> int:
    if args.prometheus:
        if args.steps is not None:
            raise UserError("--steps A:B goes with --trace (the step slices of a trace)")
        return _prometheus(args)
    return _trace(args)


def _prometheus(args: Any) -> int:
    from perfmon_analysis.analysis import Analysis
    from tui.export import prometheus
    from tui.stream import discovery
    from tui.stream.connect import remote_feed
    from tui.stream.feed import LiveFeed

    host, port = _listen_address(args.prometheus)
    target = args.targets[0] if args.targets else None
    args.target = target
    feed = remote_feed(args)
    if feed is None:
        endpoints = discovery.resolve_live(target)
        feed = LiveFeed(Analysis(), endpoints[0].job, endpoints)
    print(f"perfmon export: serving {feed.description} on http://{host or '0.0.0.0'}:{port}/metrics "
          "until the job ends", file=sys.stderr)
    try:
        prometheus.serve(feed, host, port)
    except OSError as exc:
        raise UserError(f"cannot listen on {args.prometheus}: {exc.strerror or exc}") from None
    print("perfmon export: the job ended", file=sys.stderr)
    return 0


def _listen_address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"--prometheus {text}: expected [HOST:]PORT, PORT 1..65535")
    return host.strip("[]"), int(port)


def _trace(args: Any) -> int:
    from tui.export.trace import write_trace
    from tui.stream.sources import load_recordings

    if not args.targets:
        raise UserError("--trace OUT.json needs the recordings to convert (files or directories)")
    chosen = _step_range(args.steps) if args.steps is not None else None
    loaded = [rec for target in args.targets for rec in load_recordings(target)]
    for rec in loaded:
        if rec.problem:
            print(f"perfmon export: {rec.problem}", file=sys.stderr)
    document, size = write_trace(loaded, args.trace, chosen)
    meta = document["otherData"]
    sliced = (f"step slices for {meta['perfmon_sliced_steps']} of {meta['perfmon_steps']} steps, steps "
              f"{meta['perfmon_step_slices']} ({meta['perfmon_step_slices_chosen_by']})"
              if meta["perfmon_step_slices"] is not None else meta["perfmon_step_slices_chosen_by"])
    print(f"perfmon export: {len(document['traceEvents'])} events, {size / 1e6:.1f} MB in {args.trace}; {sliced}",
          file=sys.stderr)
    return 0


def _step_range(text: str) -> StepRange:
    """``--steps A:B``: step numbers A to B-1, either end left open."""
    from tui.export.trace import StepRange

    first, colon, stop = text.partition(":")
    try:
        if not colon or not (first or stop):
            raise ValueError
        chosen = StepRange(int(first) if first else None, int(stop) if stop else None)
    except ValueError:
        chosen = None
    if chosen is None or (chosen.first or 0) < 0 or (chosen.stop is not None and chosen.stop <= (chosen.first or 0)):
        raise UserError(f"--steps {text}: expected A:B, step numbers 0 <= A < B (B excluded; A: or :B leave an "
                        "end open)")
    return chosen
