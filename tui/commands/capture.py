"""``perfmon capture TARGET``: torch.profiler over the next N steps of a live job, on demand.

Each rank asked (``--ranks``, default all on this host, or on ``--hosts`` through their relays)
starts the profiler at a step boundary, writes a gzip Chrome trace beside its recording (on its
own host) and answers with a summary (``probe.capture``).
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from perfmon_analysis.capture import capture_reading
from tui.errors import UserError


def main(args: Any) -> int:
    from tui.stream import discovery
    from tui.stream.connect import remote_feed
    from tui.stream.requests import Target, ask

    wanted = _ranks(args.ranks)
    remote = remote_feed(args)
    if remote is not None:
        return _across_hosts(args, remote, wanted)
    endpoints = discovery.resolve_live(args.target)
    chosen = [ep for ep in endpoints if wanted is None or ep.rank in wanted]
    if not chosen:
        raise UserError(f"job {endpoints[0].job} has none of ranks {args.ranks} on this host "
                        f"(here: {', '.join(str(ep.rank) for ep in endpoints)})")
    print(f"capturing the next {args.steps} steps of {len(chosen)} rank(s) of {chosen[0].job} ...", file=sys.stderr)
    targets = [(ep.rank, Target(path=ep.socket, label=f"rank {ep.rank}")) for ep in chosen]
    return _capture(args, [(rank, functools.partial(ask, t, "capture", {"steps": args.steps}, args.timeout, "capture"))
                           for rank, t in targets])


def _across_hosts(args: Any, feed: Any, wanted: set[int] | None) -> int:
    """``--hosts``: each wanted rank (default: all) asked through its node's relay."""
    from tui.stream.remote import RemoteJob

    with RemoteJob(feed) as job:
        rows = job.ranks(wanted, args.timeout)
        if wanted is not None and {r.rank for r in rows} != wanted:
            missing = ", ".join(map(str, sorted(wanted - {r.rank for r in rows})))
            raise UserError(f"job {args.target} has no rank {missing} on those hosts")
        print(f"capturing the next {args.steps} steps of {len(rows)} rank(s) of {args.target} on "
              f"{len(feed.hosts)} host(s) ...", file=sys.stderr)
        targets = [(r.rank, job.target(r.stream)) for r in rows]
        return _capture(args, [(rank, functools.partial(t.ask, "capture", {"steps": args.steps}, args.timeout,
                                                        "capture"))
                               for rank, t in targets])


def _capture(args: Any, asks: list[tuple[int, Callable[[], dict[str, Any]]]]) -> int:
    """Ask every rank at once; print what came back and each refusal or failure in one line."""

    def one(item: tuple[int, Callable[[], dict[str, Any]]]) -> dict[str, Any] | str:
        try:
            return item[1]()
        except UserError as exc:
            return str(exc)

    with ThreadPoolExecutor(max_workers=min(16, len(asks))) as pool:
        results = list(pool.map(one, asks))
    failed = [r for r in results if isinstance(r, str)]
    done = [capture_reading(r, rank) for (rank, _), r in zip(asks, results) if not isinstance(r, str)]
    if args.json:
        print(json.dumps({"captures": [c.as_json() for c in done], "errors": failed}, indent=2))
    else:
        for c in done:
            print("\n".join(c.lines(200)))
    for line in failed:
        print(f"perfmon capture: {line}", file=sys.stderr)
    return 0 if done and not failed and not any(c.error for c in done) else (1 if done else 2)


def _ranks(text: str | None) -> set[int] | None:
    if not text:
        return None
    try:
        return {int(part) for part in text.split(",") if part.strip()}
    except ValueError:
        raise UserError(f"--ranks {text}: expected a comma-separated list of rank numbers") from None
